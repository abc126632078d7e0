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

from wpk.core.graph import Graph, Node
from wpk.passes.base import GraphPass, pinned_names
from wpk.passes.pad_form import pad_form


def spatial_widths(graph: Graph, pad: Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(begin, end) zero-padding widths of the spatial dims of a foldable Pad, or None."""
    form = pad_form(graph, pad)
    if form is None or form.mode != "constant" or form.value != 0 or len(form.begin) < 3 \
            or not form.spatial_only():
        return None
    return form.begin[2:], form.end[2:]


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
