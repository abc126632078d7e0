"""Fused epilogues on the GPU: one elementwise kernel applying the steps in place.

    source = epilogue_source(workload.epilogue)    # EpilogueSource (params, body)
    apply = epilogue_kernel(workload)               # apply(out, inputs) on cupy arrays

Each step is its formula in the epilogue table (`wpk.core.epilogue`), built
here as CUDA C. The kernel is a cupy `ElementwiseKernel` whose
output `y` is read and written in place; the operands of binary steps are
extra inputs broadcast against `y` by cupy. Building the source needs no GPU
(unit-tested here); compiling and running it needs cupy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wpk.core.epilogue import epilogue_op, step_value
from wpk.core.errors import UnsupportedError
from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.c_expressions import CExpression
from wpk.kernels.cuda.cupy_support import require_cupy


def _literal(value: float) -> str:
    """A float32 C literal; inf and NaN by their bits (NVRTC, as cupy runs it, has no
    math.h and so no INFINITY or NAN)."""
    value = float(value)
    if math.isnan(value):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    return f"({value!r}f)" if math.copysign(1.0, value) < 0 else f"{value!r}f"


class _CudaBuilder(CExpression):
    """Builds float32 CUDA C expressions of epilogue formulas; a select becomes a
    statement of its own (`lines`), declaring `s1`, `s2`, ..."""

    def __init__(self, first_line: str):
        self.lines = [first_line]
        self.selects = 0

    def const(self, value: float) -> str:
        return _literal(value)

    def select(self, cond: str, a: str, b: str) -> str:
        self.selects += 1
        name = f"s{self.selects}"
        self.lines.append(f"float {name} = {cond} ? {a} : {b};")
        return name


@dataclass(frozen=True)
class EpilogueSource:
    """An ElementwiseKernel's pieces: input params, output param, body, operand indices."""

    in_params: str
    out_params: str
    body: str
    operands: tuple[int, ...]    # node-input index of each `o{i}` parameter, in order

    @property
    def name(self) -> str:
        return "wpk_epilogue"


def epilogue_source(steps: Sequence[EpilogueStep], dtype: str = "float32") -> EpilogueSource:
    """The in-place elementwise kernel of `steps` over float32 `y` (UnsupportedError for
    another dtype or an unknown op)."""
    if dtype != "float32":
        raise UnsupportedError(f"GPU epilogues are float32 only, not {dtype}")
    operands: list[int] = []
    builder = _CudaBuilder("float v = y;")
    for step in steps:
        operand = None
        if epilogue_op(step.op).arity == 2 and step.operand is not None:
            if step.operand not in operands:
                operands.append(step.operand)
            operand = f"o{operands.index(step.operand)}"
        builder.lines.append(f"v = {step_value(builder, step, 'v', operand)};")
    builder.lines.append("y = v;")
    in_params = ", ".join(f"float32 o{i}" for i in range(len(operands)))
    return EpilogueSource(in_params, "float32 y", "\n".join(builder.lines), tuple(operands))


def epilogue_kernel(workload: Workload) -> Callable | None:
    """`apply(out, inputs)` running the workload's epilogue in place on the cupy array
    `out` (operands taken from `inputs`), or None when there is no epilogue."""
    if not workload.epilogue:
        return None
    cupy = require_cupy("a GPU epilogue")
    source = epilogue_source(workload.epilogue, workload.outputs[0].dtype)
    kernel = cupy.ElementwiseKernel(source.in_params, source.out_params, source.body,
                                    source.name)

    def apply(out, inputs: Sequence) -> None:
        kernel(*[inputs[i] for i in source.operands], out)

    return apply
