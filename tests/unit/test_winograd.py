"""Winograd F(2x2,3x3) and F(4x4,3x3) NCHWc convolutions (`micro.winograd`).

Every ISA's code against the float64 reference on odd shapes (channels not a
multiple of the vector width, 1-pixel and odd-size images, asymmetric padding,
batches, the fused epilogues, a residual that is the output buffer itself),
both tile sizes, rounds that cut the tiles anywhere; the error stays within
the bound it is verified with (scaled by the reduction length); the planner and
the search see it; a ResNet-like model run with every 3x3 conv on Winograd
stays within 1e-4 relative L2 of onnxruntime end to end.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.test_microkernels import ADD3, RELU, B, conv
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep
from wpk.kernels import registry
from wpk.kernels.cpu.microkernels.isa import ISAS, usable_isas
from wpk.kernels.cpu.microkernels.space import conv_geometry
from wpk.kernels.cpu.microkernels.winograd import (
    MICRO_WINOGRAD,
    WinogradKernels,
    pack_winograd_filter,
)
from wpk.kernels.cpu.microkernels.winograd_space import (
    WinogradSpace,
    amplification,
    config_reason,
    default_config,
    error_bound,
    filter_transform,
    transforms,
)
from wpk.kernels.cpu.microkernels.winograd_templates import gemm_chunk, winograd_source
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.registry import Candidate
from wpk.runtime import Session
from wpk.search.measure import measure_candidate
from wpk.search.space import SearchSpace
from wpk.search.tuners import make_tuner

USABLE = [isa.name for isa in usable_isas()]
CASES = {
    "odd_channels_relu": conv(20, 24, (9, 7), 3, epilogue=(RELU,)),
    "one_pixel": conv(20, 36, (1, 1), 3),
    "asymmetric_pads": conv(B, 2 * B + 5, (7, 6), 3, pads=(1, 0, 2, 1), bias=False),
    "unpadded_odd_image": conv(3, 10, (5, 9), 3, pads=(0, 0, 0, 0)),
    "residual_batch2": conv(2 * B + 3, 40, (11, 10), 3, residual=True, batch=2,
                            epilogue=(ADD3, RELU)),
    "clip_wide": conv(B + 1, 3 * B, (6, 13), 3, epilogue=(
        EpilogueStep("clip", (("min", 0.0), ("max", 6.0))),)),
    "sigmoid_two_by_three": conv(5, 7, (2, 3), 3, epilogue=(EpilogueStep("sigmoid"),)),
    "silu_residual": conv(B + 5, 20, (8, 7), 3, residual=True,
                          epilogue=(ADD3, EpilogueStep("silu"))),
}


def _random_configs(workload, isa: str, count: int, seed: int) -> list[dict]:
    space = WinogradSpace(conv_geometry(workload), (isa,))
    knobs = space.space()
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(300):
        config = {k: v[rng.integers(len(v))] for k, v in knobs.items()}
        config = {k: (v.item() if hasattr(v, "item") else v) for k, v in config.items()}
        if space.validate(config) is None and config not in found:
            found.append(config)
        if len(found) == count:
            break
    return found


def _error(workload, config: dict, rng, in_place: bool = False) -> float:
    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    kernel = MICRO_WINOGRAD.prepare(workload, consts, config)
    expected = nchwc_reference(workload, inputs)[0]
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)   # poisoned
    if in_place:   # the residual is the output buffer (the runtime may alias them)
        out[...] = inputs[3]
        inputs = [*inputs[:3], out]
    kernel(inputs, [out])
    assert np.isfinite(out).all(), f"{config}: elements left unwritten"
    return relative_l2(out, expected)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_float64_reference(case, isa, rng):
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    if B % ISAS[isa].lanes:
        pytest.skip(f"block {B} is not a multiple of {isa}'s lanes")
    workload = CASES[case]
    assert MICRO_WINOGRAD.unsupported_reason(workload) is None
    g = conv_geometry(workload)
    configs = [default_config(g, isa, m) for m in (2, 4)]
    configs += [dict(c, local=1 - c["local"]) for c in configs]   # both ways of a round
    configs += _random_configs(workload, isa, 3, seed=len(case))
    for config in configs:
        err = _error(workload, config, rng)
        assert err <= error_bound(g, config["m"]), f"{case} {config}: relative L2 {err:.2e}"


@pytest.mark.parametrize("m", [2, 4])
def test_rounds_and_remainder_tiles_cut_anywhere(m, rng):
    """37 x 11 pixels: rounds of 8 tiles end inside tile rows, every px leaves a different
    last GEMM tile (px 12: every round's only tile is a smaller one, the one that
    prefetches), and a residual that is the output buffer is read before it is written."""
    workload = conv(B + 3, 2 * B, (11, 37), 3, residual=True, epilogue=(ADD3, RELU))
    g = conv_geometry(workload)
    for px, local in ((1, 0), (3, 1), (5, 0), (7, 1), (12, 0)):
        config = dict(default_config(g, USABLE[0], m), px=px, kv=1, tb=8, unroll=2, cc=1,
                      local=local)
        assert _error(workload, config, rng, in_place=True) <= error_bound(g, m)


def test_shared_rounds_prefetch_the_filter_in_chunks_local_ones_do_not():
    """A shared round streams a filter too large for the cache: the first GEMM tile of each
    pass prefetches it (the round's only tile where a round has fewer than PX), and the
    units go out in chunks of consecutive ones; a local round reads its filter from cache."""
    workload = conv(B + 3, 2 * B, (11, 37), 3)
    g = conv_geometry(workload)
    config = dict(default_config(g, USABLE[0], 2), px=12, kv=1, tb=8, local=0)
    shared = winograd_source(g, config)
    assert "gemm_rest8_ahead(u, v, mo, c0, c1)" in shared
    assert shared.count("__builtin_prefetch") == 3   # full, rest 8 and rest 2 (the last round)
    assert "schedule(dynamic, GEMM_CHUNK)" in shared
    assert gemm_chunk(36 * 16) > 1
    assert "__builtin_prefetch" not in winograd_source(g, dict(config, local=1))


def test_local_rounds_run_on_every_thread_at_once_each_in_its_own_scratch(rng):
    """128 rounds of 8 tiles: the threads work on different rounds at the same time, so a
    slice of the scratch shared between them would mix their tiles."""
    workload = conv(2 * B, 2 * B, (64, 64), 3, epilogue=(RELU,))
    g = conv_geometry(workload)
    config = dict(default_config(g, USABLE[0], 2), tb=8, local=1)
    for _ in range(3):
        assert _error(workload, config, rng) <= error_bound(g, 2)


def test_a_config_without_the_local_knob_is_a_shared_round_one(rng):
    """Records and plans written before `local` keep their meaning: no knob is 0."""
    workload = CASES["residual_batch2"]
    g = conv_geometry(workload)
    old = {k: v for k, v in default_config(g, USABLE[0], 4).items() if k != "local"}
    assert config_reason(g, old) is None
    assert _error(workload, old, rng) <= error_bound(g, 4)
    assert "local is 0 or 1" in config_reason(g, dict(old, local=2))
    assert "local" in WinogradSpace(g).space()
    wide = conv_geometry(conv(256, 256, (14, 14), 3))   # a 9 MiB transformed filter
    assert default_config(g, USABLE[0], 4)["local"] == 1
    assert default_config(wide, USABLE[0], 4)["local"] == 0


def test_transforms_compute_the_correlation_exactly_in_float64(rng):
    """A^T [(G g G^T) * (B^T d B)] A is the 3x3 correlation of one (m+2)^2 tile, for
    every filter of a 3 x 2 weight (`filter_transform`'s [m+2, m+2, O, I] layout)."""
    for m in (2, 4):
        bt, g, at = transforms(m)
        d = rng.standard_normal((m + 2, m + 2))
        w = rng.standard_normal((3, 2, 3, 3))
        transformed = filter_transform(w, m)
        assert transformed.shape == (m + 2, m + 2, 3, 2)
        for o, c in np.ndindex(3, 2):
            u = transformed[:, :, o, c]
            np.testing.assert_allclose(u, g @ w[o, c] @ g.T, rtol=1e-12, atol=1e-12)
            got = at @ (u * (bt @ d @ bt.T)) @ at.T
            direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * w[o, c]) for j in range(m)]
                               for i in range(m)])
            np.testing.assert_allclose(got, direct, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("m", [2, 4])
def test_the_packed_filter_holds_each_filters_transform_in_the_gemm_order(rng, m):
    """`pack_winograd_filter`: element [p*t+q, tile, c, j] is filter_transform's [p, q,
    tile*tk + j, c], bit for bit; padded output and input channels zero (17 output channels
    over tiles of 16, 13 input channels in a block of 16)."""
    lanes, kv = 8, 2
    tk = lanes * kv
    weight = rng.standard_normal((17, 13, 3, 3)).astype(np.float32)
    g = conv_geometry(conv(13, 17, (6, 6), 3))
    packed = pack_winograd_filter(weight, g, m, lanes, kv)
    t = m + 2
    expected = filter_transform(weight, m).reshape(t * t, 17, 13).astype(np.float32)
    assert packed.shape == (t * t, 2, g.cb * g.block, tk)
    for tile in range(2):
        n = min(tk, 17 - tile * tk)
        np.testing.assert_array_equal(packed[:, tile, :13, :n],
                                      expected[:, tile * tk:tile * tk + n].transpose(0, 2, 1))
        assert not packed[:, tile, :, n:].any() and not packed[:, tile, 13:].any()


def test_error_bound_grows_with_the_reduction_and_the_tile():
    small, large = conv(16, 16, (8, 8), 3), conv(512, 16, (8, 8), 3)
    gs, gl = conv_geometry(small), conv_geometry(large)
    assert error_bound(gs, 2) < error_bound(gl, 2) < error_bound(gl, 4)
    assert amplification(2) < amplification(4)
    # ResNet-50's widest 3x3 conv (512 channels) is still checked tighter than the 1e-4
    # the planner allows float32 kernels, and the planner uses the bound
    assert error_bound(gl, 4) < 1e-4
    assert MICRO_WINOGRAD.tolerance(large, default_config(gl, m=4)) == error_bound(gl, 4)


def test_unsupported_workloads_say_why():
    assert "3x3 stride-1" in MICRO_WINOGRAD.unsupported_reason(conv(B, B, (9, 9), 3, stride=2))
    assert "3x3 stride-1" in MICRO_WINOGRAD.unsupported_reason(
        conv(B, B, (9, 9), 3, dilation=2, pads=(2, 2, 2, 2)))
    assert "3x3 stride-1" in MICRO_WINOGRAD.unsupported_reason(conv(B, B, (9, 9), 1))
    assert "depthwise" in MICRO_WINOGRAD.unsupported_reason(conv(B, B, (9, 9), 3, group=B))
    # a grouped conv of whole-block groups (RegNet's, widened): verification caught the
    # wrong answers its one GEMM over every input block gave, now it is refused up front
    assert "ungrouped" in MICRO_WINOGRAD.unsupported_reason(
        conv(2 * B, 2 * B, (9, 9), 3, group=2))
    # narrower groups widened (ResNeXt's 4 channels): a group per block, reduced over its
    # own channels, which the micro-kernel's geometry counts as one group
    narrow = conv(2 * B, 2 * B, (9, 9), 3, group=2, group_width=B // 4)
    assert "narrow-group" in MICRO_WINOGRAD.unsupported_reason(narrow)


def test_config_space_rejects_what_does_not_fit():
    g = conv_geometry(CASES["odd_channels_relu"])
    fits = {"isa": "portable", "m": 4, "kv": 2, "px": 4, "unroll": 2, "tb": 16, "cc": 1}
    assert config_reason(g, fits) is None
    assert "m is one of" in config_reason(g, dict(fits, m=3))
    assert "registers" in config_reason(g, dict(fits, kv=3, px=5))   # 15 + 3 + 1 > 16
    assert "knobs" in config_reason(g, {"isa": "portable", "m": 2})
    assert "vectors" in config_reason(g, dict(fits, kv=g.out_vectors(4) + 1, px=1))
    wide = conv_geometry(conv(2048, 2048, (56, 56), 3))
    assert "scratch" in config_reason(wide, dict(fits, isa=USABLE[0], tb=512))
    assert "MiB" in config_reason(wide, dict(fits, isa=USABLE[0], tb=8))   # 604 MiB filter
    huge = conv(4096, 4096, (8, 8), 3)   # even F(2, 3)'s filter: 1 GiB
    assert "MiB" in MICRO_WINOGRAD.unsupported_reason(huge)
    with pytest.raises(ValueError, match="m is one of"):
        winograd_source(g, dict(fits, m=6))


def test_avx2_source_uses_eight_lanes():
    if "avx2" not in USABLE:
        pytest.skip("this host cannot run avx2 code")
    g = conv_geometry(CASES["odd_channels_relu"])
    source = winograd_source(g, default_config(g, "avx2", 2))
    assert "vector_size(8 * 4)" in source and "#define VW 8" in source and "#define M 2" in source


def test_untuned_build_measures_both_tile_sizes_and_the_tuner_searches_m(rng):
    workload = CASES["asymmetric_pads"]
    found = [c.config for c in registry.candidates(workload, "cpu")
             if c.implementation is MICRO_WINOGRAD]
    assert sorted(c["m"] for c in found) == [2, 4]
    space = SearchSpace.from_template(WinogradKernels().template(workload))
    assert space.choices[space.names.index("m")] == (2, 4)   # the algorithm is a knob
    tuner = make_tuner("ga", space, 0)
    batch = tuner.next_batch(6)
    assert batch and all(space.is_valid(space.indices(c)) for c in batch)
    g = conv_geometry(workload)
    for config in batch[:2]:
        assert _error(workload, config, rng) <= error_bound(g, config["m"])


def test_planner_verifies_it_with_its_own_bound(rng):
    """measure_candidate checks a Winograd candidate against the bound of its m (tighter than
    the float32 default), and it passes."""
    workload = CASES["residual_batch2"]
    g = conv_geometry(workload)
    config = default_config(g, m=4)
    measurement = measure_candidate(workload, Candidate(MICRO_WINOGRAD, config), rng=rng,
                                    warmup=0, repeats=1, min_time=0.0)
    assert measurement.status == "ok", measurement
    assert measurement.rel_l2_error <= error_bound(g, 4) < 1e-4


# --- end to end --------------------------------------------------------------------------


def resnet_like() -> onnx.ModelProto:
    """Stem-free ResNet-ish block stack on 24 channels of 13x11: conv3x3+relu, conv3x3 +
    residual add + relu, conv3x3 to 40 channels + relu (odd sizes on purpose)."""
    rng = np.random.default_rng(0)

    def const(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s2"]),
             helper.make_node("Relu", ["s2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c3"], ["y"])]
    inits = [const("w1", (24, 24, 3, 3), 0.1), const("b1", (24,), 0.1),
             const("w2", (24, 24, 3, 3), 0.1), const("b2", (24,), 0.1),
             const("w3", (40, 24, 3, 3), 0.1), const("b3", (40,), 0.1)]
    graph = helper.make_graph(
        nodes, "resnet_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 13, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40, 13, 11])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("m", [2, 4])
def test_resnet_like_model_on_winograd_matches_onnxruntime(m, monkeypatch):
    """Every 3x3 conv of the plan on `micro.winograd` (F(m, 3); the measured choices are
    swapped after the planner measured them): 1e-4 relative L2 of onnxruntime end to end."""
    from wpk import pipeline
    from wpk.plans.planner import PlanChoices

    real = pipeline.plan_workloads
    swapped_keys = []

    def on_winograd(*args, **kwargs):
        choices, search, parallel = real(*args, **kwargs)
        found = {}
        for key, choice in choices.choices.items():
            if MICRO_WINOGRAD.unsupported_reason(choice.workload) is None:
                config = default_config(conv_geometry(choice.workload), m=m)
                choice = dataclasses.replace(choice, candidate=Candidate(MICRO_WINOGRAD, config))
                swapped_keys.append(key)
            found[key] = choice
        return PlanChoices(found), search, parallel

    monkeypatch.setattr(pipeline, "plan_workloads", on_winograd)
    model = resnet_like()
    plan = wpk.build(model, target="cpu", progress=False, partition=False, warmup=0,
                     repeats=1, min_time=0.0)
    assert len(swapped_keys) == 3
    steps = [s["impl"] for s in plan.manifest["steps"]]
    assert steps.count("micro.winograd") == 3, steps
    x = np.random.default_rng(1).standard_normal((1, 24, 13, 11)).astype(np.float32)
    (got,) = Session(plan).run(None, {"x": x})
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert relative_l2(got, peer.run(None, {"x": x})[0]) <= 1e-4


def test_search_driver_tunes_winograd_with_rl_and_the_cost_model(tmp_path):
    """`tune_workload` on the Winograd family (RL proposals through the cost-model filter):
    compiled in the pool, verified against its bound and timed in the isolated worker,
    recorded; the winner is a valid config, its m one of the two tile sizes."""
    from wpk.kernels.target import create_target
    from wpk.search.compile_pool import CompilePool
    from wpk.search.driver import tune_workload
    from wpk.search.recorded import RecordedRunner
    from wpk.search.records import RecordStore
    from wpk.search.runner import IsolatedRunner
    from wpk.search.workers import MeasureOptions, MeasureWorker

    workload = CASES["odd_channels_relu"]
    with MeasureWorker(MeasureOptions(warmup=1, repeats=3, min_time=0.002)) as worker, \
            CompilePool(jobs=2) as pool:
        runner = RecordedRunner(IsolatedRunner(options=worker.options, worker=worker),
                                RecordStore(tmp_path / "r.jsonl"),
                                create_target("cpu").fingerprint())
        result = tune_workload(workload, "rl", trials=4, runner=runner,
                               generated=WinogradKernels(), compile_pool=pool, seed=1,
                               finalize_k=2, cost_model=True)
    assert result.trials == 4 and result.failed == 0
    assert config_reason(conv_geometry(workload), result.best_config) is None
    assert result.best_config["m"] in (2, 4) and result.final_s > 0
