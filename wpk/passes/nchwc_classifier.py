"""The NCHWc layout pass's classifier rule: Gemm on flattened pooled features as a 1x1 Conv.

A CNN ends with pooled features X of shape (N, C, 1, 1), flattened (Flatten
axis 1, or a Reshape to (N, C)) and fed to a fully connected Gemm:
Y = alpha * flat(X) @ B' + beta * Cb, B' = B^T when transB. That is the 1x1
convolution of X with the filter W[o, c, 0, 0] = alpha * B'[c, o] and the bias
beta * Cb, flattened: Y = flat(Conv(X, W, bias)). When X is blocked, the
convolution stays blocked (its output is 1x1, so any channel count is fine),
the layout change happens on the (N, O, 1, 1) result, and the classifier runs
in the same onnxruntime region as the convolutions before it instead of as a
separate BLAS call. Only constant B and C (per output column or scalar) and a
Gemm without a fused epilogue qualify.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node


@dataclass(frozen=True)
class Classifier:
    """A matched Flatten -> Gemm: the Gemm node and its convolution weight and bias."""

    gemm: Node
    weight: np.ndarray   # (O, C, 1, 1) float32
    bias: np.ndarray     # (O,) float32


def flattens_pooled(graph: Graph, node: Node) -> bool:
    """Whether `node` is a Flatten(axis 1) or Reshape of an (N, C, 1, 1) tensor to (N, C)."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or not node.inputs:
        return False
    x, out = graph.tensors.get(node.inputs[0]), graph.tensors.get(node.outputs[0])
    if x is None or out is None or len(x.shape) != 4 or tuple(x.shape[2:]) != (1, 1):
        return False
    if node.op == "Flatten":
        return int(node.attr("axis", 1)) == 1
    return node.op == "Reshape" and tuple(out.shape) == tuple(x.shape[:2])


def match_classifier(graph: Graph, flatten: Node, readers: list[Node]) -> Classifier | None:
    """The Gemm that alone reads `flatten`'s output, as a convolution, or None."""
    if not flattens_pooled(graph, flatten) or len(readers) != 1:
        return None
    gemm = readers[0]
    flat = flatten.outputs[0]
    if gemm.op != "Gemm" or gemm.domain not in ("", "ai.onnx") or gemm.epilogue \
            or len(gemm.outputs) != 1 or gemm.inputs[0] != flat or flat in gemm.inputs[1:] \
            or int(gemm.attr("transA", 0)) or flat in graph.outputs:
        return None
    b = graph.constants.get(gemm.inputs[1]) if len(gemm.inputs) > 1 else None
    if b is None or b.ndim != 2 or b.dtype != np.float32:
        return None
    b = np.asarray(b, np.float64)
    b = b.T if int(gemm.attr("transB", 0)) else b
    channels = graph.tensors[flat].shape[1]
    if b.shape[0] != channels:
        return None
    bias = _bias(graph, gemm, b.shape[1])
    if bias is None:
        return None
    weight = float(gemm.attr("alpha", 1.0)) * b.T
    return Classifier(gemm, weight.astype(np.float32).reshape(*weight.shape, 1, 1),
                      bias.astype(np.float32))


def _bias(graph: Graph, gemm: Node, outputs: int) -> np.ndarray | None:
    """beta * C as an (O,) vector: zero without C; None for a C that is not per column."""
    if len(gemm.inputs) < 3 or not gemm.inputs[2]:
        return np.zeros(outputs)
    c = graph.constants.get(gemm.inputs[2])
    if c is None or c.size not in (1, outputs) or (c.ndim == 2 and c.shape[0] != 1) \
            or c.ndim > 2:
        return None
    return float(gemm.attr("beta", 1.0)) * np.broadcast_to(
        np.asarray(c, np.float64).reshape(-1), (outputs,))


