"""Squeeze-excitation on blocked tensors: pooled convs with few outputs stay blocked, and
the gate multiply runs as MLAS's depthwise 1x1 conv (nchwc_gate), alone and in a region."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import wpk
from tests.unit.nchwc_support import model_x_to_y
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.nchwc import ORT_NCHWC, build_ort_model
from wpk.kernels.cpu.nchwc_gate import is_gate_multiply
from wpk.kernels.cpu.ort_region import RegionMember, region_kernel
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.runtime import Session

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
C = 2 * B
SQUEEZED = 4    # fewer outputs than any block: blocked only because the output is 1x1


def _se_model(rng) -> onnx.ModelProto:
    """Conv + SiLU, then squeeze-excite with a 4-channel squeeze, then a 1x1 conv."""
    def const(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    inits = [const("w1", (C, 3, 3, 3)), const("w2", (SQUEEZED, C, 1, 1)),
             const("b2", (SQUEEZED,)), const("w3", (C, SQUEEZED, 1, 1)), const("b3", (C,)),
             const("w4", (C, C, 1, 1))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             n("Sigmoid", ["c1"], ["s1"]), n("Mul", ["c1", "s1"], ["h"]),
             n("GlobalAveragePool", ["h"], ["pool"]),
             n("Conv", ["pool", "w2", "b2"], ["se1"]), n("Relu", ["se1"], ["se1r"]),
             n("Conv", ["se1r", "w3", "b3"], ["se2"]), n("Sigmoid", ["se2"], ["gate"]),
             n("Mul", ["h", "gate"], ["excited"]),
             n("Conv", ["excited", "w4"], ["y"])]
    return model_x_to_y("se", nodes, inits, [1, 3, 12, 12], [1, C, 12, 12])


@pytest.fixture(scope="module")
def se_plan():
    model = _se_model(np.random.default_rng(11))
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False)
    return model, plan


def _gate_steps(plan):
    return [s for s in plan.steps if is_gate_multiply(plan.workloads[s.workload_key])]


def test_squeeze_convs_stay_blocked(se_plan):
    _, plan = se_plan
    convs = [s for s in plan.steps if s.op == "Conv"]
    assert len(convs) == 4
    assert all(plan.workloads[s.workload_key].domain == "wpk.nchwc" for s in convs)
    squeeze = [plan.workloads[s.workload_key] for s in convs
               if plan.workloads[s.workload_key].attr("channels") == SQUEEZED]
    assert len(squeeze) == 1 and squeeze[0].outputs[0].shape[2:4] == (1, 1)


def test_gate_multiply_is_one_depthwise_conv(se_plan, rng):
    _, plan = se_plan
    steps = _gate_steps(plan)
    assert len(steps) == 1
    workload = plan.workloads[steps[0].workload_key]
    model, feeds = build_ort_model(workload, {})
    assert [(n.op_type, n.domain) for n in model.graph.node] == [
        ("Conv", "com.microsoft.nchwc")]
    assert [index for _, index in feeds] == [0, 1]
    assert ORT_NCHWC.unsupported_reason(workload) is None
    inputs = random_inputs(workload, rng)
    kernel = ORT_NCHWC.prepare(workload, {}, {})
    for _ in range(2):  # a new gate each call: the filter is read at run time
        inputs[1] = rng.standard_normal(workload.inputs[1].shape).astype(np.float32)
        out = np.full(workload.outputs[0].shape, np.nan, np.float32)
        kernel(inputs, [out])
        expected = reference(workload, [np.asarray(x, np.float64) for x in inputs])[0]
        assert relative_l2(out, expected) < 1e-6


def test_constant_gate_is_an_initializer(rng):
    shape, gate_shape = (1, 2, 5, 5, B), (1, 2, 1, 1, B)
    workload = Workload("Elementwise", (TensorSpec(shape), TensorSpec(gate_shape)),
                        (TensorSpec(shape),), epilogue=(EpilogueStep("mul", (), 1),),
                        domain="wpk", const_inputs=(1,))
    gate = rng.standard_normal(gate_shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    model, feeds = build_ort_model(workload, {1: gate})
    assert [index for _, index in feeds] == [0]
    out = np.full(shape, np.nan, np.float32)
    ORT_NCHWC.prepare(workload, {1: gate}, {})([x, gate], [out])
    np.testing.assert_allclose(out, x * gate, rtol=1e-6)


@pytest.mark.parametrize("shapes", [
    ((2, 2, 5, 5, B), (2, 2, 1, 1, B)),      # a batch: one filter cannot serve it
    ((1, 2, 5, 5, B), (1, 2, 5, 5, B)),      # not a broadcast gate
    ((1, 2, 5, 5, B), (1, 1, 1, 1, B)),      # gate of another channel count
])
def test_other_multiplies_are_not_gates(shapes):
    x, gate = shapes
    workload = Workload("Elementwise", (TensorSpec(x), TensorSpec(gate)), (TensorSpec(x),),
                        epilogue=(EpilogueStep("mul", (), 1),), domain="wpk")
    assert not is_gate_multiply(workload)


def test_gate_candidate_is_verified(se_plan):
    """The planner verified ort.nchwc's gate multiply (which one wins depends on timings)."""
    _, plan = se_plan
    rows = [w for w in plan.report["workloads"] if w["op"] == "Elementwise"
            and is_gate_multiply(plan.workloads[w["key"]])]
    assert len(rows) == 1
    for row in rows:
        statuses = {c["impl"]: c["status"] for c in row["candidates"]}
        assert statuses.get("ort.nchwc") == "ok", row["label"]


def test_se_block_as_one_region_matches_onnxruntime(se_plan):
    """Every step onnxruntime can run, SE block included, as one session: same output as
    onnxruntime on the original model."""
    model, plan = se_plan
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 3, 12, 12), np.float32)}
    steps = [s for s in plan.steps
             if ORT_NCHWC.unsupported_reason(plan.workloads[s.workload_key]) is None]
    assert [s.op for s in steps][-3:] == ["Elementwise", "Conv", "ReorderOutput"]
    members = [RegionMember(ORT_NCHWC, plan.workloads[s.workload_key],
                            {i: plan.weights[n] for i, n in enumerate(s.inputs)
                             if n in plan.weights}, s.inputs, s.outputs) for s in steps]
    kernel, inputs, outputs = region_kernel(members, {"y"})
    assert inputs == ["x"] and outputs == ["y"]
    y = np.full((1, C, 12, 12), np.nan, np.float32)
    kernel([feeds["x"]], [y])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    expected = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert relative_l2(y, expected) < 1e-4
    assert relative_l2(Session(plan).run(feeds)["y"], expected) < 1e-4
