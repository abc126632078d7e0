"""wpk.backend: the ONNX backend API (specialization per shape, folded shape inputs, errors)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import wpk.backend as backend
from wpk.core.errors import InputError, ModelError

FAST = {"warmup": 0, "repeats": 1, "min_time": 0.0}


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_symbolic_dims_build_one_plan_per_shape(rng):
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [_value("x", TensorProto.FLOAT, ["N", 3])],
                   [_value("y", TensorProto.FLOAT, ["N", 3])])
    rep = backend.prepare(model, "CPU", **FAST)
    assert rep.plans == []  # nothing to build before the shapes are known
    for rows in (2, 5, 2):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        (y,) = rep.run([x])
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert len(rep.plans) == 2


def test_static_model_is_built_at_prepare_and_outputs_index_by_name(rng):
    model = _model([helper.make_node("Add", ["a", "b"], ["c"])],
                   [_value("a", TensorProto.FLOAT, [2, 3]), _value("b", TensorProto.FLOAT, [3])],
                   [_value("c", TensorProto.FLOAT, [2, 3])])
    rep = backend.prepare(model, "CPU", **FAST)
    assert len(rep.plans) == 1
    a, b = rng.standard_normal((2, 3)).astype(np.float32), np.ones(3, np.float32)
    outputs = rep.run({"a": a, "b": b})
    np.testing.assert_allclose(outputs["c"], a + b, rtol=1e-6)
    np.testing.assert_allclose(outputs[0], a + b, rtol=1e-6)


def test_shape_input_is_folded_per_value(rng):
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                   [_value("x", TensorProto.FLOAT, [2, 6]),
                    _value("shape", TensorProto.INT64, [2])],
                   [_value("y", TensorProto.FLOAT, ["a", "b"])])
    rep = backend.prepare(model, "CPU", **FAST)
    assert rep.folded_inputs == {"shape"}
    x = rng.standard_normal((2, 6)).astype(np.float32)
    for shape in ([3, 4], [4, 3]):
        (y,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(y, x.reshape(shape))
    assert len(rep.plans) == 2


def test_run_node_and_run_model(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    (y,) = backend.run_node(helper.make_node("Sigmoid", ["x"], ["y"]), [x], **FAST)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-5)
    model = _model([helper.make_node("Neg", ["x"], ["y"])],
                   [_value("x", TensorProto.FLOAT, [4, 5])],
                   [_value("y", TensorProto.FLOAT, [4, 5])])
    np.testing.assert_array_equal(backend.run_model(model, [x], **FAST)[0], -x)


def test_old_opset_is_converted(rng):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", TensorProto.FLOAT, [3])],
                   [_value("y", TensorProto.FLOAT, [3])], opset=6)
    x = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(backend.prepare(model, **FAST).run([x])[0], np.maximum(x, 0))


def test_devices_and_errors():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("TPU")
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", TensorProto.FLOAT, [3])],
                   [_value("y", TensorProto.FLOAT, [3])])
    rep = backend.prepare(model, lazy=True, **FAST)
    with pytest.raises(InputError, match="takes 1 inputs"):
        rep.run([np.ones(3, np.float32), np.ones(3, np.float32)])
    with pytest.raises(InputError, match="missing model inputs: x"):
        rep.run({"z": np.ones(3, np.float32)})
    with pytest.raises(ModelError, match="cannot read an ONNX model"):
        backend.prepare(12345)
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ModelError, match="ONNX checker"):
        backend.prepare(broken)


def test_an_input_reaching_a_shape_input_through_other_nodes_is_folded():
    """n -> Cast -> Add 1 -> Range's limit: n is folded (one plan per value of n); x, which
    reaches the Range only through Shape, is not."""
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    nodes = [helper.make_node("Cast", ["n"], ["n64"], to=TensorProto.INT64),
             helper.make_node("Add", ["n64", "one"], ["limit"]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("ReduceSum", ["shape"], ["start"], keepdims=0),
             helper.make_node("Range", ["start", "limit", "one"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_value("n", TensorProto.INT32, []),
                                           _value("x", TensorProto.FLOAT, [2])],
                              [_value("y", TensorProto.INT64, ["L"])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(model, "CPU", **FAST)
    assert rep.folded_inputs == {"n"}
    x = np.zeros(2, np.float32)
    assert rep.run([np.array(5, np.int32), x])[0].tolist() == [2, 3, 4, 5]
    assert rep.run([np.array(3, np.int32), x])[0].tolist() == [2, 3]
    assert len(rep.plans) == 2


def test_empty_inputs_are_not_mistaken_for_dynamic_dims():
    """A run with a zero-size dim declares dim_value 0, which the frontend reads as an
    exporter's "dynamic" unless the backend gives the run's shapes."""
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                   [_value("x", TensorProto.FLOAT, ["N", 0, 4]),
                    _value("axes", TensorProto.INT64, [1])],
                   [_value("y", TensorProto.FLOAT, ["N", 1, 4])], opset=18)
    rep = backend.prepare(model, "CPU", **FAST)
    (y,) = rep.run([np.zeros((2, 0, 4), np.float32), np.array([1], np.int64)])
    assert y.shape == (2, 1, 4) and not y.any()


def test_a_loop_trip_count_input_is_folded():
    """Loop's trip count sets the length of its scan outputs: a graph input feeding it is
    folded like a Reshape shape (one plan per value)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["count"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["count", "axes"], ["value"])],
        "body", [_value("i", TensorProto.INT64, []), _value("cond_in", TensorProto.BOOL, [])],
        [_value("cond_out", TensorProto.BOOL, []), _value("value", TensorProto.FLOAT, [1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])])
    loop = helper.make_node("Loop", ["m", "go"], ["y"], body=body)
    model = _model([loop], [_value("m", TensorProto.INT64, [])],
                   [_value("y", TensorProto.FLOAT, ["M", 1])])
    model.graph.initializer.append(helper.make_tensor("go", TensorProto.BOOL, [], [True]))
    rep = backend.prepare(model, "CPU", **FAST)
    assert rep.folded_inputs == {"m"}
    assert rep.run([np.array(3, np.int64)])[0].tolist() == [[0.0], [1.0], [2.0]]
    assert rep.run([np.array(1, np.int64)])[0].tolist() == [[0.0]]
