"""Workloads: what one operator instance computes, independent of any graph.

A `Workload` is the unit that is tuned, measured and planned: the op, its
input/output shapes and dtypes, its attributes and its fused epilogue. Two
graph nodes with equal workloads share one measurement. The key is a stable
hash of the canonical JSON form, so it can index tuning records across runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wpk.core.epilogue import EPILOGUE_TABLE
from wpk.core.numerics import is_ml_dtype

# Epilogue steps, one row each in the epilogue table (wpk.core.epilogue), where every
# implementation reads its meaning. Unary ones, with attributes:
#   relu; clip(min, max); leaky_relu(alpha); sigmoid; silu (x*sigmoid(x)); tanh;
#   hard_sigmoid(alpha, beta) = clip(alpha*x+beta, 0, 1); hard_swish = x*hard_sigmoid(1/6, 1/2);
#   gelu (exact, erf form); gelu_tanh (tanh approximation);
#   exp, log, sqrt, reciprocal, neg, abs, erf, softplus.
UNARY_EPILOGUE_OPS = frozenset(name for name, row in EPILOGUE_TABLE.items() if row.arity == 1)
# Binary epilogue ops take the node input `operand` (numpy broadcasting against the value):
#   add, sub, mul, div, pow, max, min. `swap` means `operand OP value`
#   instead of `value OP operand`.
#   A residual Add fused into a Conv/Gemm is `add` with the residual tensor as operand.
BINARY_EPILOGUE_OPS = frozenset(name for name, row in EPILOGUE_TABLE.items() if row.arity == 2)



def as_text(value: Any) -> str:
    """An ONNX string attribute's value as text (ONNX stores strings as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)

@dataclass(frozen=True)
class EpilogueStep:
    """One elementwise step applied to an operator's output, in order."""

    op: str
    attrs: tuple[tuple[str, float], ...] = ()
    operand: int | None = None
    swap: bool = False

    def attr(self, name: str, default: float | None = None) -> float | None:
        return dict(self.attrs).get(name, default)

    def to_json(self) -> dict:
        return {"op": self.op, "attrs": {k: encode_attr(v) for k, v in self.attrs},
                "operand": self.operand, "swap": self.swap}

    @staticmethod
    def from_json(data: Mapping) -> EpilogueStep:
        attrs = {k: decode_attr(v) for k, v in data.get("attrs", {}).items()}
        return EpilogueStep(data["op"], tuple(sorted(attrs.items())),
                            data.get("operand"), bool(data.get("swap", False)))


@dataclass(frozen=True)
class TensorSpec:
    """Shape and numpy dtype name of one tensor."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(data: Mapping) -> TensorSpec:
        return TensorSpec(tuple(int(d) for d in data["shape"]), data["dtype"])


def encode_attr(value: Any) -> Any:
    """Turn an attribute value into canonical JSON (tuples as lists, arrays as dicts, an
    infinite or NaN float as {"__float__": "-inf"}: JSON has no such numbers, and a Clip
    whose min is -inf made a plan that could not be written)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"__ndarray__": base64.b64encode(data.tobytes()).decode("ascii"),
                "dtype": data.dtype.name if is_ml_dtype(data.dtype) else data.dtype.str,
                "shape": list(data.shape)}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode_attr(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    return value


def decode_attr(value: Any) -> Any:
    """Inverse of `encode_attr` (lists come back as tuples, so values stay hashable)."""
    if isinstance(value, dict) and "__float__" in value:
        return float(value["__float__"])
    if isinstance(value, dict) and "__ndarray__" in value:
        raw = base64.b64decode(value["__ndarray__"])
        return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    if isinstance(value, dict) and "__bytes__" in value:
        return base64.b64decode(value["__bytes__"])
    if isinstance(value, list):
        return tuple(decode_attr(v) for v in value)
    return value


@dataclass(frozen=True)
class Workload:
    """One operator instance: op, tensor specs, attributes and fused epilogue.

    `inputs[i]` is None for an absent optional input. `const_inputs` lists the
    indices of inputs that are build-time constants (weights), which an
    implementation may pre-pack in `prepare`. `static_inputs` holds the values
    of constant inputs that define *what* is computed rather than data (any
    integer tensor such as a Reshape shape or Gather indices, and small float
    tensors of at most 64 elements such as Clip bounds or Resize scales, except
    the weight inputs of Conv, Gemm, MatMul and the normalizations, listed in
    `wpk.workloads.WEIGHT_INPUTS`, which stay data however small): they are
    part of the identity, and measurement feeds these exact values while
    drawing every other input, weights included, at random. Attribute values
    are ints, floats, strings, tuples of those, or numpy arrays.
    """

    op: str
    inputs: tuple[TensorSpec | None, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    epilogue: tuple[EpilogueStep, ...] = ()
    domain: str = ""
    const_inputs: tuple[int, ...] = ()
    static_inputs: tuple[tuple[int, Any], ...] = ()
    opset: int = 17
    _key: str = field(default="", compare=False, repr=False)

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    def text_attr(self, name: str, default: str) -> str:
        """A string attribute as text (ONNX stores strings as bytes)."""
        return as_text(self.attr(name, default))

    def static_value(self, index: int) -> Any:
        """The fixed value of static input `index`, or None."""
        for i, value in self.static_inputs:
            if i == index:
                return value
        return None

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "domain": self.domain,
            "opset": self.opset,
            "inputs": [None if s is None else s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "attrs": {k: encode_attr(v) for k, v in self.attrs},
            "epilogue": [s.to_json() for s in self.epilogue],
            "const_inputs": list(self.const_inputs),
            "static_inputs": [[i, encode_attr(np.asarray(v))] for i, v in self.static_inputs],
        }

    @staticmethod
    def from_json(data: Mapping) -> Workload:
        return Workload(
            op=data["op"],
            domain=data.get("domain", ""),
            opset=int(data.get("opset", 17)),
            inputs=tuple(None if s is None else TensorSpec.from_json(s) for s in data["inputs"]),
            outputs=tuple(TensorSpec.from_json(s) for s in data["outputs"]),
            attrs=tuple(sorted((k, decode_attr(v)) for k, v in data.get("attrs", {}).items())),
            epilogue=tuple(EpilogueStep.from_json(s) for s in data.get("epilogue", [])),
            const_inputs=tuple(data.get("const_inputs", [])),
            static_inputs=tuple((int(i), decode_attr(v)) for i, v in data.get("static_inputs", [])),
        )

    @property
    def key(self) -> str:
        """Stable 16-hex-digit identity of the workload (same across runs and machines)."""
        if not self._key:
            text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_key", hashlib.sha256(text.encode()).hexdigest()[:16])
        return self._key

    @property
    def label(self) -> str:
        """Short human-readable description, e.g. `Conv 1x64x56x56 -> 1x64x56x56 +relu`."""
        def dims(spec: TensorSpec | None) -> str:
            return "x".join(map(str, spec.shape)) if spec is not None else ""

        shapes = dims(self.inputs[0]) if self.inputs else ""
        if self.op in ("Conv", "Gemm", "MatMul") and len(self.inputs) > 1 and self.inputs[1]:
            shapes += f" * {dims(self.inputs[1])}"
        out = dims(self.outputs[0]) if self.outputs else ""
        tail = "".join(f" +{s.op}" for s in self.epilogue)
        return f"{self.op} {shapes} -> {out}{tail}"
