"""Workload extraction: normalised attributes, constant/static inputs, grouping, stable keys."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h

from wpk.core.workload import Workload
from wpk.frontend import load_model
from wpk.passes import optimize
from wpk.workloads import NodeWorkload, distinct, extract_workloads, workload_of

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def build(nodes, inputs: dict, output_ranks: dict, inits: dict | None = None, opset=17):
    graph = h.make_graph(
        nodes, "case",
        [h.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, [None] * r)
         for n, r in output_ranks.items()],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return load_model(h.make_model(graph, opset_imports=[h.make_opsetid("", opset)]))


def by_name(graph, name):
    return next(n for n in graph.nodes if n.name == name)


def test_conv_defaults_are_explicit_and_equal_to_spelled_out(rng):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "W"], ["a"], name="implicit"),
             h.make_node("Conv", ["x", "W"], ["b"], name="explicit", strides=[1, 1],
                         dilations=[1, 1], pads=[0, 0, 0, 0], group=1, kernel_shape=[3, 3])]
    graph = build(nodes, {"x": [1, 3, 8, 8]}, {"a": 4, "b": 4}, {"W": w})
    implicit = workload_of(graph, by_name(graph, "implicit"))
    explicit = workload_of(graph, by_name(graph, "explicit"))
    assert implicit.key == explicit.key
    assert dict(implicit.attrs) == {"dilations": (1, 1), "group": 1, "kernel_shape": (3, 3),
                                    "pads": (0, 0, 0, 0), "strides": (1, 1)}


def test_auto_pad_becomes_explicit_pads(rng):
    w = rng.standard_normal((2, 1, 4, 4)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "W"], ["a"], name="upper", auto_pad="SAME_UPPER",
                         strides=[2, 2]),
             h.make_node("Conv", ["x", "W"], ["b"], name="lower", auto_pad="SAME_LOWER",
                         strides=[2, 2]),
             h.make_node("MaxPool", ["x"], ["c"], name="valid", auto_pad="VALID",
                         kernel_shape=[3, 3])]
    graph = build(nodes, {"x": [1, 1, 7, 7]}, {"a": 4, "b": 4, "c": 4}, {"W": w})
    # out = ceil(7/2) = 4; total pad = (4-1)*2 + 4 - 7 = 3 -> upper (1, 2), lower (2, 1)
    assert workload_of(graph, by_name(graph, "upper")).attr("pads") == (1, 1, 2, 2)
    assert workload_of(graph, by_name(graph, "lower")).attr("pads") == (2, 2, 1, 1)
    valid = workload_of(graph, by_name(graph, "valid"))
    assert valid.attr("pads") == (0, 0, 0, 0) and valid.attr("auto_pad") is None
    assert valid.attr("strides") == (1, 1) and valid.attr("ceil_mode") == 0


def test_gemm_defaults(rng):
    nodes = [h.make_node("Gemm", ["x", "W"], ["y"], name="g")]
    graph = build(nodes, {"x": [2, 3]}, {"y": 2}, {"W": np.ones((3, 4), np.float32)})
    workload = workload_of(graph, graph.nodes[0])
    assert dict(workload.attrs) == {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
    assert workload.const_inputs == (1,)
    assert workload.static_inputs == ()   # a weight: drawn at random when measured


def test_constant_and_static_inputs_and_absent_optional():
    nodes = [h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             h.make_node("Clip", ["r", "", "hi"], ["c"], name="clip"),
             h.make_node("Add", ["c", "offsets"], ["y"], name="add")]
    inits = {"shape": np.array([6, 4], np.int64), "hi": np.float32(6.0),
             "offsets": np.ones((6, 4), np.float32) * np.arange(4, dtype=np.float32)}
    graph = build(nodes, {"x": [2, 3, 4]}, {"y": 2}, inits)
    reshape = workload_of(graph, by_name(graph, "reshape"))
    assert reshape.const_inputs == (1,)
    np.testing.assert_array_equal(reshape.static_value(1), [6, 4])
    clip = workload_of(graph, by_name(graph, "clip"))
    assert clip.inputs[1] is None and clip.const_inputs == (2,)
    assert float(clip.static_value(2)) == 6.0
    add = workload_of(graph, by_name(graph, "add"))  # 24 floats: small enough to be static
    assert add.const_inputs == (1,) and add.static_value(1) is not None


def test_large_float_constant_is_not_static():
    nodes = [h.make_node("Mul", ["x", "k"], ["y"], name="mul")]
    graph = build(nodes, {"x": [8, 9]}, {"y": 2}, {"k": np.ones((8, 9), np.float32)})
    workload = workload_of(graph, graph.nodes[0])
    assert workload.const_inputs == (1,) and workload.static_inputs == ()


def test_epilogue_is_part_of_the_key(rng):
    w = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    plain = build([h.make_node("Conv", ["x", "W"], ["y"])], {"x": [1, 3, 5, 5]}, {"y": 4},
                  {"W": w})
    fused = build([h.make_node("Conv", ["x", "W"], ["c"]), h.make_node("Relu", ["c"], ["y"])],
                  {"x": [1, 3, 5, 5]}, {"y": 4}, {"W": w})
    fused, _ = optimize(fused, target="cuda")
    (a,), (b,) = extract_workloads(plain), extract_workloads(fused)
    assert [s.op for s in b.workload.epilogue] == ["relu"]
    assert a.workload.key != b.workload.key
    assert b.workload.inputs[2] is None  # absent bias padded before epilogue operands


def test_resnet50_workloads_group_and_keys_are_stable():
    graph, _ = optimize(load_model(os.path.join(LIGHT_DIR, "light_resnet50.onnx")),
                        target="cuda")
    pairs = extract_workloads(graph)
    assert len(pairs) == len(graph.nodes)
    assert all(isinstance(p, NodeWorkload) and p.node is n for p, n in zip(pairs, graph.nodes))
    groups = distinct(pairs)
    assert len(groups) < len(pairs)
    assert sum(len(v) for v in groups.values()) == len(pairs)
    again = distinct(extract_workloads(graph))
    assert list(groups) == list(again)
    for key, items in groups.items():
        assert all(item.workload.key == key for item in items)
        assert Workload.from_json(items[0].workload.to_json()).key == key
    # the repeated bottleneck blocks share workloads (e.g. 1x1 convs with add+relu)
    assert max(len(v) for v in groups.values()) >= 3
    residual = [p.workload for p in pairs if [s.op for s in p.workload.epilogue] == ["add", "relu"]]
    assert len(residual) == 16
    assert all(w.inputs[3] == w.outputs[0] for w in residual)
    assert all(w.opset == graph.opset for w in residual)


def test_old_opset_pools_get_no_attributes_from_opset_10():
    """ceil_mode/dilations exist since opset 10; onnxruntime rejects them on opset-9 nodes."""
    nodes = [h.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2])]
    old = workload_of(build(nodes, {"x": [1, 3, 8, 8]}, {"y": 4}, opset=9),
                      by_name(build(nodes, {"x": [1, 3, 8, 8]}, {"y": 4}, opset=9), "pool"))
    assert old.attr("ceil_mode") is None and old.attr("dilations") is None
    new_graph = build(nodes, {"x": [1, 3, 8, 8]}, {"y": 4}, opset=13)
    new = workload_of(new_graph, by_name(new_graph, "pool"))
    assert new.attr("ceil_mode") == 0 and new.attr("dilations") == (1, 1)


def test_blocked_conv_weights_are_data_not_identity(rng):
    """Two blocked convs differing only in weight values share one workload key."""
    w1 = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    w2 = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "W1"], ["a"], name="c1"),
             h.make_node("Relu", ["a"], ["b"], name="r1"),
             h.make_node("Conv", ["b", "W2"], ["c"], name="c2"),
             h.make_node("Relu", ["c"], ["d"], name="r2")]
    graph = build(nodes, {"x": [1, 16, 8, 8]}, {"d": 4}, {"W1": w1, "W2": w2})
    optimized, _ = optimize(graph, "cpu")
    convs = [p for p in extract_workloads(optimized)
             if p.workload.domain == "wpk.nchwc" and p.workload.op == "Conv"]
    assert len(convs) == 2
    assert convs[0].workload.static_inputs == ()
    assert convs[0].workload.key == convs[1].workload.key


def test_infinite_and_nan_attributes_round_trip_through_strict_json():
    """JSON has no infinities: a Clip with min -inf fused into an epilogue made a plan that
    could not be written (`ValueError: Out of range float values`, found by the passes'
    fuzzer on paddle2onnx's models). Such values are encoded, and come back."""
    import json
    import math

    from wpk.core.workload import EpilogueStep, TensorSpec

    workload = Workload("Conv", (TensorSpec((1, 2, 3, 3)), TensorSpec((2, 2, 1, 1))),
                        (TensorSpec((1, 2, 3, 3)),), attrs=(("alpha", float("inf")),),
                        epilogue=(EpilogueStep("clip", (("max", 6.0),
                                                        ("min", float("-inf")))),))
    text = json.dumps(workload.to_json(), allow_nan=False)
    back = Workload.from_json(json.loads(text))
    assert back == workload and back.key == workload.key
    assert back.epilogue[0].attr("min") == float("-inf") and back.attr("alpha") == math.inf
    nan = Workload.from_json(json.loads(json.dumps(
        Workload("Relu", (TensorSpec((2,)),), (TensorSpec((2,)),),
                 attrs=(("x", float("nan")),)).to_json(), allow_nan=False)))
    assert math.isnan(nan.attr("x"))

