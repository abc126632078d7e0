"""The generic fusion pass: apply a table of declarative rules until none matches.

A `FusionRule` names the ops it starts from (`anchor_ops`), a `match`
predicate that looks at the anchor and its neighbourhood and returns what it
found (or None), and a `rewrite` that edits the graph. The pass sweeps the
nodes, trying the rules in table order on every anchor, and repeats until a
sweep changes nothing. Adding a fusion is adding a rule to a table in
`wpk.passes.fusion_rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wpk.graph import Graph, Node
from wpk.passes.base import GraphPass, pinned_names


class FusionContext:
    """The graph being rewritten, with the queries and edits rules need."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pinned = pinned_names(graph)
        self._users: dict[str, list[Node]] | None = None
        self._producers: dict[str, Node] | None = None
        self.removed: set[int] = set()

    def invalidate(self) -> None:
        self._users = None
        self._producers = None

    @property
    def users(self) -> dict[str, list[Node]]:
        if self._users is None:
            self._users = self.graph.consumers()
        return self._users

    @property
    def producers(self) -> dict[str, Node]:
        if self._producers is None:
            self._producers = self.graph.producers()
        return self._producers

    def const(self, name: str):
        """The constant value of tensor `name`, or None."""
        return self.graph.constants.get(name) if name else None

    def single_user(self, name: str) -> Node | None:
        """The one node reading `name`, when it is exactly one and `name` is not pinned."""
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 and name not in self.pinned else None

    def single_consumer(self, node: Node) -> Node | None:
        """The one node reading `node`'s only used output (None if several, or pinned)."""
        if not node.outputs:
            return None
        if any(o and (o in self.users or o in self.pinned) for o in node.outputs[1:]):
            return None
        return self.single_user(node.outputs[0])

    def absorb(self, anchor: Node, consumer: Node, remove: Sequence[Node] = ()) -> None:
        """`anchor` takes over `consumer`'s outputs and position; `consumer` and `remove` go.

        Taking the consumer's position keeps the order topological even when the
        anchor gains inputs (operands) produced between the two.
        """
        graph = self.graph
        for name in anchor.outputs:
            if name and name not in consumer.outputs:
                graph.tensors.pop(name, None)
        anchor.outputs = list(consumer.outputs)
        graph.nodes.remove(anchor)
        graph.nodes[graph.nodes.index(consumer)] = anchor
        self.removed.add(id(consumer))
        for node in remove:
            graph.nodes.remove(node)
            self.removed.add(id(node))
            for name in node.outputs:
                if name and name not in anchor.outputs:
                    graph.tensors.pop(name, None)
        self.invalidate()


@dataclass(frozen=True)
class FusionRule:
    """One fusion: where it starts, when it applies and what it does."""

    name: str
    anchor_ops: frozenset[str] | None  # None: any op
    match: Callable[[FusionContext, Node], Any]
    rewrite: Callable[[FusionContext, Node, Any], None]
    doc: str = ""


class FusionPass(GraphPass):
    """Apply `rules` (in table order) to every node until nothing changes."""

    def __init__(self, name: str, rules: Sequence[FusionRule]):
        super().__init__()
        self.name = name
        self.rules = tuple(rules)

    def run(self, graph: Graph) -> Graph:
        ctx = FusionContext(graph)
        changed = True
        while changed:
            changed = False
            for node in list(graph.nodes):
                if id(node) in ctx.removed:
                    continue
                for rule in self.rules:
                    if rule.anchor_ops is not None and node.op not in rule.anchor_ops:
                        continue
                    found = rule.match(ctx, node)
                    if found is None or found is False:
                        continue
                    rule.rewrite(ctx, node, found)
                    ctx.invalidate()
                    self.hit(rule.name)
                    changed = True
                    break
        return graph
