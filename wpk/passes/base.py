"""What every graph pass shares: the pass interface and small graph-editing helpers.

A pass is a class with a `name` and `run(graph) -> Graph`; it may edit the
graph it is given in place and returns it. `hits` counts what it changed
(per pass, or per rule for the fusion passes) for the `PassReport`.
Invariants every pass keeps: nodes are topologically sorted, every tensor
used or produced has a `TensorInfo` in `graph.tensors`, and graph outputs keep
their names.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo

FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})


class GraphPass:
    """Base class of graph passes: a name, `run(graph) -> graph` and hit counters."""

    name = "pass"

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()

    def run(self, graph: Graph) -> Graph:  # pragma: no cover - interface
        raise NotImplementedError

    def hit(self, what: str | None = None, count: int = 1) -> None:
        self.hits[what or self.name] += count


def subgraph_names(graph: Graph) -> set[str]:
    """Names that subgraph attributes (If/Loop/Scan bodies) read from the outer scope."""
    names: set[str] = set()
    for node in graph.nodes:
        for value in node.attrs.values():
            for sub in value if isinstance(value, tuple) else (value,):
                if hasattr(sub, "node") and hasattr(sub, "initializer"):
                    names |= _graph_proto_inputs(sub)
    return names


def _graph_proto_inputs(proto) -> set[str]:
    used: set[str] = set()
    for node in proto.node:
        used.update(node.input)
        for attr in node.attribute:
            if attr.g.node:
                used |= _graph_proto_inputs(attr.g)
            for g in attr.graphs:
                used |= _graph_proto_inputs(g)
    return used


def constant_input(graph: Graph, node: Node, index: int, absent=None) -> np.ndarray | None:
    """The value of `node`'s input `index` when it is a constant: `absent` when the node
    does not have that input, None when it is computed at run time."""
    if index >= len(node.inputs) or not node.inputs[index]:
        return absent
    value = graph.constants.get(node.inputs[index])
    return None if value is None else np.asarray(value)


def readers_of(graph: Graph) -> dict[str, list[Node]]:
    """The nodes reading each tensor (once per node)."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(node.inputs):
            readers.setdefault(name, []).append(node)
    return readers


def slice_parameters(graph: Graph, node: Node) -> tuple[np.ndarray, ...] | None:
    """(starts, ends, axes, steps) of a Slice as flat integer arrays (axes 0.. and steps
    1 where not given), from its attributes before opset 10 or its constant inputs; None
    when one of them is computed at run time."""
    if graph.opset < 10:
        starts, ends, axes, steps = (node.attr(k) for k in ("starts", "ends", "axes",
                                                            "steps"))
    else:
        starts, ends = (constant_input(graph, node, i) for i in (1, 2))
        axes, steps = (constant_input(graph, node, i, absent=np.zeros(0)) for i in (3, 4))
        if any(v is None for v in (starts, ends, axes, steps)):
            return None
    starts, ends = np.asarray(starts).ravel(), np.asarray(ends).ravel()
    axes = np.arange(len(starts)) if axes is None or not np.size(axes) else \
        np.asarray(axes).ravel()
    steps = np.ones(len(starts), np.int64) if steps is None or not np.size(steps) else \
        np.asarray(steps).ravel()
    return starts, ends, axes, steps


def pinned_names(graph: Graph) -> set[str]:
    """Tensors whose names must stay: graph outputs and outer-scope reads of subgraphs."""
    return set(graph.outputs) | subgraph_names(graph)


def remove_node(graph: Graph, node: Node) -> None:
    """Take `node` out of the graph (by identity: equal-looking nodes stay)."""
    graph.nodes = [n for n in graph.nodes if n is not node]


def rename_uses(graph: Graph, old: str, new: str) -> None:
    """Make every node that reads `old` read `new` instead."""
    for node in graph.nodes:
        if old in node.inputs:
            node.inputs = [new if i == old else i for i in node.inputs]


def bypass(graph: Graph, node: Node, src: str, dst: str, pinned: set[str]) -> bool:
    """Remove a node that passes `src` through unchanged as `dst`; False if names forbid it.

    Readers of `dst` read `src` instead; when `dst` is a graph output, the
    producer of `src` is renamed to produce `dst` (if `src` itself may be renamed).
    """
    if dst not in pinned:
        remove_node(graph, node)
        rename_uses(graph, dst, src)
        graph.tensors.pop(dst, None)
        return True
    producer = next((n for n in graph.nodes if src in n.outputs), None)
    if producer is None or src in pinned or producer is node:
        return False
    remove_node(graph, node)
    producer.outputs = [dst if o == src else o for o in producer.outputs]
    rename_uses(graph, src, dst)
    graph.tensors.pop(src, None)
    return True


def add_constant(graph: Graph, base: str, value: np.ndarray) -> str:
    """Store a new constant under a fresh name derived from `base` and return the name."""
    name, k = base, 0
    while name in graph.tensors:
        k += 1
        name = f"{base}_{k}"
    graph.constants[name] = value
    graph.tensors[name] = TensorInfo(tuple(value.shape), value.dtype.name)
    return name


def drop_unused_constants(graph: Graph) -> int:
    """Forget constants no node reads and that are no graph output; returns how many."""
    used = {i for n in graph.nodes for i in n.inputs} | pinned_names(graph)
    unused = [name for name in graph.constants if name not in used]
    for name in unused:
        del graph.constants[name]
        graph.tensors.pop(name, None)
    return len(unused)


def topological_order_ok(graph: Graph) -> bool:
    """True when every node input is a graph input, a constant or produced earlier."""
    ready = set(graph.inputs) | set(graph.constants) | {""}
    for node in graph.nodes:
        if not all(i in ready for i in node.inputs):
            return False
        ready.update(node.outputs)
    return True


def check_graph(graph: Graph) -> None:
    """Assert the invariants of the IR (used by tests after every pass)."""
    assert topological_order_ok(graph), "nodes are not topologically sorted"
    produced = {o for n in graph.nodes for o in n.outputs if o}
    for name in [*graph.inputs, *graph.constants, *produced,
                 *(i for n in graph.nodes for i in n.inputs if i)]:
        assert name in graph.tensors, f"tensor '{name}' has no TensorInfo"
    for name in graph.outputs:
        assert name in produced or name in graph.constants or name in graph.inputs, \
            f"graph output '{name}' is not produced"
    names = [n.name for n in graph.nodes]
    assert len(names) == len(set(names)), "node names are not unique"
