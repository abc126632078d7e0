"""The epilogue table: what every epilogue step computes, written once.

An `EpilogueStep` (wpk.core.workload) names a row of `EPILOGUE_TABLE`. A row
holds the step's arity, its attributes and their defaults, the single ONNX op
that computes it where one exists (with the attribute mapping both ways), and
its *formula*, written once against the abstract `Builder`. Each backend
implements `Builder` and reads the table:

- numpy arrays, in place where it can (`wpk.kernels.epilogue.apply_epilogue`);
- DSL compute IR fused into an operator (`wpk.dsl.epilogue.with_epilogue`);
- CUDA C, the body of an elementwise kernel (`wpk.kernels.cuda.epilogue_cuda`);
- ONNX nodes: the single op when the opset has it, else (for models only
  onnxruntime runs) onnxruntime's own contrib op where it has one, else the
  formula's nodes (`wpk.kernels.epilogue.epilogue_onnx_nodes`, also behind
  `wpk.passes.to_onnx`);
- and back: `step_from_onnx` reads an ONNX node as a step (`wpk.passes.elementwise`).

Adding an epilogue step is adding a row.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from wpk.core.errors import UnsupportedError

V = TypeVar("V")

# The builder's binary operations and calls (math functions of one argument).
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "max", "min")
# `round` rounds half to even, as ONNX Round and QuantizeLinear do.
CALLS = ("exp", "log", "log1p", "sqrt", "erf", "tanh", "sigmoid", "abs", "neg", "round")

ONNXRUNTIME_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops

# The step of a QuantizeLinear -> DequantizeLinear pair; it ends the chain it is in (no step
# follows it in a fused node), so verification can tell its rounding flips from errors.
FAKE_QUANT = "fake_quant"

SQRT1_2 = 0.7071067811865476      # 1 / sqrt(2)
GELU_TANH_C = 0.7978845608028654  # sqrt(2 / pi)


class Builder(ABC, Generic[V]):
    """What a formula computes with; one subclass per backend, values of its own type.

    Backends implement the primitives (`const`, `binary`, `call`, `less`,
    `select`); formulas use the named helpers too. The rule every formula
    keeps: a value a builder returned is used at most once (a formula's
    arguments and constants as often as it likes), so a backend may overwrite
    an intermediate's storage when it uses it (`argument_uses` checks it).
    """

    @abstractmethod
    def const(self, value: float) -> V:
        """The constant `value` in the formula's dtype."""

    @abstractmethod
    def binary(self, op: str, a: V, b: V) -> V:
        """`a op b` for `op` in BINARY_OPS (max and min with a NaN: as the backend does it,
        numpy's propagate it, C's fmaxf returns the other operand)."""

    @abstractmethod
    def call(self, fn: str, x: V) -> V:
        """`fn(x)` for `fn` in CALLS (sigmoid is the logistic function, neg is -x, round
        rounds half to even)."""

    @abstractmethod
    def less(self, a: V, b: V) -> V:
        """The condition `a < b`, only for `select`."""

    @abstractmethod
    def select(self, cond: V, a: V, b: V) -> V:
        """`a` where `cond` holds, else `b` (numpy's where)."""

    def add(self, a: V, b: V) -> V:
        """`a + b`."""
        return self.binary("add", a, b)

    def sub(self, a: V, b: V) -> V:
        """`a - b`."""
        return self.binary("sub", a, b)

    def mul(self, a: V, b: V) -> V:
        """`a * b`."""
        return self.binary("mul", a, b)

    def div(self, a: V, b: V) -> V:
        """`a / b`."""
        return self.binary("div", a, b)

    def pow(self, a: V, b: V) -> V:
        """`a ** b`."""
        return self.binary("pow", a, b)

    def max(self, a: V, b: V) -> V:
        """The larger of `a` and `b`."""
        return self.binary("max", a, b)

    def min(self, a: V, b: V) -> V:
        """The smaller of `a` and `b`."""
        return self.binary("min", a, b)

    def clip(self, x: V, lo: V, hi: V) -> V:
        """min(max(x, lo), hi); a backend with a faster clip overrides it."""
        return self.min(self.max(x, lo), hi)


# --- ONNX forms ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnnxAttr:
    """How one step attribute travels on the ONNX op: as attribute `onnx`, or, from opset
    `input_since` on, as the op's optional input `index`. `unset` is the value written
    as the attribute when the step leaves the attribute out (Clip-6's open bounds)."""

    step: str
    onnx: str
    input_since: int | None = None
    index: int = 0
    unset: float | None = None

    def as_input(self, opset: int) -> bool:
        """Whether the op of `opset` takes the value as an input."""
        return self.input_since is not None and opset >= self.input_since

    def read(self, attrs: Mapping[str, Any], inputs: Sequence[float | None]) -> Any:
        """The value on an ONNX node (input first, then attribute), None when absent."""
        if self.input_since is not None and len(inputs) > self.index \
                and inputs[self.index] is not None:
            return inputs[self.index]
        return attrs.get(self.onnx)


@dataclass(frozen=True)
class OnnxForm:
    """The single ONNX op computing a step, from opset `since` on. `fixed` holds the
    attributes that select the step, as (name, value for this step, ONNX default)."""

    op: str
    since: int = 1
    attrs: tuple[OnnxAttr, ...] = ()
    fixed: tuple[tuple[str, Any, Any], ...] = ()
    domain: str = ""

    def matches(self, attrs: Mapping[str, Any]) -> bool:
        """Whether a node of this op with `attrs` computes this step."""
        return all(_text(attrs.get(name, default)) == value for name, value, default in self.fixed)

    def to_step_attrs(self, attrs: Mapping[str, Any], inputs: Sequence[float | None],
                      defaults: Sequence[tuple[str, float | None]]
                      ) -> tuple[tuple[str, float], ...]:
        """The step attributes of a node (in `defaults` order; absent ones take the default,
        those defaulting to None stay out)."""
        mapping = {a.step: a for a in self.attrs}
        values = []
        for name, default in defaults:
            value = mapping[name].read(attrs, inputs) if name in mapping else None
            value = default if value is None else value
            if value is not None:
                values.append((name, float(value)))
        return tuple(values)

    def to_onnx(self, values: Mapping[str, float | None], opset: int
                ) -> tuple[dict[int, float], dict[str, Any]]:
        """The node's extra inputs (index -> value) and attributes for step attribute `values`."""
        inputs: dict[int, float] = {}
        attrs: dict[str, Any] = {name: value for name, value, default in self.fixed
                                 if value != default}
        for spec in self.attrs:
            value = values.get(spec.step)
            if spec.as_input(opset):
                if value is not None:
                    inputs[spec.index] = float(value)
            elif value is not None or spec.unset is not None:
                attrs[spec.onnx] = float(spec.unset if value is None else value)
        return inputs, attrs


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


# --- rows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpilogueOp:
    """One row: a step's name, arity (1 or 2), formula, attributes and ONNX form.

    A unary formula is `formula(b, x, **attrs)`, attribute values given as
    builder values (None for an absent attribute without default); a binary
    one is `formula(b, x, y)`, computing `x op y`. `attrs` lists the
    attribute names in order with their defaults (None: absent unless given).
    A `commutative` binary step computes the same with its operands swapped (so
    the ONNX parser never sets `swap` on it).
    """

    name: str
    arity: int
    formula: Callable[..., Any]
    attrs: tuple[tuple[str, float | None], ...] = ()
    onnx: OnnxForm | None = None
    commutative: bool = False
    # onnxruntime's own one-pass op for the step (a com.microsoft contrib op, float32 only),
    # for models only onnxruntime runs, where the opset has no standard single op
    onnxruntime: OnnxForm | None = None

    def attr_values(self, given: Mapping[str, float]) -> dict[str, float | None]:
        """Every attribute of the row: its value in `given`, else the default."""
        return {name: given.get(name, default) for name, default in self.attrs}

    def build(self, b: Builder[V], args: Sequence[V], attrs: Mapping[str, V | None] | None = None
              ) -> V:
        """The formula on builder values `args` (1 or 2) and attribute values `attrs`
        (builder values; a missing attribute takes its default)."""
        attrs = attrs or {}
        values = {name: attrs[name] if name in attrs else None if default is None
                  else b.const(default) for name, default in self.attrs}
        return self.formula(b, *args, **values)


def _call(fn: str) -> Callable:
    return lambda b, x: b.call(fn, x)


def _binary(op: str) -> Callable:
    return lambda b, x, y: b.binary(op, x, y)


def _clip(b: Builder, x, **bounds):
    lo, hi = bounds["min"], bounds["max"]
    if lo is not None and hi is not None:
        return b.clip(x, lo, hi)
    if lo is not None:
        return b.max(x, lo)
    return x if hi is None else b.min(x, hi)


def _leaky_relu(b: Builder, x, alpha):
    return b.select(b.less(x, b.const(0.0)), b.mul(alpha, x), x)


def _hard_sigmoid(b: Builder, x, alpha, beta):
    return b.clip(b.add(b.mul(alpha, x), beta), b.const(0.0), b.const(1.0))


def _hard_swish(b: Builder, x):
    return b.mul(x, _hard_sigmoid(b, x, b.const(1.0 / 6.0), b.const(0.5)))


def _gelu(b: Builder, x):
    erf = b.call("erf", b.mul(x, b.const(SQRT1_2)))
    return b.mul(b.mul(b.const(0.5), x), b.add(b.const(1.0), erf))


def _gelu_tanh(b: Builder, x):
    cube = b.mul(x, b.mul(x, x))
    inner = b.mul(b.const(GELU_TANH_C), b.add(x, b.mul(b.const(0.044715), cube)))
    return b.mul(b.mul(b.const(0.5), x), b.add(b.const(1.0), b.call("tanh", inner)))


def _quick_gelu(b: Builder, x, alpha):
    return b.mul(x, b.call("sigmoid", b.mul(alpha, x)))


def _mish(b: Builder, x):
    return b.mul(x, b.call("tanh", _softplus(b, x)))


def _softplus(b: Builder, x):  # max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|
    tail = b.call("log1p", b.call("exp", b.call("neg", b.call("abs", x))))
    return b.add(b.max(x, b.const(0.0)), tail)


def _fake_quant(b: Builder, x, scale, zero_point, low, high):
    """QuantizeLinear then DequantizeLinear of the same scale and zero point, in float:
    (clip(round(x / scale) + zero_point, low, high) - zero_point) * scale, `low` and `high`
    the quantized type's range (0 and 255 for uint8). Computed as round(clip(x / scale,
    low - zero_point, high - zero_point)) * scale, the same as the bounds are integers: the
    value rounded is bounded (see OnnxBuilder's round before opset 11)."""
    steps = b.clip(b.div(x, scale), b.sub(low, zero_point), b.sub(high, zero_point))
    return b.mul(b.call("round", steps), scale)


def _unary(name: str, onnx_op: str, formula: Callable | None = None,
           onnxruntime: OnnxForm | None = None, **options) -> EpilogueOp:
    return EpilogueOp(name, 1, formula or _call(name), onnx=OnnxForm(onnx_op, **options),
                      onnxruntime=onnxruntime)


def _binary_row(name: str, onnx_op: str, commutative: bool) -> EpilogueOp:
    return EpilogueOp(name, 2, _binary(name), onnx=OnnxForm(onnx_op), commutative=commutative)


_CLIP_ONNX = OnnxForm("Clip", attrs=(OnnxAttr("min", "min", 11, 1, -math.inf),
                                     OnnxAttr("max", "max", 11, 2, math.inf)))
_ALPHA, _BETA = OnnxAttr("alpha", "alpha"), OnnxAttr("beta", "beta")

_ROWS = (
    _unary("relu", "Relu", lambda b, x: b.max(x, b.const(0.0))),
    EpilogueOp("clip", 1, _clip, (("min", None), ("max", None)), _CLIP_ONNX),
    EpilogueOp("leaky_relu", 1, _leaky_relu, (("alpha", 0.01),),
               OnnxForm("LeakyRelu", attrs=(_ALPHA,))),
    _unary("sigmoid", "Sigmoid"),
    # No ONNX form: Swish (opset 24) would be one, but onnxruntime 1.32 runs it at opset 24
    # only, and reading it as silu would fuse nodes that wpk leaves to onnxruntime today.
    EpilogueOp("silu", 1, lambda b, x: b.mul(x, b.call("sigmoid", x)),
               onnxruntime=OnnxForm("QuickGelu", fixed=(("alpha", 1.0, 1.702),),
                                    domain=ONNXRUNTIME_DOMAIN)),
    # x * sigmoid(alpha * x): CLIP's QuickGELU (alpha 1.702), Swish with a beta; no ONNX op
    EpilogueOp("quick_gelu", 1, _quick_gelu, (("alpha", 1.702),),
               onnxruntime=OnnxForm("QuickGelu", attrs=(_ALPHA,), domain=ONNXRUNTIME_DOMAIN)),
    _unary("tanh", "Tanh"),
    EpilogueOp("hard_sigmoid", 1, _hard_sigmoid, (("alpha", 0.2), ("beta", 0.5)),
               OnnxForm("HardSigmoid", attrs=(_ALPHA, _BETA))),
    _unary("hard_swish", "HardSwish", _hard_swish, since=14),
    _unary("gelu", "Gelu", _gelu, since=20, fixed=(("approximate", "none", "none"),),
           onnxruntime=OnnxForm("Gelu", domain=ONNXRUNTIME_DOMAIN)),
    _unary("gelu_tanh", "Gelu", _gelu_tanh, since=20, fixed=(("approximate", "tanh", "none"),),
           onnxruntime=OnnxForm("FastGelu", domain=ONNXRUNTIME_DOMAIN)),
    _unary("exp", "Exp"),
    _unary("log", "Log"),
    _unary("sqrt", "Sqrt"),
    _unary("reciprocal", "Reciprocal", lambda b, x: b.div(b.const(1.0), x)),
    _unary("neg", "Neg"),
    _unary("abs", "Abs"),
    _unary("erf", "Erf", since=9),
    _unary("softplus", "Softplus", _softplus),
    _unary("mish", "Mish", _mish, since=18),   # x * tanh(softplus(x))
    # no ONNX form: the pair of nodes it stands for (`wpk.passes.quantize_dequantize`)
    EpilogueOp(FAKE_QUANT, 1, _fake_quant, (("scale", 1.0), ("zero_point", 0.0),
                                              ("low", 0.0), ("high", 255.0))),
    _binary_row("add", "Add", True),
    _binary_row("sub", "Sub", False),
    _binary_row("mul", "Mul", True),
    _binary_row("div", "Div", False),
    _binary_row("pow", "Pow", False),
    _binary_row("max", "Max", True),
    _binary_row("min", "Min", True),
)

EPILOGUE_TABLE: Mapping[str, EpilogueOp] = {row.name: row for row in _ROWS}
# ONNX op type -> the rows it may compute (Gelu: gelu or gelu_tanh, told apart by `fixed`).
_BY_ONNX: dict[str, tuple[EpilogueOp, ...]] = {}
for _row in _ROWS:
    if _row.onnx is not None:
        _BY_ONNX[_row.onnx.op] = _BY_ONNX.get(_row.onnx.op, ()) + (_row,)
ONNX_BINARY_STEPS: Mapping[str, str] = {row.onnx.op: row.name for row in _ROWS
                                        if row.arity == 2 and row.onnx is not None}
COMMUTATIVE_STEPS = frozenset(row.name for row in _ROWS if row.commutative)


def epilogue_op(name: str) -> EpilogueOp:
    """The row of step `name` (UnsupportedError for an unknown step)."""
    row = EPILOGUE_TABLE.get(name)
    if row is None:
        raise UnsupportedError(f"unknown epilogue op {name!r}",
                               hint=f"the known ones are {', '.join(EPILOGUE_TABLE)}")
    return row


def step_value(b: Builder[V], step, value: V, operand: V | None = None) -> V:
    """`step` (an EpilogueStep) applied to `value` with builder `b`; `operand` is the
    value of a binary step's node input (`value op operand`, or the reverse with `swap`)."""
    row, attrs, _ = _resolve(step)
    if row.arity == 2:
        return row.formula(b, *step_arguments(step, value, operand))
    return row.formula(b, value, **{k: None if v is None else b.const(v) for k, v in attrs})


def step_arguments(step, value: V, operand: V | None = None) -> tuple[V, ...]:
    """The arguments of `step`'s formula: (value,), or a binary step's pair in order."""
    if _resolve(step)[0].arity == 1:
        return (value,)
    if operand is None:
        raise UnsupportedError(f"epilogue step {step.op!r} has no operand")
    return (operand, value) if step.swap else (value, operand)


def value_uses(step) -> int:
    """How many times `step`'s formula reads the value it is applied to."""
    return _resolve(step)[2]


@functools.lru_cache(maxsize=4096)
def _resolve(step) -> tuple[EpilogueOp, tuple[tuple[str, float | None], ...], int]:
    """A step's row, every attribute value, and how often its formula reads the value
    (cached: numpy kernels apply the same steps on every call)."""
    row = epilogue_op(step.op)
    attrs = row.attr_values(dict(step.attrs))
    if row.arity == 2:
        uses = argument_uses(row.name, frozenset())[1 if step.swap else 0]
    else:
        uses = argument_uses(row.name, frozenset(k for k, v in attrs.items() if v is not None))[0]
    return row, tuple(attrs.items()), uses


class _Counter(Builder[object]):
    """Counts how often a formula reads each value; refuses an intermediate read twice."""

    def __init__(self, name: str):
        self.name = name
        self.reads: dict[int, int] = {}
        self.intermediates: set[int] = set()
        self.values: list[object] = []  # keeps every value alive, so ids stay unique

    def new(self, *args: object, intermediate: bool = True) -> object:
        for arg in args:
            self.reads[id(arg)] = self.reads.get(id(arg), 0) + 1
            if id(arg) in self.intermediates and self.reads[id(arg)] > 1:
                raise ValueError(f"the formula of epilogue step {self.name!r} uses an "
                                 "intermediate value twice (see Builder)")
        value = object()
        self.values.append(value)
        if intermediate:
            self.intermediates.add(id(value))
        return value

    def const(self, value):
        return self.new(intermediate=False)

    def binary(self, op, a, b):
        return self.new(a, b)

    def call(self, fn, x):
        return self.new(x)

    def less(self, a, b):
        return self.new(a, b)

    def select(self, cond, a, b):
        return self.new(cond, a, b)


@functools.cache
def argument_uses(name: str, present: frozenset[str]) -> tuple[int, ...]:
    """How many times row `name`'s formula reads each argument when the attributes in
    `present` are given (ValueError if it breaks the single-use rule of `Builder`)."""
    row = epilogue_op(name)
    counter = _Counter(name)
    args = [counter.new(intermediate=False) for _ in range(row.arity)]
    attrs = {k: counter.const(0.0) if k in present else None for k, _ in row.attrs}
    counter.new(row.formula(counter, *args, **attrs))  # returning an argument reads it too
    return tuple(counter.reads.get(id(arg), 0) for arg in args)


def step_from_onnx(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[float | None] = ()
                   ) -> tuple[str, tuple[tuple[str, float], ...]] | None:
    """The unary step (name, attrs) an ONNX node of `op_type` computes, or None.

    `attrs` are the node's attributes; `inputs[i]` the value of its constant
    scalar input `i` (None when absent; the caller refuses non-constant ones).
    """
    for row in _BY_ONNX.get(op_type, ()):
        if row.arity == 1 and row.onnx.matches(attrs):
            return row.name, row.onnx.to_step_attrs(attrs, inputs, row.attrs)
    return None


def is_unary_onnx_op(op_type: str) -> bool:
    """Whether some unary step is computed by ONNX ops of `op_type`."""
    return any(row.arity == 1 for row in _BY_ONNX.get(op_type, ()))
