"""Blocked Concat and Elementwise run by onnxruntime (ort.nchwc), alone and inside regions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import wpk
from tests.unit.nchwc_support import check_blocked_activation_kernels, model_x_to_y
from wpk.core.numerics import relative_l2
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.nchwc import ORT_NCHWC
from wpk.kernels.cpu.nchwc_standard import is_standard_blocked
from wpk.kernels.cpu.ort_region import RegionMember, region_kernel, region_model
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.runtime import Session

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
C = 2 * B


def _dense_se_model(rng) -> onnx.ModelProto:
    """Conv, pre-activation BN + per-channel affine + ReLU, Concat, SiLU, squeeze-excite."""
    def const(name, shape, positive=False):
        value = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape) * 0.3
        return numpy_helper.from_array(value.astype(np.float32), name)

    inits = [const("w1", (C, 3, 3, 3)), const("w2", (C, C, 3, 3)),
             const("s", (2 * C,), True), const("t", (2 * C,)), const("m", (2 * C,)),
             const("v", (2 * C,), True), const("k", (1, 2 * C, 1, 1)),
             const("o", (1, 2 * C, 1, 1)),
             const("w3", (C, 2 * C, 1, 1)), const("w4", (B, C, 1, 1)), const("b4", (B,)),
             const("w5", (C, B, 1, 1)), const("w6", (C, C, 1, 1))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             n("Concat", ["c2", "r1"], ["cat"], axis=1),
             n("BatchNormalization", ["cat", "s", "t", "m", "v"], ["bn"]),
             n("Mul", ["bn", "k"], ["scaled"]), n("Add", ["scaled", "o"], ["shifted"]),
             n("Relu", ["shifted"], ["act"]),
             n("Conv", ["act", "w3"], ["c3"]),
             n("Sigmoid", ["c3"], ["g3"]), n("Mul", ["c3", "g3"], ["silu"]),
             n("GlobalAveragePool", ["silu"], ["pool"]),
             n("Conv", ["pool", "w4", "b4"], ["se1"]), n("Relu", ["se1"], ["se1r"]),
             n("Conv", ["se1r", "w5"], ["se2"]), n("Sigmoid", ["se2"], ["gate"]),
             n("Mul", ["silu", "gate"], ["excited"]),
             n("Conv", ["excited", "w6"], ["y"])]
    return model_x_to_y("dense_se", nodes, inits, [1, 3, 10, 10], [1, C, 10, 10])


@pytest.fixture(scope="module")
def dense_se():
    model = _dense_se_model(np.random.default_rng(7))
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False)
    return model, plan


def _standard_steps(plan):
    return [step for step in plan.steps
            if is_standard_blocked(plan.workloads[step.workload_key])]


def test_blocked_concat_and_elementwise_run_on_onnxruntime(dense_se, rng):
    _, plan = dense_se
    steps = _standard_steps(plan)
    assert {s.op for s in steps} >= {"Concat", "Elementwise"}
    for step in steps:
        workload = plan.workloads[step.workload_key]
        assert ORT_NCHWC.unsupported_reason(workload) is None, step.node
        inputs = random_inputs(workload, rng)
        consts = {i: inputs[i] for i in workload.const_inputs}
        kernel = ORT_NCHWC.prepare(workload, consts, {})
        out = np.full(workload.outputs[0].shape, np.nan, np.float32)
        kernel(inputs, [out])
        expected = reference(workload, [np.asarray(x, np.float64) for x in inputs])[0]
        assert relative_l2(out, expected) < 1e-5, step.node


def test_silu_rides_on_its_conv_and_onnxruntime_runs_it_as_quick_gelu(dense_se, rng):
    """The conv's SiLU is its epilogue, not a blocked Elementwise after it: the generated
    kernel applies it on the registers, onnxruntime's candidate as a QuickGelu node after its
    conv in the same session; both match the float64 reference."""
    _, plan = dense_se
    assert not [s for s in _standard_steps(plan)
                if [e.op for e in plan.workloads[s.workload_key].epilogue] == ["silu"]]
    convs = [plan.workloads[s.workload_key] for s in plan.steps if s.op == "Conv"
             and [e.op for e in plan.workloads[s.workload_key].epilogue][-1:] == ["silu"]]
    assert convs
    check_blocked_activation_kernels(convs[0], ["Conv", "QuickGelu"], rng)


def test_bn_affine_and_relu_become_one_blocked_conv(dense_se):
    _, plan = dense_se
    # BN -> Mul -> Add -> Relu: one depthwise NCHWc Conv with ReLU, no Elementwise left
    relu_elementwise = [s for s in _standard_steps(plan)
                        if [e.op for e in plan.workloads[s.workload_key].epilogue] == ["relu"]]
    assert not relu_elementwise
    bn_convs = [s for s in plan.steps if s.op == "Conv"
                and plan.workloads[s.workload_key].attr("group", 1) == 2 * C]
    assert len(bn_convs) == 1
    assert [e.op for e in plan.workloads[bn_convs[0].workload_key].epilogue] == ["relu"]


def _step_values(plan, feeds) -> dict[str, np.ndarray]:
    """Every step's outputs, copied as they are computed (the arena reuses buffers)."""
    session = Session(plan, merge_regions=False)
    session._load_feeds(feeds)
    values = {name: view.copy() for name, view in session._input_views.items()}
    for step, (kernel, inputs, outputs) in zip(plan.steps, session._calls):
        kernel(inputs, outputs)
        values.update((name, out.copy()) for name, out in zip(step.outputs, outputs))
    return values


def test_region_with_reshapes_matches_the_steps(dense_se):
    """All blocked steps as one region, whatever the planner chose: the broadcasting
    Elementwise (5-d) between MLAS nodes (4-d views) is read through Reshapes."""
    _, plan = dense_se
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 10, 10), np.float32)}
    values = _step_values(plan, feeds)
    run = [s for s in plan.steps if ORT_NCHWC.unsupported_reason(
        plan.workloads[s.workload_key]) is None and len(s.outputs) == 1]
    members = [RegionMember(ORT_NCHWC, plan.workloads[s.workload_key],
                            {i: plan.weights[n] for i, n in enumerate(s.inputs)
                             if n in plan.weights}, s.inputs, s.outputs) for s in run]
    merged, _, _, _ = region_model(members)
    assert any(node.op_type == "Reshape" for node in merged.graph.node)
    kernel, inputs, outputs = region_kernel(members)
    results = [np.full(values[n].shape, np.nan, np.float32) for n in outputs]
    kernel([values[n].copy() for n in inputs], results)
    for name, value in zip(outputs, results):
        assert relative_l2(value, values[name]) < 1e-5, name


def test_merged_plan_matches_onnxruntime(dense_se):
    model, plan = dense_se
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 3, 10, 10), np.float32)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    expected = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert relative_l2(Session(plan).run(feeds)["y"], expected) < 1e-4


def test_squeezenet_concats_are_verified_region_candidates(built_plan):
    """Fire modules end in a blocked Concat: ort.nchwc computes it correctly, so the planner
    may keep the regions going through it (which one wins depends on the timings). The
    build is the accuracy test's (tests/built_plans.py)."""
    from tests.built_plans import FAST_BUILD

    plan = built_plan("light_squeezenet", **FAST_BUILD)
    rows = [w for w in plan.report["workloads"] if w["op"] == "Concat"]
    assert rows
    for row in rows:
        statuses = {c["impl"]: c["status"] for c in row["candidates"]}
        assert statuses.get("ort.nchwc") == "ok", row["label"]
