"""The buffer plan: where every non-constant tensor of a plan lives at run time.

Intermediate tensors live from the step that produces them to the last step
that reads them (both inclusive, so a step's outputs never share memory with
its inputs). Tensors whose lifetimes do not overlap share a buffer: greedy by
size, largest first, each going to the smallest free buffer (best fit; every
existing buffer is at least as large, since sizes only decrease). Graph
inputs and outputs get buffers of their own, and constants are not buffers.
All buffers are slices of one arena, at offsets aligned to `ALIGNMENT` bytes.

A view (a step's output that is its input reinterpreted, a Reshape) shares its
source's buffer: the two are one tensor for the plan, living from the first's
production to the last read of either, in the buffer of whichever of them is a
graph input or output (two such stay apart, and the step copies).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

ALIGNMENT = 64


@dataclass(frozen=True)
class Lifetime:
    """A tensor's size and the steps (inclusive) during which it must stay intact."""

    name: str
    nbytes: int
    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class BufferPlan:
    """Buffer sizes and arena offsets, and the buffer of every tensor."""

    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    assignment: Mapping[str, int]
    no_reuse_bytes: int
    alignment: int = ALIGNMENT

    @property
    def arena_bytes(self) -> int:
        """Bytes of the whole arena (all buffers, alignment padding included)."""
        if not self.sizes:
            return 0
        return self.offsets[-1] + _align(self.sizes[-1], self.alignment)

    def to_json(self) -> dict:
        return {
            "alignment": self.alignment,
            "buffers": [{"offset": o, "nbytes": s} for o, s in zip(self.offsets, self.sizes)],
            "tensors": [{"name": name, "buffer": index}
                        for name, index in self.assignment.items()],
            "arena_bytes": self.arena_bytes,
            "no_reuse_bytes": self.no_reuse_bytes,
        }

    @staticmethod
    def from_json(data: Mapping) -> BufferPlan:
        buffers = data["buffers"]
        return BufferPlan(
            sizes=tuple(int(b["nbytes"]) for b in buffers),
            offsets=tuple(int(b["offset"]) for b in buffers),
            assignment={t["name"]: int(t["buffer"]) for t in data["tensors"]},
            no_reuse_bytes=int(data["no_reuse_bytes"]),
            alignment=int(data.get("alignment", ALIGNMENT)),
        )


def _align(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def tensor_lifetimes(steps: Sequence[tuple[Sequence[str], Sequence[str]]],
                     nbytes: Mapping[str, int], exclude: Iterable[str] = ()) -> list[Lifetime]:
    """Lifetimes of the tensors that steps `(inputs, outputs)` produce, minus `exclude`.

    A tensor nobody reads lives during its producing step only. Empty names
    (absent optional inputs/outputs) are skipped.
    """
    skip = set(exclude) | {""}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, (inputs, outputs) in enumerate(steps):
        for name in outputs:
            if name not in skip and name not in first:
                first[name] = last[name] = index
        for name in inputs:
            if name in first:
                last[name] = index
    return [Lifetime(name, int(nbytes[name]), first[name], last[name]) for name in first]


def plan_buffers(shared: Sequence[Lifetime], own: Sequence[tuple[str, int]] = (),
                 alignment: int = ALIGNMENT) -> BufferPlan:
    """Assign `shared` tensors to reusable buffers; each of `own` (name, nbytes) gets its own."""
    sizes: list[int] = []
    members: list[list[Lifetime]] = []
    assignment: dict[str, int] = {}
    for name, size in own:
        assignment[name] = len(sizes)
        sizes.append(int(size))
        members.append([])
    reusable_from = len(sizes)
    for life in sorted(shared, key=lambda t: (-t.nbytes, t.first, t.name)):
        free = [index for index in range(reusable_from, len(sizes))
                if sizes[index] >= life.nbytes
                and not any(life.overlaps(m) for m in members[index])]
        best = min(free, key=lambda index: sizes[index], default=None)
        if best is None:
            best = len(sizes)
            sizes.append(life.nbytes)
            members.append([])
        members[best].append(life)
        assignment[life.name] = best
    offsets, position = [], 0
    for size in sizes:
        offsets.append(position)
        position += _align(size, alignment)
    no_reuse = sum(_align(int(s), alignment) for _, s in own)
    no_reuse += sum(_align(t.nbytes, alignment) for t in shared)
    return BufferPlan(tuple(sizes), tuple(offsets), assignment, no_reuse, alignment)


def view_roots(views: Sequence[tuple[str, str]], own: Iterable[str],
               constants: Iterable[str]) -> dict[str, str]:
    """Tensor -> the tensor whose buffer it shares, for the (view, source) pairs `views`:
    chains of views end at one root, a graph input or output (`own`) where the chain has
    one; constants and pairs that would join two own tensors are left out."""
    own, constants = set(own), set(constants)
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while name in parent:
            name = parent[name]
        return name

    for view, source in views:
        if not view or not source or view in constants or source in constants:
            continue
        a, b = root(view), root(source)
        if a == b or (a in own and b in own):
            continue
        if a in own:
            parent[b] = a
        else:
            parent[a] = b
    return {name: root(name) for name in parent}


def plan_graph_buffers(steps: Sequence[tuple[Sequence[str], Sequence[str]]],
                       nbytes: Mapping[str, int], graph_inputs: Sequence[str],
                       graph_outputs: Sequence[str], constants: Iterable[str],
                       views: Sequence[tuple[str, str]] = ()) -> BufferPlan:
    """The buffer plan of a whole plan: inputs and outputs own, intermediates shared, each
    view of `views` ((view, source) pairs) in its root's buffer."""
    constant_names = set(constants)
    own_names = [n for n in dict.fromkeys([*graph_inputs, *graph_outputs])
                 if n and n not in constant_names]
    own = [(name, int(nbytes[name])) for name in own_names]
    roots = view_roots(views, own_names, constant_names)
    shared = tensor_lifetimes(steps, nbytes, exclude=[*own_names, *constant_names])
    merged: dict[str, Lifetime] = {}
    for life in shared:
        name = roots.get(life.name, life.name)
        if name in own_names:
            continue
        seen = merged.get(name)
        merged[name] = life if seen is None else Lifetime(
            name, max(seen.nbytes, life.nbytes), min(seen.first, life.first),
            max(seen.last, life.last))
    plan = plan_buffers([replace(life, name=name) for name, life in merged.items()], own)
    assignment = dict(plan.assignment)
    assignment.update({view: assignment[root] for view, root in roots.items()})
    return replace(plan, assignment=assignment)
