"""The compute IR: what a DSL operator computes, with no notion of loops or schedules.

The parser (`wpk.dsl.parser`) turns a `.wpk` file into `Operator`s of this IR;
the lowering (loop IR, schedules, C/CUDA code generation) consumes them, and
`evaluate` interprets them with numpy in float64 as the reference. The design
follows TVM's tensor expressions. Every node is a frozen, hashable dataclass.

Operator
    `Operator(name, params, scalars, derived, requires, stages, outputs, source)`.
    * `params`: the input tensors, `Param(name, dtype, shape)`; `shape` is a
      tuple of dim expressions (below).
    * `scalars`: scalar arguments, `Scalar(name, dtype, default)`: integer
      attributes (stride, padding, groups...) and float ones (alpha, eps...).
      Inside expressions they appear as `SymVar(name, dtype)`.
    * shape symbols: every plain name used as a dim of a param (N, C, H...)
      is a `SymVar(name, 'i32')` bound from the input arrays' shapes
      (`Operator.shape_symbols`).
    * `derived`: `(name, expr)` pairs in dependency order, e.g.
      `("OH", (H + 2*pad_h - dil_h*(R-1) - 1) // stride_h + 1)`. They are
      integer `SymVar`s too, computed from the symbols and scalars before them.
    * `requires`: `Require(cond, message)` checks on symbols/scalars (e.g.
      `C % G == 0`); `infer_bindings` raises `DslError(message)` when one fails.
    * `stages`: in execution order; each defines one tensor. `outputs` names
      the stages that are operator outputs (in signature order); the other
      stages are temporaries (`local` in the DSL). Stages may read params and
      earlier stages.

Dims
    A dim is an integer-typed expression over `Const` and `SymVar` only
    (`Const(4, 'i32')`, `SymVar('N')`, `BinOp('//', SymVar('C'), SymVar('G'))`).
    `bind_dim(expr, bindings)` turns one into an int.

Stage
    `Stage(name, axes, body, dtype)` defines the tensor
    `name[axes...] = body` elementwise over its spatial axes; its shape is
    `tuple(axis.extent for axis in axes)`. `body` may contain at most ONE
    distinct `Reduce` (the same Reduce may occur several times, e.g.
    `silu(sum(...))` = `s * sigmoid(s)`: equal nodes denote one value and
    `replace_reduce` replaces all of them); a Reduce never contains another
    Reduce and never appears
    inside an index expression, a Load's pad or a Select's condition. Code
    around the Reduce is an epilogue evaluated once per output element after
    the reduction finishes (e.g. gemm: `alpha * Reduce(sum, ...) + beta * C[m, n]`).
    Lowering recipe: `red = find_reduce(body)`; accumulate `red.body` over
    `red.axes` into a scalar starting from `red.init_value()`; then store
    `replace_reduce(body, acc)` where `acc` is any expression naming the
    accumulator (e.g. `SymVar('acc', dtype)`).

Expressions (every node has a `dtype`: 'f16' 'f32' 'f64' 'i32' 'i64' 'bool')
    * `Const(value, dtype)`: a literal (int, float or bool value).
    * `SymVar(name, dtype)`: shape symbol, derived dim or scalar argument.
    * `IterVar(name, extent, kind)`: a loop index, kind 'spatial' (a stage
      axis) or 'reduce' (a Reduce axis), running over `range(extent)`; dtype 'i32'.
    * `BinOp(op, a, b, dtype)`: arithmetic `+ - * / // % min max pow`,
      comparisons `< <= > >= == !=` (dtype 'bool'), logic `and or` on bools.
      `/` is true division and only appears on floats; `//` and `%` are
      integer floor division/modulo (Python semantics); in the library they
      only see non-negative operands, so C's `/` and `%` agree. Both
      operands always have the same dtype: the parser inserts explicit
      `Cast`s (int -> float) and retypes literals.
    * `Call(fn, args, dtype)`: math functions, see `CALL_ARITY`
      (exp log sqrt rsqrt tanh erf sigmoid abs neg floor ceil round not; round: half to even).
      `sigmoid(x) = 1/(1+exp(-x))`; `not` is on bools.
    * `Load(tensor, indices, dtype, pad)`: reads param or earlier stage
      `tensor` at integer `indices` (one per dim). If `pad` is None the
      indices are guaranteed in bounds; otherwise an out-of-bounds index in
      any dim yields the value of `pad` (the DSL's `X[i, j] ?: 0`), so a
      guarded read `in_bounds(load) ? X[...] : pad` (see `bounds_condition`).
    * `Select(cond, then, else_, dtype)`: `cond ? then : else_`; only the
      chosen branch needs evaluating.
    * `Cast(value, dtype)`: numeric conversion.
    * `Reduce(op, body, axes, dtype, init)`: `op` in 'sum' 'max' 'min' over
      the `IterVar`s `axes` (kind 'reduce'); `init` is None for the identity
      (0, -inf, +inf) or an expression free of the reduce axes.

Helpers: `walk`, `substitute` (by SymVar/IterVar name), `find_reduce`,
`replace_reduce`, `simplify` (constant folding), `specialize` (bind every
symbol and scalar to constants), `infer_bindings`, `evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

import numpy as np

from wpk.core.errors import DslError

FLOAT_TYPES = ("f16", "f32", "f64")
INT_TYPES = ("i32", "i64")
DTYPES = FLOAT_TYPES + INT_TYPES + ("bool",)
NUMPY_DTYPES = {"f16": "float16", "f32": "float32", "f64": "float64", "i32": "int32",
                "i64": "int64", "bool": "bool"}
INDEX = "i32"

ARITH_OPS = ("+", "-", "*", "/", "//", "%", "min", "max", "pow")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")
CALL_ARITY = {"exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "erf": 1, "sigmoid": 1,
              "abs": 1, "neg": 1, "floor": 1, "ceil": 1, "round": 1, "not": 1}
REDUCE_OPS = ("sum", "max", "min")


class Expr:
    """Base class of compute IR expressions (all subclasses are frozen dataclasses)."""

    dtype: str

    def children(self) -> tuple[Expr, ...]:
        """The direct sub-expressions, in field order."""
        out: list[Expr] = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Expr):
                out.append(value)
            elif isinstance(value, tuple):
                out.extend(v for v in value if isinstance(v, Expr))
        return tuple(out)

    def __str__(self) -> str:
        return to_text(self)


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool
    dtype: str = INDEX


@dataclass(frozen=True)
class SymVar(Expr):
    name: str
    dtype: str = INDEX


@dataclass(frozen=True)
class IterVar(Expr):
    name: str
    extent: Expr
    kind: str = "spatial"  # 'spatial' | 'reduce'
    dtype: str = INDEX


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True)
class Load(Expr):
    tensor: str
    indices: tuple[Expr, ...]
    dtype: str
    pad: Expr | None = None


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    then: Expr
    else_: Expr
    dtype: str


@dataclass(frozen=True)
class Cast(Expr):
    value: Expr
    dtype: str


@dataclass(frozen=True)
class Reduce(Expr):
    op: str
    body: Expr
    axes: tuple[IterVar, ...]
    dtype: str
    init: Expr | None = None

    def init_value(self) -> Expr:
        """The accumulator's starting value: `init` or the identity of `op`."""
        if self.init is not None:
            return self.init
        identity = {"sum": 0.0, "max": -math.inf, "min": math.inf}[self.op]
        return Const(identity if self.dtype in FLOAT_TYPES else int(identity), self.dtype)


@dataclass(frozen=True)
class Param:
    """An input tensor: name, dtype and shape (dim expressions)."""

    name: str
    dtype: str
    shape: tuple[Expr, ...]


@dataclass(frozen=True)
class Scalar:
    """A scalar argument (attribute): int like stride or float like alpha."""

    name: str
    dtype: str
    default: int | float | None = None


@dataclass(frozen=True)
class Require:
    """A precondition on symbols/scalars, checked by `infer_bindings`."""

    cond: Expr
    message: str


@dataclass(frozen=True)
class Stage:
    """`name[axes] = body`: one tensor defined elementwise (see module docstring)."""

    name: str
    axes: tuple[IterVar, ...]
    body: Expr
    dtype: str

    @property
    def shape(self) -> tuple[Expr, ...]:
        return tuple(axis.extent for axis in self.axes)

    @property
    def reduce(self) -> Reduce | None:
        return find_reduce(self.body)


@dataclass(frozen=True)
class SourceSpan:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Operator:
    """A DSL operator: inputs, scalars, derived dims, checks, stages and outputs."""

    name: str
    params: tuple[Param, ...]
    scalars: tuple[Scalar, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    derived: tuple[tuple[str, Expr], ...] = ()
    requires: tuple[Require, ...] = ()
    source: SourceSpan | None = None
    doc: str = field(default="", compare=False)

    @property
    def shape_symbols(self) -> tuple[str, ...]:
        """Names bound from the input shapes (plain-name dims of params), in order."""
        seen: list[str] = []
        for p in self.params:
            for d in p.shape:
                if isinstance(d, SymVar) and d.name not in seen:
                    seen.append(d.name)
        return tuple(seen)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def tensor_shape(self, name: str) -> tuple[Expr, ...]:
        """Shape of a param or stage tensor."""
        p = self.param(name)
        if p is not None:
            return p.shape
        s = self.stage(name)
        if s is None:
            raise KeyError(name)
        return s.shape

    def tensor_dtype(self, name: str) -> str:
        p = self.param(name)
        return p.dtype if p is not None else self.stage(name).dtype  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- traversal


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of `expr`, parents before children (IterVar extents not entered)."""
    yield expr
    if isinstance(expr, IterVar):
        return
    for child in expr.children():
        yield from walk(child)


def map_children(expr: Expr, fn) -> Expr:
    """A copy of `expr` with `fn` applied to each direct child expression."""
    if isinstance(expr, (Const, SymVar, IterVar)):
        return expr
    changes = {}
    for f in fields(expr):  # type: ignore[arg-type]
        value = getattr(expr, f.name)
        if isinstance(value, Expr):
            changes[f.name] = fn(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
            changes[f.name] = tuple(fn(v) for v in value)
    return replace(expr, **changes)


def substitute(expr: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """Replace SymVars and IterVars by name (IterVar extents are substituted too)."""
    if isinstance(expr, SymVar):
        return mapping.get(expr.name, expr)
    if isinstance(expr, IterVar):
        if expr.name in mapping:
            return mapping[expr.name]
        return replace(expr, extent=substitute(expr.extent, mapping))
    if isinstance(expr, Reduce):
        axes = tuple(replace(a, extent=substitute(a.extent, mapping)) for a in expr.axes)
        init = None if expr.init is None else substitute(expr.init, mapping)
        return replace(expr, body=substitute(expr.body, mapping), axes=axes, init=init)
    return map_children(expr, lambda e: substitute(e, mapping))


def find_reduce(expr: Expr) -> Reduce | None:
    """The Reduce node in `expr`, or None."""
    return next((e for e in walk(expr) if isinstance(e, Reduce)), None)


def replace_reduce(expr: Expr, value: Expr) -> Expr:
    """`expr` with its Reduce node replaced by `value` (the accumulator)."""
    if isinstance(expr, Reduce):
        return value
    return map_children(expr, lambda e: replace_reduce(e, value))


def loads(expr: Expr) -> list[Load]:
    """Every Load in `expr`."""
    return [e for e in walk(expr) if isinstance(e, Load)]


def bounds_condition(load: Load, shape: tuple[Expr, ...]) -> Expr:
    """The bool expression `0 <= idx_i < shape_i for all i` of a padded load."""
    cond: Expr | None = None
    for idx, dim in zip(load.indices, shape):
        part = BinOp("and", BinOp("<=", Const(0), idx, "bool"), BinOp("<", idx, dim, "bool"),
                     "bool")
        cond = part if cond is None else BinOp("and", cond, part, "bool")
    return cond if cond is not None else Const(True, "bool")


# ---------------------------------------------------------------------------- folding

_PY_BINOPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "min": min, "max": max, "pow": lambda a, b: a ** b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}


def _const(value, dtype: str) -> Const:
    if dtype in INT_TYPES:
        return Const(int(value), dtype)
    if dtype == "bool":
        return Const(bool(value), dtype)
    return Const(float(value), dtype)


def simplify(expr: Expr) -> Expr:
    """Fold constant sub-expressions and the identities x+0, x*1, x*0 (ints), x//1."""
    if isinstance(expr, IterVar):
        return replace(expr, extent=simplify(expr.extent))
    if isinstance(expr, Reduce):
        axes = tuple(replace(a, extent=simplify(a.extent)) for a in expr.axes)
        init = None if expr.init is None else simplify(expr.init)
        return replace(expr, body=simplify(expr.body), axes=axes, init=init)
    expr = map_children(expr, simplify)
    if isinstance(expr, BinOp):
        a, b = expr.a, expr.b
        if isinstance(a, Const) and isinstance(b, Const):
            if expr.op in ("//", "%") and b.value == 0:
                return expr
            return _const(_PY_BINOPS[expr.op](a.value, b.value), expr.dtype)
        if expr.dtype in INT_TYPES:
            if expr.op in ("+", "-") and isinstance(b, Const) and b.value == 0:
                return a
            if expr.op == "+" and isinstance(a, Const) and a.value == 0:
                return b
            if expr.op in ("*", "//") and isinstance(b, Const) and b.value == 1:
                return a
            if expr.op == "*" and isinstance(a, Const) and a.value == 1:
                return b
            if expr.op == "*" and (a == Const(0, a.dtype) or b == Const(0, b.dtype)):
                return Const(0, expr.dtype)
    if isinstance(expr, Cast) and isinstance(expr.value, Const):
        return _const(expr.value.value, expr.dtype)
    if isinstance(expr, Select) and isinstance(expr.cond, Const):
        return expr.then if expr.cond.value else expr.else_
    return expr


def bind_dim(expr: Expr, bindings: Mapping[str, int | float]) -> int:
    """Evaluate an integer dim expression with all its symbols bound."""
    value = simplify(substitute(expr, {k: _const(v, _dtype_of_value(v))
                                       for k, v in bindings.items()}))
    if not isinstance(value, Const):
        missing = sorted({e.name for e in walk(value) if isinstance(e, SymVar)})
        raise DslError(f"dim {to_text(expr)} has unbound symbols {', '.join(missing)}",
                       hint="pass the missing symbols or scalars as bindings")
    return int(value.value)


def _dtype_of_value(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return INDEX
    return "f64"


def specialize(op: Operator, bindings: Mapping[str, int | float]) -> Operator:
    """A copy of `op` with every symbol, derived dim and scalar replaced by its value.

    `bindings` is what `infer_bindings` returns. Scalars keep their declared
    dtype (a float scalar becomes a float Const of that dtype).
    """
    scalar_types = {s.name: s.dtype for s in op.scalars}
    mapping = {k: _const(v, scalar_types.get(k, _dtype_of_value(v)))
               for k, v in bindings.items()}

    def sub(e: Expr) -> Expr:
        return simplify(substitute(e, mapping))

    params = tuple(replace(p, shape=tuple(sub(d) for d in p.shape)) for p in op.params)
    stages = tuple(replace(s, axes=tuple(sub(a) for a in s.axes), body=sub(s.body))
                   for s in op.stages)
    return replace(op, params=params, stages=stages, derived=(), requires=())


# ---------------------------------------------------------------------------- printing


def to_text(expr: Expr) -> str:
    """A compact, DSL-like rendering of an expression (for --emit ir and messages)."""
    if isinstance(expr, Const):
        return repr(expr.value) if not isinstance(expr.value, bool) else str(expr.value).lower()
    if isinstance(expr, (SymVar, IterVar)):
        return expr.name
    if isinstance(expr, BinOp):
        if expr.op in ("min", "max", "pow"):
            return f"{expr.op}({to_text(expr.a)}, {to_text(expr.b)})"
        return f"({to_text(expr.a)} {expr.op} {to_text(expr.b)})"
    if isinstance(expr, Call):
        return f"{expr.fn}({', '.join(to_text(a) for a in expr.args)})"
    if isinstance(expr, Load):
        text = f"{expr.tensor}[{', '.join(to_text(i) for i in expr.indices)}]"
        return text if expr.pad is None else f"({text} ?: {to_text(expr.pad)})"
    if isinstance(expr, Select):
        return f"select({to_text(expr.cond)}, {to_text(expr.then)}, {to_text(expr.else_)})"
    if isinstance(expr, Cast):
        return f"{expr.dtype}({to_text(expr.value)})"
    if isinstance(expr, Reduce):
        axes = ", ".join(f"{a.name} in {to_text(a.extent)}" for a in expr.axes)
        init = "" if expr.init is None else f" init {to_text(expr.init)}"
        return f"{expr.op}({axes}){init} {{ {to_text(expr.body)} }}"
    return repr(expr)


def operator_text(op: Operator) -> str:
    """The whole operator as readable text (what `wpk dsl --emit ir` prints)."""

    def tensor(name, dtype, shape):
        return f"{name}: {dtype}[{', '.join(to_text(d) for d in shape)}]"

    args = [tensor(p.name, p.dtype, p.shape) for p in op.params]
    args += [f"{s.name}: {s.dtype}" + ("" if s.default is None else f" = {s.default!r}")
             for s in op.scalars]
    outs = [tensor(s.name, s.dtype, s.shape) for s in op.stages if s.name in op.outputs]
    lines = [f"# {line}" for line in op.doc.splitlines()]
    lines.append(f"op {op.name}({', '.join(args)}) -> ({', '.join(outs)})")
    lines += [f"  let {name} = {to_text(e)}" for name, e in op.derived]
    lines += [f"  require {to_text(r.cond)}" for r in op.requires]
    for s in op.stages:
        kind = "output" if s.name in op.outputs else "local"
        idx = ", ".join(f"{a.name} in {to_text(a.extent)}" for a in s.axes)
        lines.append(f"  {kind} {s.name}[{idx}]: {s.dtype} = {to_text(s.body)}")
    return "\n".join(lines)


def evaluate(op: Operator, arrays, bindings=None, keep_locals: bool = False) -> dict:
    """Outputs of `op` computed by the float64 reference interpreter (`wpk.dsl.evaluate`)."""
    from wpk.dsl.evaluate import evaluate as run  # evaluate builds on this module (a cycle)

    return run(op, arrays, bindings, keep_locals)


def infer_bindings(op: Operator, arrays, scalars=None) -> dict[str, int | float]:
    """Every symbol, scalar and derived dim of `op` bound from inputs (`wpk.dsl.evaluate`)."""
    from wpk.dsl.evaluate import infer_bindings as infer  # a cycle, as in `evaluate`

    return infer(op, arrays, scalars)


__all__ = [
    "ARITH_OPS", "CALL_ARITY", "COMPARE_OPS", "DTYPES", "FLOAT_TYPES", "INDEX", "INT_TYPES",
    "LOGIC_OPS", "NUMPY_DTYPES", "REDUCE_OPS", "BinOp", "Call", "Cast", "Const", "Expr",
    "IterVar", "Load", "Operator", "Param", "Reduce", "Require", "Scalar", "Select",
    "SourceSpan", "Stage", "SymVar", "bind_dim", "bounds_condition", "evaluate", "find_reduce",
    "infer_bindings", "loads", "map_children", "operator_text", "replace_reduce", "simplify",
    "specialize", "substitute", "to_text", "walk",
]
