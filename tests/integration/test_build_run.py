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


def hf_extended_mask(heads: int = 2, seq: int = 8) -> onnx.ModelProto:
    """Scores [1, heads, seq, seq] plus the mask HF transformers build from an int64
    attention_mask [1, seq]: (1 - mask[:, None, None, :]) * finfo(float32).min, then a
    softmax over the keys."""
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    constants = [numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(lowest, "lowest")]
    nodes = [helper.make_node("Unsqueeze", ["attention_mask", "axes"], ["m4"], "unsqueeze"),
             helper.make_node("Cast", ["m4"], ["mf"], "cast", to=TensorProto.FLOAT),
             helper.make_node("Sub", ["one", "mf"], ["inverted"], "sub"),
             helper.make_node("Mul", ["inverted", "lowest"], ["additive"], "mul"),
             helper.make_node("Add", ["scores", "additive"], ["masked"], "add"),
             helper.make_node("Softmax", ["masked"], ["p"], "softmax", axis=-1)]
    graph = helper.make_graph(
        nodes, "hf_mask",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, heads, seq, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, heads, seq, seq])],
        constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_hf_extended_attention_mask_builds_and_matches_onnxruntime(rng):
    """Verification feeds the mask's Sub/Mul random floats, where (1 - m) * finfo.min passes
    float32's range: float32's inf is then right, not an overflow (it refused every
    candidate, and every HF BERT export did not build)."""
    model = hf_extended_mask()
    plan = wpk.build(model, target="cpu", **FAST, partition=False)
    feeds = {"scores": rng.standard_normal((1, 2, 8, 8)).astype(np.float32),
             "attention_mask": np.array([[1, 1, 1, 1, 1, 0, 0, 0]], np.int64)}
    [expected] = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, feeds)
    session = Session(plan)
    np.testing.assert_allclose(session.run(feeds)["p"], expected, rtol=1e-5, atol=1e-7)
    assert expected[..., 5:].max() == 0.0


def test_an_hf_mask_builds_strict_with_its_int64_unsqueeze_and_cast_computed_by_wpk(rng):
    """The mask's int64 Unsqueeze and its Cast ran as onnxruntime fallback steps, so
    `--strict` refused every HF transformers export; now wpk computes both (any dtype)."""
    plan = wpk.build(hf_extended_mask(), target="cpu", **FAST, partition=False, strict=True)
    steps = {step.op: step for step in plan.steps}
    assert steps["Unsqueeze"].kind != "fallback" and steps["Cast"].kind != "fallback"
    assert not any(step.kind == "fallback" for step in plan.steps)


def torch_padding_mask(seq: int = 6) -> onnx.ModelProto:
    """Scores masked as torch's exporters write a key padding mask: a frame whose first
    feature is above 1 is padding (Greater), the bool mask expanded over the queries and
    negated twice (Not, Equal with false), selected by Where, plus an int64 id path
    (Gather of a Shape-free Slice, Concat, Transpose) carried to an output."""
    constants = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
                 numpy_helper.from_array(np.array(False), "false"),
                 numpy_helper.from_array(np.array([0], np.int64), "zero"),
                 numpy_helper.from_array(np.array([1], np.int64), "one_i"),
                 numpy_helper.from_array(np.array([1, 1, seq, seq], np.int64), "full"),
                 numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
                 numpy_helper.from_array(np.array([2], np.int64), "idx")]
    nodes = [helper.make_node("Slice", ["frames", "zero", "one_i", "idx"], ["first"]),
             helper.make_node("Greater", ["first", "one"], ["padded"]),       # [1, seq, 1]
             helper.make_node("Transpose", ["padded"], ["keys"], perm=[0, 2, 1]),
             helper.make_node("Unsqueeze", ["keys", "axes"], ["k4"]),         # [1,1,1,1,seq]
             helper.make_node("Squeeze", ["k4", "one_i"], ["k3"]),            # [1,1,1,seq]
             helper.make_node("Expand", ["k3", "full"], ["wide"]),
             helper.make_node("Not", ["wide"], ["kept"]),
             helper.make_node("Equal", ["kept", "false"], ["dropped"]),
             helper.make_node("Where", ["dropped", "minus_inf", "scores"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("Gather", ["ids", "idx"], ["picked"], axis=1),
             helper.make_node("Concat", ["ids", "picked"], ["joined"], axis=1),
             helper.make_node("Cast", ["joined"], ["joined32"], to=TensorProto.INT32)]
    graph = helper.make_graph(
        nodes, "torch_mask",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, seq, seq]),
         helper.make_tensor_value_info("frames", TensorProto.FLOAT, [1, seq, 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 1, seq, seq]),
         helper.make_tensor_value_info("joined32", TensorProto.INT32, [1, seq + 1])],
        constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_torch_padding_mask_runs_on_wpks_kernels_and_matches_onnxruntime(rng):
    """Greater, Not, Equal, Where, Expand and int64/bool moves: no fallback step, outputs
    equal to onnxruntime's (the int32 ids exactly)."""
    model = torch_padding_mask()
    plan = wpk.build(model, target="cpu", **FAST, partition=False, strict=True)
    assert not any(step.kind == "fallback" for step in plan.steps)
    frames = rng.uniform(0, 1, (1, 6, 3)).astype(np.float32)
    frames[0, 4:, 0] = 2.0   # the last two frames are padding
    feeds = {"scores": rng.standard_normal((1, 1, 6, 6)).astype(np.float32), "frames": frames,
             "ids": rng.integers(0, 30000, (1, 6)).astype(np.int64)}
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    got = Session(plan).run(feeds)
    np.testing.assert_allclose(got["p"], expected[0], rtol=1e-5, atol=1e-7)
    assert got["joined32"].dtype == np.int32
    np.testing.assert_array_equal(got["joined32"], expected[1])
    assert expected[0][..., 4:].max() == 0.0


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
