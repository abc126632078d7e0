"""The fused block's squeeze-excitation gate (two phases), HardSwish/SiLU activations and
expansion-1 blocks: both candidates against the float64 reference on odd sizes (channels
not a multiple of the vector width, stride 2, odd images, 5x5, batch 2, every usable ISA
forced), the reference against a plain numpy computation, and the separate steps."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.numerics import relative_l2
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.inverted_residual_spec import (
    block_parts,
    block_workload,
    inverted_residual_reason,
)
from wpk.kernels.cpu.microkernels.inverted_residual import (
    MICRO_INVERTED_RESIDUAL,
    ORT_INVERTED_RESIDUAL,
)
from wpk.kernels.cpu.microkernels.ir_space import BlockSpace, block_geometry
from wpk.kernels.cpu.microkernels.ir_templates import folds_gate
from wpk.kernels.cpu.microkernels.isa import usable_isas
from wpk.kernels.reference import reference

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
HS, SILU, RELU = ("hard_swish", ()), ("silu", ()), ("relu", ())
SIGMOID, HSIG = ("sigmoid", ()), ("hard_sigmoid", (("alpha", 1 / 6), ("beta", 0.5)))

CASES = {
    "hard-swish-residual-odd": dict(n=1, cin=12, expanded=36, cout=12, h=9, w=7, act=HS,
                                    residual=True),
    "silu-5x5-stride2": dict(n=1, cin=20, expanded=60, cout=28, h=11, w=9, k=5, stride=2,
                             act=SILU),
    "expansion1-hard-swish": dict(n=1, cin=20, expanded=20, cout=12, h=9, w=9, act=HS,
                                  expand=False),
    "expansion1-gate-residual": dict(n=1, cin=16, expanded=16, cout=16, h=8, w=7, act=RELU,
                                     expand=False, residual=True, squeezed=8),
    "gate-5x5-stride2-batch2": dict(n=2, cin=12, expanded=40, cout=20, h=10, w=13, k=5,
                                    stride=2, act=HS, squeezed=10),
    "gate-silu-sigmoid-residual": dict(n=1, cin=24, expanded=72, cout=24, h=7, w=7, k=5,
                                       act=SILU, residual=True, squeezed=6,
                                       gate_acts=(SILU, SIGMOID)),
    "gate-no-bias-one-row": dict(n=1, cin=8, expanded=24, cout=8, h=1, w=11, act=HS,
                                 squeezed=4, biases=False, gate_acts=(RELU, HSIG)),
    # more project weights than depthwise outputs: the gate scales the rows, not the weights
    "gate-wide-project-batch2": dict(n=2, cin=8, expanded=24, cout=40, h=3, w=3, act=SILU,
                                     squeezed=2, gate_acts=(SILU, SIGMOID)),
}


def case_workload(case: str):
    return block_workload(block=BLOCK, **CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_is_the_separate_ops(case):
    spec = {"k": 3, "stride": 1, "residual": False, "squeezed": 0, "expand": True,
            "gate_acts": (RELU, ("hard_sigmoid", ())), **CASES[case]}
    workload = case_workload(case)
    arrays, _ = arrays_for(workload, np.random.default_rng(1), BLOCK)
    v = [None if a is None else np.asarray(a, np.float64) for a in arrays]
    x = fmt.unblock(v[0], spec["cin"])
    h = activation(conv_nchw(x, v[1], v[2]), spec["act"]) if spec["expand"] else x
    h = activation(conv_nchw(h, v[3], v[4], spec["stride"], spec["k"] // 2, spec["expanded"]),
             spec["act"])
    if spec["squeezed"]:
        pooled = h.mean(axis=(2, 3), keepdims=True)
        s = activation(conv_nchw(pooled, v[7], v[8]), spec["gate_acts"][0])
        h = h * activation(conv_nchw(s, v[9], v[10]), spec["gate_acts"][1])
    y = conv_nchw(h, v[5], v[6]) + (x if spec["residual"] else 0)
    got = fmt.unblock(reference(workload, arrays)[0], spec["cout"])
    assert relative_l2(got, y) < 1e-12


@pytest.mark.parametrize("isa", [i.name for i in usable_isas() if BLOCK % i.lanes == 0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernel_matches_reference(case, isa):
    check_fused_kernel(case_workload(case), isa, BLOCK)


def test_the_cases_cover_both_ways_of_applying_the_gate():
    """Folded into the project weights, or scaling the depthwise rows (`folds_gate`)."""
    gated = [block_geometry(case_workload(c)) for c in CASES if CASES[c].get("squeezed")]
    assert {folds_gate(g) for g in gated} == {True, False}


def test_gate_kernel_keeps_the_result_under_every_strip_and_tile():
    """Phase 1's strips and phase 2's row tiles of several heights, and the register tiles."""
    workload = case_workload("gate-5x5-stride2-batch2")
    space = BlockSpace(block_geometry(workload))
    arrays, consts = arrays_for(workload, np.random.default_rng(3), BLOCK)
    expected = reference(workload, arrays)[0]
    base = space.default_config()
    for knob in ("rows", "rt", "kv2", "px2", "cbt"):
        valid = [v for v in space.space()[knob] if space.validate({**base, knob: v}) is None]
        for value in dict.fromkeys([valid[0], valid[-1]]):
            config = {**base, knob: value}
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, config


def test_small_gated_blocks_split_phase_1_by_channels_not_rows():
    """Two strips of a 7x7 image with a 5x5 filter compute 11 expanded rows for 7: phase 1
    splits by channel blocks instead, on more than one thread and only by default."""
    workload = case_workload("gate-silu-sigmoid-residual")
    config = {**BlockSpace(block_geometry(workload)).default_config(), "kv1": 1}
    assert channel_chunks(workload, config, 1) == 0
    assert channel_chunks(workload, config, 2) >= 2
    assert channel_chunks(workload, {**config, "rows": 4}, 2) == 0      # a tuned strip
    batch2 = case_workload("gate-wide-project-batch2")                     # a strip an image
    assert channel_chunks(batch2, BlockSpace(block_geometry(batch2)).default_config(), 2) == 0


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("case", ["gate-silu-sigmoid-residual", "gate-5x5-stride2-batch2",
                                  "gate-no-bias-one-row"])
def test_gate_kernel_keeps_the_result_on_any_thread_count(case, threads):
    """Rows or channel chunks, whichever the thread count gives, compute the same block."""
    workload = case_workload(case)
    arrays, consts = arrays_for(workload, np.random.default_rng(5), BLOCK)
    expected = reference(workload, arrays)[0]
    base = BlockSpace(block_geometry(workload)).default_config()
    with openmp_threads(threads):
        for config in (base, {**base, "kv1": 1}):
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, (config, threads)


def test_fused_kernel_is_repeatable_with_its_scratch():
    """The gate's scratch memory is rewritten by every call: a second call gives the same."""
    workload = case_workload("gate-silu-sigmoid-residual")
    arrays, consts = arrays_for(workload, np.random.default_rng(4), BLOCK)
    kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts,
                                             MICRO_INVERTED_RESIDUAL.configs(workload)[0])
    first = run(kernel, workload, arrays)
    np.testing.assert_array_equal(run(kernel, workload, arrays), first)


@pytest.mark.parametrize("case", ["hard-swish-residual-odd", "expansion1-gate-residual",
                                  "gate-silu-sigmoid-residual"])
def test_onnxruntime_candidate_runs_the_separate_steps(case):
    workload = case_workload(case)
    arrays, consts = arrays_for(workload, np.random.default_rng(5), BLOCK)
    out = run(ORT_INVERTED_RESIDUAL.prepare(workload, consts, {}), workload, arrays)
    assert relative_l2(out, reference(workload, arrays)[0]) < TOLERANCE
    ops = [n.op_type for n in ORT_INVERTED_RESIDUAL.onnx_part(workload, consts).model.graph.node]
    parts = [p.workload.op for p in block_parts(workload)]
    assert ops.count("Conv") == parts.count("Conv") + ("GlobalAveragePool" in parts)
    assert ("GlobalAveragePool" in ops) == ("GlobalAveragePool" in parts)


def test_onnxruntime_candidate_refuses_a_gated_batch():
    assert "batch 1" in ORT_INVERTED_RESIDUAL.unsupported_reason(
        case_workload("gate-5x5-stride2-batch2"))


def test_malformed_gated_workloads_are_refused():
    from dataclasses import replace
    workload = case_workload("gate-silu-sigmoid-residual")
    assert inverted_residual_reason(workload) is None
    wrong = tuple((k, 5 if k == "squeezed" else v) for k, v in workload.attrs)
    assert "squeezed" in inverted_residual_reason(replace(workload, attrs=wrong, _key=""))
    bad = tuple((k, "tanh" if k == "se_act2" else v) for k, v in workload.attrs)
    assert "activation" in inverted_residual_reason(replace(workload, attrs=bad, _key=""))
    short = replace(workload, inputs=workload.inputs[:7], _key="")
    assert "WR" in inverted_residual_reason(short)
    varying = replace(workload, const_inputs=tuple(i for i in workload.const_inputs if i != 9),
                      _key="")
    assert "constants" in inverted_residual_reason(varying)
