"""No-op removal: drop nodes that pass their input through unchanged, collapse pairs.

Removed: Identity, Dropout at inference (mask unused), Cast to the same type,
Reshape/Flatten/Squeeze/Unsqueeze/Expand to the same shape, Transpose with the
identity permutation, Pad with all-zero pads. Collapsed: a reshape-like op
feeding only a Reshape (one Reshape to the final shape), and two Transposes
in a row (one Transpose, or none when they cancel).
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.passes.base import GraphPass, add_constant, bypass, pinned_names, remove_node

RESHAPE_LIKE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
SAME_SHAPE_NOOPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})
IDENTITY_CANDIDATES = SAME_SHAPE_NOOPS | {"Identity", "Dropout", "Cast", "Transpose", "Pad"}


def _const(graph: Graph, name: str) -> np.ndarray | None:
    return graph.constants.get(name) if name else None


def _is_identity(graph: Graph, node: Node, used: set[str]) -> bool:
    op = node.op
    if op not in IDENTITY_CANDIDATES or node.domain not in ("", "ai.onnx"):
        return False
    src, dst = node.inputs[0] if node.inputs else "", node.outputs[0]
    if not src or src not in graph.tensors or dst not in graph.tensors:
        return False
    same_shape = graph.tensors[src].shape == graph.tensors[dst].shape
    same_type = graph.tensors[src].dtype == graph.tensors[dst].dtype
    if op == "Identity":
        return True
    if op == "Dropout":
        mask_used = len(node.outputs) > 1 and node.outputs[1] in used
        training = _const(graph, node.inputs[2]) if len(node.inputs) > 2 else None
        training_on = training is not None and bool(np.asarray(training).item())
        dynamic = len(node.inputs) > 2 and node.inputs[2] and training is None
        return not mask_used and not training_on and not dynamic
    if op == "Cast":
        return same_type
    if op in SAME_SHAPE_NOOPS:
        return same_shape and same_type
    if op == "Transpose":
        rank = len(graph.tensors[src].shape)
        perm = node.attr("perm", tuple(range(rank))[::-1])
        return tuple(perm) == tuple(range(rank))
    if op == "Pad":
        pads = node.attr("pads") if len(node.inputs) < 2 else _const(graph, node.inputs[1])
        return pads is not None and not np.any(np.asarray(pads))
    return False


class NoOpRemoval(GraphPass):
    """Remove nodes that compute nothing and merge reshape/transpose pairs."""

    name = "noop_removal"

    def run(self, graph: Graph) -> Graph:
        changed = True
        while changed:
            changed = False
            pinned = pinned_names(graph)
            used = pinned | {i for n in graph.nodes for i in n.inputs}
            for node in list(graph.nodes):  # a removal only ever drops visited nodes
                if _is_identity(graph, node, used):
                    if bypass(graph, node, node.inputs[0], node.outputs[0], pinned):
                        self.hit(f"remove_{node.op}")
                        changed = True
                    continue
                if node.op in ("Reshape", "Transpose") and self._collapse(graph, node, pinned):
                    changed = True
        return graph

    def _collapse(self, graph: Graph, second: Node, pinned: set[str]) -> bool:
        """Merge `second` with the Reshape-like / Transpose feeding only it."""
        mid = second.inputs[0]
        first = next((n for n in graph.nodes if mid in n.outputs), None)
        if first is None or mid in pinned:
            return False
        if sum(mid in n.inputs for n in graph.nodes) != 1:
            return False
        if second.op == "Reshape" and first.op in RESHAPE_LIKE:
            shape = np.array(graph.tensors[second.outputs[0]].shape, dtype=np.int64)
            second.inputs = [first.inputs[0], add_constant(graph, f"{second.name}_shape", shape)]
            second.attrs.pop("allowzero", None)
            self.hit("collapse_reshape")
        elif second.op == "Transpose" and first.op == "Transpose":
            rank = len(graph.tensors[mid].shape)
            p = first.attr("perm", tuple(range(rank))[::-1])
            q = second.attr("perm", tuple(range(rank))[::-1])
            second.inputs = [first.inputs[0]]
            second.attrs["perm"] = tuple(int(p[i]) for i in q)
            self.hit("collapse_transpose")
        else:
            return False
        remove_node(graph, first)
        graph.tensors.pop(mid, None)
        return True
