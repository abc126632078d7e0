"""Packed QKV split by slices of the packed tensor itself (CPU, before `attention_heads`).

torch's dynamo exporter writes a ViT's (timm's) head split as

    qkv = Reshape(x @ W_qkv, [B, S, 3, H, D])
    t = Transpose(qkv, perm=(2, 0, 3, 1, 4))           # [3, B, H, S, D], a copy of it all
    q, k, v = Slice(t, [i, i+1] on axis 0) -> Squeeze / Reshape to [B, H, S, D]

(TorchScript's export of the same `unbind(0)`: one Split of t into pieces of one on
axis 0, each read by a Squeeze),

which copies the packed tensor twice (the transpose, then its slices). Each slice is
rewritten as a slice of the packed tensor on its own axis (a copy of rows of H x D
floats), a Reshape to [B, S, H, D] (a view) and the heads' split Transpose (0, 2, 1, 3),
which `attention_heads` then absorbs into the fused attention's [B, S, H, D] operands:
one copy of the packed tensor instead of two, and no transposition. It fires only when
every reader of the Transpose is such a slice (or the one Split), each piece read by one
Squeeze or Reshape to [B, H, S, D] alone, so the Transpose goes.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import (
    FLOAT_DTYPES,
    GraphPass,
    add_constant,
    pinned_names,
    readers_of,
    slice_parameters,
)

PACKED_PERM = (2, 0, 3, 1, 4)
RESHAPES = ("Reshape", "Squeeze")


def _slice_index(graph: Graph, node: Node) -> int | None:
    """The one index a Slice keeps of axis 0 (start i, end i + 1, step 1), or None."""
    if node.op != "Slice" or node.domain not in ("", "ai.onnx"):
        return None
    found = slice_parameters(graph, node)
    if found is None:
        return None
    starts, ends, axes, steps = found
    if not (len(starts) == len(ends) == len(axes) == 1 and int(axes[0]) in (0, -5)
            and int(steps[0]) == 1):
        return None
    start = int(starts[0])
    return start if start >= 0 and int(ends[0]) == start + 1 else None


def _pieces(graph: Graph, packed: str, readers: list[Node]
            ) -> list[tuple[int, Node, str]] | None:
    """(index, the node that takes it, the tensor it lands in) of each index of axis 0 of
    the transposed tensor `packed`, read by `readers`: Slices of one index each (dynamo),
    or one Split into pieces of one on axis 0 (TorchScript's unbind); None otherwise."""
    if any(node.inputs[0] != packed for node in readers):
        return None
    if len(readers) == 1 and readers[0].op == "Split" and \
            readers[0].domain in ("", "ai.onnx") and int(readers[0].attr("axis", 0)) in (0, -5):
        split, shape = readers[0], tuple(graph.tensors[packed].shape)
        piece = (1,) + shape[1:]
        if len(split.outputs) != shape[0] or any(
                o not in graph.tensors or tuple(graph.tensors[o].shape) != piece
                for o in split.outputs):
            return None
        return [(index, split, o) for index, o in enumerate(split.outputs)]
    indices = [_slice_index(graph, node) for node in readers]
    if None in indices:
        return None
    return [(index, node, node.outputs[0]) for index, node in zip(indices, readers)]


class PackedQkvSplit(GraphPass):
    """Rewrite the packed QKV split (module docstring)."""

    name = "packed_qkv"

    def run(self, graph: Graph) -> Graph:
        readers, pinned = readers_of(graph), pinned_names(graph)
        replaced: dict[int, list[Node]] = {}   # id of a removed node -> nodes in its place
        for node in graph.nodes:
            found = self._match(graph, node, readers, pinned)
            if found is None:
                continue
            replaced[id(node)] = []
            for index, piece, reshape in found:
                replaced[id(piece)] = []
                replaced[id(reshape)] = self._split(graph, node, index, reshape)
            self.hit()
        if replaced:
            graph.nodes = [new for node in graph.nodes
                           for new in replaced.get(id(node), [node])]
        return graph

    def _match(self, graph: Graph, node: Node, readers, pinned):
        """[(index, its Slice, the Squeeze/Reshape reading it)] of a packed split, or None."""
        if node.op != "Transpose" or node.domain not in ("", "ai.onnx") or \
                tuple(node.attr("perm") or ()) != PACKED_PERM:
            return None
        info = graph.tensors.get(node.inputs[0])
        if info is None or len(info.shape) != 5 or info.dtype not in FLOAT_DTYPES:
            return None
        b, s, _, h, d = info.shape
        out = node.outputs[0]
        if out in pinned or not readers.get(out):
            return None
        pieces = _pieces(graph, out, readers[out])
        if pieces is None:
            return None
        found = []
        for index, piece, piece_out in pieces:
            after = readers.get(piece_out, [])
            if len(after) != 1 or piece_out in pinned:
                return None
            reshape = after[0]
            if reshape.op not in RESHAPES or reshape.domain not in ("", "ai.onnx") or \
                    tuple(graph.tensors[reshape.outputs[0]].shape) != (b, h, s, d):
                return None
            found.append((index, piece, reshape))
        return found

    def _split(self, graph: Graph, transpose: Node, index: int, reshape: Node) -> list[Node]:
        """Slice of the packed tensor on its axis 2, Reshape to [B, S, H, D], Transpose
        (0, 2, 1, 3) into the Squeeze/Reshape's output."""
        packed = transpose.inputs[0]
        info = graph.tensors[packed]
        b, s, _, h, d = info.shape
        base = f"{reshape.name}_packed"
        sliced = graph.unique_name(f"{base}_slice")
        graph.tensors[sliced] = TensorInfo((b, s, 1, h, d), info.dtype)
        rows = graph.unique_name(f"{base}_rows")
        graph.tensors[rows] = TensorInfo((b, s, h, d), info.dtype)
        bounds = [add_constant(graph, f"{base}_{k}", np.array([v], np.int64))
                  for k, v in (("start", index), ("end", index + 1), ("axis", 2))]
        shape = add_constant(graph, f"{base}_shape", np.array([b, s, h, d], np.int64))
        return [Node("Slice", [packed, *bounds], [sliced], graph.unique_name(f"{base}_slice")),
                Node("Reshape", [sliced, shape], [rows], graph.unique_name(f"{base}_reshape")),
                Node("Transpose", [rows], list(reshape.outputs), reshape.name,
                     {"perm": (0, 2, 1, 3)})]
