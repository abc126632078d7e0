"""The generic fusion pass: apply a table of declarative rules until none matches.

A `FusionRule` names the ops it starts from (`anchor_ops`), a `match`
predicate that looks at the anchor and its neighbourhood and returns what it
found (or None), and a `rewrite` that edits the graph. The pass sweeps the
nodes, trying the rules in table order on every anchor, and repeats until a
sweep changes nothing. Adding a fusion is adding a rule to a table in
`wpk.passes.fusion_rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from wpk.core.graph import Graph, Node
from wpk.passes.base import GraphPass, pinned_names


class FusionContext:
    """The graph being rewritten, with the queries and edits rules need.

    The consumer/producer maps are kept up to date by `absorb`, the one edit
    rules make, so a rewrite costs time proportional to the nodes it touches;
    `graph.nodes` itself is brought up to date by `commit` (after each sweep).
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pinned = pinned_names(graph)
        self.users: dict[str, list[Node]] = {}
        self.producers: dict[str, Node] = {}
        self._reads: dict[int, tuple[str, ...]] = {}
        self.removed: set[int] = set()
        self._graveyard: list[Node] = []
        self._slot: dict[int, int] = {}       # anchor -> id of the node whose place it takes
        self._moves: dict[int, Node] = {}     # id of a replaced node -> the anchor there
        self._position = {id(n): k for k, n in enumerate(graph.nodes)}
        for node in graph.nodes:
            self._register(node)

    def _register(self, node: Node) -> None:
        reads = tuple(dict.fromkeys(i for i in node.inputs if i))
        self._reads[id(node)] = reads
        for name in reads:
            self.users.setdefault(name, []).append(node)
        for name in node.outputs:
            if name:
                self.producers[name] = node

    def _unregister(self, node: Node) -> None:
        for name in self._reads.pop(id(node), ()):
            self.users[name] = [n for n in self.users.get(name, []) if n is not node]
        for name in node.outputs:
            if name and self.producers.get(name) is node:
                del self.producers[name]

    def const(self, name: str):
        """The constant value of tensor `name`, or None."""
        return self.graph.constants.get(name) if name else None

    def single_user(self, name: str) -> Node | None:
        """The one node reading `name`, when it is exactly one, reads it in one input slot
        and `name` is not pinned. A node reading it twice (MatMul(x, x), Mul(x, x)) is no
        single user: a rule absorbing `name`'s producer rewrites one slot, and the other
        would read what the rule removed or changed."""
        users = self.users.get(name, [])
        if len(users) != 1 or name in self.pinned or users[0].inputs.count(name) != 1:
            return None
        return users[0]

    def single_consumer(self, node: Node) -> Node | None:
        """The one node reading `node`'s only used output (None if several, or pinned)."""
        if not node.outputs:
            return None
        if any(o and (self.users.get(o) or o in self.pinned) for o in node.outputs[1:]):
            return None
        return self.single_user(node.outputs[0])

    def position(self, node: Node) -> int:
        """Where `node` stands in the (committed or pending) node order."""
        return self._position[self._slot.get(id(node), id(node))]

    def reindex(self, node: Node) -> None:
        """Bring the consumer/producer maps up to date after a rule changed `node`'s inputs
        in place (its outputs and position unchanged)."""
        self._unregister(node)
        self._register(node)

    @contextmanager
    def editing(self, *nodes: Node) -> Iterator[None]:
        """A rule edits `nodes` in place inside the block (op, inputs, outputs), leaving
        them where they stand; the consumer/producer maps follow when it ends. The order
        must stay topological, and the rule keeps `graph.tensors` up to date."""
        for node in nodes:
            self._unregister(node)
        try:
            yield
        finally:
            for node in nodes:
                self._register(node)

    def absorb(self, anchor: Node, consumer: Node, remove: Sequence[Node] = ()) -> None:
        """`anchor` takes over `consumer`'s outputs and position; `consumer` and `remove` go.

        Taking the consumer's position keeps the order topological even when the
        anchor gains inputs (operands) produced between the two. The rule may
        have changed the anchor's inputs, op and attrs already.
        """
        graph = self.graph
        for node in (anchor, consumer, *remove):
            self._unregister(node)
        for name in anchor.outputs:
            if name and name not in consumer.outputs:
                graph.tensors.pop(name, None)
        anchor.outputs = list(consumer.outputs)
        for node in remove:
            for name in node.outputs:
                if name and name not in anchor.outputs:
                    graph.tensors.pop(name, None)
        self._register(anchor)
        for node in (consumer, *remove):
            self.removed.add(id(node))
            self._graveyard.append(node)  # keeps ids unique while the pass runs
        self._moves[self._slot.get(id(anchor), id(anchor))] = None
        for node in remove:
            self._moves[self._slot.get(id(node), id(node))] = None
        self._slot[id(anchor)] = self._slot.get(id(consumer), id(consumer))
        self._moves[self._slot[id(anchor)]] = anchor

    def commit(self) -> None:
        """Write the pending moves and removals into `graph.nodes`."""
        if not self._moves:
            return
        nodes = []
        for node in self.graph.nodes:
            key = id(node)
            if key in self._moves:
                if self._moves[key] is not None:
                    nodes.append(self._moves[key])
            else:
                nodes.append(node)
        self.graph.nodes = nodes
        self._moves.clear()
        self._slot.clear()
        self._position = {id(n): k for k, n in enumerate(nodes)}


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
                    self.hit(rule.name)
                    changed = True
                    break
            ctx.commit()
        return graph
