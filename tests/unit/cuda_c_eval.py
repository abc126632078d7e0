"""Evaluates the body of a generated CUDA elementwise kernel with numpy (no GPU needed)."""

from __future__ import annotations

import math
import re

import numpy as np

try:  # scipy is optional (the GPU machine may lack it)
    from scipy.special import erf
except ImportError:  # pragma: no cover
    erf = np.vectorize(math.erf, otypes=[np.float64])

_C_TO_NUMPY = [(r"__int_as_float\(0x7f800000\)", "np.inf"),
               (r"__int_as_float\(0xff800000\)", "(-np.inf)"),
               (r"__int_as_float\(0x7fffffff\)", "np.nan"),
               (r"(\d(?:\.\d*)?(?:e-?\d+)?)f\b", r"\1"), (r"\bfmaxf\b", "np.maximum"),
               (r"\bfminf\b", "np.minimum"), (r"\bexpf\b", "np.exp"), (r"\btanhf\b", "np.tanh"),
               (r"\brintf\b", "np.rint"),
               (r"\berff\b", "erf"), (r"\blogf\b", "np.log"), (r"\blog1pf\b", "np.log1p"),
               (r"\bsqrtf\b", "np.sqrt"), (r"\bfabsf\b", "np.abs"), (r"\bpowf\b", "np.power")]


def run_c_body(body: str, y: np.ndarray, operands: list[np.ndarray]) -> np.ndarray:
    """Evaluate the kernel body in numpy (statement by statement, ternaries as np.where)."""
    env = {"np": np, "erf": erf, "y": y.astype(np.float64)}
    env.update({f"o{i}": o.astype(np.float64) for i, o in enumerate(operands)})
    for statement in filter(None, (s.strip() for s in body.replace("\n", " ").split(";"))):
        statement = statement.removeprefix("float ")
        for pattern, repl in _C_TO_NUMPY:
            statement = re.sub(pattern, repl, statement)
        target, expr = (part.strip() for part in statement.split("=", 1))
        ternary = re.fullmatch(r"(.+?)\?(.+?):(.+)", expr)
        if ternary:
            expr = f"np.where({ternary[1]}, {ternary[2]}, {ternary[3]})"
        env[target] = eval(expr, env)  # noqa: S307  (our own generated expression)
    return env["y"]
