"""The reference interpreter of the compute IR: vectorised numpy in float64.

`infer_bindings` binds every shape symbol, scalar and derived dim of an
operator from concrete input arrays; `evaluate` computes its outputs. Float
tensors are computed in float64 whatever their declared dtype, integers in
int64, so the result is the reference the generated kernels are verified
against. Each stage is evaluated over an index grid (spatial axes, then
reduce axes) and reduced over the trailing axes; large grids are cut into
slices of the first axis to bound memory.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from wpk.core.errors import DslError
from wpk.dsl import compute as ir


@functools.cache
def _erf_function():
    """scipy's erf, imported on first use (0.2-0.3 s, which a plan's load need not pay),
    or math.erf per element without scipy; erf is only needed by gelu-like kernels."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - exercised only without scipy
        return np.vectorize(math.erf, otypes=[np.float64])
    return erf

MAX_GRID_ELEMENTS = 1 << 22


def _where(op: ir.Operator) -> str:
    return f"{op.source}: " if op.source is not None else ""


def infer_bindings(op: ir.Operator, arrays: Mapping[str, np.ndarray],
                   scalars: Mapping[str, int | float] | None = None) -> dict[str, int | float]:
    """Bind shape symbols (from `arrays`), scalars (given or default) and derived dims.

    Raises `DslError` for a missing input, a rank or shape mismatch, a missing
    scalar without default, or a failed `require`.
    """
    scalars = dict(scalars or {})
    bindings: dict[str, int | float] = {}
    for s in op.scalars:
        if s.name in scalars:
            value = scalars[s.name]
        elif s.default is not None:
            value = s.default
        else:
            raise DslError(f"{_where(op)}operator {op.name} needs a value for scalar '{s.name}'",
                           hint=f"pass {s.name}=... (it has no default)")
        bindings[s.name] = int(value) if s.dtype in ir.INT_TYPES else float(value)
    for p in op.params:
        if p.name not in arrays:
            raise DslError(f"{_where(op)}operator {op.name}: input '{p.name}' is missing",
                           hint=f"inputs are {', '.join(q.name for q in op.params)}")
        shape = np.shape(arrays[p.name])
        if len(shape) != len(p.shape):
            raise DslError(
                f"{_where(op)}operator {op.name}: input '{p.name}' has rank {len(shape)}, "
                f"expected {len(p.shape)} ({', '.join(ir.to_text(d) for d in p.shape)})",
                hint="check the input's shape")
        for dim, size in zip(p.shape, shape):
            if isinstance(dim, ir.SymVar) and dim.name not in bindings:
                bindings[dim.name] = int(size)
    for name, expr in op.derived:
        bindings[name] = ir.bind_dim(expr, bindings)
    for p in op.params:
        shape = np.shape(arrays[p.name])
        for axis, (dim, size) in enumerate(zip(p.shape, shape)):
            expected = ir.bind_dim(dim, bindings)
            if expected != size:
                raise DslError(
                    f"{_where(op)}operator {op.name}: input '{p.name}' has size {size} in dim "
                    f"{axis}, expected {ir.to_text(dim)} = {expected}",
                    hint="check the input shapes and the scalar arguments")
    for req in op.requires:
        if not ir.bind_dim(ir.Cast(req.cond, ir.INDEX), bindings):
            raise DslError(f"{_where(op)}operator {op.name}: {req.message}",
                           hint=f"requirement {ir.to_text(req.cond)} does not hold for "
                                f"{_describe(bindings)}")
    return bindings


def _describe(bindings: Mapping[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items())


def evaluate(op: ir.Operator, arrays: Mapping[str, np.ndarray],
             bindings: Mapping[str, int | float] | None = None,
             keep_locals: bool = False) -> dict[str, np.ndarray]:
    """Compute the outputs of `op` (float64 for float outputs) from input `arrays`.

    `bindings` may hold scalar values (and is completed by `infer_bindings`).
    With `keep_locals` the temporaries are returned too.
    """
    full = infer_bindings(op, arrays, _scalars_of(op, bindings))
    tensors: dict[str, np.ndarray] = {}
    for p in op.params:
        tensors[p.name] = np.asarray(arrays[p.name], dtype=_np_type(p.dtype))
    for stage in op.stages:
        tensors[stage.name] = _StageEvaluator(op, stage, tensors, full).run()
    names = [s.name for s in op.stages] if keep_locals else list(op.outputs)
    return {name: tensors[name] for name in names}


def _scalars_of(op: ir.Operator, bindings: Mapping[str, int | float] | None) -> dict:
    """The entries of `bindings` that are scalars of `op` (the rest are re-inferred)."""
    names = {s.name for s in op.scalars}
    return {k: v for k, v in (bindings or {}).items() if k in names}


def evaluate_points(op: ir.Operator, arrays: Mapping[str, np.ndarray], stage: str,
                    points: np.ndarray, bindings: Mapping[str, int | float] | None = None
                    ) -> np.ndarray:
    """The float64 values of `stage` of `op` at `points` (an [n, rank] array of indices),
    without evaluating the whole tensor: what sampled verification compares with.

    `arrays` holds the parameters and may hold any stage's values (a kernel's inputs
    as they are in memory); a stage missing from it is evaluated only at the indices the
    requested points read, recursively."""
    full = infer_bindings(op, {p.name: arrays[p.name] for p in op.params},
                          _scalars_of(op, bindings))
    tensors: dict = {p.name: np.asarray(arrays[p.name], dtype=_np_type(p.dtype))
                     for p in op.params}
    for s in op.stages:
        if s.name == stage:
            return _StageEvaluator(op, s, tensors, full).at(np.asarray(points, np.int64))
        if s.name in arrays:
            tensors[s.name] = np.asarray(arrays[s.name], dtype=_np_type(s.dtype))
        else:
            tensors[s.name] = _PointwiseStage(op, s, tensors, full)
    raise DslError(f"{_where(op)}operator {op.name} has no stage '{stage}'",
                   hint=f"stages are {', '.join(s.name for s in op.stages)}")


class _PointwiseStage:
    """A stage's tensor that computes only the elements indexed (`evaluate_points`)."""

    def __init__(self, op: ir.Operator, stage: ir.Stage, tensors: dict, bindings):
        self.evaluator = _StageEvaluator(op, stage, tensors, bindings)
        self.shape = self.evaluator.shape
        self.size = math.prod(self.shape)
        self.dtype = _np_type(stage.dtype)

    def __getitem__(self, index: tuple) -> np.ndarray:
        if not index:
            return self.evaluator.run()[()]
        index = np.broadcast_arrays(*index)
        flat = np.ravel_multi_index([i.reshape(-1) for i in index], self.shape)
        unique, inverse = np.unique(flat, return_inverse=True)
        points = np.stack(np.unravel_index(unique, self.shape), axis=1)
        return self.evaluator.at(points)[inverse].reshape(index[0].shape)


def _np_type(dtype: str):
    if dtype in ir.FLOAT_TYPES:
        return np.float64
    if dtype in ir.INT_TYPES:
        return np.int64
    return np.bool_


class _StageEvaluator:
    """Evaluates one stage over its index grid."""

    def __init__(self, op: ir.Operator, stage: ir.Stage, tensors: dict[str, np.ndarray],
                 bindings: Mapping[str, int | float]):
        self.op, self.stage, self.tensors, self.bindings = op, stage, tensors, bindings
        self.shape = tuple(ir.bind_dim(a.extent, bindings) for a in stage.axes)
        red = stage.reduce
        self.reduce_axes = red.axes if red is not None else ()
        self.reduce_shape = tuple(ir.bind_dim(a.extent, bindings) for a in self.reduce_axes)
        self.env: dict[str, np.ndarray] = {}
        self.leading = len(self.shape)    # grid axes before the reduce axes

    def at(self, points: np.ndarray) -> np.ndarray:
        """The stage's values at `points` ([n, rank] indices), as a 1-d array."""
        count = len(points)
        if count == 0 or not self.shape:
            return np.full(count, self.run()[()] if not self.shape else 0,
                           dtype=_np_type(self.stage.dtype))
        out = np.empty(count, dtype=_np_type(self.stage.dtype))
        per_point = max(1, math.prod(self.reduce_shape))
        chunk = max(1, MAX_GRID_ELEMENTS // per_point)
        for start in range(0, count, chunk):
            out[start:start + chunk] = self._evaluate_points(points[start:start + chunk])
        return out

    def _evaluate_points(self, points: np.ndarray) -> np.ndarray:
        rank = 1 + len(self.reduce_shape)
        self.leading = 1
        self.env = {}
        for axis, column in zip(self.stage.axes, points.T):
            self.env[axis.name] = column.reshape((-1,) + (1,) * (rank - 1))
        for position, (axis, extent) in enumerate(zip(self.reduce_axes, self.reduce_shape)):
            grid_shape = [1] * rank
            grid_shape[1 + position] = extent
            self.env[axis.name] = np.arange(extent, dtype=np.int64).reshape(grid_shape)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            value = np.asarray(self.eval(self.stage.body, None),
                               dtype=_np_type(self.stage.dtype))
        return np.broadcast_to(value, (len(points),) + (1,) * (rank - 1)).reshape(-1)

    def run(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=_np_type(self.stage.dtype))
        if out.size == 0:
            return out
        rows_per_chunk = self.shape[0] if self.shape else 1
        per_row = math.prod(self.shape[1:]) * max(1, math.prod(self.reduce_shape))
        if self.shape and per_row * self.shape[0] > MAX_GRID_ELEMENTS:
            rows_per_chunk = max(1, MAX_GRID_ELEMENTS // max(1, per_row))
        start = 0
        while True:
            stop = min(start + rows_per_chunk, self.shape[0]) if self.shape else 0
            value = self._evaluate_rows(start, stop)
            if self.shape:
                out[start:stop] = value
            else:
                out[()] = value
            start = stop
            if not self.shape or start >= self.shape[0]:
                return out

    def _evaluate_rows(self, start: int, stop: int) -> np.ndarray:
        self.leading = len(self.shape)
        rank = len(self.shape) + len(self.reduce_shape)
        extents = ((stop - start,) + self.shape[1:] if self.shape else ()) + self.reduce_shape
        self.env = {}
        for position, axis in enumerate(self.stage.axes + self.reduce_axes):
            grid_shape = [1] * rank
            grid_shape[position] = extents[position]
            base = start if position == 0 else 0
            self.env[axis.name] = np.arange(base, base + extents[position],
                                            dtype=np.int64).reshape(grid_shape)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            value = self.eval(self.stage.body, None)
        value = np.asarray(value, dtype=_np_type(self.stage.dtype))
        spatial = extents[:len(self.shape)]
        value = np.broadcast_to(value, spatial + (1,) * len(self.reduce_shape)
                                if self.reduce_shape else spatial)
        return value.reshape(spatial)

    def eval(self, e: ir.Expr, guard):
        """Evaluate `e`; `guard` (bool array or None) marks where the value is used."""
        if isinstance(e, ir.Const):
            return _np_type(e.dtype)(e.value)
        if isinstance(e, ir.SymVar):
            if e.name not in self.bindings:
                raise DslError(f"{_where(self.op)}unbound symbol '{e.name}' in stage "
                               f"{self.stage.name}", hint="bind it as a scalar")
            return _np_type(e.dtype)(self.bindings[e.name])
        if isinstance(e, ir.IterVar):
            return self.env[e.name]
        if isinstance(e, ir.BinOp):
            return _binop(e.op, self.eval(e.a, guard), self.eval(e.b, guard), e.dtype)
        if isinstance(e, ir.Call):
            return _call(e.fn, [self.eval(a, guard) for a in e.args])
        if isinstance(e, ir.Cast):
            return _cast(self.eval(e.value, guard), e.dtype)
        if isinstance(e, ir.Select):
            cond = np.asarray(self.eval(e.cond, guard), dtype=bool)
            then_guard = cond if guard is None else (cond & guard)
            else_guard = ~cond if guard is None else (~cond & guard)
            return np.where(cond, self.eval(e.then, then_guard), self.eval(e.else_, else_guard))
        if isinstance(e, ir.Load):
            return self._load(e, guard)
        if isinstance(e, ir.Reduce):
            return self._reduce(e, guard)
        raise TypeError(f"unknown compute IR node {e!r}")

    def _load(self, e: ir.Load, guard):
        data = self.tensors[e.tensor]
        indices = [np.asarray(self.eval(i, guard), dtype=np.int64) for i in e.indices]
        indices = np.broadcast_arrays(*indices) if indices else []
        inside = np.ones(np.shape(indices[0]) if indices else (), dtype=bool)
        clipped = []
        for axis, idx in enumerate(indices):
            ok = (idx >= 0) & (idx < data.shape[axis])
            inside &= ok
            clipped.append(np.clip(idx, 0, max(0, data.shape[axis] - 1)))
        if e.pad is None:
            bad = ~inside if guard is None else (~inside & guard)
            if np.any(bad):
                where = np.argwhere(np.broadcast_to(bad, np.broadcast_shapes(bad.shape)))[0]
                at = [int(np.broadcast_to(i, bad.shape)[tuple(where)]) for i in indices]
                raise DslError(
                    f"{_where(self.op)}stage {self.stage.name} reads {e.tensor}{at} out of "
                    f"bounds (shape {list(data.shape)}) in {ir.to_text(e)}",
                    hint="write `?: 0` after the read for a zero-padded read, or fix the "
                         "index expression")
        if data.size == 0:
            values = np.zeros(np.shape(inside), dtype=data.dtype)
        else:
            values = data[tuple(clipped)] if clipped else data[()]
        if e.pad is None:
            return values
        return np.where(inside, values, self.eval(e.pad, guard))

    def _reduce(self, e: ir.Reduce, guard):
        body = self.eval(e.body, guard)
        rank = self.leading + len(self.reduce_shape)
        first = self.leading
        full = np.broadcast_shapes(np.shape(body), (1,) * rank)
        target = list(full)
        for k in range(first, rank):
            target[k] = self.reduce_shape[k - first]
        body = np.broadcast_to(body, tuple(target))
        axes = tuple(range(first, rank))
        init = self.eval(e.init_value(), guard)
        if 0 in self.reduce_shape:
            kept = tuple(1 if k >= first else s for k, s in enumerate(target))
            return np.broadcast_to(init, np.broadcast_shapes(np.shape(init), kept))
        if e.op == "sum":
            reduced = np.sum(body, axis=axes, keepdims=True)
        elif e.op == "max":
            reduced = np.max(body, axis=axes, keepdims=True)
        else:
            reduced = np.min(body, axis=axes, keepdims=True)
        return _combine(e.op, init, reduced)


def _combine(op: str, init, reduced):
    if op == "sum":
        return init + reduced
    if op == "max":
        return np.maximum(init, reduced)
    return np.minimum(init, reduced)


def _binop(op: str, a, b, dtype: str):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return np.true_divide(a, b)
    if op == "//":
        return np.floor_divide(a, b)
    if op == "%":
        return np.mod(a, b)
    if op == "min":
        return np.minimum(a, b)
    if op == "max":
        return np.maximum(a, b)
    if op == "pow":
        return np.power(np.asarray(a, dtype=np.float64), b)
    if op == "and":
        return np.logical_and(a, b)
    if op == "or":
        return np.logical_or(a, b)
    return {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
            "==": np.equal, "!=": np.not_equal}[op](a, b)


def _call(fn: str, args):
    x = args[0]
    if fn == "exp":
        return np.exp(x)
    if fn == "log":
        return np.log(x)
    if fn == "sqrt":
        return np.sqrt(x)
    if fn == "rsqrt":
        return 1.0 / np.sqrt(x)
    if fn == "tanh":
        return np.tanh(x)
    if fn == "erf":
        return _erf_function()(np.asarray(x, dtype=np.float64))
    if fn == "sigmoid":
        return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))
    if fn == "abs":
        return np.abs(x)
    if fn == "neg":
        return -x
    if fn == "floor":
        return np.floor(x)
    if fn == "ceil":
        return np.ceil(x)
    if fn == "round":   # half to even
        return np.rint(x)
    if fn == "not":
        return np.logical_not(x)
    raise TypeError(f"unknown function {fn}")


def _cast(x, dtype: str):
    if dtype in ir.INT_TYPES:
        return np.trunc(x).astype(np.int64) if np.asarray(x).dtype.kind == "f" \
            else np.asarray(x).astype(np.int64)
    if dtype == "bool":
        return np.asarray(x) != 0
    return np.asarray(x, dtype=np.float64)
