"""Spatial ReduceMean/ReduceMax become global pools (wpk/passes/reduce_to_pool.py)."""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.nchwc_support import evaluate
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.reduce_to_pool import ReduceToPool, spatial_reduction

C = 32


def se_model(reduce_op="ReduceMean", axes=(2, 3), keepdims=1, opset=17, seed=0):
    """conv -> relu -> reduce over `axes` -> 1x1 conv -> sigmoid -> x * gate (keepdims=1), or
    the reduction as the output (keepdims=0)."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)

    inits = [w("w1", (C, 3, 3, 3)), w("w2", (C, C, 1, 1))]
    attrs = {"keepdims": keepdims}
    reduce_inputs = ["a"]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        reduce_inputs.append("axes")
    else:
        attrs["axes"] = list(axes)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node(reduce_op, reduce_inputs, ["m"], **attrs)]
    if keepdims:
        nodes += [helper.make_node("Conv", ["m", "w2"], ["g0"]),
                  helper.make_node("Sigmoid", ["g0"], ["g"]),
                  helper.make_node("Mul", ["a", "g"], ["y"])]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 12, 12])
    else:
        nodes[-1].output[0] = "y"
        kept = [d for i, d in enumerate([1, C, 12, 12]) if i not in {a % 4 for a in axes}]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, kept)
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 12, 12])], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def ops(graph) -> collections.Counter:
    return collections.Counter((n.domain + ":" if n.domain else "") + n.op for n in graph.nodes)


def check_function(model, optimized, impl="ort.nchwc"):
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 12)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    actual = evaluate(optimized, {"x": x}, impl)["y"]
    assert relative_l2(actual, expected) <= 1e-5


@pytest.mark.parametrize("opset", [13, 18])
def test_squeeze_excite_mean_stays_in_the_blocked_layout(opset):
    model = se_model(opset=opset)
    optimized, report = optimize(load_model(model), "cpu")
    check_graph(optimized)
    counted = ops(optimized)
    assert report.passes["reduce_to_pool"] == 1
    assert "ReduceMean" not in counted and counted["wpk.nchwc:GlobalAveragePool"] == 1
    assert counted["wpk.nchwc:ReorderOutput"] == 1 and "wpk.nchwc:ReorderInput" not in counted
    check_function(model, optimized)


@pytest.mark.parametrize("opset", [13, 18])
def test_keepdims_zero_becomes_a_pool_and_a_flatten(opset):
    model = se_model("ReduceMax", axes=(-1, -2), keepdims=0, opset=opset)
    graph = ReduceToPool().run(load_model(model))
    assert [n.op for n in graph.nodes][-2:] == ["GlobalMaxPool", "Flatten"]
    check_graph(graph)
    check_function(model, graph, impl="ort")


@pytest.mark.parametrize("axes", [(1,), (1, 2, 3), (2,), (0, 2, 3)])
def test_other_reductions_are_left_alone(axes):
    model = se_model(axes=axes, keepdims=0)
    graph = ReduceToPool().run(load_model(model))
    assert "ReduceMean" in ops(graph) and "GlobalAveragePool" not in ops(graph)


def test_axes_that_are_not_constants_are_left_alone():
    graph = load_model(se_model(opset=18))
    (reduce,) = [n for n in graph.nodes if n.op == "ReduceMean"]
    assert spatial_reduction(graph, reduce)
    del graph.constants["axes"]             # as if computed at run time
    assert not spatial_reduction(graph, reduce)
