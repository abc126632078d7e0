"""ConvTranspose of a 1x1 image -> Reshape, MatMul, bias Add, Reshape.

A generator's first layer (DCGAN's latent vector (N, 100, 1, 1) -> (N, 512, 4, 4)) is a
ConvTranspose whose input has one pixel: every output pixel (y, x) is that pixel's
channels times the weights' tap (y, x), so the whole layer is one matrix product,
(N, Ci) @ W.reshape(Ci, Co * kh * kw), the bias repeated over the taps, reshaped to
(N, Co, kh, kw). As a ConvTranspose it runs as a scatter over one pixel (no vector
reuse: 3x slower than onnxruntime in `scripts/bench_conv_transpose.py`); as a MatMul it
takes the GEMM kernels and the epilogue fusion. Runs after `fold_linear`, so a
BatchNormalization folded into the ConvTranspose comes along in the weights and bias.

Only when nothing else shapes the output: group 1, dilations 1, pads and output padding 0
(or auto_pad VALID), no output_shape other than the kernel's, constant weights and bias,
and a known (N, Ci, 1, 1) input.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass, add_constant, constant_input


class ConvTransposeAsMatMul(GraphPass):
    """Rewrite each ConvTranspose of a one-pixel 2-d image as a MatMul (module docstring)."""

    name = "conv_transpose_as_matmul"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            if one_pixel_conv_transpose(graph, node):
                nodes += self._as_matmul(graph, node)
                self.hit()
            else:
                nodes.append(node)
        graph.nodes = nodes
        return graph

    def _as_matmul(self, graph: Graph, node: Node) -> list[Node]:
        weights = constant_input(graph, node, 1)
        bias = constant_input(graph, node, 2)
        (out,) = node.outputs
        n, ci = graph.tensors[node.inputs[0]].shape[:2]
        co, kh, kw = graph.tensors[out].shape[1:]
        dtype = graph.tensors[out].dtype

        def computed(base: str, shape: tuple[int, ...]) -> str:
            name = graph.unique_name(f"{out}_{base}")
            graph.tensors[name] = TensorInfo(shape, dtype)
            return name

        def named(base: str) -> str:
            return graph.unique_name(f"{node.name}_{base}")

        rows = add_constant(graph, f"{out}_rows_shape", np.array([n, ci], np.int64))
        matrix = add_constant(graph, f"{out}_matrix",
                              np.ascontiguousarray(weights.reshape(ci, co * kh * kw)))
        image = add_constant(graph, f"{out}_image_shape", np.array([n, co, kh, kw], np.int64))
        x2, product = computed("rows", (n, ci)), computed("product", (n, co * kh * kw))
        result = [Node("Reshape", [node.inputs[0], rows], [x2], named("rows")),
                  Node("MatMul", [x2, matrix], [product], node.name)]
        if bias is not None:
            taps = add_constant(graph, f"{out}_bias", np.repeat(bias, kh * kw).astype(
                weights.dtype))
            shifted = computed("shifted", (n, co * kh * kw))
            result.append(Node("Add", [product, taps], [shifted], named("bias")))
            product = shifted
        result.append(Node("Reshape", [product, image], [out], named("image")))
        return result


def one_pixel_conv_transpose(graph: Graph, node: Node) -> bool:
    """Whether `node` is a ConvTranspose the pass rewrites (module docstring)."""
    if node.op != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
        return False
    weights = constant_input(graph, node, 1)
    bias = constant_input(graph, node, 2, absent=np.zeros(0))
    x = graph.tensors.get(node.inputs[0])
    y = graph.tensors.get(node.outputs[0])
    if weights is None or bias is None or x is None or y is None or weights.ndim != 4:
        return False
    if len(x.shape) != 4 or any(not isinstance(d, int) or d < 1 for d in (*x.shape, *y.shape)):
        return False
    kh, kw = weights.shape[2:]
    if x.shape[2:] != (1, 1) or y.shape != (x.shape[0], weights.shape[1], kh, kw):
        return False
    zeros = (0, 0, 0, 0)
    return (node.attr("group", 1) == 1
            and tuple(node.attr("dilations", (1, 1))) == (1, 1)
            and tuple(node.attr("pads", zeros)) == zeros
            and tuple(node.attr("output_padding", (0, 0))) == (0, 0)
            and tuple(node.attr("output_shape", (kh, kw)))[-2:] == (kh, kw)
            and node.text_attr("auto_pad", "NOTSET") in ("NOTSET", "VALID"))
