"""Channel Concat, shuffle and split of blocked tensors as ChannelGather nodes.

Used by `wpk.passes.nchwc_layout`. A ShuffleNet block ends in Concat(x1, branch) along
the channels, a channel shuffle written out as Reshape (N, g, C/g, H, W), Transpose
(0, 2, 1, 3, 4) and Reshape back to (N, C, H, W), and a Split (or two Slices) of the
result into the next block's halves. Each of these only moves channels. With channel
counts that are whole blocks a Concat and a block-aligned slice stay blocked, but
ShuffleNet's 58, 116 and 232 channels are not, and the shuffle interleaves channels
anyway: every block left the layout and came back (ReorderOutput, four copies,
ReorderInput).

Here a tensor that only moves channels of blocked tensors is a *view*: the list, channel
by channel, of (blocked tensor, lane) it copies. A Concat of views (or of blocked
tensors) along the channels concatenates the lists, a channel shuffle permutes one
(`shuffle_permutation`: any Reshape - Transpose - Reshape that leaves N, H and W in place),
a channel Split or Slice cuts one. Nothing is emitted until a node reads the view as a
tensor: then one `wpk.nchwc` ChannelGather writes it (semantics in `nchwc_layout`). So a
ShuffleNet block's Concat, shuffle and Split become one ChannelGather per half, each
reading the block's two inputs.

A view that would read more than `MAX_SOURCES` tensors first writes the views it is made
of: a ShuffleNet stage's pass-through half would otherwise gather from every earlier
block of the stage, its source list growing block by block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.passes.nchwc_data import channel_pieces
from wpk.passes.nchwc_rewrite import NCHWC_DOMAIN, Rewrite
from wpk.passes.nchwc_rules import is_float4d

MAX_SOURCES = 2
Lanes = list[tuple[str, int]]   # per channel: (blocked tensor, lane)


@dataclass(frozen=True)
class ShuffleForm:
    """A channel shuffle: output channel j is input channel `permutation[j]`; `absorbed`
    are the Transpose and the second Reshape, rewritten with the first."""

    permutation: np.ndarray
    output: str
    absorbed: tuple[Node, Node]


def shuffle_permutation(graph: Graph, reshape: Node, readers: dict[str, list[Node]]
                        ) -> ShuffleForm | None:
    """The channel permutation of a Reshape (N, C, H, W) -> (N, c1, ..., ck, H, W), a
    Transpose keeping N first and H, W last, and a Reshape back to (N, C, H, W), each
    intermediate read only by the next node; None for anything else."""
    if reshape.op != "Reshape" or reshape.domain not in ("", "ai.onnx") \
            or not is_float4d(graph, reshape.inputs[0]):
        return None
    n, c, h, w = graph.tensors[reshape.inputs[0]].shape
    split = tuple(graph.tensors[reshape.outputs[0]].shape)
    if len(split) < 5 or split[0] != n or split[-2:] != (h, w) or \
            int(np.prod(split[1:-2])) != c:
        return None
    follow = readers.get(reshape.outputs[0], [])
    if len(follow) != 1 or follow[0].op != "Transpose" or reshape.outputs[0] in graph.outputs:
        return None
    transpose = follow[0]
    perm = tuple(int(p) for p in transpose.attr("perm", ()))
    rank = len(split)
    if len(perm) != rank or perm[0] != 0 or perm[-2:] != (rank - 2, rank - 1) \
            or transpose.epilogue:
        return None
    follow = readers.get(transpose.outputs[0], [])
    if len(follow) != 1 or follow[0].op != "Reshape" or transpose.outputs[0] in graph.outputs:
        return None
    back = follow[0]
    if tuple(graph.tensors[back.outputs[0]].shape) != (n, c, h, w) \
            or graph.tensors[back.outputs[0]].dtype != "float32":
        return None
    inner = [p - 1 for p in perm[1:-2]]
    permutation = np.arange(c).reshape(split[1:-2]).transpose(inner).ravel()
    return ShuffleForm(permutation, back.outputs[0], (transpose, back))


@dataclass
class GatherViews:
    """Views of blocked tensors (module docstring) and when to write them."""

    views: dict[str, tuple[Lanes, str]]   # logical tensor -> (lanes, node name to write it)

    def lanes(self, rw: Rewrite, name: str) -> Lanes | None:
        """The (blocked tensor, lane) of each channel of `name`, a view or a blocked tensor;
        None when it is neither (an NCHW tensor)."""
        if name in self.views:
            return self.views[name][0]
        entry = rw.blocked.get(name)
        return None if entry is None else [(entry.name, j) for j in range(entry.channels)]

    def defer(self, name: str, lanes: Lanes, node_name: str) -> None:
        self.views[name] = (lanes, node_name)

    def write(self, rw: Rewrite, name: str) -> None:
        """Emit the ChannelGather of view `name` (nothing for other tensors): it becomes
        a blocked tensor."""
        if name not in self.views:
            return
        lanes, node_name = self.views.pop(name)
        sources = list(dict.fromkeys(source for source, _ in lanes))
        first, offset = {}, 0
        for source in sources:
            first[source] = offset
            offset += int(np.prod(rw.graph.tensors[source].shape[1::3]))   # Cb * b lanes
        out = rw.new_blocked(name, len(lanes))
        attrs = {"indices": tuple(first[s] + lane for s, lane in lanes),
                 "block": rw.block, "channels": len(lanes)}
        rw.nodes.append(Node("ChannelGather", sources, [out], rw.fresh(node_name), attrs,
                             NCHWC_DOMAIN))

    def write_inputs(self, rw: Rewrite, node: Node) -> None:
        for name in node.inputs:
            self.write(rw, name)

    def sources(self, rw: Rewrite, names: list[str]) -> set[str]:
        return {source for name in names for source, _ in (self.lanes(rw, name) or ())}


def concat_view(rw: Rewrite, views: GatherViews, node: Node, shuffled: bool) -> bool:
    """Defer a channel Concat of blocked tensors and views when a plain blocked Concat
    cannot take it (channel counts that are not whole blocks, a view among the inputs) or
    a channel shuffle reads it (`shuffled`)."""
    if node.op != "Concat" or node.domain not in ("", "ai.onnx") or node.epilogue \
            or int(node.attr("axis", 1)) not in (1, -3) or not node.inputs \
            or not is_float4d(rw.graph, node.outputs[0]):
        return False
    parts = [views.lanes(rw, name) for name in node.inputs]
    if any(p is None for p in parts):
        return False
    aligned = all(name in rw.blocked and rw.blocked[name].channels % rw.block == 0
                  for name in node.inputs)
    if aligned and not shuffled:
        return False
    if len(views.sources(rw, node.inputs)) > MAX_SOURCES:
        for name in node.inputs:
            views.write(rw, name)
        parts = [views.lanes(rw, name) for name in node.inputs]
    views.defer(node.outputs[0], [lane for part in parts for lane in part], node.name)
    return True


def shuffle_view(rw: Rewrite, views: GatherViews, form: ShuffleForm, node: Node) -> bool:
    """Defer a channel shuffle of a blocked tensor or view: its permuted lanes."""
    lanes = views.lanes(rw, node.inputs[0])
    if lanes is None:
        return False
    views.defer(form.output, [lanes[int(j)] for j in form.permutation], node.name)
    return True


def slice_views(rw: Rewrite, views: GatherViews, node: Node) -> bool:
    """Defer the pieces of a channel Split or Slice of a view, or of a blocked tensor
    whose pieces are not whole blocks (a block-aligned one is a ChannelSlice)."""
    x = node.inputs[0] if node.inputs else ""
    lanes = views.lanes(rw, x)
    pieces = channel_pieces(rw.graph, node) if lanes is not None and not node.epilogue \
        else None
    if pieces is None:
        return False
    aligned = all(start % rw.block == 0 and ((start + count) % rw.block == 0
                                             or start + count == len(lanes))
                  for start, count in pieces)
    if aligned and x not in views.views:
        return False
    for index, ((start, count), name) in enumerate(zip(pieces, node.outputs)):
        if name:
            views.defer(name, lanes[start:start + count],
                        node.name if len(pieces) == 1 else f"{node.name}/{index}")
    return True


__all__ = ["MAX_SOURCES", "GatherViews", "ShuffleForm", "concat_view", "shuffle_permutation",
           "shuffle_view", "slice_views"]
