"""Fused epilogues: applying them with numpy, and expressing them as ONNX nodes.

The meaning of every step is documented in `wpk.core.workload`. The numpy
form (`apply_epilogue`) is shared by the float64 references and the numpy
library kernels; the ONNX form (`epilogue_onnx_nodes`) is used by the
onnxruntime single-node kernels and by anything that writes a fused graph
back to ONNX.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from wpk.core.errors import UnsupportedError
from wpk.core.workload import BINARY_EPILOGUE_OPS, UNARY_EPILOGUE_OPS, EpilogueStep

try:  # scipy is exact and fast; math.erf per element is the slow fallback
    from scipy.special import erf as _erf_ufunc
    from scipy.special import expit as _expit_ufunc
except ImportError:  # pragma: no cover - scipy is installed with the dev tools
    _erf_ufunc = None
    _expit_ufunc = None

_SQRT2 = math.sqrt(2.0)
_GELU_TANH_C = math.sqrt(2.0 / math.pi)


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Elementwise error function (dtype preserved), written into `out` when given."""
    if _erf_ufunc is not None:
        return _erf_ufunc(x, out=out)
    value = np.vectorize(math.erf, otypes=[x.dtype])(x)
    if out is None:
        return value
    np.copyto(out, value)
    return out


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable logistic function, written into `out` when given."""
    if _expit_ufunc is not None:
        return _expit_ufunc(x, out=out)
    with np.errstate(over="ignore"):
        out = np.negative(x, out=out)
        np.exp(out, out=out)
        out += 1
        return np.reciprocal(out, out=out)


def _apply_unary(y: np.ndarray, step: EpilogueStep) -> None:
    op = step.op
    if op == "relu":
        np.maximum(y, 0, out=y)
    elif op == "clip":
        lo, hi = step.attr("min"), step.attr("max")
        if lo is not None:
            np.maximum(y, lo, out=y)
        if hi is not None:
            np.minimum(y, hi, out=y)
    elif op == "leaky_relu":
        alpha = step.attr("alpha", 0.01)
        np.multiply(y, np.where(y < 0, y.dtype.type(alpha), y.dtype.type(1)), out=y)
    elif op == "sigmoid":
        sigmoid(y, out=y)
    elif op == "silu":
        y *= sigmoid(y)
    elif op == "tanh":
        np.tanh(y, out=y)
    elif op in ("hard_sigmoid", "hard_swish"):
        alpha = step.attr("alpha", 0.2) if op == "hard_sigmoid" else 1.0 / 6.0
        beta = step.attr("beta", 0.5) if op == "hard_sigmoid" else 0.5
        gate = y * y.dtype.type(alpha)
        gate += y.dtype.type(beta)
        np.clip(gate, 0, 1, out=gate)
        if op == "hard_sigmoid":
            np.copyto(y, gate)
        else:
            y *= gate
    elif op == "gelu":
        gate = np.multiply(y, y.dtype.type(1.0 / _SQRT2))
        erf(gate, out=gate)
        gate += 1
        gate *= y.dtype.type(0.5)
        y *= gate
    elif op == "gelu_tanh":
        gate = y * y
        gate *= y.dtype.type(0.044715)
        gate += 1
        gate *= y
        gate *= y.dtype.type(_GELU_TANH_C)
        np.tanh(gate, out=gate)
        gate += 1
        gate *= y.dtype.type(0.5)
        y *= gate
    elif op == "exp":
        np.exp(y, out=y)
    elif op == "log":
        np.log(y, out=y)
    elif op == "sqrt":
        np.sqrt(y, out=y)
    elif op == "reciprocal":
        np.reciprocal(y, out=y)
    elif op == "neg":
        np.negative(y, out=y)
    elif op == "abs":
        np.abs(y, out=y)
    elif op == "erf":
        erf(y, out=y)
    elif op == "softplus":
        np.logaddexp(y.dtype.type(0), y, out=y)
    else:  # pragma: no cover - guarded by validate_epilogue
        raise UnsupportedError(f"unknown epilogue op {op!r}")


_BINARY_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                  "pow": np.power, "max": np.maximum, "min": np.minimum}


def validate_epilogue(steps: Sequence[EpilogueStep], n_inputs: int) -> str | None:
    """None when every step is known and its operand is a valid input index, else why not."""
    for step in steps:
        if step.op in UNARY_EPILOGUE_OPS:
            continue
        if step.op not in BINARY_EPILOGUE_OPS:
            return f"unknown epilogue op {step.op!r}"
        if step.operand is None or not 0 <= step.operand < n_inputs:
            return f"epilogue step {step.op!r} has no valid operand ({step.operand})"
    return None


def apply_epilogue(y: np.ndarray, steps: Sequence[EpilogueStep],
                   inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """Apply the epilogue steps to `y`, in place when shapes allow; returns the result.

    `inputs` are the node inputs that binary steps index with `operand`. The
    dtype of `y` is preserved (operands are cast to it). The result is `y`
    itself unless an operand broadcasts `y` to a bigger shape.
    """
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for step in steps:
            if step.op in UNARY_EPILOGUE_OPS:
                _apply_unary(y, step)
                continue
            ufunc = _BINARY_UFUNCS.get(step.op)
            if ufunc is None:
                raise UnsupportedError(f"unknown epilogue op {step.op!r}",
                                       hint="see wpk.core.workload for the known ops")
            operand = inputs[step.operand]
            args = (operand, y) if step.swap else (y, operand)
            shape = np.broadcast_shapes(y.shape, np.shape(operand))
            if shape == y.shape:
                ufunc(*args, out=y, casting="unsafe")
            else:
                y = ufunc(*args).astype(y.dtype, copy=False)
    return y


# --- ONNX form --------------------------------------------------------------------------------

_UNARY_ONNX = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp",
               "log": "Log", "sqrt": "Sqrt", "reciprocal": "Reciprocal", "neg": "Neg",
               "abs": "Abs", "erf": "Erf", "softplus": "Softplus"}
_BINARY_ONNX = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
                "max": "Max", "min": "Min"}


class _NodeWriter:
    """Emits nodes with unique names under one prefix."""

    def __init__(self, prefix: str, dtype: str, opset: int):
        self.prefix = prefix
        self.opset = opset
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def const(self, value: float) -> str:
        name = self.fresh("const")
        tensor = numpy_helper.from_array(np.asarray(value, dtype=self.dtype), name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name + "_node",
                                           value=tensor))
        return name

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(op), **attrs))
        return out


def _emit_unary(w: _NodeWriter, step: EpilogueStep, x: str, out: str | None) -> str:
    op = step.op
    if op in _UNARY_ONNX:
        return w.node(_UNARY_ONNX[op], [x], out)
    if op == "clip":
        lo, hi = step.attr("min"), step.attr("max")
        if w.opset < 11:
            return w.node("Clip", [x], out, min=float(-np.inf if lo is None else lo),
                          max=float(np.inf if hi is None else hi))
        args = [x, w.const(lo) if lo is not None else "", w.const(hi) if hi is not None else ""]
        while args[-1] == "":
            args.pop()
        return w.node("Clip", args, out)
    if op == "leaky_relu":
        return w.node("LeakyRelu", [x], out, alpha=float(step.attr("alpha", 0.01)))
    if op == "hard_sigmoid":
        return w.node("HardSigmoid", [x], out, alpha=float(step.attr("alpha", 0.2)),
                      beta=float(step.attr("beta", 0.5)))
    if op == "hard_swish":
        gate = w.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
        return w.node("Mul", [x, gate], out)
    if op == "silu":
        return w.node("Mul", [x, w.node("Sigmoid", [x])], out)
    if op == "gelu":
        scaled = w.node("Div", [x, w.const(_SQRT2)])
        gate = w.node("Add", [w.node("Erf", [scaled]), w.const(1.0)])
        half = w.node("Mul", [x, w.const(0.5)])
        return w.node("Mul", [half, gate], out)
    if op == "gelu_tanh":
        cube = w.node("Mul", [w.node("Mul", [x, x]), x])
        inner = w.node("Add", [x, w.node("Mul", [cube, w.const(0.044715)])])
        gate = w.node("Tanh", [w.node("Mul", [inner, w.const(_GELU_TANH_C)])])
        half = w.node("Mul", [x, w.const(0.5)])
        return w.node("Mul", [half, w.node("Add", [gate, w.const(1.0)])], out)
    raise UnsupportedError(f"unknown epilogue op {op!r}",
                           hint="see wpk.core.workload for the known ops")


def epilogue_onnx_nodes(steps: Sequence[EpilogueStep], value_name: str,
                        operand_names: Mapping[int, str] | Sequence[str], out_name: str,
                        prefix: str, *, dtype: str = "float32", opset: int = 17
                        ) -> list[onnx.NodeProto]:
    """Standard ONNX nodes (valid at `opset`, 9 or later) computing the epilogue of `value_name`.

    `operand_names[i]` is the tensor name of node input `i` (used by binary
    steps); the last node writes `out_name`; every intermediate name and node
    name starts with `prefix`. Constants are emitted as `Constant` nodes of
    `dtype`. With no steps the result is a single `Identity`.
    """
    w = _NodeWriter(prefix, dtype, opset)
    if not steps:
        return [helper.make_node("Identity", [value_name], [out_name], name=prefix + "identity")]
    value = value_name
    for i, step in enumerate(steps):
        target = out_name if i == len(steps) - 1 else None
        if step.op in _BINARY_ONNX:
            if step.operand is None:
                raise UnsupportedError(f"epilogue step {step.op!r} has no operand")
            operand = operand_names[step.operand]
            args = [operand, value] if step.swap else [value, operand]
            value = w.node(_BINARY_ONNX[step.op], args, target)
        else:
            value = _emit_unary(w, step, value, target)
    return w.nodes

