"""End to end: build a small ONNX model, save, load, run, and compare with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.commands.render_html import render_html
from wpk.core.errors import InputError, UnsupportedError
from wpk.plans.planfile import read_plan
from wpk.runtime import Session

pytest.importorskip("wpk.workloads")

FAST = {"warmup": 1, "repeats": 3, "min_time": 0.0, "progress": False}


def conv_relu_gemm(rng) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv(4, 3x3, pad 1) -> Relu -> Flatten -> Gemm(10) -> y[1,10]."""
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv.w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "conv.b"),
        numpy_helper.from_array(rng.standard_normal((10, 256)).astype(np.float32) / 16, "fc.w"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "fc.b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], "conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], "relu"),
        helper.make_node("Flatten", ["r"], ["f"], "flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], "fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "conv_relu_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_build_save_load_run_matches_onnxruntime(rng, tmp_path):
    model = conv_relu_gemm(rng)
    path = tmp_path / "model.wpk"
    plan = wpk.build(model, target="cpu", output=path, **FAST, partition=False)
    assert path.exists()
    session = wpk.load(path)
    reference = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    for _ in range(2):
        x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        [expected] = reference.run(None, {"x": x})
        np.testing.assert_allclose(session.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(session.run(["y"], {"x": x})[0], expected,
                                   rtol=1e-4, atol=1e-5)
    report = read_plan(path).report
    assert report == plan.report
    assert report["totals"]["nodes"] == len(plan.steps)
    assert all(w["candidates"] for w in report["workloads"])
    assert report["passes"]["ops_before"]["Conv"] == 1
    assert "<svg" in render_html(report)
    with pytest.raises(InputError, match=r"has shape \(1,3,9,9\)"):
        session.run({"x": np.zeros((1, 3, 9, 9), np.float32)})


def test_strict_names_unsupported_nodes(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"], "relu"),
             helper.make_node("Det", ["r"], ["d"], "determinant"),
             helper.make_node("Round", ["r"], ["y"], "rounding")]
    graph = helper.make_graph(
        nodes, "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UnsupportedError, match=r"determinant \(Det.*rounding \(Round"):
        wpk.build(model, strict=True, **FAST, partition=False)
    plan = wpk.build(model, output=tmp_path / "odd.wpk", **FAST, partition=False)
    assert plan.report["totals"]["fallback_nodes"] == 2
    session = wpk.load(tmp_path / "odd.wpk")
    x = np.random.default_rng(3).standard_normal((2, 3, 3)).astype(np.float32)
    out = session.run({"x": x})
    np.testing.assert_allclose(out["d"], np.linalg.det(np.maximum(x, 0)), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out["y"], np.round(np.maximum(x, 0)))


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners"])
def test_bilinear_upsampling_builds_and_matches_onnxruntime(rng, transform):
    """torch's nn.Upsample(mode="bilinear") as its exporter writes it: no candidate passed
    verification while the reference only knew nearest-neighbour resizing; now wpk's own
    interpolating kernel is verified beside onnxruntime's."""
    # 32 input channels: not a stem, so the lone conv stays NCHW and the Resize a Resize
    weight = numpy_helper.from_array(rng.standard_normal((8, 32, 3, 3)).astype(np.float32), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="linear",
                              coordinate_transformation_mode=transform)]
    graph = helper.make_graph(
        nodes, "bilinear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 18, 14])],
        [weight, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    plan = wpk.build(model, target="cpu", partition=False, **FAST)
    x = rng.standard_normal((1, 32, 9, 7)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    actual = Session(plan).run({"x": x})["y"]
    assert np.linalg.norm(actual - expected) <= 1e-5 * np.linalg.norm(expected)
    (resize,) = [e for e in plan.report["workloads"] if e["op"] == "Resize"]
    statuses = {c["impl"]: c["status"] for c in resize["candidates"]}
    assert statuses.get("numpy.formula") == "ok" and statuses.get("ort") == "ok", statuses
