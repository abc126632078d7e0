"""Epilogue formulas as float32 C expressions, for the generated C and CUDA kernels.

    builder = CExpression()
    text = formula(builder, ...)        # e.g. "fmaxf((v + 0.5f), (0.0f))"
    c_float(-1.5)                       # "(-1.5f)"; INFINITY/NAN from math.h

`CExpression` builds each primitive of `wpk.core.epilogue.Builder` as a C
expression (a select as `cond ? a : b`); a backend with other literals or
statements (NVRTC has no math.h) overrides `const` or `select`.
"""

from __future__ import annotations

import math

from wpk.core.epilogue import Builder

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
FUNCTIONS = {"pow": "powf", "max": "fmaxf", "min": "fminf", "exp": "expf", "log": "logf",
             "log1p": "log1pf", "sqrt": "sqrtf", "erf": "erff", "tanh": "tanhf",
             "abs": "fabsf", "round": "rintf"}  # rintf: half to even in the default mode


def c_float(value: float) -> str:
    """A float32 C literal (math.h's INFINITY and NAN for the non-finite ones)."""
    value = float(value)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"({value!r}f)"


class CExpression(Builder[str]):
    """Builds float32 C expressions of epilogue formulas (each builder value is used at
    most once, so nesting the expressions computes nothing twice)."""

    def const(self, value: float) -> str:
        return c_float(value)

    def binary(self, op: str, a: str, b: str) -> str:
        if op in INFIX:
            return f"({a} {INFIX[op]} {b})"
        return f"{FUNCTIONS[op]}({a}, {b})"

    def call(self, fn: str, x: str) -> str:
        if fn == "neg":
            return f"(-{x})"
        if fn == "sigmoid":
            return f"(1.0f / (1.0f + expf(-{x})))"
        return f"{FUNCTIONS[fn]}({x})"

    def less(self, a: str, b: str) -> str:
        return f"({a} < {b})"

    def select(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"
