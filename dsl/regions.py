"""Regions and index helpers: what part of a tensor a loop nest reads, and copies of it.

`region` finds, per dimension, the box of a tensor that the loops below an
attach point touch (affine accesses with constant strides; fused coordinates
as opaque terms; otherwise interval bounds). `Cache` addresses a copy of that
box (shared or local memory, or a padded whole-tensor copy on the CPU) and
`fill` writes the loop nest that fills it, zero outside the tensor. Also the
small index helpers the lowering shares: `flatten`, `in_bounds`, `simplify_cond`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.schedule import StageSchedule, _cname


def shape_of(op: C.Operator, tensor: str) -> tuple[int, ...]:
    return tuple(C.bind_dim(d, {}) for d in op.tensor_shape(tensor))


def merge_fused(indices, shape) -> tuple[list[L.Expr], list[int]]:
    """(indices, shape) with every pair of dims indexed `(e // k, e % k)`, k the inner
    extent (a fused loop's coordinates), merged into one dim indexed `e`."""
    indices, shape = list(indices), [int(d) for d in shape]
    d = 0
    while d + 1 < len(indices):
        a, b = indices[d], indices[d + 1]
        if (isinstance(a, L.Bin) and a.op == "//" and isinstance(b, L.Bin) and b.op == "%"
                and a.a == b.a and a.b == b.b and isinstance(a.b, L.Imm)
                and int(a.b.value) == shape[d + 1]):
            indices[d:d + 2] = [a.a]
            shape[d:d + 2] = [shape[d] * shape[d + 1]]
        else:
            d += 1
    return indices, shape


def merge_accesses(accesses: list[list[L.Expr]], shape) -> tuple[list[list[L.Expr]], tuple]:
    """The accesses of one tensor over its dims merged by `merge_fused` when every access
    merges the same dims (a 1x1 convolution over fused pixels reads `X[n, c, p]`, a box of
    one dim instead of whole image rows), else unchanged."""
    merged = [merge_fused(acc, shape) for acc in accesses]
    shapes = {tuple(m[1]) for m in merged}
    if len(shapes) != 1 or len(next(iter(shapes))) == len(shape):
        return accesses, tuple(int(d) for d in shape)
    return [m[0] for m in merged], next(iter(shapes))


def flatten(indices: list[L.Expr], shape) -> L.Expr:
    """Row-major linear index. A pair of dims indexed `(e // k, e % k)` with inner extent k
    (a fused loop) is merged back into `e`, so contiguous accesses stay visibly contiguous."""
    indices, shape = merge_fused(indices, shape)
    flat: L.Expr = L.const(0)
    for idx, dim in zip(indices, shape):
        flat = L.add(L.mul(flat, int(dim)), idx)
    return flat


def simplify_cond(cond: L.Expr, ranges) -> L.Expr:
    """Fold comparisons that interval analysis decides; True is `Imm(1, 'bool')`."""
    if isinstance(cond, L.Bin) and cond.op == "and":
        a, b = simplify_cond(cond.a, ranges), simplify_cond(cond.b, ranges)
        if is_true(a):
            return b
        if is_true(b):
            return a
        if is_false(a) or is_false(b):
            return L.Imm(0, "bool")
        return L.Bin("and", a, b, "bool")
    if isinstance(cond, L.Bin) and cond.op in ("<", "<=", ">", ">=") and cond.a.dtype == L.INT \
            and cond.b.dtype == L.INT:
        span = L.bounds(L.binary("-", cond.a, cond.b), ranges)
        if span is not None:
            lo, hi = span
            decided = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0),
                       ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}[cond.op]
            if decided[0]:
                return L.Imm(1, "bool")
            if decided[1]:
                return L.Imm(0, "bool")
    return cond


def is_true(e) -> bool:
    return isinstance(e, L.Imm) and e.dtype == "bool" and bool(e.value)


def is_false(e) -> bool:
    return isinstance(e, L.Imm) and e.dtype == "bool" and not bool(e.value)


def in_bounds(indices: list[L.Expr], shape, ranges) -> L.Expr:
    conds = []
    for idx, dim in zip(indices, shape):
        conds += [L.Bin("<=", L.const(0), idx, "bool"), L.Bin("<", idx, L.const(int(dim)), "bool")]
    cond = L.logical_and(conds)
    return L.Imm(1, "bool") if cond is None else simplify_cond(cond, ranges)


def split_affine(expr: L.Expr, ranged) -> tuple[dict, L.Expr, int] | None:
    """`expr` as (coefficients of the `ranged` variables, remaining expression free of them,
    constant). A `//` or `%` of ranged variables only (a fused loop's coordinate) is kept as
    an opaque term, keyed by the expression; None when ranged and fixed variables mix
    non-linearly."""
    used = L.free_vars(expr) & set(ranged)
    if not used:
        if isinstance(expr, L.Imm):
            return {}, L.const(0), int(expr.value)
        if isinstance(expr, L.Bin) and expr.op in ("+", "-") and isinstance(expr.b, L.Imm):
            sign = 1 if expr.op == "+" else -1
            inner = split_affine(expr.a, ranged)
            return inner[0], inner[1], inner[2] + sign * int(expr.b.value)
        return {}, expr, 0
    if isinstance(expr, L.Var):
        return {expr.name: 1}, L.const(0), 0
    if isinstance(expr, L.Bin) and expr.op in ("+", "-"):
        a, b = split_affine(expr.a, ranged), split_affine(expr.b, ranged)
        if a is None or b is None:
            return None
        sign = 1 if expr.op == "+" else -1
        coef = dict(a[0])
        for v, x in b[0].items():
            coef[v] = coef.get(v, 0) + sign * x
        return coef, L.binary(expr.op, a[1], b[1]), a[2] + sign * b[2]
    if isinstance(expr, L.Bin) and expr.op == "*":
        for var_side, k in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(k, L.Imm):
                inner = split_affine(var_side, ranged)
                if inner is None:
                    return None
                scale = int(k.value)
                return ({v: x * scale for v, x in inner[0].items()}, L.mul(inner[1], scale),
                        inner[2] * scale)
    if isinstance(expr, L.Bin) and expr.op in ("//", "%") and L.free_vars(expr) <= set(ranged):
        return {expr: 1}, L.const(0), 0
    return None


def _term_range(term, ranged, all_ranges) -> tuple[int, int] | None:
    if isinstance(term, str):
        return 0, ranged[term] - 1
    return L.bounds(term, all_ranges)


def _term_expr(term) -> L.Expr:
    return L.Var(term) if isinstance(term, str) else term


def region(accesses: list[list[L.Expr]], shape, ranged: dict[str, int], all_ranges):
    """Per dim, (base expression over the fixed loops, extent, stride) covering every access
    when the `ranged` loops (name -> extent) run over their whole range. The stride is the
    common step of the accesses (2 for a stride-2 1x1 convolution), so the copy is dense."""
    bases, extents, strides = [], [], []
    for d in range(len(shape)):
        forms = [split_affine(acc[d], ranged) for acc in accesses]
        spans = None
        if all(f is not None for f in forms) and all(f[1] == forms[0][1] for f in forms):
            spans = []
            for coef, _, c in forms:
                lo = hi = c
                for term, x in coef.items():
                    rng = _term_range(term, ranged, all_ranges)
                    if rng is None:
                        spans = None
                        break
                    lo, hi = lo + min(x * rng[0], x * rng[1]), hi + max(x * rng[0], x * rng[1])
                if spans is None:
                    break
                spans.append((lo, hi))
        if spans is None:
            bounds = [L.bounds(acc[d], all_ranges) for acc in accesses]
            if any(b is None for b in bounds):
                raise ScheduleError(f"cannot bound the region read in dimension {d}")
            lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
            bases.append(L.const(lo))
            extents.append(hi - lo + 1)
            strides.append(1)
            continue
        low = min(sp[0] for sp in spans)
        step = 0
        for (coef, _, c), _sp in zip(forms, spans):
            step = math.gcd(step, c - low, *[abs(x) for x in coef.values()])
        step = max(step, 1)
        bases.append(L.add(forms[0][1], low))
        extents.append((max(sp[1] for sp in spans) - low) // step + 1)
        strides.append(step)
    return bases, extents, strides


@dataclass
class Cache:
    """A copy of a region of a tensor: buffer, base index per dim, extents and strides."""

    buffer: L.Buffer
    base: list[L.Expr]
    extents: list[int]
    ranged: dict = field(default_factory=dict)
    strides: list[int] = field(default_factory=list)
    shape: tuple | None = None  # the tensor's dims as the region sees them (merged), or None

    def local_indices(self, indices: list[L.Expr], shape) -> list[L.Expr]:
        """Positions inside the cached region of a tensor access (one index per tensor dim,
        merged like the region's dims)."""
        if self.shape is not None and len(self.shape) != len(shape):
            indices, merged = merge_fused(indices, shape)
            if tuple(merged) != tuple(self.shape):
                raise ScheduleError("a cached tensor is read with dims merged differently")
        return [self.local_index(d, i) for d, i in enumerate(indices)]

    def local_index(self, d: int, index: L.Expr) -> L.Expr:
        """Position of tensor index `index` (dim `d`) inside the cached region."""
        form = split_affine(index, self.ranged)
        base = split_affine(self.base[d], self.ranged)
        step = self.strides[d] if self.strides else 1
        if form is not None and base is not None and form[1] == base[1] and \
                all(x % step == 0 for x in form[0].values()) and (form[2] - base[2]) % step == 0:
            local: L.Expr = L.const((form[2] - base[2]) // step)
            for term, x in sorted(form[0].items(), key=lambda item: str(item[0])):
                local = L.add(L.mul(_term_expr(term), x // step), local)
            return local
        if step != 1:
            raise ScheduleError("strided cache read with an access off its stride")
        return L.binary("-", index, self.base[d])


def fill(cache: Cache, tensor: str, op, sched: StageSchedule, gpu: bool,
          root: bool = False) -> L.Stmt:
    """Copy the region of `tensor` into the cache buffer (zero outside the tensor); a copy
    made before all loops (`root`) on the CPU is itself a parallel loop nest."""
    shape = cache.shape or shape_of(op, tensor)
    dtype = op.tensor_dtype(tensor)
    name = cache.buffer.name
    ranges = {}
    if gpu:
        threads = sched.bound_leaves("threadIdx")
        tid: L.Expr = L.const(0)
        for n in threads:
            tid = L.add(L.mul(tid, sched.axes[n].extent), sched.leaf_var(n))
        nthreads = math.prod(sched.axes[n].extent for n in threads)
        total = cache.buffer.size
        it = L.Var(f"{name}_it")
        flat = L.add(L.mul(it, nthreads), tid)
        coords, stride = [], total
        for ext in cache.extents:
            stride //= ext
            coords.append(L.binary("%", L.binary("//", flat, stride), ext))
        ranges = {_cname(n): (0, sched.axes[n].extent - 1) for n in sched.order}
        ranges[it.name] = (0, math.ceil(total / nthreads) - 1)
        idx = [L.add(b, L.mul(c, st)) for b, c, st in zip(cache.base, coords, cache.strides)]
        cond = in_bounds(idx, shape, ranges)
        load = L.Load(tensor, flatten(idx, shape), dtype)
        value = load if is_true(cond) else L.Select(cond, load, L.Imm(0.0, dtype), dtype)
        store: L.Stmt = L.Store(name, flat, value)
        if total % nthreads:
            store = L.IfThenElse(L.Bin("<", flat, L.const(total), "bool"), store)
        loop = L.For(it, math.ceil(total / nthreads), store, "unroll" if total <= 8 * nthreads
                     else "serial")
        return L.seq(L.Barrier(), loop, L.Barrier())
    loop_vars = [L.Var(f"{name}_{d}") if e > 1 else L.const(0)
                 for d, e in enumerate(cache.extents)]
    ranges = {_cname(n): (0, sched.axes[n].extent - 1) for n in sched.order}
    ranges.update({v.name: (0, e - 1) for v, e in zip(loop_vars, cache.extents)
                   if isinstance(v, L.Var)})
    idx = [L.add(b, L.mul(v, st)) for b, v, st in zip(cache.base, loop_vars, cache.strides)]
    cond = in_bounds(idx, shape, ranges)
    load = L.Load(tensor, flatten(idx, shape), dtype)
    value = load if is_true(cond) else L.Select(cond, load, L.Imm(0.0, dtype), dtype)
    stmt: L.Stmt = L.Store(name, flatten(loop_vars, cache.extents), value)
    real = [d for d, v in enumerate(loop_vars) if isinstance(v, L.Var)]
    rows = _row_fill(cache, tensor, shape, dtype, loop_vars, idx, ranges)
    if rows is not None and real and real[-1] == len(loop_vars) - 1:
        stmt, real = rows, real[:-1]
    for d in reversed(real):
        kind = "vectorize" if d == real[-1] and rows is None else (
            "parallel" if root and d == real[0] else "serial")
        stmt = L.For(loop_vars[d], cache.extents[d], stmt, kind)
    return stmt


def _row_fill(cache: Cache, tensor, shape, dtype, loop_vars, idx, ranges) -> L.Stmt | None:
    """One row of a padded copy as zeros | unconditional contiguous copy | zeros, when the
    row's start is a constant: the per-element bounds test kept the copy scalar."""
    last = len(loop_vars) - 1
    var, base = loop_vars[last], cache.base[last]
    if not isinstance(var, L.Var) or not isinstance(base, L.Imm) or cache.strides[last] != 1:
        return None
    b, ext, dim = int(base.value), cache.extents[last], int(shape[last])
    lo, hi = min(ext, max(0, -b)), max(0, min(ext, dim - b))
    if hi <= lo:
        return None
    outer_cond = in_bounds(idx[:-1], shape[:-1], ranges)

    def segment(start: int, stop: int, copy: bool) -> L.Stmt | None:
        if stop <= start:
            return None
        pos = L.add(var, start)
        local = flatten([*loop_vars[:-1], pos], cache.extents)
        value = L.Imm(0.0, dtype)
        if copy:
            value = L.Load(tensor, flatten([*idx[:-1], L.add(pos, b)], shape), dtype)
        return L.For(var, stop - start, L.Store(cache.buffer.name, local, value), "vectorize")

    row = L.seq(segment(0, lo, False), segment(lo, hi, True), segment(hi, ext, False))
    if is_true(outer_cond):
        return row
    return L.IfThenElse(outer_cond, row, segment(0, ext, False))
