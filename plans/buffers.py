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

A part (an input of a step that only places its inputs side by side in its output, a
Concat of contiguous pieces) lives inside that output's buffer, at its byte offset
(`tensor_offsets`): its producer writes it in place and the step's copy of it is skipped.
Parts and views form trees; a tree is one tensor for the plan, as long as the largest of
its members' ends. A part stays a tensor of its own where placing it would break the
plan: a graph input or output (or in a tree of one), a constant, a tensor placed already
(the first step that places it wins), an input the step reads twice, an offset off the
alignment, or a tree that holds the output already.

A slice (the output of a step that only takes a contiguous run of its input's bytes, a
ChannelSlice of one image) lives inside its input's buffer at its byte offset likewise,
the step's copy skipped, unless it is a graph input or output or off the alignment. A
part that is a slice takes its source's whole tree into the concat's buffer where that
tree's bytes cover only pieces lying in it at their own offsets (YOLO's C2f: a conv's
output split into halves that are both pieces of the block's concat, so the conv writes
into the concat; DenseNet: each concat of all the previous features takes the previous
concat in); elsewhere the part is copied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

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
    tensor_offsets: Mapping[str, int] = field(default_factory=dict)

    def tensor_offset(self, name: str) -> int:
        """Byte offset of tensor `name` inside its buffer (0 unless it is a placed part)."""
        return self.tensor_offsets.get(name, 0)

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
            "tensors": [{"name": name, "buffer": index,
                         **({"offset": self.tensor_offsets[name]}
                            if self.tensor_offsets.get(name) else {})}
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
            tensor_offsets={t["name"]: int(t["offset"]) for t in data["tensors"]
                            if t.get("offset")},
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


def home(name: str, roots: Mapping[str, str], placed: Mapping[str, tuple[str, int]]
         ) -> tuple[str, int]:
    """(the tensor whose buffer holds `name`, its byte offset there), given the view trees
    `roots` (tensor -> root) and the placed trees `placed` (root -> (tree, offset))."""
    name, offset = roots.get(name, name), 0
    while name in placed:
        name, extra = placed[name]
        name = roots.get(name, name)
        offset += extra
    return name, offset


def place_parts(parts: Sequence[tuple[str, str, int]], roots: Mapping[str, str],
                own: Iterable[str], constants: Iterable[str], nbytes: Mapping[str, int],
                slices: Sequence[tuple[str, str, int]] = (), alignment: int = ALIGNMENT
                ) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """(tree root -> (the tree it is placed in, byte offset there), tree root -> its bytes)
    for the (part, whole, offset) triples `parts` and the (slice, source, offset) triples
    `slices` (module docstring), given the view trees `roots` (tensor -> root, as
    `view_roots` returns) and the tensors' sizes `nbytes`. The tree of a slice goes into
    the tree of its source, then the tree of a part into the tree of its whole; a part
    that lies inside another tree already (a slice) takes that whole tree with it where
    the tree fits its whole's pieces (`_moves_with`)."""
    own, constants = set(own), set(constants)
    placed: dict[str, tuple[str, int]] = {}
    extent: dict[str, int] = {}   # a tree's bytes: its members' largest end
    for name, size in nbytes.items():
        root = roots.get(name, name)
        extent[root] = max(extent.get(root, 0), int(size))

    def place(tree: str, target: str, at: int) -> None:
        placed[tree] = (target, at)
        extent[target] = max(extent.get(target, 0), at + extent.get(tree, 0))

    for piece, source, offset in slices:
        tree = roots.get(piece, piece)
        target, base = home(source, roots, placed)
        if piece and source and source not in constants and not offset % alignment \
                and tree not in own and tree not in placed and tree != target:
            place(tree, target, base + offset)
    counts: dict[tuple[str, str], int] = {}
    pieces: dict[str, list[tuple[str, int]]] = {}
    for part, whole, offset in parts:
        counts[part, whole] = counts.get((part, whole), 0) + 1
        pieces.setdefault(whole, []).append((part, offset))
    for part, whole, offset in parts:
        if not part or not whole or part in constants or counts[part, whole] > 1 \
                or offset % alignment:
            continue
        tree = roots.get(part, part)
        target, base = home(whole, roots, placed)
        if tree in placed:
            top, at = home(part, roots, placed)
            shift = base + offset - at
            if top != target and top not in own and _moves_with(
                    top, extent[top], shift, base, pieces[whole], roots, placed, nbytes,
                    alignment):
                place(top, target, shift)
            continue
        if tree in own or tree in placed or tree == target:
            continue
        place(tree, target, base + offset)
    return placed, extent


def _moves_with(top: str, size: int, shift: int, base: int,
                pieces: Sequence[tuple[str, int]], roots: Mapping[str, str],
                placed: Mapping[str, tuple[str, int]], nbytes: Mapping[str, int],
                alignment: int) -> bool:
    """Whether tree `top` (`size` bytes) may go into the tree of a whole that lies at byte
    `base` of it, at byte `shift`: aligned, inside the whole's bytes, and every piece
    whose slot its bytes cover lying in it exactly there (YOLO's C2f: a conv's output
    split in two, both halves pieces of the block's concat, so the conv writes into the
    concat)."""
    whole = sum(int(nbytes.get(part, 0)) for part, _ in pieces)
    if shift % alignment or shift < base or shift + size > base + whole:
        return False
    for part, offset in pieces:
        start, end = base + offset, base + offset + int(nbytes.get(part, 0))
        if start < shift + size and shift < end and \
                home(part, roots, placed) != (top, start - shift):
            return False
    return True


def plan_graph_buffers(steps: Sequence[tuple[Sequence[str], Sequence[str]]],
                       nbytes: Mapping[str, int], graph_inputs: Sequence[str],
                       graph_outputs: Sequence[str], constants: Iterable[str],
                       views: Sequence[tuple[str, str]] = (),
                       parts: Sequence[tuple[str, str, int]] = (),
                       slices: Sequence[tuple[str, str, int]] = ()) -> BufferPlan:
    """The buffer plan of a whole plan: inputs and outputs own, intermediates shared, each
    view of `views` ((view, source) pairs) in its root's buffer, each part of `parts`
    ((part, whole, byte offset) triples) inside its whole's buffer and each slice of
    `slices` ((slice, source, byte offset) triples) inside its source's where it may be."""
    constant_names = set(constants)
    own_names = [n for n in dict.fromkeys([*graph_inputs, *graph_outputs])
                 if n and n not in constant_names]
    roots = view_roots(views, own_names, constant_names)
    placed, extent = place_parts(parts, roots, own_names, constant_names, nbytes, slices)

    homes = {name: home(name, roots, placed) for name in nbytes}
    own = [(name, extent.get(name, nbytes[name])) for name in own_names]
    shared = tensor_lifetimes(steps, nbytes, exclude=[*own_names, *constant_names])
    merged: dict[str, Lifetime] = {}
    for life in shared:
        name = homes[life.name][0]
        if name in own_names:
            continue
        seen = merged.get(name)
        size = extent.get(name, life.nbytes)
        merged[name] = Lifetime(name, size, life.first, life.last) if seen is None else \
            Lifetime(name, size, min(seen.first, life.first), max(seen.last, life.last))
    plan = plan_buffers([replace(life, name=name) for name, life in merged.items()], own)
    assignment, offsets = dict(plan.assignment), {}
    moved = [name for name, (top, _) in homes.items() if top != name]
    for name in dict.fromkeys([*roots, *moved]):   # in order: plans are reproducible
        top, offset = homes[name]
        if top in assignment:
            assignment[name] = assignment[top]
            if offset:
                offsets[name] = offset
    return replace(plan, assignment=assignment, tensor_offsets=offsets)
