"""Zero spatial Pads fold into the Convs that read them (wpk/passes/pad_into_conv.py)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.nchwc_support import evaluate
from tests.unit.onnx_pad import pad_node
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.pad_into_conv import PadIntoConv

X_SHAPE = (1, 3, 13, 12)


def pad_conv_model(widths=(0, 0, 1, 1, 0, 0, 1, 1), opset=13, mode=None, value=None,
                   axes=None, conv_attrs=None, extra_reader=False, pad_is_output=False,
                   seed=0):
    """x -> Pad -> Conv 3x3 stride 2 (VALID) -> y, as tf2onnx writes Keras's ZeroPadding2D."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
                                     "w")]
    pad, pad_inits = pad_node("x", "p", widths, opset, mode, value, axes)
    inits += pad_inits
    nodes = [pad,
             helper.make_node("Conv", ["p", "w"], ["y"], strides=[2, 2],
                              **(conv_attrs or {}))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    if pad_is_output:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "pad_conv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, X_SHAPE)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)   # the outputs' shapes


def ops(graph) -> collections.Counter:
    return collections.Counter(n.op for n in graph.nodes)


def check_function(model, graph):
    x = np.random.default_rng(3).standard_normal(X_SHAPE).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    actual = evaluate(graph, {"x": x}, "ort")
    for name, value in expected.items():
        assert relative_l2(actual[name], value) <= 1e-5, name


@pytest.mark.parametrize(("widths", "opset", "axes", "pads"), [
    ((0, 0, 1, 1, 0, 0, 1, 1), 13, None, (1, 1, 1, 1)),      # ZeroPadding2D(1)
    ((0, 0, 0, 0, 0, 0, 1, 1), 13, None, (0, 0, 1, 1)),      # TF SAME, stride 2: end only
    ((0, 0, 2, 0, 0, 0, 1, 3), 10, None, (2, 0, 1, 3)),      # attribute form
    ((1, 2, 0, 3), 18, (2, 3), (1, 2, 0, 3)),               # opset 18 axes
])
def test_a_zero_spatial_pad_becomes_the_convs_pads(widths, opset, axes, pads):
    model = pad_conv_model(widths, opset=opset, axes=axes)
    graph = PadIntoConv().run(load_model(model))
    check_graph(graph)
    assert ops(graph) == {"Conv": 1}
    (conv,) = graph.nodes
    assert tuple(conv.attr("pads")) == pads and conv.inputs[0] == "x"
    check_function(model, graph)


def test_the_pads_add_to_the_convs_own_and_valid_becomes_explicit():
    model = pad_conv_model(conv_attrs={"pads": [1, 0, 0, 1]})
    (conv,) = PadIntoConv().run(load_model(model)).nodes
    assert tuple(conv.attr("pads")) == (2, 1, 1, 2)
    check_function(model, PadIntoConv().run(load_model(model)))
    model = pad_conv_model(conv_attrs={"auto_pad": "VALID"})
    graph = PadIntoConv().run(load_model(model))
    (conv,) = graph.nodes
    assert conv.attr("auto_pad") is None and tuple(conv.attr("pads")) == (1, 1, 1, 1)
    check_function(model, graph)


@pytest.mark.parametrize("case", [
    {"mode": "reflect"}, {"value": 0.5}, {"widths": (1, 0, 1, 1, 0, 0, 1, 1)},
    {"widths": (0, 0, -1, 1, 0, 0, 1, 1)}, {"extra_reader": True}, {"pad_is_output": True},
    {"conv_attrs": {"auto_pad": "SAME_UPPER"}},
], ids=["reflect", "non-zero value", "batch pad", "crop", "other reader", "graph output",
        "conv auto_pad SAME"])
def test_what_does_not_fold_stays(case):
    model = pad_conv_model(**case)
    graph = PadIntoConv().run(load_model(model))
    assert ops(graph)["Pad"] == 1
    check_function(model, graph)


def test_the_pipeline_folds_it_before_the_blocked_layout():
    model = pad_conv_model()
    optimized, report = optimize(load_model(model), "cpu")
    check_graph(optimized)
    assert report.passes["pad_into_conv"] == 1
    assert "Pad" not in ops(optimized)
    check_function(model, optimized)
