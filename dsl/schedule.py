"""Schedule primitives: how the loops of each stage are split, ordered, bound and cached.

A `Schedule` holds one `StageSchedule` per stage of a specialised operator
(every dim a constant). Primitives follow TVM's vocabulary:

* `split(axis, factor) -> (outer, inner)`, `fuse(outer, inner) -> fused`,
  `reorder(*axes)`;
* `parallel`, `unroll`, `vectorize` (CPU) and `bind(axis, "blockIdx.x" | "threadIdx.x" ...)`;
* `cache_write(at)`: accumulate the reduction in a local (register) buffer
  declared inside loop `at`; every spatial loop below `at` becomes a dimension
  of that register tile, which is written back once the reduction is done;
* `cache_read(tensor, scope, at)`: copy the region of `tensor` used below loop
  `at` into `shared` (GPU, filled cooperatively by the block's threads between
  barriers) or `local` memory, i.e. `compute_at` of a copy stage;
* `compute_inline()` / `compute_root()` for temporaries (stages not output).

Axes are named; a split of `k` creates `k.o` and `k.i` (then `k.i.o`, ...).
Nothing here touches code: `wpk.dsl.lower` turns a schedule into loop IR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L

ANNOTATIONS = L.LOOP_KINDS + L.GPU_BINDINGS


@dataclass
class Axis:
    name: str
    extent: int
    kind: str  # 'spatial' | 'reduce'


@dataclass(frozen=True)
class Split:
    parent: str
    outer: str
    inner: str
    factor: int


@dataclass(frozen=True)
class Fuse:
    outer: str
    inner: str
    fused: str


@dataclass(frozen=True)
class CacheRead:
    tensor: str
    scope: str
    at: str | None  # leaf axis the copy is placed in (None: before all loops)


@dataclass
class StageSchedule:
    """Loop structure of one stage: root axes, their splits/fuses, leaf order, annotations."""

    stage: str
    roots: list[Axis]
    axes: dict[str, Axis] = field(default_factory=dict)
    relations: list = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    accumulate_at: str | None = None
    cache_write_set: bool = False
    caches: list[CacheRead] = field(default_factory=list)
    placement: str = "root"  # 'root' | 'inline'

    def __post_init__(self):
        for axis in self.roots:
            self.axes[axis.name] = axis
            self.order.append(axis.name)

    # ------------------------------------------------------------------ helpers
    def _leaf(self, name: str) -> Axis:
        if name not in self.order:
            raise ScheduleError(f"stage {self.stage}: {name!r} is not a loop of this stage "
                                f"(loops: {', '.join(self.order)})",
                                hint="use the names returned by split/fuse")
        return self.axes[name]

    # ------------------------------------------------------------------ primitives
    def split(self, name: str, factor: int) -> tuple[str, str]:
        """Split loop `name` into an outer loop and an inner loop of `factor` iterations."""
        axis = self._leaf(name)
        factor = int(factor)
        if factor < 1:
            raise ScheduleError(f"stage {self.stage}: split factor {factor} of {name} must be >= 1")
        outer = Axis(f"{name}.o", math.ceil(axis.extent / factor), axis.kind)
        inner = Axis(f"{name}.i", factor, axis.kind)
        self.axes[outer.name] = outer
        self.axes[inner.name] = inner
        pos = self.order.index(name)
        self.order[pos:pos + 1] = [outer.name, inner.name]
        self.relations.append(Split(name, outer.name, inner.name, factor))
        return outer.name, inner.name

    def tile(self, name: str, *factors: int) -> list[str]:
        """Split `name` repeatedly: tile(x, 8, 4) gives loops x.o, x.i.o, x.i.i (extents ?, 8, 4)
        where the innermost has the last factor."""
        names = [name]
        for i in range(len(factors)):
            rest = math.prod(factors[i:])
            outer, inner = self.split(names[-1], rest)
            names[-1:] = [outer, inner]
        return names

    def fuse(self, outer: str, inner: str) -> str:
        """Fuse two adjacent loops (outer directly enclosing inner) into one."""
        a, b = self._leaf(outer), self._leaf(inner)
        pos = self.order.index(outer)
        if pos + 1 >= len(self.order) or self.order[pos + 1] != inner:
            raise ScheduleError(f"stage {self.stage}: can only fuse adjacent loops, "
                                f"{outer} does not directly enclose {inner}")
        if a.kind != b.kind:
            raise ScheduleError(f"stage {self.stage}: cannot fuse a spatial and a reduce loop")
        fused = Axis(f"{outer}*{inner}" if len(outer) + len(inner) < 24 else f"f{len(self.axes)}",
                     a.extent * b.extent, a.kind)
        self.axes[fused.name] = fused
        self.order[pos:pos + 2] = [fused.name]
        self.relations.append(Fuse(outer, inner, fused.name))
        return fused.name

    def reorder(self, *names: str) -> None:
        """Put the given loops in this order, in the positions they occupy now."""
        for n in names:
            self._leaf(n)
        positions = sorted(self.order.index(n) for n in names)
        for pos, n in zip(positions, names):
            self.order[pos] = n

    def annotate(self, name: str, kind: str) -> None:
        self._leaf(name)
        if kind not in ANNOTATIONS:
            raise ScheduleError(f"unknown loop annotation {kind!r}",
                                hint=f"one of {', '.join(ANNOTATIONS)}")
        self.annotations[name] = kind

    def parallel(self, name: str) -> None:
        self.annotate(name, "parallel")

    def unroll(self, name: str) -> None:
        self.annotate(name, "unroll")

    def vectorize(self, name: str) -> None:
        self.annotate(name, "vectorize")

    def bind(self, name: str, tag: str) -> None:
        if tag not in L.GPU_BINDINGS:
            raise ScheduleError(f"cannot bind {name} to {tag!r}",
                                hint=f"one of {', '.join(L.GPU_BINDINGS)}")
        self.annotate(name, tag)

    def cache_write(self, at: str | None) -> None:
        """Accumulate in a register tile declared inside loop `at` (None: outside all loops)."""
        if at is not None:
            self._leaf(at)
        self.accumulate_at = at
        self.cache_write_set = True

    def cache_read(self, tensor: str, scope: str, at: str | None) -> None:
        """Stage the part of `tensor` read below loop `at` in `scope` memory."""
        if scope not in ("shared", "local"):
            raise ScheduleError(f"cache_read scope must be shared or local, not {scope!r}")
        if at is not None:
            self._leaf(at)
        self.caches.append(CacheRead(tensor, scope, at))

    def compute_inline(self) -> None:
        """Compute this temporary stage where it is read, not into a buffer of its own."""
        self.placement = "inline"

    def compute_root(self) -> None:
        """Compute this temporary stage into its own buffer first (the default)."""
        self.placement = "root"

    # ------------------------------------------------------------------ queries
    def root_expressions(self) -> dict[str, L.Expr]:
        """Each axis (roots included) as an expression of the leaf loop variables."""
        exprs: dict[str, L.Expr] = {n: self.leaf_var(n) for n in self.order}
        for rel in reversed(self.relations):
            if isinstance(rel, Split):
                exprs[rel.parent] = L.add(L.mul(exprs[rel.outer], rel.factor), exprs[rel.inner])
            else:
                inner_extent = self.axes[rel.inner].extent
                exprs[rel.outer] = L.binary("//", exprs[rel.fused], inner_extent)
                exprs[rel.inner] = L.binary("%", exprs[rel.fused], inner_extent)
        return exprs

    def predicates(self) -> list[L.Expr]:
        """Conditions `parent < extent` for every split that does not divide its loop."""
        exprs = self.root_expressions()
        conds = []
        for rel in self.relations:
            if isinstance(rel, Split) and self.axes[rel.parent].extent % rel.factor:
                conds.append(L.Bin("<", exprs[rel.parent], L.const(self.axes[rel.parent].extent),
                                   "bool"))
        return conds

    def leaf_var(self, name: str) -> L.Expr:
        """The loop variable of a leaf; 0 for a loop of one iteration (which is not emitted)."""
        return L.const(0) if self.axes[name].extent == 1 else L.Var(_cname(name))

    def bound_leaves(self, prefix: str) -> list[str]:
        return [n for n in self.order if self.annotations.get(n, "").startswith(prefix)]


def _cname(axis_name: str) -> str:
    """A C identifier for an axis name (k.o.i -> k_o_i, a*b -> a_b)."""
    return axis_name.replace(".", "_").replace("*", "_")


class Schedule:
    """Schedules of every stage of a specialised operator (`compute.specialize`)."""

    def __init__(self, op, target: str = "cpu"):
        self.op = op
        self.target = target
        self.stages: dict[str, StageSchedule] = {}
        for stage in op.stages:
            roots = [Axis(a.name, C.bind_dim(a.extent, {}), "spatial") for a in stage.axes]
            red = stage.reduce
            if red is not None:
                roots += [Axis(a.name, C.bind_dim(a.extent, {}), "reduce") for a in red.axes]
            sched = StageSchedule(stage.name, roots)
            if stage.name not in op.outputs and red is None:
                sched.placement = "inline"
            self.stages[stage.name] = sched

    def __getitem__(self, stage: str) -> StageSchedule:
        if stage not in self.stages:
            raise ScheduleError(f"operator {self.op.name} has no stage {stage!r}",
                                hint=f"stages: {', '.join(self.stages)}")
        return self.stages[stage]

    def describe(self) -> str:
        """Readable summary (loop order with extents and annotations) per stage."""
        lines = []
        for name, s in self.stages.items():
            loops = " ".join(f"{n}[{s.axes[n].extent}]" +
                             (f"@{s.annotations[n]}" if n in s.annotations else "")
                             for n in s.order)
            lines.append(f"{name} ({s.placement}): {loops}")
        return "\n".join(lines)
