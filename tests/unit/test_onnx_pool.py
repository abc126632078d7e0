"""wpk.core.onnx_pool: onnx.reference's MaxPool at unit strides with `ceil_mode` set
computes the shape the ONNX spec and onnxruntime give (onnx.reference alone counts the
pads twice there); a model whose shapes must be evaluated through such a pool builds and
agrees with onnxruntime. Its MaxPool, AveragePool and LpPool compute onnxruntime's sizes
and values (onnx.reference alone shifts the windows where a `ceil_mode` pool's last one
reaches past the padding, and is wrong with uneven pads, dilations, 1-D pools and
auto_pad), so a folded constant pool is right too."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import wpk
from wpk.core.onnx_quantize import REFERENCE_OPS
from wpk.runtime import Session


def pool_model(size: int, kernel: int, stride: int, pad: int, dilation: int = 1,
               ceil_mode: int = 1, opset: int = 19) -> onnx.ModelProto:
    node = h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[kernel, kernel],
                       pads=[pad] * 4, strides=[stride, stride], dilations=[dilation] * 2,
                       ceil_mode=ceil_mode)
    graph = h.make_graph([node], "pool", [h.make_tensor_value_info("x", T.FLOAT,
                                                                   [1, 3, size, size])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def onnxruntime_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


CASES = [(size, kernel, stride, pad, dilation)
         for size, kernel, stride, pad, dilation in itertools.product(
             (2, 5, 8), (2, 3, 5), (1, 2), (0, 1, 2), (1, 2))
         if pad < kernel and (size + 2 * pad - dilation * (kernel - 1) - 1) >= 0]


@pytest.mark.parametrize("size, kernel, stride, pad, dilation", CASES)
def test_max_pool_in_ceil_mode_matches_onnxruntime(size, kernel, stride, pad, dilation):
    model = pool_model(size, kernel, stride, pad, dilation)
    x = np.random.default_rng(size * 100 + kernel).standard_normal(
        (1, 3, size, size)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    actual = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(None, {"x": x})[0]
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


def test_onnx_reference_alone_still_miscomputes_the_case():
    """The defect the override exists for (when onnx.reference fixes it, the override can
    go): a 5x5 pool with pads 2 at stride 1 over a 2x2 image."""
    x = np.ones((1, 3, 2, 2), np.float32)
    assert ReferenceEvaluator(pool_model(2, 5, 1, 2)).run(None, {"x": x})[0].shape \
        != (1, 3, 2, 2)


def test_a_model_whose_shapes_are_evaluated_through_such_a_pool_builds():
    """A Reshape to a shape computed from the pool's output (Shape, Gather, Concat), as
    torch exports write: ONNX's shape inference leaves it open, so wpk evaluates the model
    with onnx.reference; the pool's shape was wrong there and the build failed with
    "cannot determine the shapes"."""
    pool = h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                       strides=[1, 1], ceil_mode=1)
    nodes = [pool,
             h.make_node("Shape", ["p"], ["shape"]),
             h.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             h.make_node("Concat", ["batch", "minus_one"], ["flat_shape"], axis=0),
             h.make_node("Reshape", ["p", "flat_shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = h.make_graph(nodes, "sppf", [h.make_tensor_value_info("x", T.FLOAT,
                                                                  [1, 4, 2, 2])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", "m"])],
                         initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 4, 2, 2)).astype(np.float32)
    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    actual = Session(plan).run({"x": x})["y"]
    expected = onnxruntime_run(model, {"x": x})[0]
    assert actual.shape == expected.shape == (1, 16)
    np.testing.assert_array_equal(actual, expected)


def average_pool_model(size: list[int], kernel: list[int], stride: list[int],
                       dilation: list[int], pads: list[int], count_include_pad: int,
                       dtype: int = T.FLOAT) -> onnx.ModelProto:
    return any_pool_model("AveragePool", size, dtype, kernel_shape=kernel, pads=pads,
                          strides=stride, dilations=dilation, ceil_mode=1,
                          count_include_pad=count_include_pad)


def any_pool_model(op: str, size: list[int], dtype: int = T.FLOAT, outputs: int = 1,
                   **attributes) -> onnx.ModelProto:
    names = ["y", "indices"][:outputs]
    node = h.make_node(op, ["x"], names, **attributes)
    graph = h.make_graph([node], "pool", [h.make_tensor_value_info("x", dtype, [1, 2, *size])],
                         [h.make_tensor_value_info(n, dtype if n == "y" else T.INT64, None)
                          for n in names])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])


def _pool_cases(count: int) -> list[tuple]:
    """Seeded random MaxPools, AveragePools and LpPools of rank 1-3 (strides 1-3,
    dilations 1-2, uneven pads or auto_pad, ceil_mode and count_include_pad 0/1), none with
    a window larger than its padded input (onnxruntime sizes those by C's truncating
    division, not the spec's floor) nor a dilated SAME pool (onnxruntime leaves the
    dilations out of its pads); SAME pads below 0 (the input cropped) in AveragePools and
    LpPools only (onnxruntime's MaxPool refuses them)."""
    rng, cases = np.random.default_rng(19), []
    while len(cases) < count:
        op = ("MaxPool", "AveragePool", "LpPool")[len(cases) % 3]
        rank = int(rng.integers(1, 4))
        size = [int(v) for v in rng.integers(3, 9, rank)]
        kernel = [int(v) for v in rng.integers(1, 5, rank)]
        dilations = [int(v) for v in rng.integers(1, 3, rank)]
        pads = [int(rng.integers(0, kernel[i % rank])) for i in range(2 * rank)]
        attributes = dict(kernel_shape=kernel, strides=[int(v) for v in
                                                        rng.integers(1, 4, rank)],
                          ceil_mode=int(rng.integers(0, 2)))
        if op == "AveragePool":
            attributes["count_include_pad"] = int(rng.integers(0, 2))
        auto_pad = ("NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")[
            int(rng.integers(0, 5))]
        if auto_pad == "NOTSET":
            attributes["pads"] = pads
        else:
            attributes["auto_pad"], pads = auto_pad, [0] * (2 * rank)
        if op == "LpPool" or auto_pad.startswith("SAME"):
            dilations = [1] * rank
        attributes["dilations"] = dilations
        if auto_pad.startswith("SAME"):
            fits = op != "MaxPool" or all(   # onnxruntime's MaxPool refuses negative pads
                (-(-n // s) - 1) * s + k >= n for n, k, s in zip(size, kernel,
                                                                  attributes["strides"]))
        else:
            fits = all(n + pads[a] + pads[a + rank] >= d * (k - 1) + 1
                       for a, (n, k, d) in enumerate(zip(size, kernel, dilations)))
        if fits:
            cases.append((op, size, attributes))
    return cases


@pytest.mark.parametrize("op, size, attributes", _pool_cases(90))
def test_pools_match_onnxruntime(op, size, attributes):
    """In float32 and in float64 (as wpk's wide references run them; onnxruntime has no
    float64 AveragePool or LpPool, so against its float32 result)."""
    x = np.random.default_rng(len(size)).standard_normal((1, 2, *size)).astype(np.float32)
    expected = onnxruntime_run(any_pool_model(op, size, **attributes), {"x": x})[0]
    for dtype, numpy_dtype in ((T.FLOAT, np.float32), (T.DOUBLE, np.float64)):
        model = any_pool_model(op, size, dtype, **attributes)
        actual = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(
            None, {"x": x.astype(numpy_dtype)})[0]
        assert actual.shape == expected.shape and actual.dtype == numpy_dtype
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_an_int8_max_pool_pads_with_the_types_least_value():
    model = any_pool_model("MaxPool", [5, 5], T.INT8, kernel_shape=[3, 3], pads=[1, 1, 2, 2],
                           strides=[2, 2], ceil_mode=1)
    x = np.random.default_rng(0).integers(-128, 0, (1, 2, 5, 5)).astype(np.int8)
    expected = onnxruntime_run(model, {"x": x})[0]
    actual = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(None, {"x": x})[0]
    assert actual.dtype == np.int8
    np.testing.assert_array_equal(actual, expected)


def test_a_max_pool_with_indices_stays_onnx_references():
    """The Indices output is onnx.reference's own (wpk's pools compute one output)."""
    model = any_pool_model("MaxPool", [6, 6], outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    actual = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(None, {"x": x})
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])


def test_onnx_reference_alone_still_shifts_the_average_pools_windows():
    """The defect the AveragePool exists for: over 1..7, kernel 3, stride 3, onnx.reference
    gives (1.5, 4, 6); the spec, onnxruntime and torch (2, 5, 7)."""
    model = average_pool_model([7], [3], [3], [1], [0, 0], 0)
    x = np.arange(1, 8, dtype=np.float32).reshape(1, 1, 7).repeat(2, axis=1)
    assert onnxruntime_run(model, {"x": x})[0][0, 0].tolist() == [2, 5, 7]
    assert ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(
        None, {"x": x})[0][0, 0].tolist() == [2, 5, 7]
    assert ReferenceEvaluator(model).run(None, {"x": x})[0][0, 0].tolist() != [2, 5, 7]


def test_a_constant_average_pool_in_ceil_mode_folds_to_onnxruntimes_values():
    """A pool of an initializer is folded at build time with onnx.reference: before, the
    plan added onnx.reference's shifted windows to its input."""
    table = np.random.default_rng(3).random((1, 4, 7, 7)).astype(np.float32)
    nodes = [h.make_node("AveragePool", ["table"], ["pooled"], kernel_shape=[3, 3],
                         strides=[3, 3], pads=[1, 1, 0, 0], ceil_mode=1),
             h.make_node("Add", ["x", "pooled"], ["y"])]
    graph = h.make_graph(nodes, "folded", [h.make_tensor_value_info("x", T.FLOAT,
                                                                    [1, 4, 3, 3])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 3, 3])],
                         initializer=[numpy_helper.from_array(table, "table")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x = np.random.default_rng(4).standard_normal((1, 4, 3, 3)).astype(np.float32)
    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    assert [step.op for step in plan.steps] == ["Add"]   # the pool was folded
    np.testing.assert_allclose(Session(plan).run({"x": x})["y"],
                               onnxruntime_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
