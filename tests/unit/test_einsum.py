"""Einsum lowering (`wpk.passes.einsum`): the equation reader, the rewrite against numpy's
einsum in float64 on random inputs (run by onnxruntime as the nodes are written), the node
patterns it writes, where it must leave the node, and whole builds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.frontend import load_model
from wpk.passes import optimize, to_onnx
from wpk.passes.base import check_graph
from wpk.passes.einsum import EinsumLowering, parse_equation
from wpk.runtime import Session

_ONNX_TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
               "int64": TensorProto.INT64, "int8": TensorProto.INT8}


def _einsum_model(equation: str, shapes, opset: int = 17, dtype: str = "float32",
                  constant: int | None = None) -> onnx.ModelProto:
    """One Einsum node over inputs x0, x1, ...; `constant`: that operand is an initializer
    (a weight, as Keras' EinsumDense has it)."""
    kind = _ONNX_TYPES[dtype]
    out_shape = np.einsum(equation.replace(" ", ""), *[np.zeros(s) for s in shapes]).shape
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, kind, s) for i, (n, s) in
              enumerate(zip(names, shapes)) if i != constant]
    inits = [] if constant is None else [numpy_helper.from_array(
        np.random.default_rng(3).standard_normal(shapes[constant]).astype(dtype),
        names[constant])]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)],
                              "einsum", inputs,
                              [helper.make_tensor_value_info("y", kind, list(out_shape))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = (rng.standard_normal(shape) * 3).astype(dtype)
    return feeds


def _as_written(model: onnx.ModelProto, feeds) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _numpy_einsum(model: onnx.ModelProto, feeds) -> np.ndarray:
    node = model.graph.node[0]
    equation = helper.get_attribute_value(node.attribute[0]).decode().replace(" ", "")
    values = {**feeds, **{t.name: numpy_helper.to_array(t) for t in model.graph.initializer}}
    return np.einsum(equation, *[values[n].astype(np.float64) for n in node.input])


# ------------------------------------------------------------------ the equation reader

def test_explicit_and_implicit_outputs():
    assert parse_equation("ij,jk->ik", [2, 2]).operands == ("ij", "jk")
    assert parse_equation("ij,jk->ik", [2, 2]).output == "ik"
    assert parse_equation("B G H I D, B G H J D -> B G H I J", [5, 5]).output == "BGHIJ"
    # implicit: the labels that occur once, sorted as numpy sorts them (upper case first)
    assert parse_equation("kj,ji", [2, 2]).output == "ik"
    assert parse_equation("bA,Ac", [2, 2]).output == "bc"
    assert parse_equation("Ab,bc", [2, 2]).output == "Ac"
    assert parse_equation("ii", [2]).output == ""


def test_ellipses_take_the_leading_dims_aligned_from_the_right():
    found = parse_equation("...ij,...jk->...ik", [4, 3])
    first, second = found.operands
    assert len(first) == 4 and len(second) == 3 and first[-2:] == "ij"
    assert first[1:2] == second[:1]            # the shared ellipsis dim
    assert found.output == first[:2] + "ik"
    implicit = parse_equation("...i,...i", [3, 3])
    assert implicit.output == implicit.operands[0][:2]


@pytest.mark.parametrize("equation,ranks", [
    ("ij,jk->ik", [2]),             # one term too many
    ("ij,jk->ik", [2, 3]),          # rank 3 for two labels and no ellipsis
    ("ij->ik", [2]),                # an output label no operand has
    ("ij->ii", [2]),                # an output label twice
    ("i1,1j->ij", [2, 2]),          # not a letter
    ("...i...,i->i", [3, 1]),       # two ellipses
    ("...ijk->k", [2]),             # the ellipsis would have a negative width
])
def test_malformed_equations_are_refused(equation, ranks):
    assert parse_equation(equation, ranks) is None


# ------------------------------------------------------------------ the rewrite

EQUATIONS = [
    ("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 6, 4)]),       # q.k^T
    ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 4)]),       # p.v
    ("B G H I D, B G H J D -> B G H I J", [(1, 2, 3, 5, 4), (1, 2, 3, 6, 4)]),   # MaxViT
    ("abc,cde->abde", [(2, 5, 6), (6, 3, 4)]),              # Keras EinsumDense
    ("abcd,cde->abe", [(2, 5, 3, 4), (3, 4, 6)]),           # its output projection
    ("aecd,abcd->acbe", [(2, 5, 3, 4), (2, 6, 3, 4)]),      # Keras attention scores
    ("acbe,aecd->abcd", [(2, 3, 6, 5), (2, 5, 3, 4)]),      # and its context
    ("ij,j->i", [(3, 4), (4,)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bij,bij->bij", [(2, 3, 4), (2, 3, 4)]),
    ("bij,bj->bij", [(2, 3, 4), (2, 4)]),
    ("ijk,ikl->jl", [(2, 3, 4), (2, 4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
    ("bii->bi", [(2, 4, 4)]),
    ("ii", [(3, 3)]),
    ("iii->i", [(3, 3, 3)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ijk->ki", [(2, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 6)]),   # broadcast batch dims
    ("...i,...i->...", [(2, 3, 4), (1, 3, 4)]),
    ("ab,b->", [(3, 1), (4,)]),                             # a shared label of size 1
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (5, 3, 4), (2, 4)]),         # a bilinear form
]


@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("equation,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_the_lowering_computes_the_equation(equation, shapes, opset):
    model = _einsum_model(equation, shapes, opset)
    graph, report = optimize(load_model(model), "cuda")   # no blocked layout: plain ONNX
    check_graph(graph)
    assert report.passes["einsum_lowering"] == 1
    assert "Einsum" not in graph.op_counts()
    feeds = _feeds(model)
    got = _as_written(to_onnx(graph), feeds)
    expected = _numpy_einsum(model, feeds)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def _lowered_ops(equation: str, shapes) -> list[str]:
    graph = load_model(_einsum_model(equation, shapes))
    return [node.op for node in EinsumLowering().run(graph).nodes]


def test_the_common_contractions_are_one_matmul():
    """What exporters' attention and dense layers become: the MatMul the GEMM kernels and
    the attention fusion take, a Transpose only where an operand's order needs it."""
    assert _lowered_ops("bhid,bhjd->bhij", [(1, 2, 5, 4), (1, 2, 6, 4)]) == ["Transpose",
                                                                            "MatMul"]
    assert _lowered_ops("bhij,bhjd->bhid", [(1, 2, 5, 6), (1, 2, 6, 4)]) == ["MatMul"]
    assert _lowered_ops("abc,cde->abde", [(1, 5, 6), (6, 3, 4)]) == [
        "Reshape", "MatMul", "Reshape"]   # the weight's reshape is folded with the weight
    # Keras' scores (key, query): the query goes first, so the product is already in the
    # output's order and q.k^T is the pattern the attention fusion knows
    assert _lowered_ops("aecd,abcd->acbe", [(1, 6, 2, 4), (1, 5, 2, 4)]) == [
        "Transpose", "Transpose", "MatMul"]
    assert _lowered_ops("bij,bij->bij", [(2, 3, 4), (2, 3, 4)]) == ["Mul"]
    assert _lowered_ops("ij->ji", [(3, 4)]) == ["Transpose"]
    assert _lowered_ops("ij->ij", [(3, 4)]) == ["Identity"]


def test_a_constant_operand_is_folded_into_the_weight():
    model = _einsum_model("abc,cde->abde", [(1, 5, 6), (6, 3, 4)], constant=1)
    graph, _ = optimize(load_model(model), "cuda")
    assert graph.op_counts() == {"MatMul": 1, "Reshape": 1}
    matmul = next(n for n in graph.nodes if n.op == "MatMul")
    assert graph.constants[matmul.inputs[1]].shape == (6, 12)


@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_other_types_matmul_takes(dtype):
    model = _einsum_model("ij,jk->ik", [(3, 4), (4, 5)], dtype=dtype)
    graph, _ = optimize(load_model(model), "cuda")
    assert graph.op_counts() == {"MatMul": 1}
    feeds = {k: np.round(v).astype(dtype) for k, v in _feeds(model).items()}
    np.testing.assert_array_equal(_as_written(to_onnx(graph), feeds),
                                  np.einsum("ij,jk->ik", feeds["x0"], feeds["x1"]))


def test_a_type_matmul_does_not_take_stays_einsum():
    """int8: MatMul has no int8 form, onnxruntime runs the Einsum as before."""
    graph, report = optimize(load_model(_einsum_model("ij,jk->ik", [(3, 4), (4, 5)],
                                                      dtype="int8")), "cpu")
    assert graph.op_counts() == {"Einsum": 1} and report.passes["einsum_lowering"] == 0


# ------------------------------------------------------------------ whole builds

def _einsum_attention(rank5: bool) -> onnx.ModelProto:
    """softmax(einsum(q * scale, k) [+ bias]) einsum v, as torch exports lucidrains' ViT
    attention (rank 4) and torchvision's MaxViT (rank 5, a relative position bias)."""
    rng = np.random.default_rng(2)
    lead, labels = ((1, 3, 2), "bghid,bghjd->bghij") if rank5 else ((1, 3), "bhid,bhjd->bhij")
    q_shape = (*lead, 7, 8)
    context = "bghij,bghjd->bghid" if rank5 else "bhij,bhjd->bhid"
    bias = numpy_helper.from_array(rng.standard_normal((lead[-1], 7, 7)).astype(np.float32),
                                   "bias")
    scale = numpy_helper.from_array(np.array(8 ** -0.5, np.float32), "scale")
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Einsum", ["qs", "k"], ["scores"], equation=labels),
             helper.make_node("Add", ["scores", "bias"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
             helper.make_node("Einsum", ["probs", "v"], ["y"], equation=context)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, q_shape) for n in "qkv"]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, q_shape)],
                              [bias, scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("rank5", [False, True], ids=["rank4", "rank5"])
def test_einsum_attention_builds_without_fallbacks_and_matches(rank5):
    import wpk

    model = _einsum_attention(rank5)
    graph, _ = optimize(load_model(model), "cpu")
    # the lowered pattern is the one the attention fusion takes (rank 5: the kernels fold
    # the windows into the batch)
    assert graph.op_counts() == {"Attention": 1}
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    assert not [w["label"] for w in plan.report["workloads"] if w["fallback"]]
    feeds = _feeds(model, seed=4)
    ours = Session(plan).run(feeds)["y"]
    theirs = _as_written(model, feeds)
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-5


# ------------------------------------------------------------------ Keras' EinsumDense bias

def _dense_then_split(bias_shape, split=(3, 4), twice=False) -> onnx.ModelProto:
    """x @ W -> Reshape [1, 5, *split] -> Add bias -> Mul 0.25 (an EinsumDense projection
    and the query's scale, as the einsum lowering leaves them); `twice`: the product is
    also a graph output."""
    rng = np.random.default_rng(6)
    n = int(np.prod(split))
    inits = [numpy_helper.from_array(rng.standard_normal((6, n)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 5, *split], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0.25, np.float32), "s")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["heads"]),
             helper.make_node("Add", ["heads", "b"], ["biased"]),
             helper.make_node("Mul", ["biased", "s"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, *split])]
    if twice:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 5, n]))
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 5, 6])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bias_shape", [(3, 4), (4,), (3, 1), ()])
def test_a_bias_and_scale_after_the_head_split_join_the_matmul(bias_shape):
    model = _dense_then_split(bias_shape)
    graph, report = optimize(load_model(model), "cuda")
    assert report.rules["bias_before_head_split"] == 2
    assert graph.op_counts() == {"MatMul": 1, "Reshape": 1}
    matmul = next(n for n in graph.nodes if n.op == "MatMul")
    assert [step.op for step in matmul.epilogue] == ["add", "mul"]
    feeds = _feeds(model)
    np.testing.assert_allclose(_as_written(to_onnx(graph), feeds), _as_written(model, feeds),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias_shape, split, twice", [
    ((5, 1, 1), (3, 4), False),     # the constant varies along the tokens, not the heads
    ((3, 4), (3, 4), True),         # the product is read elsewhere too
], ids=["over-leading-dims", "product-read-twice"])
def test_the_bias_stays_where_it_cannot_move(bias_shape, split, twice):
    graph, report = optimize(load_model(_dense_then_split(bias_shape, split, twice)), "cuda")
    assert report.rules["bias_before_head_split"] == 0
    assert "Add" in graph.op_counts() or "Elementwise" in graph.op_counts()
