"""The attention fusion pass (`wpk.passes.attention`): where it fires, the graph it leaves
(checked by running it through `to_onnx` in onnxruntime against the original model), and
every case where it must not fire."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.frontend import load_model
from wpk.passes import optimize, rule_docs, to_onnx
from wpk.passes.attention import ATTENTION_RULES
from wpk.passes.base import check_graph
from wpk.passes.fusion import FusionPass

B, H, S, D = 2, 3, 11, 8


def attention_model(*, scale_op: str = "Div", mask: tuple[int, ...] | None = (B, 1, 1, S),
                    k_transposed: bool = False, axis: int = -1, rank: int = 4,
                    scale_input: bool = False, dtype=TensorProto.FLOAT,
                    extra_outputs: tuple[str, ...] = (), opset: int = 17,
                    output_shape: bool = True, pre_scale: str = "") -> onnx.ModelProto:
    """Q, K, V graph inputs -> attention as exporters write it (see the pass's docstring)."""
    lead = [B, H] if rank == 4 else [B * H]
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    k_shape = lead + ([D, S] if k_transposed else [S, D])
    inputs = [h.make_tensor_value_info("q", dtype, lead + [S, D]),
              h.make_tensor_value_info("k", dtype, k_shape),
              h.make_tensor_value_info("v", dtype, lead + [S, D])]
    nodes, inits = [], []
    kt = "k"
    if not k_transposed:
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        nodes.append(h.make_node("Transpose", ["k"], ["kt"], perm=perm))
        kt = "kt"
    q = "q"
    if "q" in pre_scale:   # torch/paddle: q * s, or q * sqrt(s) and k^T * sqrt(s)
        inits.append(numpy_helper.from_array(np.array(0.5, np_dtype), "half"))
        nodes.append(h.make_node("Mul", ["q", "half"], ["q_scaled"]))
        q = "q_scaled"
    if "k" in pre_scale:
        nodes.append(h.make_node("Mul", [kt, "half"], ["kt_scaled"]))
        kt = "kt_scaled"
    nodes.append(h.make_node("MatMul", [q, kt], ["scores"]))
    logits = "scores"
    if scale_op:
        value = math.sqrt(D) if scale_op == "Div" else 1 / math.sqrt(D)
        if scale_input:
            inputs.append(h.make_tensor_value_info("scale", dtype, []))
        else:
            inits.append(numpy_helper.from_array(np.array(value, np_dtype), "scale"))
        nodes.append(h.make_node(scale_op, [logits, "scale"], ["scaled"]))
        logits = "scaled"
    if mask is not None:
        inputs.append(h.make_tensor_value_info("mask", dtype, list(mask)))
        nodes.append(h.make_node("Add", ["mask", logits], ["masked"]))
        logits = "masked"
    nodes.append(h.make_node("Softmax", [logits], ["probs"], axis=axis))
    nodes.append(h.make_node("MatMul", ["probs", "v"], ["y"]))
    outputs = [h.make_tensor_value_info("y", dtype, lead + [S, D] if output_shape else None)]
    outputs += [h.make_tensor_value_info(name, dtype, None) for name in extra_outputs]
    graph = h.make_graph(nodes, "attention", inputs, outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def feeds_of(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(dims).astype(dtype)
    if "mask" in feeds:   # a padding mask: a few keys masked away
        feeds["mask"] = np.where(feeds["mask"] > 1.0, -10000.0, 0.0).astype(feeds["mask"].dtype)
    if "scale" in feeds:
        feeds["scale"] = np.array(0.3, feeds["scale"].dtype)
    return feeds


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def fused(model: onnx.ModelProto) -> tuple[Graph, int]:
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    return graph, report.rules.get("attention", 0)


@pytest.mark.parametrize("options", [
    {}, {"scale_op": "Mul"}, {"mask": None}, {"mask": (1, 1, S, S)}, {"mask": (S,)},
    {"k_transposed": True}, {"rank": 3, "mask": (1, S, S)}, {"scale_op": ""},
    {"axis": 3, "opset": 11}, {"mask": (B, H, S, S), "scale_op": "Mul", "k_transposed": True},
    {"pre_scale": "q", "scale_op": ""}, {"pre_scale": "qk", "scale_op": ""},
    {"pre_scale": "qk", "k_transposed": True},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "bert")
def test_attention_becomes_one_node_that_computes_the_same(rng, options):
    model = attention_model(**options)
    graph, hits = fused(model)
    assert hits == 1
    assert graph.op_counts() == {"Attention": 1}
    (node,) = graph.nodes
    assert node.domain == "wpk" and node.outputs == ["y"]
    assert node.attrs["k_transposed"] == int(options.get("k_transposed", False))
    scale = 1.0 if options.get("scale_op") == "" else 1 / math.sqrt(D)
    scale *= 0.5 ** len(options.get("pre_scale", ""))
    assert node.attrs["scale"] == pytest.approx(scale, rel=1e-6)
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    (actual,) = run(to_onnx(graph), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def head_split_model(k_perm: tuple[int, ...]) -> onnx.ModelProto:
    """Q, K, V of [B, S, H*D] split into heads as torch exports a BERT layer: Reshape to
    [B, S, H, D], then Transpose (0, 2, 1, 3) for Q and V and `k_perm` for K."""
    nodes = [h.make_node("Constant", [], ["heads"], value=numpy_helper.from_array(
        np.array([B, S, H, D], np.int64)))]
    for name, perm in (("q", (0, 2, 1, 3)), ("k", k_perm), ("v", (0, 2, 1, 3))):
        nodes.append(h.make_node("Reshape", [name, "heads"], [f"{name}_4d"]))
        nodes.append(h.make_node("Transpose", [f"{name}_4d"], [f"{name}_h"], perm=list(perm)))
    nodes += [h.make_node("MatMul", ["q_h", "k_h"], ["scores"]),
              h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              h.make_node("MatMul", ["probs", "v_h"], ["y"])]
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, H * D]) for n in "qkv"]
    graph = h.make_graph(nodes, "heads", inputs,
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])])
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def test_the_head_split_of_k_is_flipped_to_copy_rows(rng):
    """K^T made by Transpose (0, 2, 3, 1) of [B, S, H, D] moves the innermost dim (a strided
    copy of each element): the pass makes K by (0, 2, 1, 3) instead, as Q and V, and the
    fused op reads K; the result is unchanged."""
    model = head_split_model((0, 2, 3, 1))
    graph, hits = fused(model)
    assert hits == 1
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert attention.attrs["k_transposed"] == 0
    k_transpose = next(n for n in graph.nodes if n.outputs == [attention.inputs[1]])
    assert tuple(k_transpose.attrs["perm"]) == (0, 2, 1, 3)
    assert tuple(graph.tensors[attention.inputs[1]].shape) == (B, H, S, D)
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_k_transpose_that_keeps_the_innermost_dim_is_not_flipped(rng):
    """K^T = Transpose (1, 0, 2, 3) of [H, B, D, S] copies whole rows already; flipped it
    would move the innermost dim, so the fused op reads K^T as it is."""
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[1, 0, 2, 3]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    inputs = [h.make_tensor_value_info("q", TensorProto.FLOAT, [B, H, S, D]),
              h.make_tensor_value_info("k", TensorProto.FLOAT, [H, B, D, S]),
              h.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, S, D])]
    model = onnx.shape_inference.infer_shapes(h.make_model(
        h.make_graph(nodes, "kt", inputs,
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])]),
        opset_imports=[h.make_opsetid("", 17)]))
    graph, hits = fused(model)
    assert hits == 1
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert attention.attrs["k_transposed"] == 1
    (transpose,) = [n for n in graph.nodes if n.op == "Transpose"]
    assert tuple(transpose.attrs["perm"]) == (1, 0, 2, 3)
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_key_transpose_read_as_both_operands_is_neither_flipped_nor_absorbed(rng, target):
    """Found by the passes' fuzzer (CLIP's dynamo export with Q's input rewired to K^T,
    square since seq == head dim): scores = K^T @ K^T, the K^T made by the head split's
    Transpose (0, 2, 3, 1). The MatMul is that Transpose's only reader, through both slots;
    the rule flipped the Transpose to make K for the key slot and the query slot read K
    too (0.82 relative L2 off onnxruntime). A node reading a tensor twice is no single
    reader now (`FusionContext.single_user`): the graph keeps computing K^T @ K^T."""
    side = 8
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             h.make_node("MatMul", ["kt", "kt"], ["scores"]),
             h.make_node("Div", ["scores", "scale"], ["scaled"]),
             h.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    inputs = [h.make_tensor_value_info("k", TensorProto.FLOAT, [B, side, H, side]),
              h.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, side, side])]
    scale = numpy_helper.from_array(np.array(math.sqrt(side), np.float32), "scale")
    model = onnx.shape_inference.infer_shapes(h.make_model(
        h.make_graph(nodes, "kt_kt", inputs,
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, side, side])],
                     [scale]),
        opset_imports=[h.make_opsetid("", 17)]))
    graph, _ = optimize(load_model(model), target)
    check_graph(graph)
    (transpose,) = [n for n in graph.nodes if n.op == "Transpose"]
    assert tuple(transpose.attrs["perm"]) == (0, 2, 3, 1)
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_the_rule_is_documented_and_runs_for_the_cpu_and_cuda():
    assert "attention" in rule_docs("cpu") and "attention" in rule_docs()
    assert "attention" in rule_docs("cuda")   # the CUDA target has a fused kernel too
    graph, report = optimize(load_model(attention_model()), "cuda")
    assert graph.op_counts().get("Attention") == 1 and report.rules["attention"] == 1


@pytest.mark.parametrize("options, why", [
    ({"axis": 2}, "softmax over another axis"),
    ({"axis": 1, "opset": 11}, "opset 11 default-like axis: a 2-D coercion at dim 1"),
    ({"scale_input": True}, "scale is no constant"),
    ({"extra_outputs": ("scores",)}, "scores are a graph output"),
    ({"extra_outputs": ("probs",)}, "probabilities are a graph output"),
    ({"extra_outputs": ("scaled",)}, "scaled scores are a graph output"),
    ({"dtype": TensorProto.DOUBLE}, "float64"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_the_pass_does_not_fire(options, why):
    graph, hits = fused(attention_model(**options))
    assert hits == 0, why
    assert "Attention" not in graph.op_counts()
    assert "Softmax" in graph.op_counts()


def test_a_score_read_by_another_node_keeps_the_pattern_apart():
    model = attention_model()
    extra = h.make_node("ReduceMax", ["scores"], ["peak"], keepdims=1, axes=[-1])
    model.graph.node.insert(len(model.graph.node) - 2, extra)
    model.graph.output.append(h.make_tensor_value_info("peak", TensorProto.FLOAT, None))
    graph, hits = fused(onnx.shape_inference.infer_shapes(model))
    assert hits == 0 and "Softmax" in graph.op_counts()


def test_a_mask_that_would_grow_the_scores_does_not_fuse():
    """Add(scores, mask) where the mask broadcasts the scores up ([B,H,S,S] + [2,B,H,S,S])
    is no attention mask."""
    graph, hits = fused(attention_model(mask=(2, B, H, S, S), output_shape=False))
    assert hits == 0 and "Softmax" in graph.op_counts()


def _hand_graph(shape_q: tuple[int, ...]) -> Graph:
    """MatMul -> Softmax -> MatMul with Q's shape as given (unknown dims as -1)."""
    known = (B, H, S, D)
    tensors = {"q": TensorInfo(shape_q), "kt": TensorInfo((B, H, D, S)),
               "v": TensorInfo(known), "s": TensorInfo((B, H, S, S)),
               "p": TensorInfo((B, H, S, S)), "y": TensorInfo(known)}
    nodes = [Node("MatMul", ["q", "kt"], ["s"], "scores"),
             Node("Softmax", ["s"], ["p"], "softmax", {"axis": -1}),
             Node("MatMul", ["p", "v"], ["y"], "context")]
    return Graph(nodes, ["q", "kt", "v"], ["y"], tensors)


def test_unknown_shapes_do_not_fuse():
    fusion = FusionPass("attention_fusion", ATTENTION_RULES)
    graph = fusion.run(_hand_graph((B, -1, S, D)))
    assert not fusion.hits and [n.op for n in graph.nodes] == ["MatMul", "Softmax", "MatMul"]
    fusion = FusionPass("attention_fusion", ATTENTION_RULES)
    graph = fusion.run(_hand_graph((B, H, S, D)))   # the same graph with shapes fires
    assert fusion.hits["attention"] == 1 and [n.op for n in graph.nodes] == ["Attention"]


def test_the_suite_transformer_plans_the_fused_op_against_onnxruntime(rng):
    """A build of the suite's encoder layer measures (and verifies) the generated kernel and
    onnxruntime's nodes for the one attention workload, and its plan computes the model."""
    import wpk
    from tests.models import transformer_encoder
    from wpk.runtime import Session

    model = transformer_encoder(seq_len=24, d_model=64, heads=2, ffn=128)
    plan = wpk.build(model, target="cpu")
    (item,) = [w for w in plan.report["workloads"] if w["op"] == "Attention"]
    statuses = {c["impl"]: c["status"] for c in item["candidates"]}
    assert statuses == {"attention.c": "ok", "ort.attention": "ok"}
    assert all(c["rel_l2_error"] < 1e-5 for c in item["candidates"])
    assert item["chosen_impl"] in statuses
    x = rng.standard_normal((1, 24, 64)).astype(np.float32)
    (expected,) = run(model, {"input": x})
    (actual,) = Session(plan).run({"input": x}).values()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_swap_between_reshapes_of_the_leading_dims_is_absorbed(rng):
    """torch's dynamo export of K^T: [B, H, S, D] -> Reshape [B*H, S, D] -> Transpose
    (0, 2, 1) -> Reshape [B, H, D, S]: the fused op reads K where it lies, with none of the
    three nodes (the Transpose was a strided copy of every element)."""
    nodes = [h.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(
                 np.array([B * H, S, D], np.int64))),
             h.make_node("Constant", [], ["heads"], value=numpy_helper.from_array(
                 np.array([B, H, D, S], np.int64))),
             h.make_node("Reshape", ["k", "flat"], ["k3"]),
             h.make_node("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
             h.make_node("Reshape", ["kt3", "heads"], ["kt"]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    model = onnx.shape_inference.infer_shapes(h.make_model(h.make_graph(
        nodes, "dynamo_k", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[h.make_opsetid("", 17)]))
    graph, hits = fused(model)
    assert hits == 1 and graph.op_counts() == {"Attention": 1}
    (attention,) = graph.nodes
    assert attention.inputs[:3] == ["q", "k", "v"] and attention.attrs["k_transposed"] == 0
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_reshapes_that_move_the_last_two_dims_are_not_looked_through(rng):
    """[B, H, S, D] -> Reshape [B, H, D, S] is no transpose: nothing is absorbed."""
    nodes = [h.make_node("Constant", [], ["odd"], value=numpy_helper.from_array(
                 np.array([B, H, D, S], np.int64))),
             h.make_node("Reshape", ["k", "odd"], ["kt"]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    model = onnx.shape_inference.infer_shapes(h.make_model(h.make_graph(
        nodes, "odd_k", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[h.make_opsetid("", 17)]))
    graph, hits = fused(model)
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert attention.inputs[1] == "kt" and attention.attrs["k_transposed"] == 1
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_swap_of_a_sliced_head_split_makes_k_by_one_reshape(rng):
    """As torch's dynamo exports a ViT: K is one of three heads slices [1, 1, H, S, D] of a
    QKV tensor, reshaped to [H, S, D], swapped, reshaped to [1, H, D, S]. The first Reshape
    now makes K ([1, H, S, D], a view of the slice), the Transpose and the second go."""
    nodes = [h.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(
                 np.array([H, S, D], np.int64))),
             h.make_node("Constant", [], ["heads"], value=numpy_helper.from_array(
                 np.array([1, H, D, S], np.int64))),
             h.make_node("Reshape", ["k5", "flat"], ["k3"]),
             h.make_node("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
             h.make_node("Reshape", ["kt3", "heads"], ["kt"]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    inputs = [h.make_tensor_value_info("q", TensorProto.FLOAT, [1, H, S, D]),
              h.make_tensor_value_info("k5", TensorProto.FLOAT, [1, 1, H, S, D]),
              h.make_tensor_value_info("v", TensorProto.FLOAT, [1, H, S, D])]
    model = onnx.shape_inference.infer_shapes(h.make_model(h.make_graph(
        nodes, "vit_k", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[h.make_opsetid("", 17)]))
    graph, hits = fused(model)
    assert hits == 1 and graph.op_counts() == {"Reshape": 1, "Attention": 1}
    reshape, attention = graph.nodes
    assert reshape.inputs[0] == "k5" and attention.inputs[1] == reshape.outputs[0]
    assert tuple(graph.tensors[reshape.outputs[0]].shape) == (1, H, S, D)
    assert attention.attrs["k_transposed"] == 0
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def bert_heads_model(merge: bool = True) -> onnx.ModelProto:
    """Q, K, V of [B, S, H*D] split into heads by Reshape and Transpose (0, 2, 1, 3) (K by
    (0, 2, 3, 1), which the attention pass flips), attention, and, with `merge`, the heads
    merged back by Transpose (0, 2, 1, 3) and Reshape, as BERT exports write it."""
    model = head_split_model((0, 2, 3, 1))
    if not merge:
        return model
    graph = model.graph
    flat = numpy_helper.from_array(np.array([B, S, H * D], np.int64), "flat")
    graph.node.extend([h.make_node("Transpose", ["y"], ["y_merged"], perm=[0, 2, 1, 3]),
                       h.make_node("Reshape", ["y_merged", "flat"], ["out"])])
    graph.initializer.append(flat)
    del graph.output[:]
    del graph.value_info[:]
    graph.output.append(h.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, H * D]))
    return onnx.shape_inference.infer_shapes(model)


def test_the_heads_transposes_around_attention_are_absorbed_on_the_cpu(rng):
    """Q's, K's (flipped) and V's split Transposes and the output's merge go: the fused op
    reads and writes [B, S, H, D] (attribute bshd), and the graph computes the same."""
    model = bert_heads_model()
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    assert report.rules.get("attention_heads") == 1
    assert graph.op_counts() == {"Reshape": 4, "Attention": 1}
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert tuple(attention.attrs["bshd"]) == (1, 1, 1, 1)
    assert attention.attrs["k_transposed"] == 0
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_the_heads_stay_apart_without_a_merge_and_on_cuda():
    """No merge Transpose after the op (its output is read as [B, H, S, D]): nothing is
    absorbed; and the CUDA kernels read [B, H, S, D] only, so the rule is the CPU's."""
    graph, report = optimize(load_model(bert_heads_model(merge=False)), "cpu")
    assert not report.rules.get("attention_heads")
    assert all(not n.attr("bshd") for n in graph.nodes if n.op == "Attention")
    graph, report = optimize(load_model(bert_heads_model()), "cuda")
    assert report.rules.get("attention") == 1 and not report.rules.get("attention_heads")
    assert graph.op_counts().get("Transpose") == 4


def packed_qkv_model(extra_reader: bool = False, split: tuple[int, ...] | None = None
                     ) -> onnx.ModelProto:
    """torch dynamo's ViT head split: the packed QKV [B, S, 3*H*D] reshaped to
    [B, S, 3, H, D], Transpose (2, 0, 3, 1, 4), three slices of axis 0, each squeezed to
    [B, H, S, D]; attention; the heads merged by Transpose (0, 2, 1, 3) and Reshape. With
    `extra_reader`, V's slice is a graph output too. With `split` (its sizes), one Split
    of axis 0 instead of the slices, as TorchScript exports `unbind(0)`: (1, 1, 1), or
    (1, 2) where K and V stay together (then K is that piece's first index)."""
    def const(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [h.make_node("Reshape", ["x", "packed_shape"], ["packed"]),
             h.make_node("Transpose", ["packed"], ["heads"], perm=[2, 0, 3, 1, 4])]
    if split is None:
        nodes += [h.make_node("Slice", ["heads", f"s{i}", f"e{i}", "axis0"], [f"{name}5"])
                  for i, name in enumerate("qkv")]
    else:
        pieces = ["q5", "k5", "v5"] if len(split) == 3 else ["q5", "kv5"]
        nodes.append(h.make_node("Split", ["heads", "sizes"], pieces, axis=0))
        if len(split) == 2:
            nodes += [h.make_node("Slice", ["kv5", f"s{i}", f"e{i}", "axis0"], [f"{n}5"])
                      for i, n in enumerate("kv")]
    nodes += [h.make_node("Squeeze", [f"{name}5", "axis0"], [name]) for name in "qkv"]
    nodes += [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              h.make_node("MatMul", ["q", "kt"], ["scores"]),
              h.make_node("Div", ["scores", "root"], ["scaled"]),
              h.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
              h.make_node("MatMul", ["probs", "v"], ["y"]),
              h.make_node("Transpose", ["y"], ["y_merged"], perm=[0, 2, 1, 3]),
              h.make_node("Reshape", ["y_merged", "flat"], ["out"])]
    inits = [const("packed_shape", [B, S, 3, H, D]), const("axis0", [0]),
             const("flat", [B, S, H * D]),
             numpy_helper.from_array(np.array(D ** 0.5, np.float32), "root")]
    inits += [const(f"s{i}", [i]) for i in range(3)] + [const(f"e{i}", [i + 1])
                                                        for i in range(3)]
    if split is not None:
        inits.append(const("sizes", list(split)))
    outputs = [h.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, H * D])]
    if extra_reader:
        outputs.append(h.make_tensor_value_info("v5", TensorProto.FLOAT, [1, B, H, S, D]))
    model = h.make_model(h.make_graph(
        nodes, "packed_qkv", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [B, S, 3 * H * D])],
        outputs, inits), opset_imports=[h.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("split", [None, (1, 1, 1)], ids=["slices", "split"])
def test_a_packed_qkv_split_becomes_slices_of_the_packed_tensor(rng, split):
    """The packed tensor's Transpose goes: Q, K and V are slices of its axis 2 read where
    they lie ([B, S, H, D]: bshd on all three and the output), one copy of the packed
    tensor instead of two; the graph computes the same. From dynamo's three Slices or
    TorchScript's one Split alike."""
    model = packed_qkv_model(split=split)
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    assert report.passes.get("packed_qkv") == 1 and report.rules.get("attention_heads") == 1
    assert "Transpose" not in graph.op_counts() and graph.op_counts()["Slice"] == 3
    (attention,) = [n for n in graph.nodes if n.op == "Attention"]
    assert tuple(attention.attrs["bshd"]) == (1, 1, 1, 1)
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_packed_split_read_elsewhere_stays_and_cuda_keeps_it():
    """A slice read by another node too (here a graph output) keeps the Transpose; the
    rewrite is the CPU's (its Transposes are absorbed by the CPU's heads rule)."""
    graph, report = optimize(load_model(packed_qkv_model(extra_reader=True)), "cpu")
    assert not report.passes.get("packed_qkv")
    assert any(n.op == "Transpose" and tuple(n.attrs["perm"]) == (2, 0, 3, 1, 4)
               for n in graph.nodes)
    graph, report = optimize(load_model(packed_qkv_model()), "cuda")
    assert "packed_qkv" not in report.passes


def test_a_split_whose_pieces_are_not_single_indices_keeps_the_transpose(rng):
    """A Split of axis 0 into pieces of 1 and 2 (K and V kept together, sliced later) is
    not the unbind the pass rewrites: the Transpose stays and the graph computes the
    same."""
    model = packed_qkv_model(split=(1, 2))
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    assert not report.passes.get("packed_qkv")
    assert any(n.op == "Transpose" and tuple(n.attrs["perm"]) == (2, 0, 3, 1, 4)
               for n in graph.nodes)
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def masked_fill_model(*, fill: float = -np.inf, keep_first: bool = True,
                      condition: str = "causal", consumer: str = "Softmax") -> onnx.ModelProto:
    """Causal attention as torch's masked_fill writes it (nanoGPT): Where(keep, scores, fill)
    or Where(drop, fill, scores) on the scaled scores, then Softmax and the context MatMul.
    `condition`: causal (a constant), input (a graph input) or row (a constant whose first
    query row keeps no key)."""
    keep = np.tril(np.ones((S, S), bool))
    if condition == "row":
        keep[0] = False
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    inits = [numpy_helper.from_array(np.array(1 / math.sqrt(D), np.float32), "scale"),
             numpy_helper.from_array(np.array(fill, np.float32), "fill")]
    if condition == "input":
        inputs.append(h.make_tensor_value_info("cond", TensorProto.BOOL, [S, S]))
    else:
        inits.append(numpy_helper.from_array(keep if keep_first else ~keep, "cond"))
    where_inputs = ["cond", "scaled", "fill"] if keep_first else ["cond", "fill", "scaled"]
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Mul", ["scores", "scale"], ["scaled"]),
             h.make_node("Where", where_inputs, ["masked"]),
             h.make_node(consumer, ["masked"], ["probs"], **({"axis": -1}
                                                             if consumer == "Softmax" else {})),
             h.make_node("MatMul", ["probs", "v"], ["y"])]
    graph = h.make_graph(nodes, "masked_fill", inputs,
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])], inits)
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


@pytest.mark.parametrize("fill, keep_first", [(-np.inf, True), (-np.inf, False),
                                              (np.finfo(np.float32).min, True)],
                         ids=["nanogpt", "drop-mask", "hf-finfo-min"])
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_causal_masked_fill_fuses_into_attention(rng, fill, keep_first, target):
    """Rule `masked_fill_as_mask` makes the Where an Add of a constant 0 / fill mask,
    which the attention rule fuses; the graph computes what the model did. (The CUDA
    kernel on such masks: tests/unit/test_cuda_fused.py, in the emulator.)"""
    model = masked_fill_model(fill=fill, keep_first=keep_first)
    graph, report = optimize(load_model(model), target)
    check_graph(graph)
    assert report.rules["masked_fill_as_mask"] == 1 and report.rules["attention"] == 1
    assert graph.op_counts() == {"Attention": 1}
    mask = graph.constants[graph.nodes[0].inputs[3]]
    assert mask.shape == (S, S) and mask[0, 0] == 0 and mask[0, 1] == fill
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    (actual,) = run(to_onnx(graph), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options, why", [
    ({"condition": "input"}, "the mask is not a constant"),
    ({"fill": -1e4}, "a fill a score does not swamp (old BERT's -10000)"),
    ({"condition": "row"}, "a query row keeps no key: uniform after Where, not after Add"),
    ({"consumer": "Relu"}, "no softmax reads it"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_masked_fill_that_is_no_additive_mask_stays(options, why):
    graph, report = optimize(load_model(masked_fill_model(**options)), "cpu")
    assert report.rules["masked_fill_as_mask"] == 0, why
    assert "Where" in graph.op_counts()


def sdpa_model(*, guard_zero: float = 0.0, extra_reader: bool = False) -> onnx.ModelProto:
    """torch.onnx's export of scaled_dot_product_attention with a boolean mask (Hugging
    Face's BERT): q * sqrt(s) @ k^T * sqrt(s), + Where(keep, 0, -inf), Softmax, then the NaN
    guard Where(IsNaN(P), 0, P) before the context MatMul. `keep` is an input [B, 1, S, S]."""
    root = np.float32(D ** -0.25)
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    inputs.append(h.make_tensor_value_info("keep", TensorProto.BOOL, [B, 1, S, S]))
    inits = [numpy_helper.from_array(np.array(root), "root"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
             numpy_helper.from_array(np.array(guard_zero, np.float32), "guard")]
    nodes = [h.make_node("Mul", ["q", "root"], ["qs"]),
             h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("Mul", ["kt", "root"], ["kts"]),
             h.make_node("MatMul", ["qs", "kts"], ["scores"]),
             h.make_node("Where", ["keep", "zero", "minus_inf"], ["bias"]),
             h.make_node("Add", ["scores", "bias"], ["logits"]),
             h.make_node("Softmax", ["logits"], ["probs"], axis=-1),
             h.make_node("IsNaN", ["probs"], ["nan"]),
             h.make_node("Where", ["nan", "guard", "probs"], ["guarded"]),
             h.make_node("MatMul", ["guarded", "v"], ["y"])]
    outputs = [h.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])]
    if extra_reader:
        outputs.append(h.make_tensor_value_info("probs", TensorProto.FLOAT, [B, H, S, S]))
    graph = h.make_graph(nodes, "sdpa", inputs, outputs, inits)
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def sdpa_feeds(model: onnx.ModelProto, rng) -> dict[str, np.ndarray]:
    """Random q, k, v; a padding mask keeping the first 7 keys of image 0 and no key at all
    in query row 2 of image 1 (its softmax is NaN, the guard's zeros)."""
    feeds = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in "qkv"}
    keep = np.ones((B, 1, S, S), bool)
    keep[0, :, :, 7:] = False
    keep[1, :, 2, :] = False
    feeds["keep"] = keep
    return feeds


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_torchs_nan_guard_moves_past_the_product_and_attention_fuses(rng, target):
    """Pass `softmax_nan_guard` puts the guard on the context product, the attention rule
    fuses the rest (both-sides scale, the Where-made mask); the graph computes the model,
    the fully masked row's zeros included."""
    model = sdpa_model()
    graph, report = optimize(load_model(model), target)
    check_graph(graph)
    assert report.passes["softmax_nan_guard"] == 1 and report.rules["attention"] == 1
    assert "Softmax" not in graph.op_counts() and graph.op_counts()["IsNaN"] == 1
    feeds = sdpa_feeds(model, rng)
    (expected,) = run(model, feeds)
    assert np.all(expected[1, :, 2] == 0)
    (actual,) = run(to_onnx(graph), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_a_plan_of_torchs_guarded_attention_gives_the_masked_rows_zeros(rng):
    """wpk's plan (the fused kernel and the moved guard) against onnxruntime on the model,
    a query row with no key among the inputs."""
    import wpk
    from wpk.runtime import Session

    model = sdpa_model()
    plan = wpk.build(model, target="cpu", search="none", progress=False, partition=False)
    assert any(w["op"] == "Attention" for w in plan.report["workloads"])
    feeds = sdpa_feeds(model, rng)
    (expected,) = run(model, feeds)
    (actual,) = Session(plan).run(feeds).values()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options, why", [
    ({"guard_zero": 1.0}, "the guard fills with 1, not 0"),
    ({"extra_reader": True}, "the probabilities are a graph output too"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_guard_that_is_not_torchs_stays(options, why):
    model = sdpa_model(**options)
    graph, report = optimize(load_model(model), "cpu")
    assert report.passes["softmax_nan_guard"] == 0 and report.rules["attention"] == 0, why
