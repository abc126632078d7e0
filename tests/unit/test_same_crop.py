"""SAME padding below zero (wpk.passes.same_crop) and SAME pools with ceil_mode
(wpk.frontend_pools): plans of single pools against onnxruntime, and where the pass must
not fire."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import wpk
from wpk.core.onnx_pool import auto_pads
from wpk.frontend import load_model
from wpk.passes.same_crop import SameCrop
from wpk.runtime import Session


def pool_model(op: str, size: list[int], opset: int = 19, **attributes) -> onnx.ModelProto:
    node = h.make_node(op, ["x"], ["y"], **attributes)
    dims = [f"d{i}" for i in range(len(size) + 2)]
    graph = h.make_graph([node], "pool", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, *size])],
                         [h.make_tensor_value_info("y", T.FLOAT, dims)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def build_and_compare(model: onnx.ModelProto, size: list[int]) -> wpk.plans.planfile.Plan:
    x = np.random.default_rng(len(size)).standard_normal((1, 2, *size)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    actual = Session(plan).run({"x": x})["y"]
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    return plan


def test_onnxruntimes_split_of_a_negative_total():
    """Halved toward zero (for SAME_LOWER the total plus one): 1x1 at stride 3 over 6
    (total -2) starts one in and ends one short; total -3 (8 at stride 4) crops one at the
    begin and two at the end for both; -1 crops only the end; positive totals as before."""
    assert auto_pads("SAME_UPPER", [6], [1], [3], [1]) == [-1, -1]
    assert auto_pads("SAME_UPPER", [8], [1], [4], [1]) == [-1, -2]
    assert auto_pads("SAME_LOWER", [8], [1], [4], [1]) == [-1, -2]
    assert auto_pads("SAME_UPPER", [6], [1], [4], [1]) == [0, -1]
    assert auto_pads("SAME_LOWER", [6], [1], [4], [1]) == [0, -1]
    assert auto_pads("SAME_UPPER", [7], [4], [2], [1]) == [1, 2]
    assert auto_pads("SAME_LOWER", [7], [4], [2], [1]) == [2, 1]


@pytest.mark.parametrize("op, size, attributes", [
    ("AveragePool", [6], dict(kernel_shape=[1], strides=[3], auto_pad="SAME_UPPER")),
    ("AveragePool", [8, 8], dict(kernel_shape=[1, 1], strides=[4, 4], auto_pad="SAME_LOWER")),
    ("AveragePool", [9, 7], dict(kernel_shape=[1, 2], strides=[3, 4], auto_pad="SAME_UPPER",
                                 count_include_pad=1)),
    ("AveragePool", [6, 5, 8], dict(kernel_shape=[1, 4, 2], strides=[3, 3, 1],
                                    auto_pad="SAME_UPPER", count_include_pad=1)),
    ("LpPool", [8, 6], dict(kernel_shape=[2, 1], strides=[4, 3], auto_pad="SAME_LOWER", p=2)),
    ("LpPool", [9], dict(kernel_shape=[1], strides=[3], auto_pad="SAME_UPPER", p=1)),
])
def test_pools_with_negative_same_padding_match_onnxruntime(op, size, attributes):
    """Before, the plans clamped the padding at zero and took other pixels (AveragePool
    over 6 at stride 3 averaged pixels 0 and 3 where onnxruntime takes 1 and 4)."""
    plan = build_and_compare(pool_model(op, size, **attributes), size)
    assert plan.report["passes"]["passes"]["same_crop"] == 1


@pytest.mark.parametrize("op, size, attributes", [
    ("AveragePool", [6], dict(kernel_shape=[1], strides=[2], auto_pad="SAME_UPPER",
                              ceil_mode=1)),
    ("AveragePool", [7, 5], dict(kernel_shape=[2, 1], strides=[1, 3], auto_pad="SAME_LOWER",
                                 ceil_mode=1)),
    ("LpPool", [6, 8, 3], dict(kernel_shape=[2, 2, 1], strides=[3, 2, 1], auto_pad="SAME_LOWER",
                               ceil_mode=1, p=2)),
    ("MaxPool", [7, 7], dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER",
                             ceil_mode=1)),
])
def test_same_pools_with_ceil_mode_get_onnxruntimes_size(op, size, attributes):
    """ONNX's inference rounded a SAME pool's size up again with ceil_mode set (4 outputs
    of 6 values at stride 2): the plan had an extra output, or failed to build."""
    build_and_compare(pool_model(op, size, **attributes), size)


def _crop_hits(model: onnx.ModelProto) -> int:
    graph = load_model(model)
    crop = SameCrop()
    crop.run(graph)
    return sum(crop.hits.values())


@pytest.mark.parametrize("op, attributes", [
    ("AveragePool", dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")),  # total 2
    ("AveragePool", dict(kernel_shape=[1], strides=[3], pads=[0, 0])),   # explicit pads
    ("AveragePool", dict(kernel_shape=[1], strides=[3], auto_pad="VALID")),
    ("MaxPool", dict(kernel_shape=[1], strides=[3], auto_pad="SAME_UPPER")),  # refused by ort
    ("AveragePool", dict(kernel_shape=[2], strides=[3], auto_pad="SAME_UPPER")),  # total 0 (8)
])
def test_the_pass_leaves_other_padding_alone(op, attributes):
    size = [8] if attributes["kernel_shape"] == [2] else [6]
    assert _crop_hits(pool_model(op, size, **attributes)) == 0


def test_the_pass_leaves_convs_alone():
    """onnxruntime's Conv is not consistent with negative SAME padding (over 9 pixels a
    1x1 kernel at stride 3 starts at 0, over 8 at stride 4 at 1): wpk keeps the clamp."""
    weight = numpy_helper.from_array(np.ones((1, 2, 1, 1), np.float32), "w")
    node = h.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], strides=[3, 3],
                       auto_pad="SAME_UPPER")
    graph = h.make_graph([node], "conv", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 1, 2, 2])],
                         initializer=[weight])
    assert _crop_hits(h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])) == 0


def test_an_opset_9_pool_is_cropped_with_slices_attributes():
    """Before opset 10 a Slice takes its starts, ends and axes as attributes. (onnxruntime
    refuses negative pads in its AveragePool before opset 10, so the plan is compared with
    the same pool at opset 19.)"""
    attributes = dict(kernel_shape=[1, 1], strides=[4, 4], auto_pad="SAME_UPPER")
    model = pool_model("AveragePool", [8, 8], opset=9, **attributes)
    graph = load_model(model)
    SameCrop().run(graph)
    [crop] = [n for n in graph.nodes if n.op == "Slice"]
    assert crop.inputs == ["x"] and crop.attrs == {"starts": (1, 1), "ends": (6, 6),
                                                   "axes": (2, 3)}
    x = np.random.default_rng(0).standard_normal((1, 2, 8, 8)).astype(np.float32)
    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    expected = ort.InferenceSession(pool_model("AveragePool", [8, 8], **attributes)
                                    .SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(Session(plan).run({"x": x})["y"], expected, rtol=1e-6)
