"""Swin's window attention (`wpk.passes.window_attention`): the shifted windows' mask,
added to the scores viewed per image and viewed back per window, becomes the one mask Add
the attention rule fuses, and Swin V2's per-head logit scale a scale of the queries; the
graph computes what the model did (run through `to_onnx` in onnxruntime, and built into a
plan); and every case where the rules must not fire."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

import wpk
from tests.built_plans import FAST_BUILD
from wpk.dsl.toolchain_cuda import nvrtc_available
from wpk.frontend import load_model
from wpk.passes import optimize, rule_docs, to_onnx
from wpk.passes.base import check_graph
from wpk.passes.window_attention import compact

IMAGES, WINDOWS, HEADS, TOKENS, DIM = 2, 4, 3, 9, 8
RULES = ("window_mask_unreshaped", "score_constants_summed", "head_scale_on_queries")
OFFLINE_PRESET = "p100" if nvrtc_available() else "h100"   # NVRTC compiles faster than nvcc


def shift_mask(rng: np.random.Generator) -> np.ndarray:
    """[1, W, 1, N, N]: 0 within a region, -100 across, regions drawn per window."""
    labels = rng.integers(0, 3, (WINDOWS, TOKENS))
    apart = labels[:, None, :] != labels[:, :, None]
    return np.where(apart, -100.0, 0.0).astype(np.float32)[None, :, None]


def window_model(rng: np.random.Generator, *, bias: bool = True, mask_input: bool = False,
                 back_shape: tuple[int, ...] | None = None, axis: int = -1,
                 extra_output: str = "", images: int = IMAGES,
                 head_scale: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """Q, K, V [images * W, H, N, D] -> scores (times a constant of shape `head_scale`,
    Swin V2's logit scale; + a relative bias), viewed per image, the shifted windows' mask
    added, viewed back, softmax, times V (torchvision's Swin)."""
    count = images * WINDOWS
    lead = [count, HEADS, TOKENS]
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, lead + [DIM]) for n in "qkv"]
    inits = [numpy_helper.from_array(np.array(DIM ** -0.5, np.float32), "scale"),
             numpy_helper.from_array(np.array([images, WINDOWS, HEADS, TOKENS, TOKENS],
                                              np.int64), "per_image"),
             numpy_helper.from_array(np.array(back_shape or lead + [TOKENS], np.int64),
                                     "per_window")]
    nodes = [h.make_node("Mul", ["q", "scale"], ["q_scaled"]),
             h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["q_scaled", "kt"], ["scores"])]
    scores = "scores"
    if head_scale is not None:
        inits.append(numpy_helper.from_array(
            np.exp(rng.uniform(1.0, 4.0, head_scale)).astype(np.float32), "logit_scale"))
        nodes.append(h.make_node("Mul", ["scores", "logit_scale"], ["scaled"]))
        scores = "scaled"
    if bias:
        inits.append(numpy_helper.from_array(
            rng.standard_normal((1, HEADS, TOKENS, TOKENS)).astype(np.float32), "bias"))
        nodes.append(h.make_node("Add", [scores, "bias"], ["biased"]))
        scores = "biased"
    mask = shift_mask(rng)
    if mask_input:
        inputs.append(h.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask.shape)))
    else:
        inits.append(numpy_helper.from_array(mask, "mask"))
    nodes += [h.make_node("Reshape", [scores, "per_image"], ["viewed"]),
              h.make_node("Add", ["viewed", "mask"], ["masked"]),
              h.make_node("Reshape", ["masked", "per_window"], ["logits"]),
              h.make_node("Softmax", ["logits"], ["probs"], axis=axis)]
    probs = "probs"
    if back_shape is not None:   # the softmax over a flattened view: back for the product
        inits.append(numpy_helper.from_array(np.array(lead + [TOKENS], np.int64), "lead"))
        nodes.append(h.make_node("Reshape", ["probs", "lead"], ["probs_back"]))
        probs = "probs_back"
    nodes.append(h.make_node("MatMul", [probs, "v"], ["y"]))
    outputs = [h.make_tensor_value_info("y", TensorProto.FLOAT, lead + [DIM])]
    if extra_output:
        outputs.append(h.make_tensor_value_info(extra_output, TensorProto.FLOAT, None))
    graph = h.make_graph(nodes, "swin_window_attention", inputs, outputs, inits)
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def feeds_of(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    if "mask" in feeds:
        feeds["mask"] = shift_mask(rng)
    return feeds


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("images", [1, IMAGES])
@pytest.mark.parametrize("bias", [True, False], ids=["relative-bias", "mask-only"])
def test_the_shifted_windows_mask_becomes_the_fused_attentions_mask(rng, images, bias,
                                                                     target):
    model = window_model(rng, bias=bias, images=images)
    graph, report = optimize(load_model(model), target)
    check_graph(graph)
    assert report.rules["window_mask_unreshaped"] == 1
    assert report.rules["score_constants_summed"] == int(bias)
    assert report.rules["attention"] == 1 and graph.op_counts() == {"Attention": 1}
    mask = graph.constants[graph.nodes[0].inputs[3]]
    # per window (images * W of them), the same for every head unless a bias is added
    assert mask.shape == (images * WINDOWS, HEADS if bias else 1, TOKENS, TOKENS)
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    (actual,) = run(to_onnx(graph), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_a_plan_of_the_window_attention_runs_the_fused_kernel_and_matches(rng, tmp_path):
    """End to end: the build verifies the fused kernel on the per-window mask against the
    float64 reference, and the plan's output matches onnxruntime's."""
    model = window_model(rng)
    plan = wpk.build(model, target="cpu", **FAST_BUILD)
    assert [s.op for s in plan.steps] == ["Attention"]
    plan.save(tmp_path / "window.wpk")
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    actual = wpk.load(tmp_path / "window.wpk").run(feeds)["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options, why", [
    ({"mask_input": True}, "the mask is no constant"),
    ({"back_shape": (IMAGES * WINDOWS * HEADS, TOKENS, TOKENS)},
     "the outer Reshape does not give the scores their shape back"),
    ({"axis": 1}, "the softmax is not over the last axis"),
    ({"extra_output": "masked"}, "the masked scores are a graph output"),
    ({"extra_output": "viewed"}, "the scores viewed per image are a graph output"),
    ({"extra_output": "biased"}, "the biased scores are a graph output"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_sandwich_the_rules_cannot_undo_stays(rng, options, why):
    """Neither the sandwich nor the two Adds are rewritten where a rule would lose a
    tensor or change what the model computes (with the biased scores an output, the
    sandwich goes but the Adds stay apart); the graph computes what the model did."""
    model = window_model(rng, **options)
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    undone = options.get("extra_output") == "biased"
    assert report.rules["window_mask_unreshaped"] == int(undone), why
    assert report.rules["score_constants_summed"] == 0, why
    assert "Attention" not in graph.op_counts()
    feeds = feeds_of(model, rng)
    expected = run(model, feeds)
    actual = run(to_onnx(graph), feeds)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_constants_that_would_widen_the_scores_are_not_summed(rng):
    """(scores + bias) + mask with a mask of more windows than the scores have: the sum
    would broadcast the scores wider, so the Adds stay."""
    lead = [1, HEADS, TOKENS, TOKENS]
    nodes = [h.make_node("Add", ["s", "bias"], ["biased"]),
             h.make_node("Add", ["biased", "mask"], ["masked"]),
             h.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(rng.standard_normal(lead).astype(np.float32), "bias"),
             numpy_helper.from_array(np.zeros([2] + lead[1:], np.float32), "mask")]
    graph = h.make_graph(nodes, "wider", [h.make_tensor_value_info("s", TensorProto.FLOAT, lead)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    optimized, report = optimize(load_model(model), "cpu")
    assert report.rules["score_constants_summed"] == 0
    feeds = {"s": rng.standard_normal(lead).astype(np.float32)}
    (expected,) = run(model, feeds)
    (actual,) = run(to_onnx(optimized), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_compact_keeps_only_the_axes_a_mask_changes_along():
    base = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    assert compact(np.broadcast_to(base, (3, 5, 4))).shape == (3, 1, 4)
    assert compact(np.ones((2, 3), np.float32)).shape == (1, 1)
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(compact(value), value)


def test_the_rules_are_documented_for_both_targets():
    assert all(rule in rule_docs("cpu") and rule in rule_docs("cuda") for rule in RULES)


def test_an_offline_cuda_build_fuses_the_window_attention_and_verifies_it(rng, tmp_path):
    """The CUDA target: Swin V2's scale and the shifted windows' mask fold into one fused
    attention whose kernels the emulator verifies against the float64 reference on the
    per-window mask before the plan may list them."""
    path = tmp_path / "window-cuda.wpk"
    wpk.build(window_model(rng, head_scale=(HEADS, 1, 1)), target="cuda",
              gpu=OFFLINE_PRESET, offline=True, output=str(path))
    with zipfile.ZipFile(path) as z:
        report = json.loads(z.read("report.json"))
        manifest = json.loads(z.read("manifest.json"))
    assert "Attention" in [s["op"] for s in manifest["steps"]]
    [item] = [w for w in report["workloads"] if w["op"] == "Attention"]
    fused = [c for c in item["candidates"] if c["impl"] == "cuda.fused"]
    assert fused and all(c["status"] == "ok" and "emulator" in c["message"] for c in fused)


@pytest.mark.parametrize("shape", [(HEADS, 1, 1), (IMAGES * WINDOWS, HEADS, 1, 1)],
                         ids=["per-head", "per-window-and-head"])
def test_swin_v2s_logit_scale_moves_onto_the_queries_and_the_attention_fuses(rng, shape):
    model = window_model(rng, head_scale=shape)
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    assert report.rules["head_scale_on_queries"] == 1
    assert report.rules["window_mask_unreshaped"] == 1 and report.rules["attention"] == 1
    counts = graph.op_counts()   # the queries' two factors: one elementwise chain
    assert counts.pop("Attention") == 1 and sum(counts.values()) == 1, counts
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert attention.attrs["scale"] == 1.0
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    (actual,) = run(to_onnx(graph), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options, why", [
    ({"head_scale": (HEADS, 1, TOKENS)}, "the factor varies along the keys"),
    ({"head_scale": (1,)}, "a scalar: the attention rule's own scale"),
    ({"head_scale": (HEADS, 1, 1), "extra_output": "scores"}, "the scores are an output"),
    ({"head_scale": (HEADS, 1, 1), "axis": 1}, "no softmax over the last axis follows"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_scale_that_is_no_per_head_factor_of_the_scores_stays_put(rng, options, why):
    model = window_model(rng, **options)
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    assert report.rules["head_scale_on_queries"] == 0, why
    feeds = feeds_of(model, rng)
    expected = run(model, feeds)
    actual = run(to_onnx(graph), feeds)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
