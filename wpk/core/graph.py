"""The graph IR that the frontend produces and the passes transform.

A `Graph` is a topologically ordered list of `Node`s over named tensors.
Every tensor has a `TensorInfo` (static shape and dtype; after the frontend
no dimension is symbolic). Constants (initializers, folded values) live in
`Graph.constants` and are never produced by a node. A node may carry an
`epilogue` (see `wpk.core.workload.EpilogueStep`): elementwise steps fused
into it, whose binary operands are further node inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wpk.core.workload import EpilogueStep, TensorSpec, as_text


@dataclass
class TensorInfo:
    """Static shape and numpy dtype name of a tensor."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(tuple(self.shape), self.dtype)


@dataclass
class Node:
    """One operator application. Empty strings in `inputs` are absent optional inputs."""

    op: str
    inputs: list[str]
    outputs: list[str]
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    epilogue: tuple[EpilogueStep, ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def text_attr(self, name: str, default: str) -> str:
        """A string attribute as text (ONNX stores strings as bytes)."""
        value = self.attrs.get(name)
        return as_text(default if value is None else value)


@dataclass
class Graph:
    """A model as wpk sees it: nodes in topological order over named tensors."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    tensors: dict[str, TensorInfo]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    opsets: dict[str, int] = field(default_factory=lambda: {"": 17})
    source: str = ""

    @property
    def opset(self) -> int:
        """Opset of the default ONNX domain."""
        return self.opsets.get("", self.opsets.get("ai.onnx", 17))

    def copy(self) -> Graph:
        """A deep copy of the structure; constant arrays are shared, not copied."""
        clone = copy.copy(self)
        clone.nodes = [copy.deepcopy(n) for n in self.nodes]
        clone.inputs = list(self.inputs)
        clone.outputs = list(self.outputs)
        clone.tensors = {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in self.tensors.items()}
        clone.constants = dict(self.constants)
        clone.opsets = dict(self.opsets)
        return clone

    def producers(self) -> dict[str, Node]:
        """Map tensor name -> the node producing it."""
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Map tensor name -> nodes reading it (each node once per tensor)."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(i for i in node.inputs if i):
                users.setdefault(name, []).append(node)
        return users

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def op_counts(self) -> dict[str, int]:
        """Number of nodes per op type (fused nodes count under their op)."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items()))

    def iter_nodes(self, op: str | None = None) -> Iterator[Node]:
        return (n for n in list(self.nodes) if op is None or n.op == op)

    def unique_name(self, base: str) -> str:
        """A tensor/node name not used yet in the graph."""
        taken = set(self.tensors) | {n.name for n in self.nodes}
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        return name
