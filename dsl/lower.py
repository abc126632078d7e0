"""Lowering: specialised compute IR + schedule -> loop IR (`PrimFunc`).

One recipe for both targets. Each stage placed at root becomes one loop nest
(one CUDA kernel on the GPU); temporaries without a reduction are inlined into
their consumers; an output stage that only applies an elementwise epilogue to a
reduction stage is fused into that stage's write-back. A reduction is
accumulated in a register tile (`cache_write`), then written back. Splits that
do not divide their loop get guards; padded loads become `Select`s whose
conditions are dropped when interval analysis proves them always true.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.regions import (
    Cache,
    fill,
    flatten,
    in_bounds,
    is_false,
    is_true,
    merge_accesses,
    region,
    shape_of,
    simplify_cond,
)
from wpk.dsl.schedule import Schedule, StageSchedule, _cname


@dataclass
class _Env:
    """What expression translation needs: axis values, inlined stages, caches, ranges."""

    op: C.Operator
    axes: dict[str, L.Expr]
    ranges: dict[str, tuple[int, int]]
    caches: dict[str, Cache] = field(default_factory=dict)
    override: dict[str, L.Expr] = field(default_factory=dict)
    inlined: set[str] = field(default_factory=set)
    seen_loads: list[tuple[str, list[L.Expr]]] = field(default_factory=list)
    unguarded: set[str] = field(default_factory=set)  # variables indexing unguarded loads


def translate(expr: C.Expr, env: _Env) -> L.Expr:
    """Compute-IR expression -> loop-IR expression (Reduce nodes are not allowed here)."""
    t = lambda e: translate(e, env)  # noqa: E731
    if isinstance(expr, C.Const):
        return L.Imm(expr.value, expr.dtype)
    if isinstance(expr, C.IterVar):
        return env.axes[expr.name]
    if isinstance(expr, C.SymVar):
        if expr.name in env.override:
            return env.override[expr.name]
        raise ScheduleError(f"symbol {expr.name} is unbound at lowering",
                            hint="specialize the operator with its bindings first")
    if isinstance(expr, C.BinOp):
        a, b = t(expr.a), t(expr.b)
        if expr.op in C.COMPARE_OPS:
            return simplify_cond(L.Bin(expr.op, a, b, "bool"), env.ranges)
        if expr.op in C.LOGIC_OPS:
            return L.Bin(expr.op, a, b, "bool")
        if expr.dtype in C.INT_TYPES:
            if expr.op in ("//", "%") and isinstance(expr.b, C.Const) and expr.b.value > 0:
                folded = _fold_division(expr, a)
                if folded is not None:
                    return folded
            return L.binary(expr.op, a, b)
        return L.Bin(expr.op, a, b, expr.dtype)
    if isinstance(expr, C.Call):
        return L.Call(expr.fn, tuple(t(a) for a in expr.args), expr.dtype)
    if isinstance(expr, C.Select):
        cond = t(expr.cond)
        if isinstance(cond, L.Imm):
            return t(expr.then) if cond.value else t(expr.else_)
        return L.Select(cond, t(expr.then), t(expr.else_), expr.dtype)
    if isinstance(expr, C.Cast):
        return L.Cast(expr.dtype, t(expr.value))
    if isinstance(expr, C.Load):
        return _translate_load(expr, env)
    raise ScheduleError(f"cannot lower {type(expr).__name__} here: {C.to_text(expr)}")


def compute_bounds(expr: C.Expr) -> tuple[int, int] | None:
    """Interval of an integer compute-IR expression over its axes' own domains."""
    if isinstance(expr, C.Const) and expr.dtype in C.INT_TYPES:
        return int(expr.value), int(expr.value)
    if isinstance(expr, C.IterVar) and isinstance(expr.extent, C.Const):
        return 0, int(expr.extent.value) - 1
    if isinstance(expr, C.BinOp) and expr.op in ("+", "-", "*", "//", "%"):
        a, b = compute_bounds(expr.a), compute_bounds(expr.b)
        if a is None or b is None:
            return None
        return L.bounds(L.Bin(expr.op, L.Var("a"), L.Var("b")), {"a": a, "b": b})
    return None


def _fold_division(expr: C.BinOp, numerator: L.Expr) -> L.Expr | None:
    """`x // d` -> constant and `x % d` -> `x` when the axes' domains decide them (e.g. the
    group index k // (K / groups) of an ungrouped convolution is always 0)."""
    span = compute_bounds(expr.a)
    d = int(expr.b.value)
    if span is None or span[0] < 0:
        return None
    if expr.op == "//" and span[0] // d == span[1] // d:
        return L.const(span[0] // d)
    if expr.op == "%" and span[1] < d:
        return numerator
    return None


def _translate_load(expr: C.Load, env: _Env) -> L.Expr:
    indices = [translate(i, env) for i in expr.indices]
    shape = shape_of(env.op, expr.tensor)
    cond = in_bounds(indices, shape, env.ranges) if expr.pad is not None else L.Imm(1, "bool")
    if expr.tensor in env.override:
        value = env.override[expr.tensor]
    elif expr.tensor in env.inlined:
        stage = env.op.stage(expr.tensor)
        inner = _Env(env.op, {**env.axes, **{a.name: i for a, i in zip(stage.axes, indices)}},
                     env.ranges, env.caches, env.override, env.inlined, env.seen_loads,
                     env.unguarded)
        value = translate(stage.body, inner)
    else:
        env.seen_loads.append((expr.tensor, indices))
        cache = env.caches.get(expr.tensor)
        if cache is not None:
            local = cache.local_indices(indices, shape)
            value = L.Load(cache.buffer.name, flatten(local, cache.extents), expr.dtype)
            if expr.pad is not None and isinstance(expr.pad, C.Const) and expr.pad.value == 0:
                return value  # the cache holds zeros outside the tensor
        else:
            value = L.Load(expr.tensor, flatten(indices, shape), expr.dtype)
            if is_true(cond):
                env.unguarded |= L.free_vars(value.index)
    if is_true(cond):
        return value
    if is_false(cond):
        return translate(expr.pad, env)
    return L.Select(cond, value, translate(expr.pad, env), expr.dtype)


# ----------------------------------------------------------------------------- nests
def _wrap(names, body, sched: StageSchedule, guards: dict[int, list], prologue: dict[str, list],
          kinds_override: dict | None = None) -> L.Stmt:
    """Wrap `body` in the loops `names` (outermost first), with guards placed inside the loop
    of the given depth and prologue statements at the start of a loop's body."""
    stmt = body
    for depth in range(len(names) - 1, -2, -1):
        cond = L.logical_and(guards.get(depth, []))
        if cond is not None:
            stmt = L.IfThenElse(cond, stmt)
        if depth < 0:
            break
        name = names[depth]
        stmt = L.seq(*prologue.get(name, []), stmt)
        kind = (kinds_override or {}).get(name, sched.annotations.get(name, "serial"))
        if sched.axes[name].extent == 1:
            continue
        stmt = L.For(L.Var(_cname(name)), sched.axes[name].extent, stmt, kind)
    return stmt


def _place_guards(conds, names, hoist: bool) -> dict[int, list]:
    placed: dict[int, list] = {}
    for cond in conds:
        if hoist:
            used = L.free_vars(cond)
            depth = max([i for i, n in enumerate(names) if _cname(n) in used], default=-1)
        else:
            depth = len(names) - 1
        placed.setdefault(depth, []).append(cond)
    return placed


# ----------------------------------------------------------------------------- stages
def fused_epilogue(op: C.Operator, stage: C.Stage) -> C.Stage | None:
    """The output stage that only applies an elementwise epilogue to the reduction `stage`
    (read at its own indices), which lowering then computes in `stage`'s write-back."""
    if stage.reduce is None or stage.name in op.outputs:
        return None
    consumers = [s for s in op.stages if any(ld.tensor == stage.name for ld in C.loads(s.body))]
    if len(consumers) != 1:
        return None
    out = consumers[0]
    if out.reduce is not None or out.name not in op.outputs:
        return None
    if shape_of(op, out.name) != shape_of(op, stage.name):
        return None
    own = tuple(C.IterVar(a.name, a.extent, a.kind) for a in out.axes)
    for ld in C.loads(out.body):
        if ld.tensor == stage.name and (ld.pad is not None or len(ld.indices) != len(own) or any(
                not isinstance(i, C.IterVar) or i.name != a.name for i, a in zip(ld.indices, own))):
            return None
    return out


def stage_plan(op: C.Operator, schedule: Schedule) -> tuple[list[C.Stage], dict, set]:
    """(stages computed at root in order, epilogue fusions {stage: output}, inlined names)."""
    inlined = {s.name for s in op.stages if schedule[s.name].placement == "inline"}
    for name in inlined:
        if op.stage(name).reduce is not None or name in op.outputs:
            raise ScheduleError(f"stage {name} cannot be inlined (it is an output or a reduction)")
    fusions = {}
    for s in op.stages:
        out = fused_epilogue(op, s)
        if out is not None:
            fusions[s.name] = out
    fused_outputs = {o.name for o in fusions.values()}
    roots = [s for s in op.stages if s.name not in inlined and s.name not in fused_outputs]
    return roots, fusions, inlined


def _shared_fills(stmts: list[L.Stmt]) -> list[L.Stmt]:
    """The cooperative fills placed at one loop, between one pair of barriers (they write
    different buffers, so one barrier after all of them suffices)."""
    flat = [x for st in stmts for x in (st.stmts if isinstance(st, L.Seq) else (st,))]
    return [L.Barrier(), *(x for x in flat if not isinstance(x, L.Barrier)), L.Barrier()]


def _check_gpu_order(sched: StageSchedule) -> None:
    bound = [n for n in sched.order if sched.annotations.get(n, "") in L.GPU_BINDINGS]
    if sched.order[:len(bound)] != bound:
        raise ScheduleError(f"stage {sched.stage}: loops bound to blocks/threads must be the "
                            f"outermost loops (order: {', '.join(sched.order)})")
    if not bound:
        raise ScheduleError(f"stage {sched.stage}: a CUDA schedule must bind loops to "
                            "blocks and threads")


def lower_stage(op: C.Operator, schedule: Schedule, stage: C.Stage, out_stage: C.Stage,
                inlined: set, target: str) -> tuple[L.Stmt, list[L.Buffer]]:
    """The loop nest computing `stage` (storing `out_stage` when an epilogue is fused)."""
    sched = schedule[stage.name]
    gpu = target == "cuda"
    if gpu:
        _check_gpu_order(sched)
    exprs = sched.root_expressions()
    ranges = {_cname(n): (0, sched.axes[n].extent - 1) for n in sched.order}
    env = _Env(op, {a.name: exprs[a.name] for a in sched.roots}, ranges, inlined=inlined)
    red = stage.reduce
    order = sched.order
    shared: list[L.Buffer] = []
    prologue: dict = {}
    pending: dict[str, Cache] = {}

    def value_of(acc: L.Expr | None) -> L.Expr:
        body = stage.body if red is None else C.replace_reduce(stage.body, C.SymVar("__acc__"))
        env.override["__acc__"] = acc
        value = translate(body, env)
        if out_stage is stage:
            return value
        out_env = _Env(op, {a.name: exprs[s.name] for a, s in zip(out_stage.axes, stage.axes)},
                       ranges, env.caches, {stage.name: value}, inlined, env.seen_loads)
        return translate(out_stage.body, out_env)

    # first pass: which regions of which tensors are read (for cache_read)
    if red is not None:
        translate(red.body, env)
    value_of(L.Var("__acc__", stage.dtype))
    for cr in sched.caches:
        accesses = [idx for t, idx in env.seen_loads if t == cr.tensor]
        if not accesses:
            raise ScheduleError(f"stage {stage.name}: cache_read of {cr.tensor}, which it does "
                                "not read directly")
        q = order.index(cr.at) if cr.at is not None else -1
        ranged = {_cname(n): sched.axes[n].extent for n in order[q + 1:]}
        if gpu:
            ranged.update({_cname(n): sched.axes[n].extent
                           for n in sched.bound_leaves("threadIdx")})
        shape = shape_of(op, cr.tensor)
        if gpu:  # fused coordinates read as one dim: a box, not whole rows
            accesses, shape = merge_accesses(accesses, shape)
        bases, extents, strides = region(accesses, shape, ranged, ranges)
        buf = L.Buffer(f"{cr.tensor}_{cr.scope}", op.tensor_dtype(cr.tensor), tuple(extents),
                       cr.scope)
        cache = pending[cr.tensor] = Cache(buf, bases, extents, ranged, strides,
                                           tuple(shape) if gpu else None)
        decl = [] if cr.scope == "shared" and gpu else [L.Allocate(buf)]
        if cr.scope == "shared" and gpu:
            shared.append(buf)
        copy = fill(cache, cr.tensor, op, sched, gpu, root=cr.at is None)
        prologue.setdefault(cr.at, []).extend(decl + [copy])
    if gpu:
        prologue = {at: _shared_fills(stmts) for at, stmts in prologue.items()}
    env.caches.update(pending)  # only now, so regions are computed on the original accesses
    out_shape = shape_of(op, out_stage.name)
    out_index = flatten([exprs[a.name] for a in stage.axes], out_shape)
    preds = sched.predicates()
    top = prologue.pop(None, [])

    if red is None:
        store = L.Store(out_stage.name, out_index, value_of(None))
        nest = _wrap(order, store, sched, _place_guards(preds, order, not gpu), prologue)
        return L.seq(*top, nest), shared

    first_reduce = next(i for i, n in enumerate(order) if sched.axes[n].kind == "reduce")
    p = order.index(sched.accumulate_at) if sched.cache_write_set and \
        sched.accumulate_at is not None else (first_reduce - 1 if not sched.cache_write_set
                                               else -1)
    if p >= first_reduce:
        raise ScheduleError(f"stage {stage.name}: the register tile (cache_write at "
                            f"{sched.accumulate_at}) must enclose every reduction loop")
    outer, inner = order[:p + 1], order[p + 1:]
    if gpu and any(sched.annotations.get(n, "") in L.GPU_BINDINGS for n in inner):
        raise ScheduleError(f"stage {stage.name}: block/thread loops must enclose the "
                            "register tile")
    tile = [n for n in inner if sched.axes[n].kind == "spatial"]
    tile_ext = [sched.axes[n].extent for n in tile]
    acc = L.Buffer(f"{stage.name}_acc", stage.dtype, (max(1, math.prod(tile_ext)),), "local")
    acc_idx = flatten([sched.leaf_var(n) for n in tile], tile_ext)
    acc_load = L.Load(acc.name, acc_idx, stage.dtype)
    env.unguarded = set()
    contrib = translate(red.body, env)
    combined = L.Bin("+" if red.op == "sum" else red.op, acc_load, contrib, stage.dtype)
    inner_names = {_cname(n) for n in inner}
    outer_preds = [c for c in preds if not gpu and not (L.free_vars(c) & inner_names)]
    inner_preds = [c for c in preds if c not in outer_preds]
    tile_preds = [c for c in inner_preds if not (L.free_vars(c) & {_cname(n) for n in inner
                                                                    if n not in tile})]
    tile_kinds = {n: "unroll" for n in tile if sched.annotations.get(n) not in
                  ("vectorize", "unroll")} if gpu else None
    init = _wrap(tile, L.Store(acc.name, acc_idx, translate(red.init_value(), env)), sched, {},
                 {}, tile_kinds)
    # a spatial guard can go from the reduction when no unguarded load depends on it:
    # the extra lanes of the register tile then compute values that are never stored
    reduce_vars = {_cname(n) for n in order if sched.axes[n].kind == "reduce"}
    main_preds = [c for c in inner_preds if L.free_vars(c) & (reduce_vars | env.unguarded)]
    main = _wrap(inner, L.Store(acc.name, acc_idx, combined), sched,
                 _place_guards(main_preds, inner, not gpu), prologue)
    write = _wrap(tile, L.Store(out_stage.name, out_index, value_of(acc_load)), sched,
                  _place_guards(tile_preds, tile, not gpu), {}, tile_kinds)
    body = L.seq(L.Allocate(acc), init, main, write)
    nest = _wrap(outer, body, sched, _place_guards(outer_preds, outer, True), prologue)
    return L.seq(*top, nest), shared



def lower(op: C.Operator, schedule: Schedule, target: str = "cpu") -> L.PrimFunc:
    """Lower a specialised operator with its schedule to a `PrimFunc` for `target`
    ('cpu' or 'cuda'): one kernel per stage computed at root, in execution order. Its
    `meta` names the outputs, keeps the operator lowered (`"operator"`, what the
    reference interpreter evaluates) and the tensor each kernel writes
    (`"kernel_outputs"`)."""
    roots, fusions, inlined = stage_plan(op, schedule)
    params = [L.Buffer(p.name, p.dtype, shape_of(op, p.name)) for p in op.params]
    params += [L.Buffer(o, op.tensor_dtype(o), shape_of(op, o)) for o in op.outputs]
    workspaces = [L.Buffer(s.name, s.dtype, shape_of(op, s.name)) for s in roots
                  if s.name not in op.outputs and s.name not in fusions]
    names = tuple(b.name for b in params + workspaces)
    kernels, writes = [], []
    for stage in roots:
        out_stage = fusions.get(stage.name, stage)
        writes.append(out_stage.name)
        body, shared = lower_stage(op, schedule, stage, out_stage, inlined, target)
        body = L.seq(*[L.Allocate(b) for b in shared], body)
        kernels.append(L.Kernel(f"wpk_{op.name}_{stage.name}" if len(roots) > 1 else
                                f"wpk_{op.name}", body, names))
    return L.PrimFunc(f"wpk_{op.name}", tuple(params), (), tuple(workspaces), tuple(kernels),
                      target, meta={"outputs": tuple(op.outputs), "operator": op,
                                    "kernel_outputs": tuple(writes)})
