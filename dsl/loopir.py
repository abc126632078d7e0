"""Loop IR: the one imperative program form that every back end consumes.

Lowering (`wpk.dsl.lower`) turns a compute definition plus a schedule into a
`PrimFunc` made of these nodes; `codegen_c`, `codegen_cuda` and the GPU
`emulator` all read the same tree. Buffers are addressed with flat (row-major,
already linearised) integer indices, so back ends never re-derive layouts.

Expressions: `Var`, `Imm`, `Bin`, `Call`, `Load`, `Select`, `Cast`.
Statements: `For` (kind serial/parallel/unroll/vectorize or a CUDA binding such
as ``blockIdx.x`` / ``threadIdx.x``), `Seq`, `Allocate`, `Store`, `IfThenElse`,
`Barrier`, `Comment`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

LOOP_KINDS = ("serial", "parallel", "unroll", "vectorize")
GPU_BINDINGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z",
                "threadIdx.x", "threadIdx.y", "threadIdx.z")
INT = "i32"


# ----------------------------------------------------------------------------- expressions
class Expr:
    """Base class of loop-IR expressions (immutable, hashable)."""

    dtype: str

    def __add__(self, other):
        return add(self, other)

    def __mul__(self, other):
        return mul(self, other)


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str
    dtype: str = INT


@dataclass(frozen=True, eq=True)
class Imm(Expr):
    value: int | float
    dtype: str = INT


@dataclass(frozen=True, eq=True)
class Bin(Expr):
    """Binary op: + - * / (true division) // % (floor, non-negative operands
    for index math) min max pow < <= > >= == != and or."""

    op: str
    a: Expr
    b: Expr
    dtype: str = INT


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """Math intrinsic (exp, log, sqrt, tanh, erf, abs, ...) applied elementwise."""

    func: str
    args: tuple[Expr, ...]
    dtype: str = "f32"


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buffer: str
    index: Expr
    dtype: str = "f32"


@dataclass(frozen=True, eq=True)
class Select(Expr):
    """`cond ? a : b`; only the chosen branch is evaluated (loads may be guarded by it)."""

    cond: Expr
    a: Expr
    b: Expr
    dtype: str = "f32"


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    dtype: str
    value: Expr


COMPARISONS = ("<", "<=", ">", ">=", "==", "!=", "and", "or")


def const(value, dtype: str | None = None) -> Imm:
    """An immediate; ints default to int32, floats to float32."""
    if dtype is None:
        dtype = INT if isinstance(value, (int, bool)) and not isinstance(value, float) else "f32"
    return Imm(value, dtype)


def _wrap(x) -> Expr:
    return x if isinstance(x, Expr) else const(x)


def binary(op: str, a, b) -> Expr:
    """Build `a op b` with constant folding of trivial cases (keeps generated code readable)."""
    a, b = _wrap(a), _wrap(b)
    if isinstance(a, Imm) and isinstance(b, Imm) and a.dtype == INT and b.dtype == INT:
        folded = _fold_int(op, a.value, b.value)
        if folded is not None:
            return folded
    if op == "+":
        if _is(b, 0):
            return a
        if _is(a, 0):
            return b
        if isinstance(b, Imm) and b.dtype == INT and b.value < 0:
            return binary("-", a, -b.value)
    if op == "-" and _is(b, 0):
        return a
    if op == "-" and isinstance(b, Imm) and b.dtype == INT and b.value < 0:
        return binary("+", a, -b.value)
    if op == "-" and a == b and a.dtype == INT:
        return const(0)
    if op == "*":
        if _is(b, 1):
            return a
        if _is(a, 1):
            return b
        if (_is(a, 0) or _is(b, 0)) and a.dtype == INT and b.dtype == INT:
            return const(0)
    if op == "//" and _is(b, 1):
        return a
    if op == "%" and _is(b, 1):
        return const(0)
    dtype = INT if op in COMPARISONS else (b.dtype if a.dtype == INT else a.dtype)
    if op in COMPARISONS:
        dtype = "bool"
    return Bin(op, a, b, dtype)


def _is(e: Expr, v) -> bool:
    return isinstance(e, Imm) and e.value == v


def _fold_int(op: str, a: int, b: int) -> Expr | None:
    ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
           "//": lambda: a // b if b else None, "%": lambda: a % b if b else None,
           "min": lambda: min(a, b), "max": lambda: max(a, b)}
    if op in ops:
        value = ops[op]()
        return None if value is None else const(int(value))
    return None


def add(a, b) -> Expr:
    return binary("+", a, b)


def mul(a, b) -> Expr:
    return binary("*", a, b)


def logical_and(conds: list[Expr]) -> Expr | None:
    """Conjunction of conditions, or None for an empty list."""
    result = None
    for cond in conds:
        result = cond if result is None else Bin("and", result, cond, "bool")
    return result


# ----------------------------------------------------------------------------- statements
class Stmt:
    """Base class of loop-IR statements."""


@dataclass(frozen=True)
class Buffer:
    """A named array: kernel parameter (global), workspace, shared or local (register) memory."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    scope: str = "global"

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    extent: int
    body: Stmt
    kind: str = "serial"


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class Allocate(Stmt):
    """Declare a shared or local buffer, live until the end of the enclosing block."""

    buffer: Buffer


@dataclass(frozen=True)
class Store(Stmt):
    buffer: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True)
class Barrier(Stmt):
    """`__syncthreads()`: every thread of the block reaches it before any continues."""


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


def seq(*stmts: Stmt | None) -> Stmt:
    """Flatten nested sequences and drop None; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        for item in (s.stmts if isinstance(s, Seq) else (s,)):
            if isinstance(item, Barrier) and flat and isinstance(flat[-1], Barrier):
                continue  # two barriers in a row synchronise once
            flat.append(item)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


@dataclass(frozen=True)
class Kernel:
    """One loop nest launched as a unit (a CUDA kernel, or one phase of a C function)."""

    name: str
    body: Stmt
    buffers: tuple[str, ...]  # global buffers it touches, in parameter order


@dataclass(frozen=True)
class PrimFunc:
    """A lowered operator: parameters, scalar arguments, workspaces and its kernels in order."""

    name: str
    params: tuple[Buffer, ...]
    scalars: tuple[Var, ...]
    workspaces: tuple[Buffer, ...]
    kernels: tuple[Kernel, ...]
    target: str = "cpu"
    meta: dict = field(default_factory=dict, compare=False)

    def buffer(self, name: str) -> Buffer:
        for b in self.params + self.workspaces:
            if b.name == name:
                return b
        raise KeyError(name)


# ----------------------------------------------------------------------------- traversal
def children(node) -> Iterator:
    """Direct sub-expressions and sub-statements of a node."""
    if isinstance(node, Bin):
        yield from (node.a, node.b)
    elif isinstance(node, Call):
        yield from node.args
    elif isinstance(node, Load):
        yield node.index
    elif isinstance(node, Select):
        yield from (node.cond, node.a, node.b)
    elif isinstance(node, Cast):
        yield node.value
    elif isinstance(node, For):
        yield node.body
    elif isinstance(node, Seq):
        yield from node.stmts
    elif isinstance(node, Store):
        yield from (node.index, node.value)
    elif isinstance(node, IfThenElse):
        yield from (node.cond, node.then)
        if node.orelse is not None:
            yield node.orelse


def walk(node) -> Iterator:
    """Pre-order traversal of every node below (and including) `node`."""
    yield node
    for child in children(node):
        yield from walk(child)


def free_vars(expr: Expr) -> set[str]:
    return {n.name for n in walk(expr) if isinstance(n, Var)}


def substitute(expr: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by expressions (re-folding constants)."""
    return transform(expr, lambda e: mapping.get(e.name) if isinstance(e, Var) else None)


def transform(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: `fn` returns a replacement or None to keep the (rebuilt) node."""
    hit = fn(expr)
    if hit is not None:
        return hit
    if isinstance(expr, Bin):
        a, b = transform(expr.a, fn), transform(expr.b, fn)
        if expr.op in COMPARISONS:
            return Bin(expr.op, a, b, "bool")
        if expr.dtype == INT:
            return binary(expr.op, a, b)
        return Bin(expr.op, a, b, expr.dtype)
    if isinstance(expr, Call):
        return replace(expr, args=tuple(transform(a, fn) for a in expr.args))
    if isinstance(expr, Load):
        return replace(expr, index=transform(expr.index, fn))
    if isinstance(expr, Select):
        return Select(transform(expr.cond, fn), transform(expr.a, fn), transform(expr.b, fn),
                      expr.dtype)
    if isinstance(expr, Cast):
        return Cast(expr.dtype, transform(expr.value, fn))
    return expr


# ----------------------------------------------------------------------------- bounds
def bounds(expr: Expr, ranges: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Inclusive integer interval of an index expression, given inclusive ranges of its
    variables; None when it cannot be bounded (unknown variable or unsupported op)."""
    if isinstance(expr, Imm):
        return (int(expr.value), int(expr.value)) if expr.dtype == INT else None
    if isinstance(expr, Var):
        return ranges.get(expr.name)
    if not isinstance(expr, Bin):
        return None
    a, b = bounds(expr.a, ranges), bounds(expr.b, ranges)
    if a is None or b is None:
        return None
    if expr.op == "+":
        return a[0] + b[0], a[1] + b[1]
    if expr.op == "-":
        return a[0] - b[1], a[1] - b[0]
    if expr.op == "*":
        c = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
        return min(c), max(c)
    if expr.op == "//" and b[0] == b[1] and b[0] > 0:
        return a[0] // b[0], a[1] // b[0]
    if expr.op == "%" and b[0] == b[1] and b[0] > 0:
        if a[0] >= 0 and a[1] // b[0] == a[0] // b[0]:
            return a[0] % b[0], a[1] % b[0]
        return 0, b[0] - 1
    if expr.op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if expr.op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    return None


# ----------------------------------------------------------------------------- printing
def expr_text(e: Expr) -> str:
    """Compact infix rendering of an expression."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Imm):
        return str(e.value).lower() if e.dtype == "bool" else repr(e.value)
    if isinstance(e, Load):
        return f"{e.buffer}[{expr_text(e.index)}]"
    if isinstance(e, Select):
        return f"select({expr_text(e.cond)}, {expr_text(e.a)}, {expr_text(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_text(e.value)})"
    if isinstance(e, Call):
        return f"{e.func}({', '.join(expr_text(a) for a in e.args)})"
    if isinstance(e, Bin):
        if e.op in ("min", "max", "pow"):
            return f"{e.op}({expr_text(e.a)}, {expr_text(e.b)})"
        return f"({expr_text(e.a)} {e.op} {expr_text(e.b)})"
    return repr(e)


def _stmt_lines(s: Stmt, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(s, Seq):
        for child in s.stmts:
            _stmt_lines(child, indent, out)
    elif isinstance(s, For):
        kind = "" if s.kind == "serial" else f"{s.kind} "
        out.append(f"{pad}{kind}for {s.var.name} in 0..{s.extent}:")
        _stmt_lines(s.body, indent + 1, out)
    elif isinstance(s, Allocate):
        b = s.buffer
        out.append(f"{pad}alloc {b.scope} {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]")
    elif isinstance(s, Store):
        out.append(f"{pad}{s.buffer}[{expr_text(s.index)}] = {expr_text(s.value)}")
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {expr_text(s.cond)}:")
        _stmt_lines(s.then, indent + 1, out)
        if s.orelse is not None:
            out.append(f"{pad}else:")
            _stmt_lines(s.orelse, indent + 1, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}barrier")
    elif isinstance(s, Comment):
        out.append(f"{pad}# {s.text}")


def to_text(func: PrimFunc) -> str:
    """The whole lowered function as indented pseudo-code (what `wpk dsl --emit ir` shows)."""
    params = ", ".join(f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]"
                       for b in func.params)
    lines = [f"func {func.name}({params})  # target {func.target}"]
    for w in func.workspaces:
        lines.append(f"  workspace {w.name}: {w.dtype}[{', '.join(map(str, w.shape))}]")
    for k in func.kernels:
        lines.append(f"  kernel {k.name}:")
        _stmt_lines(k.body, 2, lines)
    return "\n".join(lines)
