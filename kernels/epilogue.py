"""Fused epilogues: applying them with numpy, and expressing them as ONNX nodes.

Both read the epilogue table (`wpk.core.epilogue`): each step's formula is
evaluated by a builder of this module. The numpy form (`apply_epilogue`,
`apply_epilogue_into`) is shared by the float64 references and the numpy
library kernels; the ONNX form (`epilogue_onnx_nodes`) is used by the
onnxruntime single-node kernels and by `wpk.passes.to_onnx`, which writes a
fused graph back to ONNX.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.deferred import helper, numpy_helper, onnx
from wpk.core.epilogue import (
    EPILOGUE_TABLE,
    Builder,
    epilogue_op,
    step_arguments,
    step_value,
    value_uses,
)
from wpk.core.workload import EpilogueStep


@functools.cache
def _scipy_ufuncs() -> tuple:
    """(erf, expit) of scipy.special, or (None, None) without scipy; imported on first use
    (scipy.special takes 0.2-0.3 s to import, a fifth of a small plan's load)."""
    try:  # scipy is exact and fast; math.erf per element is the slow fallback
        from scipy.special import erf, expit
    except ImportError:  # pragma: no cover - scipy is installed with the dev tools
        return None, None
    return erf, expit


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Elementwise error function (dtype preserved), written into `out` when given."""
    erf_ufunc = _scipy_ufuncs()[0]
    if erf_ufunc is not None:
        return erf_ufunc(x, out=out)
    value = np.vectorize(math.erf, otypes=[np.asarray(x).dtype])(x)
    if out is None:
        return value
    np.copyto(out, value)
    return out


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable logistic function, written into `out` when given."""
    expit_ufunc = _scipy_ufuncs()[1]
    if expit_ufunc is not None:
        return expit_ufunc(x, out=out)
    with np.errstate(over="ignore"):
        out = np.negative(x, out=out)
        np.exp(out, out=out)
        out += 1
        return np.reciprocal(out, out=out)


# --- numpy form ------------------------------------------------------------------------------

_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "max": np.maximum, "min": np.minimum}
_CALLS = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "erf": erf,
          "tanh": np.tanh, "sigmoid": sigmoid, "abs": np.abs, "neg": np.negative,
          "round": np.rint}


class _NumpyBuilder(Builder[np.ndarray]):
    """Evaluates formulas on arrays of `home`'s dtype, vectorised, writing each result into
    a buffer whose value is no longer needed when one has the result's shape: `home`
    and the builder's own temporaries (a formula reads each intermediate once)."""

    def __init__(self, home: np.ndarray):
        self.dtype = home.dtype
        self.buffers = [home]  # storage the builder may overwrite, `home` first
        self.reads_left = {id(home): 0}  # buffer id -> reads its value still has coming

    def hold(self, value: np.ndarray, reads: int) -> None:
        """Note that `value`, a step's input, is read `reads` times by the step."""
        if id(value) in self.reads_left:
            self.reads_left[id(value)] = reads

    def const(self, value: float):
        return self.dtype.type(value)

    def binary(self, op: str, a, b):
        return self._compute(_UFUNCS[op], a, b, casting="unsafe")

    def call(self, fn: str, x):
        return self._compute(_CALLS[fn], x)

    def clip(self, x, lo, hi):  # one pass, where maximum then minimum take two slower ones
        return self._compute(np.clip, x, lo, hi)

    def less(self, a, b):
        self._read(a)
        self._read(b)
        return np.less(a, b)

    def select(self, cond, a, b):
        self._read(a)
        self._read(b)
        return self._own(np.where(cond, a, b))

    def _read(self, arg) -> None:
        key = id(arg)  # buffers stay alive, so an argument with a buffer's id is it
        if key in self.reads_left:
            self.reads_left[key] -= 1

    def _compute(self, fn, *args, **kwargs):
        shape = ()
        for arg in args:
            self._read(arg)
            if isinstance(arg, np.ndarray) and arg.shape != shape:  # constants are scalars
                shape = np.broadcast_shapes(shape, arg.shape) if shape else arg.shape
        for buf in self.buffers:
            if self.reads_left[id(buf)] <= 0 and buf.shape == shape:
                fn(*args, out=buf, **kwargs)
                self.reads_left[id(buf)] = 1
                return buf
        return self._own(fn(*args, **kwargs))

    def _own(self, result) -> np.ndarray:
        result = np.asarray(result).astype(self.dtype, copy=False)
        self.buffers.append(result)
        self.reads_left[id(result)] = 1
        return result


def validate_epilogue(steps: Sequence[EpilogueStep], n_inputs: int) -> str | None:
    """None when every step is known and its operand is a valid input index, else why not."""
    for step in steps:
        row = EPILOGUE_TABLE.get(step.op)
        if row is None:
            return f"unknown epilogue op {step.op!r}"
        if row.arity == 2 and (step.operand is None or not 0 <= step.operand < n_inputs):
            return f"epilogue step {step.op!r} has no valid operand ({step.operand})"
    return None


def _evaluate(home: np.ndarray, value: np.ndarray, steps: Sequence[EpilogueStep],
              inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """The steps applied to `value`, left in `home` unless an operand broadcast it bigger."""
    builder = _NumpyBuilder(home)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for step in steps:
            builder.hold(value, value_uses(step))
            operand = None if step.operand is None else inputs[step.operand]
            value = step_value(builder, step, value, operand)
        if value is not home and np.shape(value) == home.shape:
            np.copyto(home, value, casting="unsafe")
            return home
    return value


def apply_epilogue(y: np.ndarray, steps: Sequence[EpilogueStep],
                   inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """Apply the epilogue steps to `y`, in place when shapes allow; returns the result.

    `inputs` are the node inputs that binary steps index with `operand`. The
    dtype of `y` is preserved (operands are cast to it). The result is `y`
    itself unless an operand broadcasts `y` to a bigger shape.
    """
    return _evaluate(y, y, steps, inputs)


def apply_epilogue_into(out: np.ndarray, x: np.ndarray, steps: Sequence[EpilogueStep],
                        inputs: Sequence[np.ndarray | None]) -> None:
    """Write the epilogue steps applied to `x` into `out` (x is left as it is; it may
    broadcast against `out`); the first step already writes into `out` when it can."""
    result = _evaluate(out, x, steps, inputs)
    if result is not out:
        np.copyto(out, result, casting="unsafe")


# --- ONNX form -------------------------------------------------------------------------------


class OnnxBuilder(Builder[str]):
    """Emits ONNX nodes (valid from opset 9) for formulas; values are tensor names, every
    name starting with `prefix`, constants `Constant` nodes of `dtype`. With
    `onnxruntime`, a step without a standard single op at the opset uses onnxruntime's
    contrib op where the table gives one (float32 only)."""

    def __init__(self, prefix: str, dtype: str, opset: int, onnxruntime: bool = False):
        self.prefix = prefix
        self.opset = opset
        self.onnxruntime = onnxruntime and np.dtype(dtype) == np.float32
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        """A new name under the prefix."""
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def node(self, op: str, inputs: list[str], domain: str = "", **attrs) -> str:
        """Append a node of `op`; returns its (fresh) output name."""
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(op),
                                           domain=domain or None, **attrs))
        return out

    def const(self, value: float) -> str:
        name = self.fresh("const")
        tensor = numpy_helper.from_array(np.asarray(value, dtype=self.dtype), name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name + "_node",
                                           value=tensor))
        return name

    def binary(self, op: str, a: str, b: str) -> str:
        return self.node(EPILOGUE_TABLE[op].onnx.op, [a, b])  # Add, Sub, ... as the steps

    def call(self, fn: str, x: str) -> str:
        if fn == "log1p":
            return self.node("Log", [self.node("Add", [x, self.const(1.0)])])
        if fn == "round":   # half to even: ONNX Round from opset 11 on
            if self.opset >= 11:
                return self.node("Round", [x])
            # before it, adding and subtracting 1.5 * 2^(mantissa bits) rounds as the
            # hardware does, half to even: exact below 2^22 in float32 (fake_quant's
            # rounded value is clipped to its integer range first)
            magic = 1.5 * 2.0 ** np.finfo(self.dtype).nmant
            return self.node("Sub", [self.node("Add", [x, self.const(magic)]),
                                     self.const(magic)])
        return self.node(EPILOGUE_TABLE[fn].onnx.op, [x])  # Exp, Erf, ... as the steps

    def less(self, a: str, b: str) -> str:
        return self.node("Less", [a, b])

    def select(self, cond: str, a: str, b: str) -> str:
        return self.node("Where", [cond, a, b])

    def step(self, step: EpilogueStep, value: str, operand: str | None) -> str:
        """Nodes computing `step` on `value`: its single op if the opset has one, else
        its formula's."""
        row = epilogue_op(step.op)
        form = row.onnx
        if form is None or self.opset < form.since:
            form = row.onnxruntime if self.onnxruntime else None
        if form is None:
            return step_value(self, step, value, operand)
        args = list(step_arguments(step, value, operand))
        extra, attrs = form.to_onnx(row.attr_values(dict(step.attrs)), self.opset)
        for index in range(len(args), max(extra, default=-1) + 1):
            args.append(self.const(extra[index]) if index in extra else "")
        return self.node(form.op, args, form.domain, **attrs)

    def finish(self, value: str, out: str) -> None:
        """Make the value the tensor `out` (renaming the last node's output)."""
        if self.nodes and self.nodes[-1].output[0] == value:
            self.nodes[-1].output[0] = out
        else:
            self.nodes.append(helper.make_node("Identity", [value], [out],
                                               name=self.fresh("Identity")))


def epilogue_onnx_nodes(steps: Sequence[EpilogueStep], value_name: str,
                        operand_names: Mapping[int, str] | Sequence[str], out_name: str,
                        prefix: str, *, dtype: str = "float32", opset: int = 17,
                        onnxruntime: bool = False) -> list[onnx.NodeProto]:
    """Standard ONNX nodes (valid at `opset`, 9 or later) computing the epilogue of `value_name`.

    `operand_names[i]` is the tensor name of node input `i` (used by binary
    steps); the last node writes `out_name`; every intermediate name and node
    name starts with `prefix`. Constants are emitted as `Constant` nodes of
    `dtype`. With no steps the result is a single `Identity`. `onnxruntime`: the nodes
    are for onnxruntime only, which may then use its contrib ops (`OnnxBuilder`).
    """
    if not steps:
        return [helper.make_node("Identity", [value_name], [out_name], name=prefix + "identity")]
    builder = OnnxBuilder(prefix, dtype, opset, onnxruntime)
    value = value_name
    for step in steps:
        operand = None if step.operand is None else operand_names[step.operand]
        value = builder.step(step, value, operand)
    builder.finish(value, out_name)
    return builder.nodes
