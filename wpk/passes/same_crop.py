"""SAME padding below zero in AveragePool and LpPool: the input cropped by a Slice.

`auto_pad` SAME_UPPER or SAME_LOWER asks for ceil(size / stride) outputs; the spec's total
padding `(out - 1) * stride + extent - size` is negative when the window is shorter than
the stride and the size leaves room (a 1x1 window at stride 3 over 6 pixels: -2).
onnxruntime's AveragePool and LpPool then split the negative total as they split a
positive one (halved toward zero, the odd one at the end for SAME_UPPER, at the begin for
SAME_LOWER), so a begin of -1 starts the windows one pixel in: they average pixels 1 and 4
where a padding clamped at zero takes 0 and 3. wpk's kernels clamped it at zero, and
their results differed from onnxruntime's with no error (found by a grid of pools against
onnxruntime). Here each such pool reads its input through a Slice that crops the negative
parts off, and takes the (non-negative) rest as explicit pads: the windows, the counts and
the output size are onnxruntime's.

Left alone: MaxPool (onnxruntime refuses negative pads there; wpk keeps the clamp, as
TensorFlow reads SAME) and Conv (onnxruntime's own Conv is not consistent there: over 9
pixels a 1x1 kernel at stride 3 starts at pixel 0, over 8 at stride 4 at pixel 1; wpk
keeps the clamp).
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.onnx_pool import auto_pads
from wpk.passes.base import GraphPass, add_constant

WINDOW_OPS = frozenset({"AveragePool", "LpPool"})


def _negative_same_pads(graph: Graph, node: Node) -> list[int] | None:
    """The node's SAME pads when one of them is negative, else None."""
    if node.op not in WINDOW_OPS or node.domain not in ("", "ai.onnx"):
        return None
    auto_pad = node.text_attr("auto_pad", "NOTSET")
    info = graph.tensors.get(node.inputs[0])
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER") or info is None:
        return None
    sizes = info.shape[2:]
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != len(sizes) \
            or not all(isinstance(n, int) for n in sizes):
        return None
    rank = len(sizes)
    pads = auto_pads(auto_pad, sizes, kernel, node.attr("strides") or (1,) * rank,
                     node.attr("dilations") or (1,) * rank)
    return pads if min(pads) < 0 else None


class SameCrop(GraphPass):
    """Negative SAME padding as a crop and explicit pads (module docstring)."""

    name = "same_crop"

    def run(self, graph: Graph) -> Graph:
        for node in list(graph.nodes):
            pads = _negative_same_pads(graph, node)
            if pads is None:
                continue
            cropped = self._crop(graph, node, pads)
            node.inputs[0] = cropped
            node.attrs.pop("auto_pad", None)
            node.attrs["pads"] = tuple(max(0, p) for p in pads)
            self.hit()
        return graph

    def _crop(self, graph: Graph, node: Node, pads: list[int]) -> str:
        """A Slice before `node` cropping its input by the negative pads; its output."""
        source = node.inputs[0]
        info = graph.tensors[source]
        rank = len(info.shape) - 2
        axes = [a for a in range(rank) if pads[a] < 0 or pads[a + rank] < 0]
        starts = [max(0, -pads[a]) for a in axes]
        ends = [info.shape[2 + a] - max(0, -pads[a + rank]) for a in axes]
        shape = list(info.shape)
        for a, start, end in zip(axes, starts, ends):
            shape[2 + a] = end - start
        cropped = graph.unique_name(f"{source}/same_crop")
        graph.tensors[cropped] = TensorInfo(tuple(shape), info.dtype)
        inputs = [source]
        attrs = {}
        if graph.opset >= 10:
            inputs += [add_constant(graph, f"{cropped}/{part}", np.array(values, np.int64))
                       for part, values in (("starts", starts), ("ends", ends),
                                            ("axes", [2 + a for a in axes]))]
        else:
            attrs = {"starts": tuple(starts), "ends": tuple(ends),
                     "axes": tuple(2 + a for a in axes)}
        slice_node = Node("Slice", inputs, [cropped], graph.unique_name(f"{node.name}/crop"),
                          attrs)
        graph.nodes.insert(graph.nodes.index(node), slice_node)
        return cropped
