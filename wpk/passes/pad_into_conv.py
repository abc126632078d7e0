"""Pad -> Conv: a zero Pad of the spatial dims becomes the convolutions' own padding.

Keras's `ZeroPadding2D` before a strided convolution (ResNet's and MobileNet's
stems in `keras.applications`), and TensorFlow's explicit `tf.pad`, reach ONNX
through tf2onnx as a `Pad` node in front of a `Conv` with VALID padding. As two
nodes the padded tensor makes a round trip through memory, and the Pad is not
an op of the blocked layout, so the layout ends before it. When every reader
of the padded tensor is a Conv reading it as its input, the Pad widths add to
each Conv's `pads` and the Pad goes.

Folded: `mode` constant (the default) with value 0 (attribute before opset 11,
input 2 from opset 11), widths that are known constants (attribute, or input 1
from opset 11, with opset 18's `axes` input), non-negative, zero on the batch
and channel dims; Convs with explicit pads or auto_pad NOTSET/VALID. Not folded:
a Pad whose output is a graph output or read by anything else, negative widths
(a crop), reflect/edge modes, a non-zero value.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.passes.base import GraphPass, constant_input, pinned_names


def spatial_widths(graph: Graph, pad: Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(begin, end) zero-padding widths of the spatial dims of a foldable Pad, or None."""
    if pad.op != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.outputs) != 1:
        return None
    if pad.text_attr("mode", "constant") != "constant":
        return None
    info = graph.tensors.get(pad.inputs[0])
    if info is None or len(info.shape) < 3:
        return None
    rank = len(info.shape)
    if graph.opset < 11:
        widths, value = pad.attr("pads"), pad.attr("value", 0.0)
    else:
        widths = constant_input(graph, pad, 1)
        value = constant_input(graph, pad, 2, absent=np.zeros(()))
    if widths is None or value is None or np.any(np.asarray(value) != 0):
        return None
    widths = [int(w) for w in np.asarray(widths).ravel()]
    given = constant_input(graph, pad, 3, absent=np.arange(rank))   # opset 18's axes
    if given is None:
        return None
    axes = [int(a) % rank for a in given.ravel()]
    if len(widths) != 2 * len(axes):
        return None
    begin, end = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        begin[axis], end[axis] = widths[k], widths[k + len(axes)]
    if min(begin + end) < 0 or any(begin[:2]) or any(end[:2]):
        return None
    return tuple(begin[2:]), tuple(end[2:])


def _takes_pads(conv: Node, padded: str) -> bool:
    """Whether `conv` reads `padded` only as its data input and its padding is explicit."""
    if conv.op != "Conv" or conv.domain not in ("", "ai.onnx") or conv.inputs[0] != padded:
        return False
    if padded in conv.inputs[1:]:
        return False
    return conv.text_attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")


class PadIntoConv(GraphPass):
    """Fold zero spatial Pads into the Convs that read them (module docstring)."""

    name = "pad_into_conv"

    def run(self, graph: Graph) -> Graph:
        readers = graph.consumers()
        pinned = pinned_names(graph)
        for pad in list(graph.nodes):
            found = spatial_widths(graph, pad)
            padded = pad.outputs[0]
            convs = readers.get(padded, [])
            if found is None or not convs or padded in pinned \
                    or not all(_takes_pads(c, padded) for c in convs):
                continue
            begin, end = found
            for conv in convs:
                rank = len(begin)
                pads = list(conv.attr("pads") or (0,) * (2 * rank))
                conv.attrs["pads"] = tuple(
                    [p + b for p, b in zip(pads[:rank], begin)]
                    + [p + e for p, e in zip(pads[rank:], end)])
                conv.attrs.pop("auto_pad", None)
                conv.inputs[0] = pad.inputs[0]
            graph.nodes = [n for n in graph.nodes if n is not pad]
            self.hit()
        return graph
