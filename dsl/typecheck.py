"""Name resolution and type checking of DSL expressions, producing compute IR.

`ExprChecker` turns one lark expression tree into a typed `compute.Expr`,
resolving names against a `Scope` (symbols, tensors, index variables) and
applying the typing rules of dsl/LANGUAGE.md: integer literals adopt the
type of the other operand, integer variables are cast explicitly to float
where mixed with floats, floats of different widths need an explicit cast,
indices must be integers, conditions must be bool. Every mistake raises
`DslError` with `file:line:col: message` and a hint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lark import Token, Tree

from wpk.core.errors import DslError
from wpk.dsl import compute as ir
from wpk.dsl.epilogue import epilogue_expr

TYPE_ALIASES = {"int": "i32", "float": "f32"}
DEFAULT_FLOAT = "f32"
UNARY_FLOAT_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid")
EPILOGUE_FUNCTIONS = {
    # name: (min args, max args)
    "relu": (1, 1), "relu6": (1, 1), "clip": (3, 3), "leaky_relu": (1, 2), "silu": (1, 1),
    "gelu": (1, 1), "gelu_tanh": (1, 1), "hard_sigmoid": (1, 3), "hard_swish": (1, 1),
    "softplus": (1, 1), "reciprocal": (1, 1),
}
OTHER_FUNCTIONS = {"abs": (1, 1), "floor": (1, 1), "ceil": (1, 1), "round": (1, 1),
                   "min": (2, 2),
                   "max": (2, 2), "pow": (2, 2), "select": (3, 3)}


def dtype_name(token: str) -> str:
    """Canonical dtype of a type token (`int` is i32, `float` is f32)."""
    return TYPE_ALIASES.get(str(token), str(token))


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[ir.Expr, ...]
    kind: str  # 'input' | 'output' | 'local'
    defined: bool = False


@dataclass
class Scope:
    """Names visible in an operator: symbols (SymVars) and tensors."""

    symbols: dict[str, ir.SymVar] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)


@dataclass
class Context:
    """Where an expression sits: the stage's index variables and reduction state."""

    stage: str = ""
    spatial: dict[str, ir.IterVar] = field(default_factory=dict)
    reduce: dict[str, ir.IterVar] = field(default_factory=dict)
    dims_only: bool = False          # dims, lets, requires: symbols and literals only
    reduce_allowed: bool = True      # False inside indices, pads, conditions, reductions
    closed_reduce_axes: dict[str, tuple[int, int]] = field(default_factory=dict)
    reduction_sites: list[tuple[int, int]] = field(default_factory=list)  # shared by nesting

    def nested(self, **changes) -> Context:
        child = Context(**{**self.__dict__, **changes})
        return child


def position(node) -> tuple[int, int]:
    """(line, column) of a lark tree or token (1, 1 when unknown)."""
    if isinstance(node, Token):
        return node.line or 1, node.column or 1
    meta = getattr(node, "meta", None)
    if meta is not None and not meta.empty:
        return meta.line, meta.column
    if isinstance(node, Tree):
        for child in node.children:
            if isinstance(child, (Tree, Token)):
                return position(child)
    return 1, 1


class ExprChecker:
    """Builds typed compute IR from expression trees, reporting mistakes precisely."""

    def __init__(self, filename: str, scope: Scope):
        self.filename = filename
        self.scope = scope

    # ------------------------------------------------------------------ errors

    def error(self, node, message: str, hint: str) -> DslError:
        line, column = position(node)
        return DslError(f"{self.filename}:{line}:{column}: {message}", hint=hint)

    # ------------------------------------------------------------------ entry points

    def dim(self, tree) -> ir.Expr:
        """An integer expression over symbols only (a dim, a let, a reduce extent)."""
        expr = self.build(tree, Context(dims_only=True, reduce_allowed=False))
        if expr.dtype not in ir.INT_TYPES:
            raise self.error(tree, f"a size must be an integer expression, got {expr.dtype}",
                             "use integer symbols, int scalars and integer literals")
        return ir.simplify(expr)

    def condition(self, tree, ctx: Context) -> ir.Expr:
        expr = self.build(tree, ctx.nested(reduce_allowed=False))
        if expr.dtype != "bool":
            raise self.error(tree, f"a condition must be bool, got {expr.dtype}",
                             "compare values, e.g. `x > 0`")
        return expr

    def index(self, tree, ctx: Context) -> ir.Expr:
        expr = self.build(tree, ctx.nested(reduce_allowed=False))
        if expr.dtype not in ir.INT_TYPES:
            raise self.error(tree, f"an index must be an integer expression, got {expr.dtype}",
                             "indices are built from index variables, symbols and integers")
        return expr

    def coerce(self, expr: ir.Expr, dtype: str, node, what: str) -> ir.Expr:
        """Convert `expr` to `dtype` where the language allows it implicitly."""
        if expr.dtype == dtype:
            return expr
        if isinstance(expr, ir.Const) and expr.dtype != "bool" and dtype != "bool":
            if dtype in ir.INT_TYPES and expr.dtype in ir.FLOAT_TYPES \
                    and not float(expr.value).is_integer():
                raise self.error(node, f"{what}: float literal {expr.value} where an "
                                       f"integer is expected", "use an integer literal")
            return ir._const(expr.value, dtype)
        if expr.dtype in ir.INT_TYPES and dtype in ir.FLOAT_TYPES + ir.INT_TYPES:
            return ir.Cast(expr, dtype)
        hint = (f"convert explicitly with {dtype}(...)" if dtype != "bool" and
                expr.dtype != "bool" else "compare values to get a bool, e.g. `x > 0`")
        raise self.error(node, f"type mismatch: {what} expects {dtype}, got {expr.dtype}", hint)

    def unify(self, a: ir.Expr, b: ir.Expr, node, what: str) -> tuple[ir.Expr, ir.Expr]:
        """Bring two operands to one dtype (literals adopt, ints widen to floats)."""
        if a.dtype == b.dtype:
            return a, b
        for x in (a, b):
            if x.dtype == "bool":
                raise self.error(node, f"type mismatch in {what}: bool and "
                                       f"{(b if x is a else a).dtype}",
                                 "bools only combine with `and`, `or`, `not` and select(...)")
        if isinstance(a, ir.Const) and not (a.dtype in ir.FLOAT_TYPES and b.dtype in ir.INT_TYPES):
            return self.coerce(a, b.dtype, node, what), b
        if isinstance(b, ir.Const) and not (b.dtype in ir.FLOAT_TYPES and a.dtype in ir.INT_TYPES):
            return a, self.coerce(b, a.dtype, node, what)
        if a.dtype in ir.INT_TYPES and b.dtype in ir.INT_TYPES:
            return ir.Cast(a, "i64") if a.dtype != "i64" else a, \
                ir.Cast(b, "i64") if b.dtype != "i64" else b
        if a.dtype in ir.INT_TYPES:
            return ir.Cast(a, b.dtype), b
        if b.dtype in ir.INT_TYPES:
            return a, ir.Cast(b, a.dtype)
        raise self.error(node, f"type mismatch in {what}: {a.dtype} and {b.dtype}",
                         f"convert one side explicitly, e.g. {a.dtype}(...)")

    def to_float(self, expr: ir.Expr, node, what: str) -> ir.Expr:
        if expr.dtype in ir.FLOAT_TYPES:
            return expr
        return self.coerce(expr, DEFAULT_FLOAT, node, what)

    # ------------------------------------------------------------------ dispatch

    def build(self, tree, ctx: Context) -> ir.Expr:
        """Typed IR of one expression tree."""
        kind = tree.data if isinstance(tree, Tree) else "token"
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise self.error(tree, f"unsupported expression ({kind})", "see dsl/LANGUAGE.md")
        return method(tree, ctx)

    def _int_lit(self, tree, ctx):
        return ir.Const(int(tree.children[0]), ir.INDEX)

    def _float_lit(self, tree, ctx):
        if ctx.dims_only:
            raise self.error(tree, "a float literal cannot appear in a size expression",
                             "sizes are integers")
        return ir.Const(float(tree.children[0]), DEFAULT_FLOAT)

    def _inf_lit(self, tree, ctx):
        return ir.Const(math.inf, DEFAULT_FLOAT)

    def _true_lit(self, tree, ctx):
        return ir.Const(True, "bool")

    def _false_lit(self, tree, ctx):
        return ir.Const(False, "bool")

    def _name(self, tree, ctx):
        token = tree.children[0]
        name = str(token)
        if not ctx.dims_only:
            if name in ctx.reduce:
                return ctx.reduce[name]
            if name in ctx.spatial:
                return ctx.spatial[name]
        if name in self.scope.symbols:
            sym = self.scope.symbols[name]
            if ctx.dims_only and sym.dtype not in ir.INT_TYPES:
                raise self.error(token, f"'{name}' is a {sym.dtype} scalar and cannot be "
                                        f"used in a size", "sizes use integer symbols only")
            return sym
        if name in ctx.closed_reduce_axes:
            line, col = ctx.closed_reduce_axes[name]
            raise self.error(token, f"'{name}' is a reduction axis of the reduction at "
                                    f"{line}:{col} and is not visible outside its {{ ... }} body",
                             "move the use into the reduction body, or reduce in a local stage")
        if name in self.scope.tensors:
            raise self.error(token, f"'{name}' is a tensor; read an element with {name}[...]",
                             "index the tensor with one expression per dimension")
        if ctx.dims_only:
            raise self.error(token, f"undefined symbol '{name}' in a size expression",
                             "sizes may use input dims, int scalars and earlier `let`s")
        known = sorted(set(ctx.spatial) | set(ctx.reduce) | set(self.scope.symbols))
        raise self.error(token, f"undefined name '{name}'",
                         f"names in scope here: {', '.join(known) or 'none'}")

    def _neg(self, tree, ctx):
        value = self.build(tree.children[-1], ctx)
        if value.dtype == "bool":
            raise self.error(tree, "cannot negate a bool", "use `not` for bools")
        if isinstance(value, ir.Const):
            return ir._const(-value.value, value.dtype)
        return ir.Call("neg", (value,), value.dtype)

    def _not_op(self, tree, ctx):
        return ir.Call("not", (self.condition(tree.children[-1], ctx),), "bool")

    def _logic(self, tree, ctx, op):
        parts = [self.condition(c, ctx) for c in tree.children]
        out = parts[0]
        for p in parts[1:]:
            out = ir.BinOp(op, out, p, "bool")
        return out

    def _and_expr(self, tree, ctx):
        return self._logic(tree, ctx, "and")

    def _or_expr(self, tree, ctx):
        return self._logic(tree, ctx, "or")

    def _comparison(self, tree, ctx):
        a = self.build(tree.children[0], ctx)
        b = self.build(tree.children[2], ctx)
        op = str(tree.children[1])
        a, b = self.unify(a, b, tree.children[1], f"comparison '{op}'")
        return ir.BinOp(op, a, b, "bool")

    def _sum(self, tree, ctx):
        return self._chain(tree, ctx)

    def _product(self, tree, ctx):
        return self._chain(tree, ctx)

    def _chain(self, tree, ctx):
        out = self.build(tree.children[0], ctx)
        for op_token, operand in zip(tree.children[1::2], tree.children[2::2]):
            out = self.arith(str(op_token), out, self.build(operand, ctx), op_token)
        return out

    def arith(self, op: str, a: ir.Expr, b: ir.Expr, node) -> ir.Expr:
        """Typed arithmetic `a op b` (`/` on integers is floor division)."""
        if op == "%" and (a.dtype in ir.FLOAT_TYPES or b.dtype in ir.FLOAT_TYPES):
            raise self.error(node, "'%' needs integer operands", "use integers with '%'")
        if op == "//" and (a.dtype in ir.FLOAT_TYPES or b.dtype in ir.FLOAT_TYPES):
            raise self.error(node, "'//' needs integer operands", "use '/' for floats")
        a, b = self.unify(a, b, node, f"'{op}'")
        if op == "/" and a.dtype in ir.INT_TYPES:
            op = "//"
        return ir.BinOp(op, a, b, a.dtype)

    # ------------------------------------------------------------------ tensors

    def _load(self, tree, ctx, pad_tree=None):
        token = tree.children[0]
        name = str(token)
        if ctx.dims_only:
            raise self.error(token, f"tensor '{name}' cannot be read in a size expression",
                             "sizes depend on symbols only")
        info = self.scope.tensors.get(name)
        if info is None:
            if name in self.scope.symbols or name in ctx.spatial or name in ctx.reduce:
                raise self.error(token, f"'{name}' is not a tensor and cannot be indexed",
                                 "only inputs, outputs and locals are indexed")
            raise self.error(token, f"undefined tensor '{name}'",
                             f"tensors here: {', '.join(sorted(self.scope.tensors)) or 'none'}")
        if info.kind != "input" and not info.defined:
            raise self.error(token, f"'{name}' is read before it is defined",
                             f"define {name}[...] = ... in an earlier statement")
        index_trees = [c for c in tree.children[1:] if c is not None]
        if pad_tree is not None:
            index_trees = index_trees[:-1]
        if len(index_trees) != len(info.shape):
            raise self.error(token, f"rank mismatch: '{name}' has {len(info.shape)} "
                                    f"dimension(s) but is indexed with {len(index_trees)}",
                             f"{name} is {info.dtype}"
                             f"[{', '.join(ir.to_text(d) for d in info.shape)}]")
        indices = tuple(self.index(t, ctx) for t in index_trees)
        pad = None
        if pad_tree is not None:
            pad = self.build(pad_tree, ctx.nested(reduce_allowed=False))
            pad = self.coerce(pad, info.dtype, pad_tree, f"padding value of '{name}'")
        return ir.Load(name, indices, info.dtype, pad)

    def _padded_load(self, tree, ctx):
        return self._load(tree, ctx, pad_tree=tree.children[-1])

    def _reduction(self, tree, ctx):
        op_token = tree.children[0]
        op = str(op_token)
        if op not in ir.REDUCE_OPS:
            raise self.error(op_token, f"unknown reduction '{op}'",
                             f"reductions are {', '.join(ir.REDUCE_OPS)}")
        if ctx.dims_only:
            raise self.error(op_token, "a reduction cannot appear in a size expression",
                             "sizes depend on symbols only")
        if ctx.reduce:
            raise self.error(op_token, "nested reductions are not supported",
                             "compute the inner reduction in a `local` stage first")
        if not ctx.reduce_allowed:
            raise self.error(op_token, "a reduction cannot appear in an index, a padding "
                                       "value or a condition",
                             "compute it in a `local` stage and read that instead")
        if ctx.reduction_sites:
            line, col = ctx.reduction_sites[0]
            raise self.error(op_token, f"stage '{ctx.stage}' has a second reduction (the "
                                       f"first is at {line}:{col})",
                             "split it: compute each reduction in its own `local` stage")
        ctx.reduction_sites.append(position(tree))
        axes: dict[str, ir.IterVar] = {}
        for axis_tree in tree.children[1:-1]:
            name_token, extent_tree = axis_tree.children
            name = str(name_token)
            if name in axes or name in ctx.spatial or name in self.scope.symbols \
                    or name in self.scope.tensors:
                raise self.error(name_token, f"reduction axis '{name}' shadows an existing "
                                             f"name", "give the reduction axis a fresh name")
            extent = self.dim(extent_tree)
            axes[name] = ir.IterVar(name, extent, "reduce")
        body = self.build(tree.children[-1], ctx.nested(reduce=axes, reduce_allowed=False))
        if body.dtype == "bool":
            raise self.error(tree.children[-1], f"cannot {op} bool values",
                             "convert with select(cond, 1.0, 0.0)")
        ctx.closed_reduce_axes.update({n: position(tree) for n in axes})
        return ir.Reduce(op, body, tuple(axes.values()), body.dtype)

    # ------------------------------------------------------------------ calls

    def _cast(self, tree, ctx):
        dtype = dtype_name(tree.children[0])
        value = self.build(tree.children[1], ctx)
        if value.dtype == dtype:
            return value
        if isinstance(value, ir.Const) and dtype != "bool":
            return ir._const(value.value, dtype)
        return ir.Cast(value, dtype)

    def _call(self, tree, ctx):
        token = tree.children[0]
        fn = str(token)
        arg_trees = [c for c in tree.children[1:] if c is not None]
        if fn in ir.REDUCE_OPS and fn not in OTHER_FUNCTIONS:
            raise self.error(token, f"'{fn}' is a reduction: write {fn}(i in EXTENT) {{ ... }}",
                             "name the reduction axes with `in`")
        arity = (EPILOGUE_FUNCTIONS.get(fn) or OTHER_FUNCTIONS.get(fn)
                 or ((1, 1) if fn in UNARY_FLOAT_FUNCTIONS else None))
        if arity is None:
            known = sorted(set(EPILOGUE_FUNCTIONS) | set(OTHER_FUNCTIONS)
                           | set(UNARY_FLOAT_FUNCTIONS))
            raise self.error(token, f"unknown function '{fn}'",
                             f"functions are {', '.join(known)}; casts are f32(...), i32(...)")
        if not arity[0] <= len(arg_trees) <= arity[1]:
            count = str(arity[0]) if arity[0] == arity[1] else f"{arity[0]} to {arity[1]}"
            raise self.error(token, f"'{fn}' takes {count} argument(s), got {len(arg_trees)}",
                             "see the function list in dsl/LANGUAGE.md")
        if fn == "select":
            cond = self.condition(arg_trees[0], ctx)
            a, b = (self.build(t, ctx) for t in arg_trees[1:])
            a, b = self.unify(a, b, token, "select branches")
            return ir.Select(cond, a, b, a.dtype)
        args = [self.build(t, ctx) for t in arg_trees]
        for arg, t in zip(args, arg_trees):
            if arg.dtype == "bool":
                raise self.error(t, f"'{fn}' does not take a bool argument",
                                 "convert with select(cond, 1.0, 0.0)")
        if fn in UNARY_FLOAT_FUNCTIONS:
            x = self.to_float(args[0], token, fn)
            return ir.Call(fn, (x,), x.dtype)
        if fn in ("min", "max", "pow"):
            a, b = self.unify(args[0], args[1], token, fn)
            if fn == "pow":
                a, b = self.to_float(a, token, fn), self.to_float(b, token, fn)
            return ir.BinOp(fn, a, b, a.dtype)
        if fn == "abs":
            return ir.Call("abs", (args[0],), args[0].dtype)
        if fn in ("floor", "ceil", "round"):
            x = self.to_float(args[0], token, fn)
            return ir.Call(fn, (x,), x.dtype)
        x = self.to_float(args[0], token, fn)
        extra = [self.coerce(self.to_float(a, t, fn), x.dtype, t, fn)
                 for a, t in zip(args[1:], arg_trees[1:])]
        return epilogue_expr(fn, x, extra)

