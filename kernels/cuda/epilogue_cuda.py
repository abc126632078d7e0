"""Fused epilogues on the GPU: one elementwise kernel applying the steps in place.

    source = epilogue_source(workload.epilogue)    # EpilogueSource (params, body)
    apply = epilogue_kernel(workload)               # apply(out, inputs) on cupy arrays

The steps and their meaning are those of `wpk.core.workload` (and of the
numpy `apply_epilogue`). The kernel is a cupy `ElementwiseKernel` whose
output `y` is read and written in place; the operands of binary steps are
extra inputs broadcast against `y` by cupy. Building the source needs no GPU
(unit-tested here); compiling and running it needs cupy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wpk.core.errors import UnsupportedError
from wpk.core.workload import (
    BINARY_EPILOGUE_OPS,
    EpilogueStep,
    Workload,
)

_SQRT1_2 = 0.7071067811865476
_GELU_TANH_C = 0.7978845608028654  # sqrt(2/pi)

_UNARY = {
    "relu": "v = fmaxf(v, 0.0f);",
    "sigmoid": "v = 1.0f / (1.0f + expf(-v));",
    "silu": "v = v / (1.0f + expf(-v));",
    "tanh": "v = tanhf(v);",
    "gelu": f"v = 0.5f * v * (1.0f + erff(v * {_SQRT1_2}f));",
    "gelu_tanh": (f"v = 0.5f * v * (1.0f + tanhf({_GELU_TANH_C}f * "
                  "(v + 0.044715f * v * v * v)));"),
    "exp": "v = expf(v);",
    "log": "v = logf(v);",
    "sqrt": "v = sqrtf(v);",
    "reciprocal": "v = 1.0f / v;",
    "neg": "v = -v;",
    "abs": "v = fabsf(v);",
    "erf": "v = erff(v);",
    "softplus": "v = fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v)));",
}
_BINARY = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
           "pow": "powf({a}, {b})", "max": "fmaxf({a}, {b})", "min": "fminf({a}, {b})"}


def _float(value: float) -> str:
    return f"{float(value)!r}f".replace("inf", "INFINITY")


def _unary_code(step: EpilogueStep) -> str:
    op = step.op
    if op in _UNARY:
        return _UNARY[op]
    if op == "clip":
        lo, hi = step.attr("min"), step.attr("max")
        parts = []
        if lo is not None:
            parts.append(f"v = fmaxf(v, {_float(lo)});")
        if hi is not None:
            parts.append(f"v = fminf(v, {_float(hi)});")
        return " ".join(parts)
    if op == "leaky_relu":
        return f"v = v < 0.0f ? v * {_float(step.attr('alpha', 0.01))} : v;"
    if op in ("hard_sigmoid", "hard_swish"):
        alpha = step.attr("alpha", 0.2) if op == "hard_sigmoid" else 1.0 / 6.0
        beta = step.attr("beta", 0.5) if op == "hard_sigmoid" else 0.5
        gate = f"fminf(fmaxf(v * {_float(alpha)} + {_float(beta)}, 0.0f), 1.0f)"
        return f"v = {gate};" if op == "hard_sigmoid" else f"v = v * {gate};"
    raise UnsupportedError(f"unknown epilogue op {op!r}",
                           hint="see wpk.core.workload for the known ops")


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
    lines = ["float v = y;"]
    for step in steps:
        if step.op in BINARY_EPILOGUE_OPS:
            if step.operand is None:
                raise UnsupportedError(f"epilogue step {step.op!r} has no operand")
            if step.operand not in operands:
                operands.append(step.operand)
            name = f"o{operands.index(step.operand)}"
            a, b = (name, "v") if step.swap else ("v", name)
            lines.append(f"v = {_BINARY[step.op].format(a=a, b=b)};")
        else:
            lines.append(_unary_code(step))
    lines.append("y = v;")
    in_params = ", ".join(f"float32 o{i}" for i in range(len(operands)))
    return EpilogueSource(in_params, "float32 y", "\n".join(lines), tuple(operands))


def epilogue_kernel(workload: Workload) -> Callable | None:
    """`apply(out, inputs)` running the workload's epilogue in place on the cupy array
    `out` (operands taken from `inputs`), or None when there is no epilogue."""
    if not workload.epilogue:
        return None
    from wpk.kernels.cuda.cupy_support import require_cupy

    cupy = require_cupy("a GPU epilogue")
    source = epilogue_source(workload.epilogue, workload.outputs[0].dtype)
    kernel = cupy.ElementwiseKernel(source.in_params, source.out_params, source.body,
                                    source.name)

    def apply(out, inputs: Sequence) -> None:
        kernel(*[inputs[i] for i in source.operands], out)

    return apply
