"""Consecutive onnxruntime steps of any kind run as one session (kernels/cpu/ort_region)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

import wpk
from tests.built_plans import FAST_BUILD
from wpk.core.numerics import relative_l2
from wpk.kernels import registry
from wpk.kernels.cpu.node_model import PART_EXTERNAL_MIN_BYTES
from wpk.kernels.cpu.ort_region import (
    CONVERTED_WEIGHT_LIMIT,
    DETACHED_MIN_BYTES,
    WIDENING_SINCE,
    RegionMember,
    region_kernel,
    region_model,
    upgraded,
)
from wpk.runtime import Session, example_feeds


def transformer_plan_on_onnxruntime(built_plan):
    """The transformer encoder's plan with every step onnxruntime runs given to `ort`
    (whatever the timing chose), so the region logic is tested, not the planner. The build
    is shared with the accuracy test's (tests/built_plans.py); each call changes its own copy."""
    plan = built_plan("transformer_encoder", **FAST_BUILD)
    ort_impls = [registry.get("ort"), registry.get("ort.attention")]  # the fused attention
    for step in plan.manifest["steps"]:
        workload = plan.workloads[step["workload_key"]]
        impl = next((i for i in ort_impls if i.unsupported_reason(workload) is None), None)
        if impl is not None:
            step.update(impl=impl.name, config={}, kind=impl.kind)
    return plan


def test_a_transformers_onnxruntime_steps_share_one_session_with_the_same_outputs(built_plan):
    plan = transformer_plan_on_onnxruntime(built_plan)
    assert sum(s.impl == "ort" for s in plan.steps) >= 10   # 12 since the heads rule
    merged, stepwise = Session(plan), Session(plan, merge_regions=False)
    assert len(merged._calls) <= 2 < len(stepwise._calls)
    for seed in (0, 1):
        feeds = example_feeds(merged, seed)
        ours, reference = merged.run(feeds), stepwise.run(feeds)
        for name in reference:
            assert relative_l2(ours[name], reference[name]) <= 1e-6, name


def _opset11_model(channels: int = 8) -> onnx.ModelProto:
    """Conv -> ReduceMean(axes attribute) -> Squeeze(axes attribute): both ops were later
    redefined (axes became an input), so they read differently at opset 17+."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(
        rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Squeeze", ["m"], ["y"], axes=[1])]
    graph = helper.make_graph(
        nodes, "opset11", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def _opset11_members(model: onnx.ModelProto) -> list[RegionMember]:
    """The steps of `model`'s plan as `ort` region members, its Conv's at opset 17."""
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False)
    ort_node = registry.get("ort")

    def member(step):
        workload = plan.workloads[step.workload_key]
        if step.op == "Conv":
            workload = type(workload)(**{**workload.__dict__, "opset": 17, "_key": ""})
        consts = {i: plan.weights[n] for i, n in enumerate(step.inputs) if n in plan.weights}
        return RegionMember(ort_node, workload, consts, step.inputs, step.outputs)

    return [member(s) for s in plan.steps]


def test_a_region_upgrades_older_members_to_its_newest_opset():
    """A member at opset 17 (a blocked conv's ONNX form is) and the model's opset-11
    ReduceMean and Squeeze run as one region, the older nodes converted (axes as inputs),
    with onnxruntime's answer on the original model."""
    model = _opset11_model()
    members = _opset11_members(model)
    region, *_ = region_model(members)
    assert [o.version for o in region.opset_import if o.domain == ""] == [17]
    squeeze = next(n for n in region.graph.node if n.op_type == "Squeeze")
    assert len(squeeze.input) == 2 and not squeeze.attribute
    kernel, inputs, outputs = region_kernel(members, {"y"})
    assert (inputs, outputs) == (["x"], ["y"])
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = np.empty((1, 8, 8), np.float32)
    kernel([x], [y])
    (expected,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert relative_l2(y, expected) <= 1e-6


@pytest.mark.parametrize("channels", [64, 320], ids=["inside-its-part", "beside-its-part"])
def test_a_regions_large_weights_reach_onnxruntime_outside_its_model(channels):
    """`detached`: a weight of DETACHED_MIN_BYTES or more leaves the model (an external
    initializer: name, type and shape) with its values unchanged, whether its part held it
    (64 x 3 x 3 x 3 floats, 6912 bytes) or kept it beside its model (320 filters, 34560
    bytes: PART_EXTERNAL_MIN_BYTES or more); a smaller one stays; the region session,
    handed them, answers as onnxruntime does on the original model."""
    model = _opset11_model(channels)
    members = _opset11_members(model)
    beside = members[0].part().external
    assert bool(beside) == (channels * 27 * 4 >= PART_EXTERNAL_MIN_BYTES)
    detached: dict[str, np.ndarray] = {}
    region, *_ = region_model(members, detached=detached)
    whole, *_ = region_model(members)
    inside = {t.name: t for t in whole.graph.initializer}
    assert list(detached) and all(v.nbytes >= DETACHED_MIN_BYTES for v in detached.values())
    for tensor in region.graph.initializer:
        if tensor.name in detached:
            assert tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data
            np.testing.assert_array_equal(detached[tensor.name],
                                          numpy_helper.to_array(inside[tensor.name]))
        else:
            assert numpy_helper.to_array(tensor).nbytes < DETACHED_MIN_BYTES
    kernel, inputs, outputs = region_kernel(members, {"y"})
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = np.empty((1, 8, 8), np.float32)
    kernel([x], [y])
    (expected,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert relative_l2(y, expected) <= 1e-6


def test_upgraded_leaves_parts_whose_ops_did_not_change_alone():
    part = _opset11_model()
    del part.graph.node[1:]
    assert upgraded(part, 11, 18) is part


def _one_node_part(op: str, opset: int) -> onnx.ModelProto:
    """A one-node model of `op` at `opset` (two-input ops on 3x3, a Reshape's shape as an
    initializer, a Where's condition boolean)."""
    inputs = {"Add": "ab", "Sub": "ab", "Mul": "ab", "Div": "ab", "MatMul": "ab",
              "Concat": "ab", "Gemm": "abc", "Where": "mab", "Reshape": "as"}.get(op, "a")
    attrs = {"Concat": {"axis": 1}, "Flatten": {"axis": 1}, "LeakyRelu": {"alpha": 0.2}}
    shape = [1, 2, 3, 3] if op == "GlobalAveragePool" else [3, 3]
    values = [helper.make_tensor_value_info(n, TensorProto.BOOL if n == "m" else
                                            TensorProto.FLOAT, shape)
              for n in inputs if n != "s"]
    initializers = [numpy_helper.from_array(np.array([9], np.int64), "s")] \
        if "s" in inputs else []
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), ["y"], **attrs.get(op, {}))], op, values,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("op", sorted(WIDENING_SINCE))
def test_parts_of_ops_that_only_widened_are_not_converted(op):
    """From its `WIDENING_SINCE` opset on, ONNX's own converter leaves such a node as it is
    up to opset 21 (nothing but the version changes), so `upgraded` skips the converter:
    DenseNet-121's opset-9 Concats in a region of opset-17 blocked convs were converted at
    every load, 0.15 s of it."""
    part = _one_node_part(op, WIDENING_SINCE[op])
    converted = version_converter.convert_version(part, 21)
    assert [n.SerializeToString() for n in converted.graph.node] == \
        [n.SerializeToString() for n in part.graph.node]
    assert upgraded(part, WIDENING_SINCE[op], 17) is part


def test_parts_of_ops_whose_meaning_changed_are_still_converted():
    """Softmax-13 changed what its axis means; Concat-1 had a default axis (required from
    opset 4 on)."""
    softmax, concat = _one_node_part("Softmax", 11), _one_node_part("Concat", 1)
    assert upgraded(softmax, 11, 13) is not softmax
    assert upgraded(concat, 1, 17) is not concat


@pytest.mark.parametrize("weight_listed_as_input", [False, True])
def test_upgraded_converts_around_large_weights_and_keeps_them(weight_listed_as_input,
                                                              monkeypatch):
    """MatMul with a weight above CONVERTED_WEIGHT_LIMIT, then an opset-10 Clip (bounds as
    attributes): at opset 13 the Clip reads its bounds as inputs, the weight is the same
    initializer (the converter saw only its type), the graph inputs are the part's own
    (IR 3's listing of the weight kept), and onnxruntime computes the original's answer."""
    rng = np.random.default_rng(2)
    value = rng.standard_normal((64, CONVERTED_WEIGHT_LIMIT // 32)).astype(np.float32)
    weight = numpy_helper.from_array(value, "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])
    inputs = [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, list(value.shape))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Clip", ["m"], ["y"], min=-0.5, max=0.5)], "big",
        inputs if weight_listed_as_input else [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, value.shape[1]])], [weight])
    part = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    part.ir_version = 5
    seen = []
    convert = version_converter.convert_version
    monkeypatch.setattr(version_converter, "convert_version",
                        lambda model, target: seen.append(model) or convert(model, target))
    converted = upgraded(part, 10, 13)
    assert [t.name for t in seen[0].graph.initializer] == []   # the converter's copy
    clip = next(n for n in converted.graph.node if n.op_type == "Clip")
    assert len(clip.input) == 3 and not clip.attribute
    assert [v.name for v in converted.graph.input] == [v.name for v in part.graph.input]
    (kept,) = [t for t in converted.graph.initializer if t.name == "w"]
    assert kept.SerializeToString() == weight.SerializeToString()
    data = rng.standard_normal((3, 64)).astype(np.float32)
    (y,) = onnxruntime.InferenceSession(converted.SerializeToString()).run(None, {"x": data})
    assert np.allclose(y, np.clip(data @ value, -0.5, 0.5), atol=1e-5)


def test_onnxruntimes_own_layer_norm_before_opset_17_is_not_converted():
    """onnxruntime registers LayerNormalization in the default domain below opset 17 (as
    paddle2onnx/tf2onnx-era models get it from wpk's fusion); ONNX's converter knows no
    such op, so the part is kept as it is, and runs in onnxruntime."""
    scale = numpy_helper.from_array(np.ones(8, np.float32), "g")
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=-1)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [scale])
    part = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    part.ir_version = 8
    assert upgraded(part, 13, 17) is part
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    (y,) = onnxruntime.InferenceSession(part.SerializeToString()).run(None, {"x": x})
    assert np.allclose(y.mean(axis=-1), 0, atol=1e-6)


def test_a_region_onnxruntime_cannot_load_runs_step_by_step(monkeypatch, built_plan):
    plan = transformer_plan_on_onnxruntime(built_plan)

    def refuse(*args, **kwargs):
        raise ValueError("no such kernel")

    monkeypatch.setattr("wpk.runtime.region_kernel", refuse)
    session, stepwise = Session(plan), Session(plan, merge_regions=False)
    assert len(session._calls) == len(stepwise._calls)
    assert session.region_failures and "no such kernel" in session.region_failures[0]
    feeds = example_feeds(session, 0)
    ours, reference = session.run(feeds), stepwise.run(feeds)
    assert all(relative_l2(ours[n], reference[n]) <= 1e-6 for n in reference)
