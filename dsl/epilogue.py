"""Fusing a workload's elementwise epilogue into a DSL operator's output stage.

`with_epilogue(op, steps, operand_shapes)` appends the `EpilogueStep`s of a
fused graph node to the body of the operator's output stage, so the epilogue
runs in the same loop nest, after the reduction, without another pass over
memory. Each step is its formula in the epilogue table (`wpk.core.epilogue`)
built as compute IR. A binary step reads the
node input `operand` as a new parameter named `E{operand}`, broadcast
against the output numpy-style (right-aligned; size-1 dims read index 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from wpk.core.epilogue import EPILOGUE_TABLE, Builder, step_value
from wpk.core.errors import DslError
from wpk.dsl import compute as ir

# The builder's binary operations as compute IR operators.
_IR_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "pow", "max": "max",
              "min": "min"}


class _IrBuilder(Builder[ir.Expr]):
    """Builds the compute IR of epilogue formulas over float values of dtype `t`."""

    def __init__(self, t: str):
        self.t = t

    def const(self, value: float) -> ir.Expr:
        return ir.Const(float(value), self.t)

    def binary(self, op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return ir.BinOp(_IR_BINARY[op], a, b, self.t)

    def call(self, fn: str, x: ir.Expr) -> ir.Expr:
        if fn == "log1p":  # the IR has no log1p
            return ir.Call("log", (self.add(self.const(1.0), x),), self.t)
        return ir.Call(fn, (x,), self.t)

    def less(self, a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return ir.BinOp("<", a, b, "bool")

    def select(self, cond: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return ir.Select(cond, a, b, self.t)


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
    builder = _IrBuilder(target.dtype)
    for step in steps:
        if step.op not in EPILOGUE_TABLE:
            raise DslError(f"unknown epilogue step '{step.op}' for {op.name}",
                           hint="see EPILOGUE_TABLE in wpk.core.epilogue")
        load = None
        if EPILOGUE_TABLE[step.op].arity == 2:
            if step.operand is None or step.operand not in shapes:
                raise DslError(f"epilogue step {step.op} of {op.name} needs the shape of "
                               f"operand {step.operand}", hint="pass operand_shapes")
            load = _broadcast_load(op, target, step.operand, tuple(shapes[step.operand]),
                                   operand_dtype, params, requires)
            if load.dtype != target.dtype:
                load = ir.Cast(load, target.dtype)
        value = step_value(builder, step, value, load)
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

    `extra` holds the optional arguments, in the order of the row's attributes
    in the epilogue table (clip bounds, leaky_relu/hard_sigmoid alpha and beta);
    missing ones take the defaults. The DSL's functions of the same names (and
    relu6, a clip to [0, 6]) are desugared here too.
    """
    builder = _IrBuilder(x.dtype)
    if fn == "relu6":
        fn, extra = "clip", [builder.const(0.0), builder.const(6.0)]
    row = EPILOGUE_TABLE.get(fn)
    if row is None or row.arity != 1:
        raise ValueError(f"unknown epilogue {fn}")
    return row.build(builder, (x,), dict(zip((name for name, _ in row.attrs), extra)))
