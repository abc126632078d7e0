"""The fused inverted-residual block: its kernels against the float64 reference on odd sizes
(channels not a multiple of the vector width, stride 2, odd images, 5x5, every usable ISA
forced), the reference against a plain numpy computation of the separate ops, the config
space, and onnxruntime's candidate running the separate nodes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.unit.asm_checks import stack_accesses
from wpk.core.devices import host_cpu
from wpk.core.numerics import relative_l2
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.inverted_residual_spec import (
    block_workload,
    inverted_residual_reason,
    part_workloads,
)
from wpk.kernels.cpu.microkernels.inverted_residual import (
    MICRO_INVERTED_RESIDUAL,
    ORT_INVERTED_RESIDUAL,
    InvertedResidualKernels,
)
from wpk.kernels.cpu.microkernels.ir_space import (
    KNOBS,
    BlockSpace,
    block_geometry,
    config_reason,
    default_config,
)
from wpk.kernels.cpu.microkernels.ir_templates import block_source, splits_channels
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags, usable_isas
from wpk.kernels.cpu.microkernels.vector_c import half_last
from wpk.kernels.reference import reference
from wpk.kernels.support import is_supported

from .conv_reference import conv_nchw
from .irb_helpers import (
    TOLERANCE,
    activation,
    arrays_for,
    channel_chunks,
    check_fused_kernel,
    openmp_threads,
    run,
)

BLOCK = fmt.host_block_size()
RELU6 = ("clip", (("max", 6.0), ("min", 0.0)))

# (n, cin, expanded, cout, h, w, k, stride, activation, residual, biases)
CASES = {
    "odd-channels-stride1-residual": (1, 12, 36, 12, 9, 7, 3, 1, RELU6, True, True),
    "stride2-odd-image": (1, 20, 60, 28, 11, 9, 3, 2, RELU6, False, True),
    "5x5-stride2-relu": (2, 8, 48, 20, 10, 13, 5, 2, ("relu", ()), False, True),
    "5x5-stride1-no-bias-leaky": (1, 16, 40, 16, 6, 5, 5, 1,
                                  ("leaky_relu", (("alpha", 0.1),)), True, False),
    "hard-sigmoid-tiny": (1, 4, 24, 8, 3, 3, 3, 1, ("hard_sigmoid", ()), False, True),
    "no-activation-one-row": (1, 24, 72, 24, 1, 8, 3, 1, ("", ()), True, True),
    "wide-rows-depthwise-tiles": (1, 12, 36, 12, 5, 21, 3, 1, RELU6, True, True),
    "wide-rows-stride2": (1, 8, 24, 16, 4, 37, 3, 2, ("relu", ()), False, True),
}


def case_workload(case: str):
    n, cin, e, cout, h, w, k, s, act, residual, biases = CASES[case]
    return block_workload(n, cin, e, cout, h, w, k, s, act, residual, BLOCK, biases)


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_is_the_separate_ops(case):
    workload = case_workload(case)
    n, cin, e, cout, h, w, k, s, act, residual, biases = CASES[case]
    arrays, _ = arrays_for(workload, np.random.default_rng(1), BLOCK)
    wide = [None if a is None else np.asarray(a, np.float64) for a in arrays]
    x = fmt.unblock(wide[0], cin)
    h1 = activation(conv_nchw(x, wide[1], wide[2], 1, 0, 1), act)
    h2 = activation(conv_nchw(h1, wide[3], wide[4], s, k // 2, e), act)
    y = conv_nchw(h2, wide[5], wide[6], 1, 0, 1) + (x if residual else 0)
    got = fmt.unblock(reference(workload, arrays)[0], cout)
    assert relative_l2(got, y) < 1e-12


@pytest.mark.parametrize("isa", [i.name for i in usable_isas() if BLOCK % i.lanes == 0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernel_matches_reference(case, isa):
    check_fused_kernel(case_workload(case), isa, BLOCK)


@pytest.mark.parametrize("case", ["stride2-odd-image", "5x5-stride1-no-bias-leaky"])
def test_every_schedule_knob_keeps_the_result(case):
    """Strips and row tiles of several heights (halo rows kept and recomputed), channel and
    pixel tiles that leave remainders, passes over the input blocks: per knob its smallest,
    a middle and its largest valid value."""
    workload = case_workload(case)
    space = BlockSpace(block_geometry(workload))
    arrays, consts = arrays_for(workload, np.random.default_rng(3), BLOCK)
    expected = reference(workload, arrays)[0]
    base = space.default_config()
    tried = 0
    for knob, choices in space.space().items():
        valid = [v for v in choices if space.validate({**base, knob: v}) is None]
        for value in dict.fromkeys([valid[0], valid[len(valid) // 2], valid[-1]]):
            config = {**base, knob: value}
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, config
            tried += 1
    assert tried >= 12


def _ring_wraps(g, rt: int, rows: int) -> bool:
    """Whether some row tile of a strip of `rows` output rows computes new expanded rows that
    run past the end of the kernel's ring of rows (they then go in two runs: its end, then
    its start)."""
    rin = min((rt - 1) * g.s + g.k, g.h)
    for s0 in range(0, g.oh, rows):
        done = None
        for t0 in range(s0, min(s0 + rows, g.oh), rt):
            t1 = min(t0 + rt, s0 + rows, g.oh)
            lo, hi = max(0, t0 * g.s - g.pt), min(g.h, (t1 - 1) * g.s - g.pt + g.k)
            new = lo if done is None or done <= lo else done
            if new < hi and new % rin + hi - new > rin:
                return True
            done = hi
    return False


@pytest.mark.parametrize("shape", [(23, 3, 1), (23, 5, 1), (25, 3, 2), (26, 5, 2)],
                         ids=lambda s: f"{s[0]}-rows-{s[1]}x{s[1]}-stride{s[2]}")
def test_row_tiles_whose_rows_wrap_around_the_ring_keep_the_result(shape):
    """The expanded rows live in a ring of as many rows as a row tile's window needs; the
    halo rows stay in their slots and a tile's new rows that run past the ring's end are
    computed in two runs. Row tiles of several heights on a tall image, one strip and
    several (walked downwards, and upwards where neighbours share rows), where the
    new rows wrap."""
    h, k, s = shape
    workload = block_workload(1, 8, 24, 8, h, 6, k, s, RELU6, s == 1, BLOCK)
    g = block_geometry(workload)
    space = BlockSpace(g)
    arrays, consts = arrays_for(workload, np.random.default_rng(h + k), BLOCK)
    expected = reference(workload, arrays)[0]
    wrapped = 0
    for rt, rows in itertools.product((2, 3, 5), (0, g.oh)):
        config = {**space.default_config(), "rt": rt, "rows": rows}
        wrapped += _ring_wraps(g, rt, rows or -(-g.oh // 2))
        for threads in (1, 2):
            with openmp_threads(threads):
                out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                          arrays)
            assert relative_l2(out, expected) < TOLERANCE, (config, threads)
    assert wrapped >= 2


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("case", ["odd-channels-stride1-residual", "5x5-stride1-no-bias-leaky",
                                  "stride2-odd-image", "no-activation-one-row"])
def test_blocks_without_a_gate_keep_the_result_on_any_thread_count(case, threads):
    """Strips of rows on any number of threads (halo rows computed twice) give the block's
    result (the one-row block splits by channels instead: its weights outweigh its
    activations)."""
    workload = case_workload(case)
    arrays, consts = arrays_for(workload, np.random.default_rng(6), BLOCK)
    expected = reference(workload, arrays)[0]
    base = BlockSpace(block_geometry(workload)).default_config()
    with openmp_threads(threads):
        for config in (base, {**base, "kv1": 1}, {**base, "kv2": 1}):
            if BlockSpace(block_geometry(workload)).validate(config) is not None:
                continue
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, (config, threads)


# Blocks whose 1x1 weights outweigh their activations (small images, wide expansions):
# (n, cin, expanded, cout, h, w, k, stride, activation, residual, biases)
SPLIT_CASES = {
    "split-odd-channels-residual": (1, 20, 180, 20, 5, 3, 3, 1, RELU6, True, True),
    "split-5x5-stride2-batch2": (2, 12, 300, 36, 5, 5, 5, 2, ("relu", ()), False, True),
    "split-one-row-no-bias": (1, 8, 96, 8, 1, 4, 3, 1, ("leaky_relu", (("alpha", 0.1),)),
                              True, False),
}


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("isa", [i.name for i in usable_isas() if BLOCK % i.lanes == 0])
@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_blocks_split_by_channels_keep_the_result_on_any_thread_count(case, isa, threads):
    """A block without a gate whose weights outweigh its activations splits by channels,
    one chunk a thread, each a partial sum of the output (the first with the bias, the last
    with the residual) that the threads add up; on any team size it has channel units for,
    with register tiles that cut the chunks differently, the output written over its own
    input too; a tuned strip height (`rows` > 0) keeps the strips."""
    n, cin, e, cout, h, w, k, s, act, residual, biases = SPLIT_CASES[case]
    workload = block_workload(n, cin, e, cout, h, w, k, s, act, residual, BLOCK, biases)
    geometry = block_geometry(workload)
    assert splits_channels(geometry)
    arrays, consts = arrays_for(workload, np.random.default_rng(8), BLOCK)
    expected = reference(workload, arrays)[0]
    base = default_config(geometry, isa)
    split = 0
    with openmp_threads(threads):
        for config in (base, {**base, "kv1": 1}, {**base, "kv2": 1}, {**base, "rows": 1}):
            if config_reason(geometry, config) is not None:
                continue
            lanes = BLOCK // ISAS[isa].lanes
            units = geometry.kbe * lanes // math.lcm(int(config["kv1"]), lanes)
            splits = threads > 1 and config["rows"] == 0 and units >= threads
            assert channel_chunks(workload, config, threads) == (threads if splits else 0)
            split += splits
            kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config)
            out = run(kernel, workload, arrays)
            assert relative_l2(out, expected) < TOLERANCE, (config, threads)
            if residual:
                buffer = arrays[0].copy()
                kernel([buffer, *arrays[1:]], [buffer])
                assert relative_l2(buffer, expected) < TOLERANCE, (config, threads, "in place")
    assert split or threads == 1 or threads > 2


def test_only_blocks_whose_weights_outweigh_their_activations_split_by_channels():
    """MobileNet-v2's 7x7 blocks split; its 14x14 and 28x28 ones, a gated block, a block
    without an expand conv and one whose partial sums would be too large keep the strips."""
    def geometry(cin, e, cout, size, stride=1, **extra):
        return block_geometry(block_workload(1, cin, e, cout, size, size, 3, stride, RELU6,
                                             cin == cout and stride == 1, BLOCK, **extra))
    assert splits_channels(geometry(160, 960, 160, 7))
    assert splits_channels(geometry(160, 960, 320, 7))
    assert not splits_channels(geometry(96, 576, 96, 14))
    assert not splits_channels(geometry(32, 192, 32, 28))
    assert not splits_channels(geometry(160, 960, 160, 7, squeezed=40))
    assert not splits_channels(geometry(160, 160, 160, 7, expand=False))
    assert not splits_channels(geometry(1024, 8192, 1536, 7))   # partial sum > SPLIT_FLOATS


def test_residual_reads_its_input_when_the_output_aliases_it():
    workload = case_workload("odd-channels-stride1-residual")
    arrays, consts = arrays_for(workload, np.random.default_rng(4), BLOCK)
    expected = reference(workload, arrays)[0]
    kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts,
                                             MICRO_INVERTED_RESIDUAL.configs(workload)[0])
    buffer = arrays[0].copy()
    kernel([buffer, *arrays[1:]], [buffer])   # in place: the runtime may reuse the buffer
    assert relative_l2(buffer, expected) < TOLERANCE


@pytest.mark.parametrize("case", ["stride2-odd-image", "odd-channels-stride1-residual",
                                  "5x5-stride1-no-bias-leaky"])
def test_onnxruntime_candidate_runs_the_separate_nodes(case):
    workload = case_workload(case)
    arrays, consts = arrays_for(workload, np.random.default_rng(5), BLOCK)
    out = run(ORT_INVERTED_RESIDUAL.prepare(workload, consts, {}), workload, arrays)
    assert relative_l2(out, reference(workload, arrays)[0]) < TOLERANCE
    part = ORT_INVERTED_RESIDUAL.onnx_part(workload, consts)
    assert [n.op_type for n in part.model.graph.node] == ["Conv"] * 3


def test_both_candidates_are_offered_and_supported():
    workload = case_workload("stride2-odd-image")
    names = {c.implementation.name for c in registry.candidates(workload, "cpu")}
    assert {"micro.inverted_residual", "ort.inverted_residual"} <= names
    assert is_supported(workload)
    assert InvertedResidualKernels().supports(workload)
    assert [p.op for p in part_workloads(workload)] == ["Conv"] * 3


def test_onnxruntime_candidate_only_at_mlas_block():
    other = 8 if BLOCK == 16 else 16
    n, cin, e, cout, h, w, k, s, act, residual, biases = CASES["stride2-odd-image"]
    workload = block_workload(n, cin, e, cout, h, w, k, s, act, residual, other, biases)
    assert "block" in ORT_INVERTED_RESIDUAL.unsupported_reason(workload)
    assert ORT_INVERTED_RESIDUAL.unsupported_reason(case_workload("stride2-odd-image")) is None


def test_config_space_refuses_what_it_cannot_build():
    g = block_geometry(case_workload("stride2-odd-image"))
    base = default_config(g)
    assert config_reason(g, base) is None
    assert set(base) == set(KNOBS)
    assert "knobs" in config_reason(g, {k: v for k, v in base.items() if k != "rt"})
    assert config_reason(g, {**base, "isa": "sse9"})
    assert "divide" in config_reason(g, {**base, "kv2": 7})
    assert config_reason(g, {**base, "px2": 0})
    assert "registers" in config_reason(g, {**base, "kv1": 4, "px1": 12})
    with pytest.raises(ValueError):
        block_source(g, {**base, "rt": 0})


def test_malformed_workloads_are_refused():
    workload = case_workload("stride2-odd-image")
    assert inverted_residual_reason(workload) is None
    from dataclasses import replace
    assert "constants" in inverted_residual_reason(replace(workload, const_inputs=(2, 4, 6),
                                                           _key=""))
    bad_act = tuple((k, "tanh" if k == "act1" else v) for k, v in workload.attrs)
    assert "activation" in inverted_residual_reason(replace(workload, attrs=bad_act, _key=""))
    assert isinstance(block_geometry(replace(workload, attrs=bad_act, _key="")), str)


def test_bench_script_runs_a_block_and_renders_its_tables(tmp_path):
    """The benchmark verifies both contenders before timing them, and its --markdown output
    is the README's tables."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_inverted_residual.py"
    out = tmp_path / "ir.json"
    done = subprocess.run([sys.executable, str(script), "--threads", "1", "--rounds", "1",
                           "--limit", "1", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    [row] = written["rows"]
    assert max(row["errors"].values()) < 1e-4 and row["speedup"] > 0
    assert written["cpu_model"] == host_cpu().description   # which VM ran it, by name
    table = subprocess.run([sys.executable, str(script), "--markdown", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "| 16 > 96 > 24 | 112x112 | 2 | no |" in table.stdout
    gated = tmp_path / "v3.json"   # MobileNetV3's first block: expansion 1 with a gate
    done = subprocess.run([sys.executable, str(script), "--net", "mobilenetv3", "--threads", "1",
                           "--rounds", "1", "--limit", "1", "--json", str(gated)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(gated.read_text())["rows"]
    assert row["squeezed"] == 8 and row["median_s"]["fused_without_gate"] > 0
    table = subprocess.run([sys.executable, str(script), "--markdown", str(gated)],
                           capture_output=True, text=True, timeout=60)
    assert "| 16 > 16 > 16 | 112x112 | 2 | no | 3x3 | relu | SE 8 (" in table.stdout
    bad = subprocess.run([sys.executable, str(script), "--rounds", "0"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "hint:" in bad.stderr


@pytest.mark.parametrize("isa", [i.name for i in usable_isas()])
@pytest.mark.parametrize("act", [("silu", ()), ("sigmoid", ()), ("hard_swish", ()), RELU6])
def test_register_activations_match_their_definition_on_extreme_inputs(act, isa):
    """The block's activations as compiled for each ISA (vector exp, reciprocal estimate,
    min/max instructions) against numpy in float64, from -200 to 200 and at +-0: relative
    error within a few float32 ulp, no overflow, no NaN."""
    import ctypes

    from wpk.dsl.toolchain import compile_c, load_function
    from wpk.kernels.cpu.microkernels.ir_templates import activation_c, vector_header
    from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags

    lanes = ISAS[isa].lanes
    source = (vector_header(lanes) + activation_c("act", act)
              + "void wpk_act(float *x, int n) {\n"
                f"    for (int i = 0; i < n; i += {lanes}) vstore(x + i, act(vload(x + i)));\n}}\n")
    run_act = load_function(compile_c(source, compile_flags(ISAS[isa])).path, "wpk_act",
                            [ctypes.c_void_p, ctypes.c_int])
    x = np.concatenate([np.linspace(-200, 200, 4001), np.linspace(-12, 12, 2401),
                        [0.0, -0.0, 87.5, -87.5]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    got = x.copy()
    run_act(got.ctypes.data, len(got))
    expected = activation(x.astype(np.float64), act)
    assert np.all(np.isfinite(got))
    # float32 rounding of the gate's argument (a few ulp of |x| / 6 + 0.5, which cancels near
    # HardSwish's corners) bounds the absolute error by a multiple of eps |x|
    error = np.abs(got - expected)
    bound = 2e-6 * np.abs(expected) + 4 * np.finfo(np.float32).eps * np.abs(x)
    assert np.all(error <= bound), (x[error > bound][:5], got[error > bound][:5])


@pytest.mark.isa
@pytest.mark.skipif(not {"avx2", "avx512"} & {i.name for i in usable_isas()},
                    reason="x86 FMA ISAs only (the AVX2 code is compiled, not run)")
def test_sixteen_register_default_tiles_keep_their_vectors_in_registers(tmp_path):
    """With 16 registers (AVX2) the 1x1 convs' default tile is 2 x 6 (15 registers, one
    spare; `register_tile`), and gcc keeps it in registers: no vector instruction of the
    expand or project loops touches the stack (MobileNet-v2's 96 > 576 > 96 block, 14x14,
    and its 160 > 960 > 320 one, 7x7)."""
    for cin, expanded, cout, size in ((96, 576, 96, 14), (160, 960, 320, 7)):
        g = block_geometry(block_workload(1, cin, expanded, cout, size, size, 3, 1, RELU6,
                                          cin == cout, 8))
        config = default_config(g, "avx2")
        assert (config["kv1"], config["px1"], config["kv2"], config["px2"]) == (2, 6, 2, 6)
        found = stack_accesses(block_source(g, config), compile_flags(ISAS["avx2"]), tmp_path,
                               ("ex_", "pr_"))
        assert found and not any(found.values()), (cin, expanded, cout, found)


@pytest.mark.parametrize("isa", [i.name for i in usable_isas() if i.lanes == BLOCK])
def test_a_last_vector_of_at_most_half_real_channels_is_a_half_vector(isa):
    """Where a 1x1 conv's last output vector holds at most half a vector of real channels
    (24 channels in blocks of 16), the kernel computes it as a half vector, in the tile with
    full vectors or alone (kv 1), over passes of one input block (partial sums read back),
    with the residual; the padding lanes stay zero (the NaN-poisoned output is compared
    whole with the reference, whose padding lanes are zero). The host's block, one vector a
    block: every case with such a vector."""
    with_halves = 0
    for case in sorted(CASES):
        workload = case_workload(case)
        g = block_geometry(workload)
        halves = [name for name, real, blocks in (("ex", g.expanded, g.kbe),
                                                  ("pr", g.out_channels, g.kbo))
                  if half_last(real, blocks, BLOCK)]
        if not halves:
            continue
        with_halves += 1
        space = BlockSpace(g)
        base = default_config(g, isa)
        arrays, consts = arrays_for(workload, np.random.default_rng(8), BLOCK)
        expected = reference(workload, arrays)[0]
        for kv1, kv2, cbt in itertools.product(space.space()["kv1"], space.space()["kv2"],
                                               (1, base["cbt"])):
            config = {**base, "kv1": kv1, "kv2": kv2, "cbt": cbt}
            if space.validate(config):
                continue
            source = block_source(g, config)
            assert all(f"{name}_h1(" in source for name in halves), (case, config)
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, (case, config)
    assert with_halves >= 3


def test_half_last_only_where_the_real_channels_fit_half_the_last_vector():
    assert half_last(24, 2, 16) and half_last(40, 3, 16) and half_last(20, 2, 16)
    assert not half_last(32, 2, 16) and not half_last(25, 2, 16) and not half_last(16, 1, 16)
    assert half_last(12, 2, 8) and not half_last(24, 3, 8)
    assert not half_last(24, 4, 8)   # a last vector of padding alone is not a half vector
    assert not half_last(2, 1, 4)    # no half vectors narrower than 4 lanes
