"""What a Pad node does, when it is known before the run: mode, value and widths.

    form = pad_form(graph, node)    # PadForm, or None (widths or value not constant)

Reads both spellings: attributes `pads` and `value` before opset 11, inputs 1
(widths) and 2 (value) from opset 11, and opset 18's `axes` input (input 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.passes.base import constant_input


@dataclass(frozen=True)
class PadForm:
    """A Pad with constant widths: `begin` and `end` per dim of its input (negative
    widths crop), `mode` (constant, reflect, edge, wrap) and the constant `value`."""

    mode: str
    value: float
    begin: tuple[int, ...]
    end: tuple[int, ...]

    def spatial_only(self) -> bool:
        """Whether it pads (never crops) only the dims after batch and channel."""
        return min(self.begin + self.end) >= 0 and not any(self.begin[:2] + self.end[:2])


def pad_form(graph: Graph, pad: Node) -> PadForm | None:
    """The form of a Pad node whose widths and value are constants, else None."""
    if pad.op != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.outputs) != 1:
        return None
    info = graph.tensors.get(pad.inputs[0])
    if info is None or not info.shape:
        return None
    rank = len(info.shape)
    if graph.opset < 11:
        widths, value = pad.attr("pads"), pad.attr("value", 0.0)
    else:
        widths = constant_input(graph, pad, 1)
        value = constant_input(graph, pad, 2, absent=np.zeros(()))
    given = constant_input(graph, pad, 3, absent=np.arange(rank))   # opset 18's axes
    if widths is None or value is None or given is None or np.asarray(value).size != 1:
        return None
    widths = [int(w) for w in np.asarray(widths).ravel()]
    axes = [int(a) % rank for a in np.asarray(given).ravel()]
    if len(widths) != 2 * len(axes):
        return None
    begin, end = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        begin[axis], end[axis] = widths[k], widths[k + len(axes)]
    return PadForm(pad.text_attr("mode", "constant"), float(np.asarray(value).ravel()[0]),
                   tuple(begin), tuple(end))
