"""Dead-node elimination: drop nodes none of whose outputs is used, and unused constants."""

from __future__ import annotations

from wpk.core.graph import Graph
from wpk.passes.base import GraphPass, drop_unused_constants, pinned_names


class DeadNodeElimination(GraphPass):
    """Remove nodes whose outputs nobody reads (walking backwards from the graph outputs)."""

    name = "dead_nodes"

    def run(self, graph: Graph) -> Graph:
        live = pinned_names(graph)
        kept = []
        for node in reversed(graph.nodes):
            if any(o in live for o in node.outputs if o):
                kept.append(node)
                live.update(i for i in node.inputs if i)
            else:
                self.hit()
        graph.nodes = kept[::-1]
        drop_unused_constants(graph)
        used = set(graph.inputs) | set(graph.constants) | live
        used |= {o for n in graph.nodes for o in n.outputs}
        for name in [t for t in graph.tensors if t not in used]:
            del graph.tensors[name]
        return graph
