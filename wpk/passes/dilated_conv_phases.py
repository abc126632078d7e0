"""CPU graph pass: a dilated 3x3 conv of the blocked layout as a regular conv of its phases.

A conv with dilation d reads, for output pixel (d*i + r, d*j + s), only input pixels of
the same phase (r, s) of the d x d grid: it is d^2 independent undilated convs, one per
phase image (space-to-batch, as TensorFlow computes atrous convolution). DeepLab-style
segmentation networks run their last stages dilated (ASPP, output stride 8 or 16), where
these convs take most of the time and no fast algorithm applied: the Winograd kernels
(`micro.winograd`) take undilated 3x3 stride-1 convs only, and onnxruntime's MLAS kernel
computes the dilated conv directly. So the blocked input (N, Cb, H, W, b) is viewed as
(N, Cb, H/d, d, W/d, d, b), transposed to the d^2 phases as a batch (d^2 N, Cb, H/d, W/d,
b), convolved with dilation 1 and the pads divided by d, and the result transposed back:
two copies of whole blocks around a conv every kernel family may compute (the planner
measures them as for any conv; the end-to-end check keeps onnxruntime's model when the
whole is not faster).

Only where it is exact and can pay: a blocked group-1 3x3 stride-1 `wpk.nchwc` Conv (not a
grouped conv the layout made one: groups widened to blocks, or sparse groups in bands) with
equal dilations d > 1, pads that are multiples of d, input and output sides that are
multiples of d, phase images of at least `MIN_PHASE_SIDE` pixels a side (smaller ones
leave a Winograd tile mostly empty), and no residual operand (its epilogue is bias and
activation only).
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS
from wpk.passes.base import GraphPass, add_constant
from wpk.passes.nchwc_rewrite import NCHWC_DOMAIN

MIN_PHASE_SIDE = 4
TO_PHASES = (3, 5, 0, 1, 2, 4, 6)     # (N, C, H/d, d, W/d, d, b) -> (d, d, N, C, H/d, W/d, b)
FROM_PHASES = (2, 3, 4, 0, 5, 1, 6)   # the inverse


def phase_dilation(graph: Graph, node: Node) -> int:
    """The dilation d of a blocked conv this pass rewrites, 0 for any other node."""
    if node.op != "Conv" or node.domain != NCHWC_DOMAIN or len(node.outputs) != 1 \
            or len(node.inputs) > 3 or any(s.operand is not None for s in node.epilogue):
        return 0
    x = graph.tensors[node.inputs[0]].shape
    y = graph.tensors[node.outputs[0]].shape
    dilations = tuple(node.attr("dilations", (1, 1)))
    if len(x) != 5 or len(y) != 5 or tuple(node.attr("kernel_shape", ())) != (3, 3) \
            or tuple(node.attr("strides", (1, 1))) != (1, 1) or int(node.attr("group", 1)) != 1 \
            or len(dilations) != 2 or dilations[0] != dilations[1] or dilations[0] < 2 \
            or node.attr(GROUP_WIDTH, 0) or node.attr(SPARSE_GROUPS, 0):
        return 0
    d = int(dilations[0])
    sides = (x[2], x[3], y[2], y[3])
    if any(p % d for p in node.attr("pads", (0, 0, 0, 0))) or any(n % d for n in sides) \
            or min(sides) < d * MIN_PHASE_SIDE:
        return 0
    return d


class DilatedConvPhases(GraphPass):
    """Rewrite dilated blocked 3x3 convs as undilated convs of their phases (module doc)."""

    name = "dilated_conv_phases"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            d = phase_dilation(graph, node)
            if d:
                nodes += self._by_phases(graph, node, d)
                self.hit()
            else:
                nodes.append(node)
        graph.nodes = nodes
        return graph

    def _by_phases(self, graph: Graph, node: Node, d: int) -> list[Node]:
        x, (y,) = node.inputs[0], node.outputs
        n, cb, h, w, b = graph.tensors[x].shape
        kb, oh, ow = graph.tensors[y].shape[1:4]

        def tensor(base: str, shape: tuple[int, ...]) -> str:
            name = graph.unique_name(f"{y}_{base}")
            graph.tensors[name] = TensorInfo(shape, "float32")
            return name

        def shape_of(base: str, shape: tuple[int, ...]) -> str:
            return add_constant(graph, f"{y}_{base}_shape", np.array(shape, np.int64))

        def named(base: str) -> str:
            return graph.unique_name(f"{node.name}_{base}")

        grid_in = tensor("input_grid", (n, cb, h // d, d, w // d, d, b))
        phases_in = tensor("input_phases", (d, d, n, cb, h // d, w // d, b))
        batch_in = tensor("input_batch", (d * d * n, cb, h // d, w // d, b))
        batch_out = tensor("output_batch", (d * d * n, kb, oh // d, ow // d, b))
        phases_out = tensor("output_phases", (d, d, n, kb, oh // d, ow // d, b))
        grid_out = tensor("output_grid", (n, kb, oh // d, d, ow // d, d, b))
        conv = Node("Conv", [batch_in, *node.inputs[1:]], [batch_out], node.name,
                    {**node.attrs, "dilations": (1, 1),
                     "pads": tuple(int(p) // d for p in node.attr("pads", (0, 0, 0, 0)))},
                    NCHWC_DOMAIN, node.epilogue)
        return [
            Node("Reshape", [x, shape_of("input_grid", graph.tensors[grid_in].shape)],
                 [grid_in], named("input_grid")),
            Node("Transpose", [grid_in], [phases_in], named("input_phases"),
                 {"perm": TO_PHASES}),
            Node("Reshape", [phases_in, shape_of("input_batch", graph.tensors[batch_in].shape)],
                 [batch_in], named("input_batch")),
            conv,
            Node("Reshape", [batch_out, shape_of("output_phases",
                                                 graph.tensors[phases_out].shape)],
                 [phases_out], named("output_phases")),
            Node("Transpose", [phases_out], [grid_out], named("output_grid"),
                 {"perm": FROM_PHASES}),
            Node("Reshape", [grid_out, shape_of("output", graph.tensors[y].shape)], [y],
                 named("output")),
        ]
