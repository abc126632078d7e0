"""Graph passes: every rule on a hand-built model and the nine light models, checked by
running the graph before and after the passes in onnxruntime (via `to_onnx`)."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

from tests.unit.nchwc_support import evaluate
from wpk.core.graph import Graph
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep
from wpk.frontend import load_model
from wpk.passes import (
    PIPELINE,
    PassReport,
    PipelineEntry,
    optimize,
    passes_for,
    rule_docs,
    to_onnx,
)
from wpk.passes.base import check_graph

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))
# The target-independent passes: target 'cpu' adds the NCHWc layout pass (wpk.nchwc ops,
# which onnxruntime cannot run and which has its own tests).
TARGET = "cuda"


# ------------------------------------------------------------------ helpers

def run_ort(graph: Graph, feeds: dict) -> list[np.ndarray]:
    """Run the graph in onnxruntime; big constants are fed as inputs (no serializing)."""
    graph = graph.copy()
    feeds = dict(feeds)
    for name, value in list(graph.constants.items()):
        if value.size > 1 << 16:
            feeds[name] = np.asarray(graph.constants.pop(name), order="C")
            graph.inputs.append(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(list(graph.outputs), feeds)


def rel_l2(expected: np.ndarray, actual: np.ndarray) -> float:
    return relative_l2(actual, expected)


def assert_equivalent(before: Graph, after: Graph, rng, tol: float = 1e-5,
                      run_after=None) -> None:
    """`after` computes `before`'s outputs on random inputs (`run_after(graph, feeds)`: its
    outputs in order; onnxruntime by default)."""
    assert after.outputs == before.outputs
    feeds = {name: rng.standard_normal(before.tensors[name].shape).astype(
        before.tensors[name].dtype) for name in before.inputs}
    for expected, actual in zip(run_ort(before, feeds), (run_after or run_ort)(after, feeds)):
        assert expected.shape == actual.shape
        assert rel_l2(expected, actual) <= tol


def randomize_weights(graph: Graph, rng) -> None:
    """Seeded weights (the light models' ConstantOfShape weights are all 0.02).

    Big tensors repeat a random block of 2^20 values, which is as good for catching
    wrong folds and much cheaper than drawing 100 million numbers."""
    block = rng.standard_normal(1 << 20, dtype=np.float32)
    for name, value in list(graph.constants.items()):
        if value.dtype != np.float32:
            continue
        if value.ndim >= 2:
            scale = math.sqrt(2.0 / max(1, int(np.prod(value.shape[1:]))))
            draw = (np.resize(block, value.shape) if value.size > block.size
                    else rng.standard_normal(value.shape, dtype=np.float32))
            graph.constants[name] = draw * np.float32(scale)
        else:
            graph.constants[name] = rng.uniform(0.5, 1.5, value.shape).astype(np.float32)


def strip_softmax(graph: Graph) -> None:
    """Compare logits, not probabilities (a saturated softmax hides errors)."""
    last = graph.nodes[-1]
    if last.op == "Softmax" and graph.outputs == last.outputs:
        graph.nodes.pop()
        graph.outputs = [last.inputs[0]]


def fval(name, shape):
    return h.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def build(nodes, inputs: dict, output_ranks: dict, inits: dict | None = None,
          opset: int = 17) -> Graph:
    inits = {k: np.asarray(v) for k, v in (inits or {}).items()}
    graph = h.make_graph(nodes, "case", [fval(n, s) for n, s in inputs.items()],
                         [fval(n, [None] * r) for n, r in output_ranks.items()],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return load_model(h.make_model(graph, opset_imports=[h.make_opsetid("", opset)]))


def optimize_checked(graph: Graph, target: str = TARGET) -> tuple[Graph, PassReport]:
    """`optimize`, plus the IR invariants checked after every single pass."""
    staged = graph.copy()
    for graph_pass in passes_for(target):
        staged = graph_pass.run(staged)
        check_graph(staged)
    optimized, report = optimize(graph, target=target)
    assert optimized.op_counts() == staged.op_counts()
    return optimized, report


def weights(rng, *shape, positive=False):
    if positive:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def conv_inits(rng, cin=3, cout=4, bn=True, bias=True):
    inits = {"W": weights(rng, cout, cin, 3, 3) * 0.3}
    if bias:
        inits["B"] = weights(rng, cout)
    if bn:
        inits.update(s=weights(rng, cout, positive=True), b=weights(rng, cout),
                     m=weights(rng, cout), v=weights(rng, cout, positive=True))
    return inits


def conv(x="x", y="c", bias=True, **attrs):
    return h.make_node("Conv", [x, "W", "B"] if bias else [x, "W"], [y], pads=[1, 1, 1, 1],
                       **attrs)


def bn(x="c", y="n"):
    return h.make_node("BatchNormalization", [x, "s", "b", "m", "v"], [y], epsilon=1e-3)


X4 = {"x": [1, 3, 6, 6]}


# ------------------------------------------------------------------ hand-built cases

def case_conv_bn_relu(rng):
    nodes = [conv(), bn(), h.make_node("Relu", ["n"], ["y"])]
    return build(nodes, X4, {"y": 4}, conv_inits(rng)), \
        {"batchnorm_into_conv", "epilogue_activation"}, {"Conv": 1}


def conv_transpose_bn_case(groups: int, bias: bool):
    """DBNet's head: ConvTranspose (2x2, stride 2) -> BatchNormalization -> ReLU; with
    groups, input channel ci of group g feeds output channels of group g only."""
    def case(rng):
        cin, cout = 4, 6
        inits = {"W": weights(rng, cin, cout // groups, 2, 2),
                 "s": weights(rng, cout, positive=True), "b": weights(rng, cout),
                 "m": weights(rng, cout), "v": weights(rng, cout, positive=True)}
        if bias:
            inits["B"] = weights(rng, cout)
        nodes = [h.make_node("ConvTranspose", ["x", "W", "B"] if bias else ["x", "W"], ["c"],
                             kernel_shape=[2, 2], strides=[2, 2], group=groups),
                 bn(), h.make_node("Relu", ["n"], ["y"])]
        return build(nodes, {"x": [1, cin, 3, 5]}, {"y": 4}, inits), \
            {"batchnorm_into_conv_transpose"}, {"ConvTranspose": 1, "Relu": 1}
    return case


def case_conv_scale_bias(rng):
    nodes = [conv(bias=False), h.make_node("Mul", ["c", "k"], ["p"]),
             h.make_node("Add", ["p", "t"], ["q"]), h.make_node("Sub", ["q", "u"], ["y"])]
    inits = conv_inits(rng, bn=False, bias=False)
    inits.update(k=weights(rng, 1, 4, 1, 1), t=weights(rng, 4, 1, 1), u=np.float32(0.25))
    return build(nodes, X4, {"y": 4}, inits), {"scale_into_conv", "bias_into_conv"}, {"Conv": 1}


def case_gemm_bn(rng):
    nodes = [h.make_node("Gemm", ["x", "W", "C"], ["g"], transB=1, alpha=0.5, beta=2.0),
             bn("g", "y")]
    inits = {"W": weights(rng, 4, 8), "C": weights(rng, 4), "s": weights(rng, 4, positive=True),
             "b": weights(rng, 4), "m": weights(rng, 4), "v": weights(rng, 4, positive=True)}
    return build(nodes, {"x": [3, 8]}, {"y": 2}, inits), {"batchnorm_into_gemm"}, {"Gemm": 1}


def case_matmul_bn(rng):
    nodes = [h.make_node("MatMul", ["x", "W"], ["g"]), bn("g", "y")]
    inits = {"W": weights(rng, 8, 4), "s": weights(rng, 4, positive=True),
             "b": weights(rng, 4), "m": weights(rng, 4), "v": weights(rng, 4, positive=True)}
    return build(nodes, {"x": [3, 8]}, {"y": 2}, inits), {"batchnorm_into_gemm"}, {"Gemm": 1}


def case_matmul_add_relu(rng):
    nodes = [h.make_node("MatMul", ["x", "W"], ["g"]), h.make_node("Add", ["bias", "g"], ["a"]),
             h.make_node("Relu", ["a"], ["y"])]
    inits = {"W": weights(rng, 8, 5), "bias": weights(rng, 5)}
    return build(nodes, {"x": [4, 8]}, {"y": 2}, inits), \
        {"matmul_add_to_gemm", "epilogue_activation"}, {"Gemm": 1}


def case_gemm_bias_add(rng):
    nodes = [h.make_node("Gemm", ["x", "W", "C"], ["g"], alpha=0.5, beta=2.0),
             h.make_node("Add", ["g", "bias"], ["y"])]
    inits = {"W": weights(rng, 8, 5), "C": weights(rng, 1, 5), "bias": weights(rng, 4, 5)}
    return build(nodes, {"x": [4, 8]}, {"y": 2}, inits), {"bias_into_gemm"}, {"Gemm": 1}


def case_nd_matmul_bias_tanh(rng):
    nodes = [h.make_node("MatMul", ["x", "W"], ["g"]), h.make_node("Add", ["g", "bias"], ["a"]),
             h.make_node("Tanh", ["a"], ["y"])]
    inits = {"W": weights(rng, 8, 5), "bias": weights(rng, 5)}
    return build(nodes, {"x": [2, 3, 8]}, {"y": 3}, inits), {"epilogue_const"}, {"MatMul": 1}


def case_conv_silu(rng):
    nodes = [conv(), h.make_node("Sigmoid", ["c"], ["s1"]), h.make_node("Mul", ["s1", "c"], ["y"])]
    return build(nodes, X4, {"y": 4}, conv_inits(rng, bn=False)), \
        {"silu", "epilogue_activation"}, {"Conv": 1}


def case_silu_alone(rng):
    nodes = [h.make_node("Sigmoid", ["x"], ["s1"]), h.make_node("Mul", ["x", "s1"], ["y"])]
    return build(nodes, {"x": [2, 7]}, {"y": 2}), {"silu"}, {"Elementwise": 1}


def quick_gelu_case(order: str):
    """CLIP's QuickGELU after a MatMul, x * Sigmoid(1.702 * x), in the product orders
    exporters write; "z" gates x by another tensor's sigmoid (no QuickGELU), "one" scales
    by 1 (silu, `test_quick_gelu_by_one_is_silu`)."""
    def case(rng):
        scale = {"c_x": ["alpha", "g"], "x_c": ["g", "alpha"], "z": ["z", "alpha"],
                 "one": ["g", "unit"]}[order]
        gate = ["s", "g"] if order != "x_c" else ["g", "s"]
        nodes = [h.make_node("MatMul", ["x", "W"], ["g"]), h.make_node("Mul", scale, ["a"]),
                 h.make_node("Sigmoid", ["a"], ["s"]), h.make_node("Mul", gate, ["y"])]
        inits = {"W": weights(rng, 8, 5), "alpha": np.float32(1.702), "unit": np.float32(1)}
        inputs = {"x": [3, 8], **({"z": [3, 5]} if order == "z" else {})}
        if order == "z":   # one chain of three steps, the gate's Mul among them
            return build(nodes, inputs, {"y": 2}, inits), {"elementwise_chain"}, \
                {"MatMul": 1, "Elementwise": 1}
        return build(nodes, inputs, {"y": 2}, inits), \
            {"quick_gelu", "epilogue_activation"}, {"MatMul": 1}
    return case


def mish_case(gated_by: str):
    """The TorchScript exporter's Mish below opset 18, x * Tanh(Softplus(x)), after a Conv
    (into its epilogue); gated by another tensor ("z") it is no Mish."""
    def case(rng):
        nodes = [conv(), h.make_node("Softplus", ["c"], ["sp"]),
                 h.make_node("Tanh", ["sp"], ["t"]), h.make_node("Mul", [gated_by, "t"], ["y"])]
        inputs = {**X4, **({"z": [1, 4, 6, 6]} if gated_by == "z" else {})}
        graph = build(nodes, inputs, {"y": 4}, conv_inits(rng, bn=False))
        if gated_by == "z":   # one chain of three steps, the gate's Mul among them
            return graph, {"elementwise_chain"}, {"Conv": 1, "Elementwise": 1}
        return graph, {"mish", "epilogue_activation"}, {"Conv": 1}
    return case


def case_hard_swish(rng):
    nodes = [conv(), h.make_node("HardSigmoid", ["c"], ["s1"], alpha=1 / 6, beta=0.5),
             h.make_node("Mul", ["c", "s1"], ["y"])]
    return build(nodes, X4, {"y": 4}, conv_inits(rng, bn=False), opset=13), \
        {"hard_swish", "epilogue_activation"}, {"Conv": 1}


def _gelu_nodes(form: str, x: str = "g", p: str = "") -> list:
    """Three spellings of the erf-GELU of tensor `x` (output p+"y", intermediates prefixed)."""
    d, e, q, y, hx, one = p + "d", p + "e", p + "p", p + "y", p + "hx", p + "q"
    if form == "div_first":   # torch's export: (x * (1 + erf(x / sqrt2))) * 0.5
        return [h.make_node("Div", [x, "sqrt2"], [d]), h.make_node("Erf", [d], [e]),
                h.make_node("Add", [e, "one"], [one]), h.make_node("Mul", [x, one], [q]),
                h.make_node("Mul", [q, "half"], [y])]
    if form == "half_last_x":  # (0.5 * (1 + erf(1/sqrt2 * x))) * x
        return [h.make_node("Mul", ["rsqrt2", x], [d]), h.make_node("Erf", [d], [e]),
                h.make_node("Add", ["one", e], [one]), h.make_node("Mul", [one, "half"], [q]),
                h.make_node("Mul", [q, x], [y])]
    return [h.make_node("Mul", [x, "half"], [hx]),  # (0.5 * x) * (1 + erf(x / sqrt2))
            h.make_node("Div", [x, "sqrt2"], [d]), h.make_node("Erf", [d], [e]),
            h.make_node("Add", [e, "one"], [one]), h.make_node("Mul", [hx, one], [y])]


def gelu_case(form):
    def case(rng):
        nodes = [h.make_node("MatMul", ["x", "W"], ["g"]), *_gelu_nodes(form)]
        inits = {"W": weights(rng, 8, 6), "sqrt2": np.float32(math.sqrt(2)),
                 "rsqrt2": np.float32(1 / math.sqrt(2)), "one": np.float32(1.0),
                 "half": np.float32(0.5)}
        return build(nodes, {"x": [2, 3, 8]}, {"y": 3}, inits), \
            {"gelu_erf", "epilogue_activation"}, {"MatMul": 1}
    return case


def activation_case(op_nodes, opset=17, inits=None):
    def case(rng):
        all_inits = conv_inits(rng, bn=False)
        all_inits.update(inits or {})
        return build([conv(), *op_nodes], X4, {"y": 4}, all_inits, opset=opset), \
            {"epilogue_activation"}, {"Conv": 1}
    return case


def case_residual(rng):
    inits = conv_inits(rng, cin=4, cout=4)
    inits.update(W2=weights(rng, 4, 4, 1, 1), B2=weights(rng, 4))
    nodes = [conv(), bn(), h.make_node("Conv", ["x", "W2", "B2"], ["sc"]),
             h.make_node("Sum", ["n", "sc"], ["r"]), h.make_node("Relu", ["r"], ["y"])]
    graph = build(nodes, {"x": [1, 4, 5, 5]}, {"y": 4}, inits)
    return graph, {"batchnorm_into_conv", "epilogue_residual_add"}, {"Conv": 2}


def case_identity_residual(rng):
    inits = conv_inits(rng, cin=4, cout=4, bn=False)
    nodes = [conv(), h.make_node("Add", ["x", "c"], ["r"]), h.make_node("Relu", ["r"], ["y"])]
    return build(nodes, {"x": [1, 4, 5, 5]}, {"y": 4}, inits), \
        {"elementwise_chain", "epilogue_residual_add"}, {"Conv": 1}


def case_elementwise_chain(rng):
    nodes = [h.make_node("Add", ["x", "z"], ["a"]), h.make_node("Mul", ["k", "a"], ["b"]),
             h.make_node("Exp", ["b"], ["e"]), h.make_node("Div", ["one", "e"], ["y"])]
    inits = {"k": weights(rng, 5), "one": np.float32(1.0)}
    return build(nodes, {"x": [3, 5], "z": [3, 5]}, {"y": 2}, inits), \
        {"elementwise_chain"}, {"Elementwise": 1}


CUBES = {  # x^3 as exporters write it; "not_a_cube" multiplies x * x by another tensor
    "pow": [h.make_node("Pow", ["x", "three"], ["cube"])],
    "x_times_square": [h.make_node("Mul", ["x", "x"], ["sq"]),
                       h.make_node("Mul", ["x", "sq"], ["cube"])],
    "square_times_x": [h.make_node("Mul", ["x", "x"], ["sq"]),
                       h.make_node("Mul", ["sq", "x"], ["cube"])],
    "not_a_cube": [h.make_node("Mul", ["x", "x"], ["sq"]),
                   h.make_node("Mul", ["sq", "z"], ["cube"])],
}


def gelu_fast_case(square: str, valid: bool = True):
    """Hugging Face's FastGELU, 0.5 x (1 + tanh(x k (1 + c x x))), its c x x grouped as
    `square` says; with 0.05 for c it is no GELU."""
    def case(rng):
        c = "c0" if valid else "c1"
        squares = {"c_times_square": [h.make_node("Mul", ["x", "x"], ["sq"]),
                                      h.make_node("Mul", [c, "sq"], ["term"])],
                   "scaled_times_x": [h.make_node("Mul", [c, "x"], ["cx"]),
                                      h.make_node("Mul", ["cx", "x"], ["term"])],
                   "x_times_scaled": [h.make_node("Mul", ["x", c], ["cx"]),
                                      h.make_node("Mul", ["x", "cx"], ["term"])]}
        nodes = [h.make_node("Mul", ["x", "k"], ["xk"]), *squares[square],
                 h.make_node("Add", ["one", "term"], ["poly"]),
                 h.make_node("Mul", ["xk", "poly"], ["arg"]), h.make_node("Tanh", ["arg"], ["t"]),
                 h.make_node("Add", ["t", "one"], ["phi"]),
                 h.make_node("Mul", ["x", "half"], ["hx"]),
                 h.make_node("Mul", ["hx", "phi"], ["y"])]
        inits = {"c0": np.float32(0.044715), "c1": np.float32(0.05),
                 "k": np.float32(math.sqrt(2 / math.pi)), "one": np.float32(1),
                 "half": np.float32(0.5)}
        return build(nodes, {"x": [3, 5]}, {"y": 2}, inits), \
            {"gelu_tanh"} if valid else {"elementwise_chain"}, \
            {"Elementwise": 1 if valid else 3}
    return case


def gelu_tanh_case(c0: float, cube: str = "pow"):
    """ONNX's own expansion of tanh-GELU (and TorchScript's, its cube written out as two
    products); with another cubic factor, or a cube that is not x^3, it is no GELU, and
    the chains left have operands naming the chain's input."""
    def case(rng):
        nodes = [*CUBES[cube],
                 h.make_node("Mul", ["c0", "cube"], ["cube_c0"]),
                 h.make_node("Sum", ["x", "cube_c0"], ["inner"]),
                 h.make_node("Mul", ["k", "inner"], ["arg"]), h.make_node("Tanh", ["arg"], ["t"]),
                 h.make_node("Sum", ["one", "t"], ["phi"]),
                 h.make_node("Mul", ["half", "x"], ["hx"]),
                 h.make_node("Mul", ["hx", "phi"], ["y"])]
        inits = {"three": np.float32(3), "c0": np.float32(c0),
                 "k": np.float32(math.sqrt(2 / math.pi)), "one": np.float32(1),
                 "half": np.float32(0.5)}
        gelu = c0 == 0.044715 and cube != "not_a_cube"
        inputs = {"x": [3, 5], "z": [3, 5]} if cube == "not_a_cube" else {"x": [3, 5]}
        return build(nodes, inputs, {"y": 2}, inits), \
            {"gelu_tanh"} if gelu else {"elementwise_chain"}, \
            {"Elementwise": 1} if gelu else \
            {"Elementwise": 2, **({"Mul": 1} if cube == "not_a_cube" else {})}
    return case


def layer_norm_case(square: str, affine: bool, opset: int):
    def case(rng):
        axes = {"axes": [-1]} if opset < 18 else {}
        extra = [] if opset < 18 else ["axes"]
        nodes = [h.make_node("ReduceMean", ["x", *extra], ["mean"], **axes),
                 h.make_node("Sub", ["x", "mean"], ["d"]),
                 h.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else
                 h.make_node("Mul", ["d", "d"], ["sq"]),
                 h.make_node("ReduceMean", ["sq", *extra], ["var"], **axes),
                 h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
                 h.make_node("Div", ["d", "std"], ["y" if not affine else "n"])]
        if affine:
            nodes += [h.make_node("Mul", ["n", "gamma"], ["g"]),
                      h.make_node("Add", ["beta", "g"], ["y"])]
        inits = {"two": np.float32(2), "eps": np.float32(1e-5), "axes": np.array([-1]),
                 "gamma": weights(rng, 1, 8), "beta": weights(rng, 8)}
        return build(nodes, {"x": [2, 5, 8]}, {"y": 3}, inits, opset=opset), \
            {"layer_norm"}, {"LayerNormalization": 1}
    return case


def channel_layer_norm_case(square: str, opset: int, gamma_shape=(6, 1, 1),
                            axes=(1,)):
    """ConvNeXt's channels-first LayerNorm of NCHW (mean over axis 1, gamma and beta
    [C, 1, 1]): Transpose, LayerNormalization, Transpose. A gamma varying along another
    axis, or a mean over two axes that are not the last, is no such normalization."""
    def case(rng):
        kw = {"axes": list(axes)} if opset < 18 else {}
        extra = [] if opset < 18 else ["axes"]
        nodes = [h.make_node("ReduceMean", ["x", *extra], ["mean"], **kw),
                 h.make_node("Sub", ["x", "mean"], ["d"]),
                 h.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else
                 h.make_node("Mul", ["d", "d"], ["sq"]),
                 h.make_node("ReduceMean", ["sq", *extra], ["var"], **kw),
                 h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
                 h.make_node("Div", ["d", "std"], ["n"]),
                 h.make_node("Mul", ["gamma", "n"], ["g"]),
                 h.make_node("Add", ["g", "beta"], ["y"])]
        inits = {"two": np.float32(2), "eps": np.float32(1e-6), "axes": np.array(axes),
                 "gamma": weights(rng, *gamma_shape), "beta": weights(rng, 6, 1, 1)}
        fused = len(axes) == 1
        return build(nodes, {"x": [2, 6, 4, 5]}, {"y": 4}, inits, opset=opset), \
            {"channel_layer_norm"} if fused else set(), \
            {"Transpose": 2, "LayerNormalization": 1} if gamma_shape == (6, 1, 1) else None
    return case


def keras_layer_norm_case(gamma: bool, beta: bool, mean_used_elsewhere: bool = False):
    """tf2onnx's Keras LayerNormalization at opset 13: x * inv + (beta - mean * inv)."""
    def case(rng):
        nodes = [h.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
                 h.make_node("Sub", ["x", "mean"], ["d"]),
                 h.make_node("Mul", ["d", "d"], ["sq"]),
                 h.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
                 h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
                 h.make_node("Reciprocal", ["std"], ["r"])]
        inv = "r"
        if gamma:
            nodes.append(h.make_node("Mul", ["r", "gamma"], ["inv"]))
            inv = "inv"
        nodes += [h.make_node("Mul", ["x", inv], ["xs"]),
                  h.make_node("Mul", ["mean", inv], ["ms"]),
                  h.make_node("Sub", ["beta", "ms"], ["shift"]) if beta else
                  h.make_node("Neg", ["ms"], ["shift"]),
                  h.make_node("Add", ["xs", "shift"], ["y"])]
        outputs = {"y": 3}
        if mean_used_elsewhere:
            nodes.append(h.make_node("Relu", ["mean"], ["m2"]))
            outputs["m2"] = 3
        inits = {"eps": np.float32(1e-3), "gamma": weights(rng, 8), "beta": weights(rng, 8)}
        if mean_used_elsewhere:
            return build(nodes, {"x": [2, 5, 8]}, outputs, inits, opset=13), set(), None
        return build(nodes, {"x": [2, 5, 8]}, outputs, inits, opset=13), \
            {"layer_norm_reciprocal"}, {"LayerNormalization": 1}
    return case


def keras_channel_layer_norm_case(rng):
    """The Keras form over NCHW's channels (axis 1; gamma and beta [C, 1, 1]): a
    channels-last LayerNorm whose Transposes `transpose_sinking` moved past it."""
    nodes = [h.make_node("ReduceMean", ["x"], ["mean"], axes=[1]),
             h.make_node("Sub", ["x", "mean"], ["d"]),
             h.make_node("Mul", ["d", "d"], ["sq"]),
             h.make_node("ReduceMean", ["sq"], ["var"], axes=[1]),
             h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
             h.make_node("Reciprocal", ["std"], ["r"]),
             h.make_node("Mul", ["r", "gamma"], ["inv"]),
             h.make_node("Mul", ["x", "inv"], ["xs"]),
             h.make_node("Mul", ["mean", "inv"], ["ms"]),
             h.make_node("Sub", ["beta", "ms"], ["shift"]),
             h.make_node("Add", ["xs", "shift"], ["y"])]
    inits = {"eps": np.float32(1e-3), "gamma": weights(rng, 6, 1, 1),
             "beta": weights(rng, 6, 1, 1)}
    return build(nodes, {"x": [2, 6, 4, 5]}, {"y": 4}, inits, opset=13), \
        {"channel_layer_norm_reciprocal"}, {"Transpose": 2, "LayerNormalization": 1}


def case_transformer_blocks(rng, blocks=3, dim=16):
    """MatMul + bias -> erf-GELU -> residual Add -> decomposed LayerNorm, three times."""
    nodes, inits, x = [], {"sqrt2": np.float32(math.sqrt(2)), "one": np.float32(1),
                           "half": np.float32(0.5), "two": np.float32(2),
                           "eps": np.float32(1e-5)}, "x"
    for i in range(blocks):
        p = f"b{i}_"
        inits[p + "W"], inits[p + "b"] = weights(rng, dim, dim) * 0.3, weights(rng, dim)
        nodes += [h.make_node("MatMul", [x, p + "W"], [p + "m"]),
                  h.make_node("Add", [p + "m", p + "b"], [p + "g"]),
                  *_gelu_nodes("div_first", p + "g", p),
                  h.make_node("Add", [p + "y", x], [p + "r"]),
                  h.make_node("ReduceMean", [p + "r"], [p + "mu"], axes=[-1]),
                  h.make_node("Sub", [p + "r", p + "mu"], [p + "dd"]),
                  h.make_node("Pow", [p + "dd", "two"], [p + "sq"]),
                  h.make_node("ReduceMean", [p + "sq"], [p + "var"], axes=[-1]),
                  h.make_node("Add", [p + "var", "eps"], [p + "ve"]),
                  h.make_node("Sqrt", [p + "ve"], [p + "std"]),
                  h.make_node("Div", [p + "dd", p + "std"], [p + "o"])]
        x = p + "o"
    nodes.append(h.make_node("Identity", [x], ["y"]))
    return build(nodes, {"x": [2, 4, dim]}, {"y": 3}, inits), \
        {"gelu_erf", "layer_norm", "elementwise_chain", "epilogue_residual_add"}, \
        {"LayerNormalization": blocks, "MatMul": blocks}


def case_squeeze_excite(rng):
    """EfficientNet's block: Conv+BN+SiLU, squeeze-excite gate (broadcast Mul stays), Conv+BN,
    identity residual."""
    inits = conv_inits(rng, cin=4, cout=4)
    inits.update(W1=weights(rng, 2, 4, 1, 1), B1=weights(rng, 2), W2=weights(rng, 4, 2, 1, 1),
                 B2=weights(rng, 4), W3=weights(rng, 4, 4, 1, 1) * 0.3,
                 s3=weights(rng, 4, positive=True), b3=weights(rng, 4), m3=weights(rng, 4),
                 v3=weights(rng, 4, positive=True))
    nodes = [conv(), bn(), h.make_node("Sigmoid", ["n"], ["sg"]),
             h.make_node("Mul", ["n", "sg"], ["a"]),
             h.make_node("GlobalAveragePool", ["a"], ["p"]),
             h.make_node("Conv", ["p", "W1", "B1"], ["q"]),
             h.make_node("Sigmoid", ["q"], ["q1"]), h.make_node("Mul", ["q", "q1"], ["q2"]),
             h.make_node("Conv", ["q2", "W2", "B2"], ["r"]), h.make_node("Sigmoid", ["r"], ["g"]),
             h.make_node("Mul", ["a", "g"], ["ag"]),
             h.make_node("Conv", ["ag", "W3"], ["o"]),
             h.make_node("BatchNormalization", ["o", "s3", "b3", "m3", "v3"], ["on"]),
             h.make_node("Add", ["on", "x"], ["y"])]
    graph = build(nodes, {"x": [1, 4, 6, 6]}, {"y": 4}, inits)
    return graph, {"silu", "batchnorm_into_conv", "epilogue_activation",
                   "epilogue_residual_add"}, \
        {"Conv": 4, "GlobalAveragePool": 1, "Mul": 1}


def case_single_elementwise_stays(rng):
    return build([h.make_node("Relu", ["x"], ["y"])], {"x": [3, 5]}, {"y": 2}), set(), \
        {"Relu": 1}


def case_sum_three(rng):
    nodes = [h.make_node("Sum", ["x", "z", "w"], ["y"])]
    return build(nodes, {"x": [3, 5], "z": [3, 5], "w": [5]}, {"y": 2}), \
        {"elementwise_chain"}, {"Elementwise": 1}


def case_self_add_doubles(rng):
    """x + x (two merged average pools in tf2onnx's NASNet) becomes x * 2, a chain step:
    Relu, the doubling and the Sum's other Add fuse into one chain."""
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Add", ["r", "r"], ["d"]),
             h.make_node("Sum", ["d", "d", "z"], ["y"])]
    return build(nodes, {"x": [3, 5], "z": [3, 5]}, {"y": 2}), {"elementwise_chain"}, \
        {"Elementwise": 1}


def case_noops(rng):
    nodes = [h.make_node("Identity", ["x"], ["i"]), h.make_node("Dropout", ["i"], ["d"]),
             h.make_node("Cast", ["d"], ["c"], to=TensorProto.FLOAT),
             h.make_node("Reshape", ["c", "shape"], ["r"]),
             h.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 2]),
             h.make_node("Pad", ["t", "pads"], ["p"]),
             h.make_node("Expand", ["p", "shape"], ["e"]),
             h.make_node("Relu", ["e"], ["y"])]
    inits = {"shape": np.array([2, 3, 4], np.int64), "pads": np.zeros(6, np.int64)}
    return build(nodes, {"x": [2, 3, 4]}, {"y": 3}, inits), set(), {"Relu": 1}


def case_reshape_and_transpose_pairs(rng):
    nodes = [h.make_node("Reshape", ["x", "s1"], ["a"]), h.make_node("Reshape", ["a", "s2"], ["b"]),
             h.make_node("Transpose", ["b"], ["t1"], perm=[1, 0, 2]),
             h.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2]),
             h.make_node("Transpose", ["t2"], ["t3"], perm=[1, 2, 0]),
             h.make_node("Transpose", ["t3"], ["y"], perm=[1, 2, 0])]
    inits = {"s1": np.array([6, -1], np.int64), "s2": np.array([0, 2, 2], np.int64)}
    return build(nodes, {"x": [2, 3, 4]}, {"y": 3}, inits), set(), \
        {"Reshape": 1, "Transpose": 1}


def case_output_through_identity(rng):
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Identity", ["a"], ["y"]),
             h.make_node("Identity", ["x"], ["z"])]
    return build(nodes, {"x": [3]}, {"y": 1, "z": 1}), set(), {"Identity": 1, "Relu": 1}


def case_constant_folding(rng):
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "zero"], ["n"]),
             h.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             h.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             h.make_node("Reshape", ["x", "shape"], ["r"]),
             h.make_node("Expand", ["tiny", "big_shape"], ["big"]),  # 16 MiB + : stays
             h.make_node("ReduceSum", ["big"], ["sb"], keepdims=0),
             h.make_node("Add", ["r", "sb"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "tiny": np.ones((1, 1), np.float32) * 1e-7,
             "big_shape": np.array([4097, 1024], np.int64)}
    return build(nodes, {"x": [2, 3, 4]}, {"y": 2}, inits), set(), \
        {"Add": 1, "Expand": 1, "ReduceSum": 1, "Reshape": 1}


def case_standalone_bn_and_shared_conv(rng):
    nodes = [conv(), h.make_node("Relu", ["c"], ["y"]), bn("c", "z")]
    return build(nodes, X4, {"y": 4, "z": 4}, conv_inits(rng)), set(), \
        {"BatchNormalization": 1, "Conv": 1, "Relu": 1}


def case_preactivation_bn_affine(rng):
    """DenseNet's pre-activation BN: BN -> Mul -> Add -> Div by per-channel constants -> Relu."""
    nodes = [bn("x", "n"), h.make_node("Mul", ["n", "k"], ["p"]),
             h.make_node("Add", ["t", "p"], ["q"]), h.make_node("Div", ["q", "u"], ["r"]),
             h.make_node("Relu", ["r"], ["y"])]
    inits = {"s": weights(rng, 3, positive=True), "b": weights(rng, 3), "m": weights(rng, 3),
             "v": weights(rng, 3, positive=True), "k": weights(rng, 1, 3, 1, 1),
             "t": weights(rng, 3, 1, 1), "u": np.float32(1.5)}
    return build(nodes, X4, {"y": 4}, inits), {"affine_into_batchnorm"}, \
        {"BatchNormalization": 1, "Relu": 1}


CASES = {
    "preactivation_bn_affine": case_preactivation_bn_affine,
    "conv_bn_relu": case_conv_bn_relu,
    "conv_scale_bias": case_conv_scale_bias,
    "gemm_bn": case_gemm_bn,
    "matmul_bn": case_matmul_bn,
    "matmul_add_relu": case_matmul_add_relu,
    "gemm_bias_add": case_gemm_bias_add,
    "nd_matmul_bias_tanh": case_nd_matmul_bias_tanh,
    "conv_silu": case_conv_silu,
    "silu_alone": case_silu_alone,
    "hard_swish": case_hard_swish,
    "quick_gelu_c_x": quick_gelu_case("c_x"),
    "quick_gelu_x_c": quick_gelu_case("x_c"),
    "not_quick_gelu_other_gate": quick_gelu_case("z"),
    "quick_gelu_by_one_is_silu": quick_gelu_case("one"),
    "mish": mish_case("c"),
    "not_mish_other_gate": mish_case("z"),
    "mish_op": activation_case([h.make_node("Mish", ["c"], ["y"])], opset=18),
    "gelu_div_first": gelu_case("div_first"),
    "gelu_half_last_x": gelu_case("half_last_x"),
    "gelu_half_x_first": gelu_case("half_x_first"),
    "relu6_clip_inputs": activation_case(
        [h.make_node("Clip", ["c", "lo", "hi"], ["y"])],
        inits={"lo": np.float32(0), "hi": np.float32(6)}),
    "clip_attrs_opset9": activation_case([h.make_node("Clip", ["c"], ["y"], min=-1.0, max=2.0)],
                                         opset=9),
    "leaky_relu": activation_case([h.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)]),
    "sigmoid_tanh": activation_case([h.make_node("Sigmoid", ["c"], ["s1"]),
                                     h.make_node("Tanh", ["s1"], ["y"])]),
    "hard_sigmoid": activation_case([h.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3)]),
    "gelu_op": activation_case([h.make_node("Gelu", ["c"], ["y"])], opset=20),
    "gelu_tanh_op": activation_case([h.make_node("Gelu", ["c"], ["y"], approximate="tanh")],
                                    opset=20),
    "hard_swish_op": activation_case([h.make_node("HardSwish", ["c"], ["y"])], opset=14),
    "conv_transpose_bn": conv_transpose_bn_case(1, True),
    "conv_transpose_bn_groups_no_bias": conv_transpose_bn_case(2, False),
    "residual": case_residual,
    "identity_residual": case_identity_residual,
    "elementwise_chain": case_elementwise_chain,
    "gelu_tanh_expanded": gelu_tanh_case(0.044715),
    "not_gelu_tanh_chains": gelu_tanh_case(0.05),
    "gelu_tanh_cube_x_times_square": gelu_tanh_case(0.044715, "x_times_square"),
    "gelu_tanh_cube_square_times_x": gelu_tanh_case(0.044715, "square_times_x"),
    "not_gelu_tanh_square_times_z": gelu_tanh_case(0.044715, "not_a_cube"),
    "gelu_fast_c_times_square": gelu_fast_case("c_times_square"),
    "gelu_fast_scaled_times_x": gelu_fast_case("scaled_times_x"),
    "gelu_fast_x_times_scaled": gelu_fast_case("x_times_scaled"),
    "not_gelu_fast_other_factor": gelu_fast_case("scaled_times_x", valid=False),
    "single_elementwise_stays": case_single_elementwise_stays,
    "transformer_blocks": case_transformer_blocks,
    "squeeze_excite": case_squeeze_excite,
    "layer_norm_pow_affine": layer_norm_case("pow", True, 17),
    "layer_norm_mul_axes_input": layer_norm_case("mul", False, 18),
    "layer_norm_opset13": layer_norm_case("pow", True, 13),
    "keras_layer_norm": keras_layer_norm_case(True, True),
    "keras_layer_norm_no_gamma": keras_layer_norm_case(False, True),
    "keras_layer_norm_no_beta": keras_layer_norm_case(True, False),
    "keras_layer_norm_mean_read_elsewhere_kept": keras_layer_norm_case(True, True, True),
    "sum_three": case_sum_three,
    "self_add_doubles": case_self_add_doubles,
    "noops": case_noops,
    "reshape_and_transpose_pairs": case_reshape_and_transpose_pairs,
    "output_through_identity": case_output_through_identity,
    "constant_folding": case_constant_folding,
    "standalone_bn_and_shared_conv": case_standalone_bn_and_shared_conv,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fusion_case(case, rng):
    graph, rules, ops_after = CASES[case](rng)
    optimized, report = optimize_checked(graph)
    if ops_after is not None:
        assert optimized.op_counts() == ops_after
    for rule in rules:
        assert report.rules[rule] >= 1, f"rule {rule} did not fire: {report.rules}"
    assert_equivalent(graph, optimized, rng)


def test_an_integer_self_add_stays_an_add():
    """Doubling is rewritten for floats only (an integer Add stays as its kernels have it)."""
    graph = h.make_graph([h.make_node("Add", ["x", "x"], ["y"])], "int_add",
                         [h.make_tensor_value_info("x", TensorProto.INT64, [4])],
                         [h.make_tensor_value_info("y", TensorProto.INT64, [4])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    optimized, report = optimize(load_model(model), TARGET)
    assert optimized.op_counts() == {"Add": 1} and report.passes["sum_to_add"] == 0


def test_quick_gelu_by_one_is_silu(rng):
    """x * Sigmoid(1 * x) becomes silu, the step the blocked convs have a vector form of;
    1.702 stays quick_gelu with its alpha."""
    for order, op, attrs in (("one", "silu", {}), ("c_x", "quick_gelu", {"alpha": 1.702})):
        graph, _, _ = quick_gelu_case(order)(rng)
        (node,) = optimize(graph, target=TARGET)[0].nodes
        assert [step.op for step in node.epilogue] == [op]
        assert dict(node.epilogue[0].attrs) == pytest.approx(attrs)


def test_a_layer_norm_whose_mean_is_read_elsewhere_is_not_fused(rng):
    graph, _, _ = keras_layer_norm_case(True, True, mean_used_elsewhere=True)(rng)
    optimized, report = optimize(graph, target=TARGET)
    assert report.rules["layer_norm_reciprocal"] == 0
    assert "LayerNormalization" not in optimized.op_counts()


CHANNEL_NORM_CASES = {
    "pow": channel_layer_norm_case("pow", 17),
    "mul_axes_input": channel_layer_norm_case("mul", 18),
    "gamma_along_h_apart": channel_layer_norm_case("pow", 17, (1, 4, 1)),
    "two_axes_kept": channel_layer_norm_case("pow", 17, axes=(1, 2)),
    "keras_reciprocal": keras_channel_layer_norm_case,
}


@pytest.mark.parametrize("case", sorted(CHANNEL_NORM_CASES))
def test_channel_layer_norm_on_the_cpu(case, rng):
    """Rules `channel_layer_norm` and `channel_layer_norm_reciprocal` (Keras' form) run for
    the CPU target only (their Transposes become NHWC
    reorders there): axis 1 moved last and back, the last axis normalized with the
    per-channel gamma and beta (a gamma along another axis applied after), equal to the
    graph before; the kept case fuses no LayerNormalization at all; the CUDA target leaves
    the pattern to the other rules."""
    graph, rules, ops_after = CHANNEL_NORM_CASES[case](rng)
    optimized, report = optimize(graph, target="cpu")
    assert {r for r in ("channel_layer_norm", "channel_layer_norm_reciprocal")
            if report.rules[r]} == rules
    if not rules:
        assert "LayerNormalization" not in optimized.op_counts()
        return
    first, norm = optimized.nodes[:2]
    assert (first.op, first.attrs["perm"]) == ("Transpose", [0, 2, 3, 1])
    assert (norm.op, norm.attrs["axis"]) == ("LayerNormalization", 3)
    assert optimized.tensors[norm.inputs[1]].shape == (6,)
    if ops_after is not None:
        assert optimized.op_counts() == ops_after
        back = optimized.nodes[2]
        assert (back.op, back.attrs["perm"], back.outputs) == ("Transpose", [0, 3, 1, 2], ["y"])
    assert_equivalent(graph, optimized, rng)
    assert "LayerNormalization" not in optimize(graph, target="cuda")[0].op_counts()


def _on_wpk_kernels(graph: Graph, feeds: dict) -> list[np.ndarray]:
    outputs = evaluate(graph, feeds)
    return [outputs[name] for name in graph.outputs]


def _swallowed(graph: Graph, optimized: Graph) -> list[str]:
    """The tensors of `graph` that no node of `optimized` computes any more."""
    kept = {o for n in optimized.nodes for o in n.outputs if o}
    return [o for n in graph.nodes for o in n.outputs
            if o and o not in kept and o not in graph.outputs]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("case", sorted(CASES) + sorted(CHANNEL_NORM_CASES))
def test_a_fused_patterns_inner_tensor_that_is_a_graph_output_stays_computed(case, target,
                                                                              rng):
    """Each tensor a rule takes into a fused node, made a graph output too (a user asking
    for an intermediate, a tensor a subgraph reads), must still be computed: the rule does
    not fire there, or keeps it, and the graph computes what it did. (Found by mutating
    tf2onnx's Keras LayerNorm: the rule took in its mean, which a graph output read.)"""
    graph, _, _ = {**CASES, **CHANNEL_NORM_CASES}[case](rng)
    optimized, _ = optimize(graph, target=target)
    for name in _swallowed(graph, optimized):
        asked = graph.copy()
        asked.outputs = [*graph.outputs, name]
        # the CPU's graph holds wpk's blocked ops: run node by node on wpk's kernels
        assert_equivalent(asked, optimize_checked(asked, target)[0], rng,
                          run_after=_on_wpk_kernels if target == "cpu" else None)


def conv_transpose_case(tail: list[str], second_reader: bool = False):
    """ConvTranspose (2x2, stride 2) and the ops of `tail` after it, one after the other;
    with `second_reader` its output is also a graph output."""
    def case(rng):
        nodes = [h.make_node("ConvTranspose", ["x", "w", "b"], ["t0"], kernel_shape=[2, 2],
                             strides=[2, 2])]
        nodes += [h.make_node(op, [f"t{k}"], [f"t{k + 1}"]) for k, op in enumerate(tail)]
        outputs = {f"t{len(tail)}": 4, **({"t0": 4} if second_reader else {})}
        return build(nodes, {"x": [1, 3, 5, 6]}, outputs,
                     {"w": weights(rng, 3, 4, 2, 2), "b": weights(rng, 4)})
    return case


@pytest.mark.parametrize("tail, second_reader, fused", [
    (["Relu"], False, ["relu"]),              # DBNet's head after the folded BN
    (["Sigmoid"], False, ["sigmoid"]),        # DBNet's probability map
    (["Tanh"], False, ["tanh"]),              # a DCGAN's image
    (["Relu"], True, []),                     # the raw output is read too
    (["Exp"], False, []),                     # no vector form in the C kernels
    (["Relu", "Exp"], False, []),             # a chain of two: one Elementwise node
])
def test_conv_transpose_activation_on_the_cpu(tail, second_reader, fused, rng):
    """Rule `epilogue_activation_conv_transpose` (CPU only) moves one activation the C
    kernels apply into a ConvTranspose's epilogue; not a chain, not a shared output, not
    on CUDA; the graph computes what it did."""
    graph = conv_transpose_case(tail, second_reader)(rng)
    optimized, report = optimize(graph, target="cpu")
    (node,) = [n for n in optimized.nodes if n.op == "ConvTranspose"]
    assert [step.op for step in node.epilogue] == fused
    assert report.rules["epilogue_activation_conv_transpose"] == len(fused)
    assert_equivalent(graph, optimized, rng)
    (gpu,) = [n for n in optimize(graph, target="cuda")[0].nodes if n.op == "ConvTranspose"]
    assert not gpu.epilogue


def test_every_rule_is_documented_and_reported(rng):
    graph, _, _ = case_conv_bn_relu(rng)
    _, report = optimize(graph, target=TARGET)
    docs = rule_docs(TARGET)
    assert set(report.rules) == set(docs) and all(docs.values())


def test_residual_add_then_relu_order(rng):
    graph, _, _ = case_residual(rng)
    optimized, _ = optimize(graph, target=TARGET)
    fused = [n for n in optimized.nodes if n.epilogue]
    assert len(fused) == 1
    assert [s.op for s in fused[0].epilogue] == ["add", "relu"]
    operand = fused[0].epilogue[0].operand
    assert operand == 3 and fused[0].inputs[operand] in {n.outputs[0] for n in optimized.nodes}


def test_gelu_and_silu_become_single_steps(rng):
    for make, step in ((gelu_case("div_first"), "gelu"), (case_conv_silu, "silu")):
        optimized, _ = optimize(make(rng)[0], target=TARGET)
        assert [s.op for n in optimized.nodes for s in n.epilogue] == [step]


def test_folding_keeps_original_graph_untouched(rng):
    graph, _, _ = case_conv_bn_relu(rng)
    before = graph.op_counts()
    optimize(graph, target=TARGET)
    assert graph.op_counts() == before


def test_pipeline_accepts_target_specific_passes(monkeypatch):
    from wpk.passes.base import GraphPass

    class Marker(GraphPass):
        name = "marker"

        def run(self, graph):
            self.hit()
            return graph

    monkeypatch.setattr("wpk.passes.PIPELINE",
                        [*PIPELINE, PipelineEntry(Marker, targets=frozenset({"special"}))])
    graph = build([h.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": 1})
    assert "marker" not in optimize(graph, target=TARGET)[1].passes
    report = optimize(graph, target="special")[1]
    assert report.passes["marker"] == 1
    assert set(report.seconds) == set(report.passes) and list(report.passes)[-1] == "marker"
    assert report.to_json()["nodes_after"] == 1


@pytest.mark.parametrize("filename", LIGHT_MODELS)
def test_light_model_equivalent_after_passes(filename, rng):
    graph = load_model(os.path.join(LIGHT_DIR, filename))
    strip_softmax(graph)
    randomize_weights(graph, rng)
    optimized, report = optimize_checked(graph)
    assert report.nodes_after < report.nodes_before
    assert not {"Dropout", "Sum", "Identity"} & set(report.ops_after)
    assert_equivalent(graph, optimized, rng)


def test_resnet50_fused(capsys):
    start = time.perf_counter()
    graph = load_model(os.path.join(LIGHT_DIR, "light_resnet50.onnx"))
    optimized, report = optimize(graph, target=TARGET)
    seconds = time.perf_counter() - start
    convs = [n for n in optimized.nodes if n.op == "Conv"]
    assert len(convs) == 53
    # 49 = 33 conv+relu + 16 conv+add+relu; the other 4 are the projection shortcuts (or
    # the main-branch conv whose sum the shortcut took), whose output only feeds the Add.
    assert sum(1 for n in convs if n.epilogue) == 49
    assert sum(1 for n in convs if [s.op for s in n.epilogue] == ["add", "relu"]) == 16
    assert not {"BatchNormalization", "Sum", "Relu", "Add"} & set(report.ops_after)
    assert report.rules["batchnorm_into_conv"] == 53
    with capsys.disabled():
        print(f"\nResNet-50 load+optimize {seconds:.2f} s; ops before {report.ops_before}"
              f"\n  after {report.ops_after}")


EPILOGUE_STEPS = [
    EpilogueStep("relu"), EpilogueStep("clip", (("max", 0.7), ("min", -0.3))),
    EpilogueStep("clip", (("min", 0.1),)), EpilogueStep("leaky_relu", (("alpha", 0.2),)),
    EpilogueStep("sigmoid"), EpilogueStep("silu"), EpilogueStep("tanh"),
    EpilogueStep("hard_sigmoid", (("alpha", 0.3), ("beta", 0.4))), EpilogueStep("hard_swish"),
    EpilogueStep("gelu"), EpilogueStep("gelu_tanh"), EpilogueStep("exp"), EpilogueStep("log"),
    EpilogueStep("sqrt"), EpilogueStep("reciprocal"), EpilogueStep("neg"), EpilogueStep("abs"),
    EpilogueStep("erf"), EpilogueStep("softplus"),
    *(EpilogueStep(op, operand=1, swap=swap) for op in ("add", "sub", "mul", "div", "pow",
                                                        "max", "min") for swap in (False, True)),
]


@pytest.mark.parametrize("step", EPILOGUE_STEPS, ids=lambda s: f"{s.op}{'_swap' if s.swap else ''}")
def test_to_onnx_expands_steps_as_the_kernels_apply_them(step, rng):
    from wpk.core.graph import Node, TensorInfo
    from wpk.kernels.epilogue import apply_epilogue

    info = TensorInfo((4, 6), "float32")
    node = Node("Elementwise", ["x", "b"] if step.operand else ["x"], ["y"], "e",
                domain="wpk", epilogue=(step,))
    graph = Graph([node], ["x", *node.inputs[1:]], ["y"],
                  {"x": info, "b": TensorInfo((6,), "float32"), "y": info},
                  opsets={"": 17, "wpk": 1})
    x = (rng.uniform(0.5, 2.0, (4, 6)) * rng.choice([-1, 1], (4, 6))).astype(np.float32)
    if step.op in ("log", "sqrt", "pow"):
        x = np.abs(x).astype(np.float32)
    b = rng.uniform(0.5, 2.0, 6).astype(np.float32)
    feeds = {"x": x, "b": b} if step.operand else {"x": x}
    (got,) = run_ort(graph, feeds)
    expected = apply_epilogue(x.astype(np.float64), [step], [x.astype(np.float64),
                                                              b.astype(np.float64)])
    assert rel_l2(expected, got) <= 1e-5


UNARY_FOR_PROPERTY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "Softplus", "Exp"]
BINARY_FOR_PROPERTY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_elementwise_graphs_stay_equivalent(data):
    """Random DAGs of elementwise ops (optionally after a Conv) are optimized without changing
    what they compute, whatever the fusions chosen."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    with_conv = data.draw(st.booleans())
    values, nodes, inits = ["x", "z"], [], {"W": weights(rng, 4, 4, 1, 1), "B": weights(rng, 4)}
    if with_conv:
        nodes.append(h.make_node("Conv", ["x", "W", "B"], ["c"]))
        values.append("c")
    for k in range(data.draw(st.integers(1, 7))):
        out = f"v{k}"
        if data.draw(st.booleans()):
            op = data.draw(st.sampled_from(UNARY_FOR_PROPERTY))
            src = data.draw(st.sampled_from(values))
            if op == "Exp":  # keep magnitudes sane
                nodes.append(h.make_node("Tanh", [src], [out + "t"]))
                src = out + "t"
            nodes.append(h.make_node(op, [src], [out]))
        else:
            op = data.draw(st.sampled_from(BINARY_FOR_PROPERTY))
            a = data.draw(st.sampled_from(values))
            kind = data.draw(st.sampled_from(["tensor", "scalar", "channel"]))
            if kind == "tensor":
                b = data.draw(st.sampled_from(values))
            else:
                b = f"k{k}"
                shape = () if kind == "scalar" else (4, 1, 1)
                inits[b] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            pair = [a, b] if data.draw(st.booleans()) else [b, a]
            nodes.append(h.make_node(op, pair, [out]))
        values.append(out)
    outputs = {values[-1]: 4}
    if data.draw(st.booleans()) and len(values) > 3:
        outputs[data.draw(st.sampled_from(values[2:-1]))] = 4
    graph = build(nodes, {"x": [1, 4, 3, 3], "z": [1, 4, 3, 3]}, outputs, inits)
    optimized, _ = optimize_checked(graph)
    assert_equivalent(graph, optimized, rng, tol=1e-5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_layout_chains_stay_equivalent(data):
    """Random chains of Reshape/Transpose/Identity/Flatten/Relu, with some intermediates as
    graph outputs: no-op removal and pair collapsing keep values and output names."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    shape, nodes, inits, values, ranks = [2, 3, 4], [], {}, ["x"], {}
    for k in range(data.draw(st.integers(1, 8))):
        src, out = values[-1], f"v{k}"
        op = data.draw(st.sampled_from(["Reshape", "Transpose", "Identity", "Relu", "Flatten"]))
        if op == "Reshape":
            shape = list(data.draw(st.sampled_from([(2, 3, 4), (6, 4), (4, 6), (24,), (2, 12)])))
            inits[f"s{k}"] = np.array(shape, np.int64)
            nodes.append(h.make_node("Reshape", [src, f"s{k}"], [out]))
        elif op == "Transpose":
            perm = list(data.draw(st.permutations(range(len(shape)))))
            nodes.append(h.make_node("Transpose", [src], [out], perm=perm))
            shape = [shape[p] for p in perm]
        elif op == "Flatten":
            nodes.append(h.make_node("Flatten", [src], [out], axis=1))
            shape = [shape[0], int(np.prod(shape[1:]))]
        else:
            nodes.append(h.make_node(op, [src], [out]))
        values.append(out)
        ranks[out] = len(shape)
    chosen = data.draw(st.lists(st.sampled_from(values[1:]), max_size=2, unique=True))
    outputs = {name: ranks[name] for name in dict.fromkeys([*chosen, values[-1]])}
    graph = build(nodes, {"x": [2, 3, 4]}, outputs, inits)
    optimized, _ = optimize_checked(graph)
    assert_equivalent(graph, optimized, rng, tol=0.0)
