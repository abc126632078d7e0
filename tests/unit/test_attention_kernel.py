"""The fused attention op's implementations against its float64 reference, on odd sizes
(sequences not a multiple of the tiles, head dims not a multiple of the vector width,
masks of several broadcasts, batch > 1, rank 3), and the reference against onnx.reference
running the standard nodes the op stands for."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from wpk.core.devices import host_cpu
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.attention import (
    ATTENTION_C,
    ORT_ATTENTION,
    attention_configs,
    attention_model,
)
from wpk.kernels.cpu.attention_c import attention_source, config_reason
from wpk.kernels.cpu.attention_spec import attention_reason, attention_shape
from wpk.kernels.cpu.node_model import input_name
from wpk.kernels.reference import has_formula, reference
from wpk.kernels.support import is_supported

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

TOLERANCE = 1e-5


def workload(lead=(2, 3), sq=37, sk=45, d=20, dv=13, k_transposed=False, mask=None,
             dtype="float32") -> Workload:
    k = lead + ((d, sk) if k_transposed else (sk, d))
    inputs = [TensorSpec(lead + (sq, d), dtype), TensorSpec(k, dtype),
              TensorSpec(lead + (sk, dv), dtype)]
    if mask is not None:
        inputs.append(TensorSpec(mask, dtype))
    return Workload("Attention", tuple(inputs), (TensorSpec(lead + (sq, dv), dtype),),
                    (("k_transposed", int(k_transposed)), ("scale", 0.31)), domain="wpk")


def arrays_for(w: Workload, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = [rng.standard_normal(s.shape).astype(np.float32) * 2 for s in w.inputs[:3]]
    if len(w.inputs) > 3:
        mask = rng.standard_normal(w.inputs[3].shape).astype(np.float32)
        if mask.shape[-1] > 1:   # keys masked away (a -1e4 shift of a whole row would cost
            mask = np.where(mask > 1.0, -1e4, mask)   # float32 its digits, in any kernel)
        arrays.append(mask.astype(np.float32))
    return arrays


def check(kernel, w: Workload, arrays: list[np.ndarray]) -> float:
    out = np.full(w.outputs[0].shape, np.nan, np.float32)   # poisoned: every element written
    kernel(arrays, [out])
    assert np.isfinite(out).all()
    return relative_l2(out, reference(w, arrays)[0])


CASES = {
    "bert-mask": dict(mask=(2, 1, 1, 45)),
    "no-mask": dict(),
    "k-transposed": dict(k_transposed=True, mask=(1, 1, 37, 45)),
    "per-head-mask": dict(mask=(2, 3, 70, 130), d=64, dv=64, sq=70, sk=130),
    "rank-3": dict(lead=(5,), mask=(5, 1, 45)),
    "tiny": dict(lead=(1, 1), sq=1, sk=1, d=1, dv=1),
    "key-mask-only": dict(mask=(129,), sq=65, sk=129),
    # MaxViT's [B, windows, H, S, D] with a per-head relative position bias, and a mask
    # per window (a shifted window's), folded into the kernels' rank-4 view
    "rank-5-bias": dict(lead=(1, 4, 2), sq=49, sk=49, d=32, dv=32, mask=(2, 49, 49)),
    "rank-5-window-mask": dict(lead=(2, 3, 2), sq=17, sk=17, mask=(2, 3, 1, 17, 17),
                               k_transposed=True),
    "rank-6": dict(lead=(2, 2, 2, 3), sq=9, sk=11, d=8, dv=5, mask=(3, 9, 11)),
}


@pytest.mark.parametrize("case", CASES)
def test_generated_kernel_matches_the_reference(rng, case):
    w = workload(**CASES[case])
    assert attention_reason(w) is None
    arrays = arrays_for(w, rng)
    configs = attention_configs(w)
    assert configs
    for config in configs[:2] + configs[-1:]:
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config


@pytest.mark.parametrize("tq, tk", [(64, 96), (48, 96), (32, 96), (64, 144)])
@pytest.mark.parametrize("case", ["bert-mask", "k-transposed", "per-head-mask", "no-mask"])
def test_the_wide_micro_tile_is_correct(rng, case, tq, tk):
    """6 keys x 2 vectors of 8 with 96- and 144-key tiles (not powers of two), over sizes
    that leave partial tiles and micro-tiles, with each kind of mask; query tiles of 64 and 32
    leave the P V product a remainder of 4 and 2 queries past its 6-query micro-tiles, 48
    none."""
    w = workload(**CASES[case])
    config = {"tq": tq, "tk": tk, "vw": 8, "mr": 6, "nr": 2}
    assert config_reason(attention_shape(w), config) is None
    assert check(ATTENTION_C.prepare(w, {}, config), w, arrays_for(w, rng)) < TOLERANCE


@pytest.mark.parametrize("vw, mr, nr, tq", [(4, 6, 2, 24), (4, 5, 1, 12), (2, 3, 2, 8)])
def test_query_tiles_that_micro_tiles_do_not_divide_are_correct(rng, vw, mr, nr, tq):
    """The P V product's remainder micro-tile at other widths: 24 = 4 x 6 (none), 12 = 2 x 5
    + 2, 8 = 2 x 3 + 2, with a per-query mask and an odd number of queries."""
    w = workload(**CASES["per-head-mask"])
    config = {"tq": tq, "tk": 6 * mr, "vw": vw, "mr": mr, "nr": nr}
    assert config_reason(attention_shape(w), config) is None
    assert check(ATTENTION_C.prepare(w, {}, config), w, arrays_for(w, rng)) < TOLERANCE


def test_the_wide_micro_tile_is_offered_with_16_registers():
    from tests.isa import forced_isa

    with forced_isa("avx2"):
        wide = [c for c in attention_configs(workload(sq=512, sk=512)) if c["mr"] == 6]
        assert wide == [{"tq": tq, "tk": tk, "vw": 8, "mr": 6, "nr": 2}
                        for tq in (32, 64) for tk in (96, 144)]
        short = [c for c in attention_configs(workload(sq=20, sk=64)) if c["mr"] == 6]
        assert [(c["tq"], c["tk"]) for c in short] == [(32, 96)]   # tiles under twice it
        assert not [c for c in attention_configs(workload(sq=64, sk=40)) if c["mr"] == 6]
    assert not [c for c in attention_configs(workload(sq=512, sk=512), lanes=16)
                if c["mr"] == 6]   # 32 registers: 4 x 4 and 8 x 2 already keep 16


@pytest.mark.parametrize("mask", [(2, 1, 37, 1), (2, 1, 37, 45)])
@pytest.mark.parametrize("vw, mr, nr", [(1, 4, 2), (4, 2, 4), (8, 4, 2)])
def test_every_vector_width_is_correct(rng, vw, mr, nr, mask):
    """The portable scalar path (vw 1) and narrower vectors than the host's, with a mask
    of one value per query (broadcast over the keys) and one per query and key (its blocks
    transposed in registers, and the edges past a multiple of the width)."""
    w = workload(mask=mask)
    config = {"tq": 8 * nr * vw, "tk": 12 * mr, "vw": vw, "mr": mr, "nr": nr}
    assert config_reason(attention_shape(w), config) is None
    assert check(ATTENTION_C.prepare(w, {}, config), w, arrays_for(w, rng)) < TOLERANCE


def padded(w: Workload, rng, dead: np.ndarray, fill: float) -> tuple[list, np.ndarray]:
    """Inputs whose mask gives `fill` to the keys `dead` marks ([batch, key]) and 0 to the
    others, V NaN on those keys, and the output the reference gives with V 0 there."""
    arrays = arrays_for(w, rng)
    mask = np.where(dead, fill, 0.0).astype(np.float32)
    arrays[3] = np.broadcast_to(mask[:, None, None, :], w.inputs[3].shape).copy()
    dead_v = np.broadcast_to(dead[:, None, :, None], arrays[2].shape)   # [b, head, key, dv]
    expected = reference(w, arrays[:2] + [np.where(dead_v, 0, arrays[2])] + arrays[3:])[0]
    arrays[2] = np.where(dead_v, np.float32(np.nan), arrays[2])
    return arrays, expected


PADDINGS = {"right, -1e4": (-1e4, False), "left, -inf": (-np.inf, True),
            "right, float32 min": (float(np.finfo(np.float32).min), False)}


@pytest.mark.parametrize("padding", PADDINGS)
def test_padded_keys_are_never_read(rng, padding):
    """Keys a padding mask pushes more than 104 below a score every query reaches weigh
    under the smallest float: the kernel leaves them out (their V rows, NaN here, are never
    read), on one side or the other, in the first key tile or later ones."""
    fill, left = PADDINGS[padding]
    w = workload(lead=(2, 3), sq=70, sk=150, d=24, dv=20, mask=(2, 1, 1, 150))
    dead = np.zeros((2, 150), bool)
    dead[0, 101:], dead[1, 140:] = True, True   # one ends in the first tile of 64 keys
    dead[1, :3] = True                              # an edge of the anchor's tile
    if left:
        dead = dead[:, ::-1].copy()
    arrays, expected = padded(w, rng, dead, fill)
    for config in attention_configs(w)[:2] + [{"tq": 16, "tk": 8, "vw": 1, "mr": 2, "nr": 2}]:
        out = np.full(w.outputs[0].shape, np.nan, np.float32)
        ATTENTION_C.prepare(w, {}, config)(arrays, [out])
        assert np.isfinite(out).all(), config
        assert relative_l2(out, expected) < TOLERANCE, config


def test_keys_masked_for_every_query_are_never_read_under_a_full_mask(rng):
    """A [batch, 1, query, key] mask (the general path: one mask value per query and key)
    that leaves the last keys out for every query, and random values elsewhere."""
    w = workload(lead=(2, 3), sq=40, sk=90, mask=(2, 1, 40, 90))
    dead = np.zeros((2, 90), bool)
    dead[:, 75:] = True
    arrays, _ = padded(w, rng, dead, -1e30)
    arrays[3] += rng.standard_normal(arrays[3].shape).astype(np.float32)
    expected = reference(w, arrays[:2] + [np.nan_to_num(arrays[2], nan=0.0)] + arrays[3:])[0]
    out = np.full(w.outputs[0].shape, np.nan, np.float32)
    ATTENTION_C.prepare(w, {}, attention_configs(w)[0])(arrays, [out])
    assert np.isfinite(out).all() and relative_l2(out, expected) < TOLERANCE


@pytest.mark.parametrize("mask_shape", [(2, 3, 1, 60), (1, 3, 1, 60), (2, 1, 1, 60)])
def test_only_the_padded_plane_of_a_mask_leaves_keys_out(rng, mask_shape):
    """A mask whose batch and head planes differ: keys are left out exactly where that
    plane's mask pushes them down (V NaN there), every other plane reads all its keys."""
    w = workload(lead=(2, 3), sq=33, sk=60, d=16, dv=16, mask=mask_shape)
    arrays = arrays_for(w, rng)
    mask = np.zeros(mask_shape, np.float32)
    b, h = mask_shape[0] - 1, mask_shape[1] - 1
    mask[b, h, :, 40:] = -np.inf
    arrays[3] = mask
    expected = reference(w, arrays)[0]
    dead = np.zeros(arrays[2].shape, bool)
    dead[b if mask_shape[0] > 1 else slice(None), h if mask_shape[1] > 1 else slice(None),
         40:] = True
    arrays[2] = np.where(dead, np.float32(np.nan), arrays[2])
    for config in attention_configs(w)[:2]:
        out = np.full(w.outputs[0].shape, np.nan, np.float32)
        ATTENTION_C.prepare(w, {}, config)(arrays, [out])
        assert np.isfinite(out).all() and relative_l2(out, expected) < TOLERANCE, config


def test_a_causal_mask_matches_the_reference(rng):
    """-inf above the diagonal: the query tiles leave their future keys out."""
    w = workload(lead=(1, 2), sq=97, sk=97, d=32, dv=32, mask=(1, 1, 97, 97))
    arrays = arrays_for(w, rng)
    arrays[3] = np.triu(np.full((97, 97), -np.inf, np.float32), 1)[None, None]
    for config in attention_configs(w)[:2] + [{"tq": 16, "tk": 16, "vw": 4, "mr": 4, "nr": 2}]:
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config


@pytest.mark.parametrize("mask", [None, (1, 1, 1, 50), (1, 1, 40, 50)])
def test_a_nan_reaches_the_outputs_it_reaches_in_the_reference(rng, mask):
    """A NaN in one query poisons that query's output row; one in a key every row of its
    head (the softmax of a NaN score): as the standard nodes do, no finite stand-in."""
    w = workload(lead=(1, 3), sq=40, sk=50, d=24, dv=16, mask=mask)
    arrays = arrays_for(w, rng)
    arrays[0][0, 0, 7, 5] = np.nan
    arrays[1][0, 2, 11, 3] = np.nan
    expected = reference(w, arrays)[0]
    assert np.isnan(expected).sum() == (16 + 40 * 16)
    for config in attention_configs(w)[:2] + [{"tq": 16, "tk": 16, "vw": 1, "mr": 2, "nr": 2}]:
        out = np.full(w.outputs[0].shape, np.nan, np.float32)
        ATTENTION_C.prepare(w, {}, config)(arrays, [out])
        finite = ~np.isnan(expected)
        assert np.array_equal(np.isnan(out), ~finite), config
        assert relative_l2(out[finite], expected[finite]) < TOLERANCE, config


@pytest.mark.parametrize("key", [75, 40])
def test_a_masked_key_that_still_wins_is_kept(rng, key):
    """A mask of -1e4 does not make a key negligible when its score is larger still: the
    queries' and keys' norms bound the scores, and here they leave the key in, past the
    first key tile (75) and inside it (40, where only the bound stands for the scores)."""
    w = workload(lead=(1, 1), sq=8, sk=80, d=16, dv=16, mask=(1, 1, 1, 80))
    arrays = arrays_for(w, rng)
    arrays[3] = np.zeros((1, 1, 1, 80), np.float32)
    arrays[3][..., 70:] = -1e4
    arrays[3][..., key] = -1e4
    arrays[0] = np.abs(arrays[0]) + 0.5
    arrays[1][0, 0, key] = 1e4   # every query's score with it: above 5e4, 1e4 masked away
    expected = reference(w, arrays)[0]
    assert np.allclose(expected[0, 0], arrays[2][0, 0, key])   # it takes all the weight
    for config in attention_configs(w)[:2] + [{"tq": 8, "tk": 64, "vw": 1, "mr": 4, "nr": 2}]:
        out = np.full(w.outputs[0].shape, np.nan, np.float32)
        ATTENTION_C.prepare(w, {}, config)(arrays, [out])
        assert relative_l2(out, expected) < TOLERANCE, config


def _unit_vector(rng, d: int) -> np.ndarray:
    direction = rng.standard_normal(d).astype(np.float32)
    return direction / np.linalg.norm(direction)


def _scores_at_levels(rng, arrays, level: np.ndarray) -> None:
    """Queries near one unit direction and keys along it at `level` (one per key) plus
    noise, so that score = q . k * 0.31 is about the level (natural units)."""
    d = arrays[0].shape[-1]
    direction = _unit_vector(rng, d)
    arrays[0][:] = direction + 0.05 * rng.standard_normal(arrays[0].shape)
    keys = direction * level[:, None] + 0.3 * rng.standard_normal((len(level), d))
    arrays[1][:] = (keys / 0.31).astype(np.float32)


# Scores per key tile (natural units): the online softmax rescales the sums and the
# output by 2^(m_old - m_new) where a tile rises above the running max (far: by 100, e^100
# would overflow a float), and a tile far below it adds nothing that matters.
LEVELS = {"small rises": (0, 3, 5, 4), "rises that move the max": (0, 6.5, 13, 7),
          "a rise that would overflow": (0, 6, 100, 98), "falls": (10, 0, -200, 9)}


@pytest.mark.parametrize("levels", LEVELS.values(), ids=list(LEVELS))
def test_scores_that_rise_or_fall_from_one_key_tile_to_the_next(rng, levels):
    tile, d = 16, 16
    w = workload(lead=(1, 2), sq=24, sk=tile * len(levels), d=d, dv=16)
    arrays = arrays_for(w, rng)
    _scores_at_levels(rng, arrays, np.repeat(np.asarray(levels, np.float32), tile))
    lanes = host_cpu().vector_lanes
    for config in ({"tq": 8, "tk": tile, "vw": 1, "mr": 4, "nr": 2},
                   {"tq": 2 * lanes, "tk": tile, "vw": lanes, "mr": 4, "nr": 2}):
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config


@pytest.mark.parametrize("step", [7.0, 40.0, -7.0])
def test_scores_that_rise_within_one_key_tile(rng, step):
    """Levels that change every 4 keys (one micro-tile's) inside a 64-key tile, 0, 1, 2, 3
    steps over and over: the running max rises (by 7 or 40, natural units) and falls
    within one key step's block, its largest scores far above its first ones."""
    group, d = 4, 16
    w = workload(lead=(1, 2), sq=24, sk=64, d=d, dv=16, mask=(1, 1, 1, 64))
    arrays = arrays_for(w, rng)
    _scores_at_levels(rng, arrays, np.repeat(step * (np.arange(64 // group) % 4), group))
    arrays[3][:] = 0.0
    lanes = host_cpu().vector_lanes
    for config in ({"tq": 8, "tk": 64, "vw": 1, "mr": group, "nr": 2},
                   {"tq": 2 * lanes, "tk": 64, "vw": lanes, "mr": group, "nr": 2}):
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config


@pytest.mark.parametrize("mask", [(1, 1, 1, 80), (1, 1, 8, 80)])
def test_a_best_masked_key_that_scores_far_under_its_mask_leaves_the_others_in(rng, mask):
    """Key 0 has the best mask (0, the others -110) and goes first, but scores -1000: the
    floor that tells dead keys before any score is its mask less the bound on its score,
    not its mask, which would have left out the keys that take all the weight."""
    w = workload(lead=(1, 1), sq=8, sk=80, d=16, dv=16, mask=mask)
    arrays = arrays_for(w, rng)
    direction = _unit_vector(rng, 16)
    arrays[0][:] = direction   # |q| = 1
    arrays[1][0, 0, 0] = -direction * np.float32(1000 / 0.31)   # score -1000
    arrays[3] = np.full(mask, -110.0, np.float32)   # 110 under it: beyond the 104 that kills
    arrays[3][..., 0] = 0.0
    expected = reference(w, arrays)[0]
    assert np.allclose(expected, arrays[2][:, :, 1:].mean(axis=2, keepdims=True), atol=0.5)
    for config in attention_configs(w)[:2] + [{"tq": 8, "tk": 64, "vw": 1, "mr": 4, "nr": 2}]:
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config


@pytest.mark.parametrize("k_transposed", [False, True])
@pytest.mark.parametrize("mask", [(1, 1, 1, 80), (1, 1, 8, 80)])
def test_the_norm_bound_keeps_a_key_whose_score_outweighs_its_mask_by_a_little(
        rng, k_transposed, mask):
    """A key along every query's direction scores |q||k|, the Cauchy-Schwarz bound
    itself: at 2e4, less a mask of 2e4 - 50, it takes all the weight, and a key norm
    under its true value by 1% would have left it out (K as it lies and transposed; a
    mask per key and one per query and key)."""
    w = workload(lead=(1, 2), sq=8, sk=80, d=16, dv=16, k_transposed=k_transposed, mask=mask)
    arrays = arrays_for(w, rng)
    direction = _unit_vector(rng, 16)
    arrays[0][:] = direction   # every query the unit vector: |q| = 1
    key = direction * np.float32(2e4 / 0.31)   # its score: |q||k| * scale = 2e4
    if k_transposed:
        arrays[1][..., 75] = key
    else:
        arrays[1][..., 75, :] = key
    arrays[3] = np.zeros(mask, np.float32)
    arrays[3][..., 70:] = -1e4
    arrays[3][..., 75] = -(2e4 - 50)
    expected = reference(w, arrays)[0]
    assert np.allclose(expected, arrays[2][:, :, 75:76, :], rtol=1e-5)   # all its weight
    for config in attention_configs(w)[:2] + [{"tq": 16, "tk": 8, "vw": 1, "mr": 2, "nr": 2}]:
        out = np.full(w.outputs[0].shape, np.nan, np.float32)
        ATTENTION_C.prepare(w, {}, config)(arrays, [out])
        assert relative_l2(out, expected) < TOLERANCE, config


@pytest.mark.parametrize("case", ["bert-mask", "k-transposed", "rank-3", "rank-5-bias"])
def test_onnxruntime_candidate_matches_the_reference(rng, case):
    w = workload(**CASES[case])
    assert check(ORT_ATTENTION.prepare(w, {}, {}), w, arrays_for(w, rng)) < TOLERANCE


@pytest.mark.parametrize("case", ["bert-mask", "k-transposed", "rank-3", "key-mask-only",
                                  "rank-5-window-mask"])
def test_reference_is_what_the_standard_nodes_compute(rng, case):
    """The float64 formula against onnx.reference running the unfused ONNX nodes."""
    w = workload(**CASES[case])
    arrays = arrays_for(w, rng)
    model, feeds = attention_model(w, {})
    (expected,) = ReferenceEvaluator(model).run(None, {input_name(i): arrays[i] for i in feeds})
    assert has_formula(w)
    assert relative_l2(reference(w, arrays)[0], expected) < TOLERANCE


def test_the_planner_sees_both_candidates_and_the_op_is_wpks():
    w = workload(mask=(2, 1, 1, 45))
    names = {c.implementation.name for c in registry.candidates(w)}
    assert names == {"attention.c", "ort.attention"}
    assert is_supported(w) and is_supported("Attention", "wpk")


def test_head_dims_too_big_for_the_stack_get_no_config():
    assert attention_configs(workload(d=4096, dv=4096)) == []


def test_bench_script_refuses_bad_sizes(capsys):
    import runpy
    from pathlib import Path
    bench = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "bench_attention.py"))
    assert bench["main"](["--d-models", "100"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_bench_script_verifies_and_times_a_causal_mask(capsys, tmp_path):
    import json
    import runpy
    from pathlib import Path
    bench = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "bench_attention.py"))
    out = tmp_path / "causal.json"
    assert bench["main"](["--causal", "--seqs", "40", "--d-models", "128", "--rounds", "1",
                          "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    (row,) = written["rows"]
    assert row["mask"] == "causal" and max(row["errors"].values()) < 1e-4
    assert written["cpu_model"] == host_cpu().description   # which VM ran it, by name


def test_configs_follow_the_host_vector_width_and_the_sequence():
    w = workload(sq=20, sk=20)
    lanes = host_cpu().vector_lanes
    configs = attention_configs(w)
    assert {c["vw"] for c in configs} == {lanes}
    assert all(c["tq"] == 32 and c["tk"] == 64 for c in configs)   # no tile 2x the sequence
    assert all(config_reason(attention_shape(w), c) is None for c in configs)
    assert [c for c in configs if c.get("par") == 0]        # small: the calling thread too
    big = workload(lead=(1, 12), sq=512, sk=512, d=64, dv=64)
    assert all(c.get("par", 1) == 1 for c in attention_configs(big))
    assert {c["vw"] for c in attention_configs(w, lanes=8)} == {8}


@pytest.mark.parametrize("config, words", [
    ({"tq": 32, "tk": 64, "vw": 16, "mr": 4}, "has the knobs"),
    ({"tq": 32, "tk": 64, "vw": 16, "mr": 4, "nr": 2, "par": 2}, "par is 1"),
    ({"tq": 48, "tk": 64, "vw": 16, "mr": 4, "nr": 2}, "tq must be a multiple of nr*vw"),
    ({"tq": 40, "tk": 64, "vw": 4, "mr": 4, "nr": 4}, "tq must be a multiple of nr*vw"),
    ({"tq": 32, "tk": 66, "vw": 16, "mr": 4, "nr": 2}, "tk a multiple of mr"),
    ({"tq": 32, "tk": 64, "vw": 3, "mr": 4, "nr": 2}, "vw must be"),
    ({"tq": 64, "tk": 4096, "vw": 16, "mr": 4, "nr": 2}, "bytes of stack"),
])
def test_bad_configs_are_refused(config, words):
    w = workload()
    assert words in config_reason(attention_shape(w), config)
    with pytest.raises(ValueError, match="knobs"):
        ATTENTION_C.prepare(w, {}, config)
    with pytest.raises(ValueError):
        attention_source(attention_shape(w), 3, 4, config)


@pytest.mark.parametrize("w, words", [
    (workload(dtype="float64"), "float32"),
    (workload(mask=(3, 1, 1, 45)), "does not broadcast"),
    # broadcast along the windows but not the batch: no single stride walks the fold
    (workload(lead=(2, 3, 2), mask=(2, 1, 1, 37, 45)), "cannot be folded"),
    (workload(lead=(2, 2, 2, 2, 2)), "rank 3 to 6"),
    (Workload("Attention", (TensorSpec((2, 4, 8)), TensorSpec((2, 4, 8)),
                            TensorSpec((3, 4, 8))), (TensorSpec((2, 4, 8)),), domain="wpk"),
     "same leading"),
])
def test_malformed_workloads_have_no_candidate(w, words):
    assert words in attention_reason(w)
    assert ATTENTION_C.unsupported_reason(w) and ORT_ATTENTION.unsupported_reason(w)


def heads_workload(bshd, k_transposed=False, mask=True, b=2, h=3, sq=37, sk=45, d=20, dv=13):
    """A rank-4 attention whose operands flagged in `bshd` (Q, K, V, output) are stored
    [B, S, H, D]."""
    def stored(s, width, flag):
        return (b, s, h, width) if flag else (b, h, s, width)
    k = (b, h, d, sk) if k_transposed else stored(sk, d, bshd[1])
    inputs = [TensorSpec(stored(sq, d, bshd[0])), TensorSpec(k),
              TensorSpec(stored(sk, dv, bshd[2]))]
    if mask:
        inputs.append(TensorSpec((b, 1, 1, sk)))
    return Workload("Attention", tuple(inputs), (TensorSpec(stored(sq, dv, bshd[3])),),
                    (("bshd", tuple(bshd)), ("k_transposed", int(k_transposed)),
                     ("scale", 0.31)), domain="wpk")


LAYOUTS = {"all": ((1, 1, 1, 1), False), "k_kept": ((1, 0, 1, 1), False),
           "output_only": ((0, 0, 0, 1), False), "q_and_kt": ((1, 0, 0, 0), True)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_operands_stored_batch_seq_heads_match_the_reference(rng, layout):
    """The head-split layout ([B, S, H, D], attribute bshd) per operand: the kernel reads
    and writes it where it lies, onnxruntime runs it with the Transposes it stands for."""
    bshd, k_transposed = LAYOUTS[layout]
    w = heads_workload(bshd, k_transposed)
    assert attention_reason(w) is None
    arrays = arrays_for(w, rng)
    expected = reference(w, arrays)[0]
    if bshd[0]:   # the same numbers as the [B, H, S, D] op on transposed operands
        moved = [a.transpose(0, 2, 1, 3) if f else a for a, f in zip(arrays[:3], bshd)]
        plain = heads_workload((0, 0, 0, 0), k_transposed)
        same = reference(plain, moved + arrays[3:])[0]
        np.testing.assert_allclose(expected, same.transpose(0, 2, 1, 3) if bshd[3] else same,
                                   rtol=1e-12)
    for config in attention_configs(w)[:2] + [{"tq": 16, "tk": 8, "vw": 4, "mr": 4, "nr": 2}]:
        assert check(ATTENTION_C.prepare(w, {}, config), w, arrays) < TOLERANCE, config
    assert check(ORT_ATTENTION.prepare(w, {}, {}), w, arrays) < TOLERANCE


def test_layouts_the_op_does_not_define_are_refused():
    assert "not both" in attention_reason(heads_workload((0, 1, 0, 0), k_transposed=True))
    rank3 = Workload("Attention", (TensorSpec((2, 5, 4)),) * 3, (TensorSpec((2, 5, 4)),),
                     (("bshd", (1, 0, 0, 0)),), domain="wpk")
    assert "rank 4" in attention_reason(rank3)
    from wpk.kernels.cuda.fused import ATTENTION
    assert "[B, H, S, D]" in ATTENTION.reason(heads_workload((1, 1, 1, 1)))


def test_bench_script_combines_runs_into_per_shape_medians(capsys, tmp_path):
    import json
    import runpy
    from pathlib import Path
    bench = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "bench_attention.py"))
    rows = [{"seq": 64, "d_model": 256, "mask": True}, {"seq": 128, "d_model": 256, "mask": True}]
    paths = []
    for i, speedups in enumerate([(1.4, 1.2), (1.6, 1.3), (1.7, 1.9)]):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps({"rows": [{**row, "speedup": x}
                                                  for row, x in zip(rows, speedups)]}))
    assert bench["main"](["--combine", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "1.40 1.60 1.70 -> 1.60" in out and "1.20 1.30 1.90 -> 1.30" in out
    assert "met by 1/2 shapes' medians" in out
    assert bench["main"](["--combine", str(tmp_path / "none.json")]) == 2
    assert "error: --combine" in capsys.readouterr().err
