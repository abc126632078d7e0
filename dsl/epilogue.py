"""Fusing a workload's elementwise epilogue into a DSL operator's output stage.

`with_epilogue(op, steps, operand_shapes)` appends the `EpilogueStep`s of a
fused graph node (meanings in `wpk.core.workload`) to the body of the
operator's output stage, so the epilogue runs in the same loop nest, after
the reduction, without another pass over memory. A binary step reads the
node input `operand` as a new parameter named `E{operand}`, broadcast
against the output numpy-style (right-aligned; size-1 dims read index 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from wpk.core.errors import DslError
from wpk.dsl import compute as ir

BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "pow", "max": "max",
              "min": "min"}
CALLS = ("exp", "log", "sqrt", "erf", "tanh", "sigmoid", "abs", "neg")
DESUGARED = ("relu", "leaky_relu", "silu", "gelu", "gelu_tanh", "hard_sigmoid", "hard_swish",
             "softplus", "reciprocal")


def operand_name(index: int) -> str:
    """Parameter name of epilogue operand `index` (a node input index)."""
    return f"E{index}"


def with_epilogue(op: ir.Operator, steps: Sequence, operand_shapes: Mapping[int, Sequence[int]]
                  = (), output: str | None = None, operand_dtype: str = "f32") -> ir.Operator:
    """A copy of `op` whose output stage also applies `steps` (EpilogueSteps) in order."""
    if not steps:
        return op
    target = op.stage(output or op.outputs[0])
    if target is None:
        raise DslError(f"operator {op.name} has no output '{output}'",
                       hint=f"outputs are {', '.join(op.outputs)}")
    shapes = dict(operand_shapes)
    value = target.body
    params: dict[str, ir.Param] = {}
    requires: list[ir.Require] = []
    t = target.dtype
    for step in steps:
        attrs = dict(step.attrs)
        if step.op in BINARY_OPS:
            if step.operand is None or step.operand not in shapes:
                raise DslError(f"epilogue step {step.op} of {op.name} needs the shape of "
                               f"operand {step.operand}", hint="pass operand_shapes")
            load = _broadcast_load(op, target, step.operand, tuple(shapes[step.operand]),
                                   operand_dtype, params, requires)
            if load.dtype != t:
                load = ir.Cast(load, t)
            a, b = (load, value) if step.swap else (value, load)
            value = ir.BinOp(BINARY_OPS[step.op], a, b, t)
        elif step.op in CALLS:
            value = ir.Call(step.op, (value,), t)
        elif step.op == "clip":
            if attrs.get("min") is not None:
                value = ir.BinOp("max", value, ir.Const(float(attrs["min"]), t), t)
            if attrs.get("max") is not None:
                value = ir.BinOp("min", value, ir.Const(float(attrs["max"]), t), t)
        elif step.op in DESUGARED:
            extra = []
            if step.op == "leaky_relu":
                extra = [ir.Const(float(attrs.get("alpha", 0.01)), t)]
            elif step.op == "hard_sigmoid":
                extra = [ir.Const(float(attrs.get("alpha", 0.2)), t),
                         ir.Const(float(attrs.get("beta", 0.5)), t)]
            value = epilogue_expr(step.op, value, extra)
        else:
            raise DslError(f"unknown epilogue step '{step.op}' for {op.name}",
                           hint="see UNARY_EPILOGUE_OPS and BINARY_EPILOGUE_OPS in "
                                "wpk.core.workload")
    stages = tuple(replace(s, body=value) if s.name == target.name else s for s in op.stages)
    return replace(op, params=op.params + tuple(params.values()), stages=stages,
                   requires=op.requires + tuple(requires))


def _broadcast_load(op: ir.Operator, stage: ir.Stage, index: int, shape: tuple[int, ...],
                    dtype: str, params: dict[str, ir.Param], requires: list) -> ir.Load:
    name = operand_name(index)
    if op.param(name) is not None or op.stage(name) is not None:
        raise DslError(f"operator {op.name} already has a tensor named {name}",
                       hint="rename it in the .wpk file")
    axes = stage.axes
    if len(shape) > len(axes):
        raise DslError(f"epilogue operand {index} of {op.name} has rank {len(shape)}, more "
                       f"than the output's {len(axes)}", hint="it must broadcast to the output")
    aligned = axes[len(axes) - len(shape):]
    indices = []
    for size, axis in zip(shape, aligned):
        if size == 1:
            indices.append(ir.Const(0))
        else:
            indices.append(axis)
            cond = ir.BinOp("==", axis.extent, ir.Const(int(size)), "bool")
            requires.append(ir.Require(cond, f"epilogue operand {index} has size {size} where "
                                             f"the output has {ir.to_text(axis.extent)}"))
    params[name] = ir.Param(name, dtype, tuple(ir.Const(int(s)) for s in shape))
    return ir.Load(name, tuple(indices), dtype)


def epilogue_expr(fn: str, x: ir.Expr, extra: list[ir.Expr]) -> ir.Expr:
    """The compute IR of epilogue function `fn` (relu, gelu, ...) applied to float `x`.

    `extra` holds the optional arguments (clip bounds, leaky_relu/hard_sigmoid
    alpha and beta). Names and defaults follow `wpk.core.workload`; the
    DSL's functions of the same names are desugared here too.
    """
    t = x.dtype

    def c(v: float) -> ir.Const:
        return ir.Const(float(v), t)

    def mul(a, b):
        return ir.BinOp("*", a, b, t)

    def add(a, b):
        return ir.BinOp("+", a, b, t)

    def clip(v, lo, hi):
        return ir.BinOp("min", ir.BinOp("max", v, lo, t), hi, t)

    if fn == "relu":
        return ir.BinOp("max", x, c(0), t)
    if fn == "relu6":
        return clip(x, c(0), c(6))
    if fn == "clip":
        return clip(x, extra[0], extra[1])
    if fn == "leaky_relu":
        alpha = extra[0] if extra else c(0.01)
        return ir.Select(ir.BinOp(">=", x, c(0), "bool"), x, mul(alpha, x), t)
    if fn == "silu":
        return mul(x, ir.Call("sigmoid", (x,), t))
    if fn == "gelu":
        return mul(mul(c(0.5), x),
                   add(c(1), ir.Call("erf", (mul(x, c(0.7071067811865476)),), t)))
    if fn == "gelu_tanh":
        inner = mul(c(0.7978845608028654), add(x, mul(c(0.044715), mul(x, mul(x, x)))))
        return mul(mul(c(0.5), x), add(c(1), ir.Call("tanh", (inner,), t)))
    if fn == "hard_sigmoid":
        alpha = extra[0] if extra else c(0.2)
        beta = extra[1] if len(extra) > 1 else c(0.5)
        return clip(add(mul(alpha, x), beta), c(0), c(1))
    if fn == "hard_swish":
        return mul(x, clip(add(mul(c(1 / 6), x), c(0.5)), c(0), c(1)))
    if fn == "softplus":
        return ir.Call("log", (add(c(1), ir.Call("exp", (x,), t)),), t)
    if fn == "reciprocal":
        return ir.BinOp("/", c(1), x, t)
    raise ValueError(f"unknown epilogue {fn}")
