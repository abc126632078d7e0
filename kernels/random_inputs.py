"""Random inputs for measuring and verifying a workload.

Float inputs are drawn from U(-1, 1), weights (a Conv's, a MatMul's or Gemm's B,
every conv weight of a fused block) scaled by 1/sqrt(fan_in) so outputs stay of
order one, as a trained model's do; static inputs (shapes, indices, bounds) get their
exact fixed values; integer inputs are drawn inside the range the op accepts
(Gather indices within the gathered axis); inputs that must be positive
(BatchNormalization variance, Log/Sqrt/Pow arguments, divisors) are drawn
from U(0.5, 1.5).
"""

from __future__ import annotations

import math

import numpy as np

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS, narrow_group_lanes

# Ops whose data input must be positive for a finite result.
_POSITIVE_DATA_OPS = frozenset({"Log", "Sqrt", "Reciprocal", "Pow"})
# Fused blocks of convolutions (the CPU's blocked inverted residual, CUDA's NCHW one):
# each 4-d input is a conv weight [out, in/groups, kh, kw]. Unscaled U(-1, 1) weights
# chained through a block grow activations to hundreds, where a sigmoid's exp lands on
# denormal floats: one block measured 10x slower than on a trained model's weights.
_FUSED_CONV_OPS = frozenset({"InvertedResidual", "InvertedResidualNCHW"})
# Recurrent ops: W [dirs, gates*H, input], R [dirs, gates*H, H], B [dirs, 2*gates*H]. Unscaled
# U(-1, 1) weights make a 256-wide recurrence chaotic: float32 and float64 runs part ways
# within a few dozen steps (relative error ~1), so every correct kernel read as wrong.
_RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
# Epilogue steps that want a positive argument.
_POSITIVE_STEPS = frozenset({"log", "sqrt", "reciprocal", "pow"})


def _fan_in(workload: Workload, index: int) -> int | None:
    """The reduction length an input is multiplied over, for weight-like inputs."""
    op, specs = workload.op, workload.inputs
    if op == "Conv" and index == 1:
        width = int(workload.attr(GROUP_WIDTH, 0) or 0)   # a widened filter's own group
        sparse = int(workload.attr(SPARSE_GROUPS, 0) or 0)  # ... or a dense one's
        reduction = width or specs[1].shape[1] // max(1, sparse)
        return int(np.prod(specs[1].shape[2:], dtype=np.int64)) * reduction
    if op in _FUSED_CONV_OPS and index > 0 and len(specs[index].shape) == 4:
        # every conv weight of a fused block: expand, depthwise, project, the gate's two
        return int(np.prod(specs[index].shape[1:], dtype=np.int64))
    if op in _RECURRENT_OPS and index in (1, 2, 3):
        # torch's initialisation, U(-1/sqrt(H), 1/sqrt(H)), for the weights and biases
        return int(workload.attr("hidden_size", specs[2].shape[-1]))
    if op == "Gemm" and index == 1:
        shape = specs[1].shape
        return int(shape[1] if workload.attr("transB", 0) else shape[0])
    if op == "MatMul" and index == 1:
        shape = specs[1].shape
        return int(shape[-2] if len(shape) > 1 else shape[0])
    return None


def _positive_inputs(workload: Workload) -> set[int]:
    positive = set()
    if workload.op == "BatchNormalization":
        positive |= {1, 4}
    if workload.op in _POSITIVE_DATA_OPS:
        positive.add(0)
    if workload.op == "Div":
        positive.add(1)
    if any(step.op in _POSITIVE_STEPS for step in workload.epilogue):
        # A step with a restricted domain somewhere in the chain: keep every value positive.
        positive |= set(range(len(workload.inputs)))
    for step in workload.epilogue:
        if step.operand is not None and (step.op == "div" and not step.swap
                                         or step.op == "pow" and step.swap):
            positive.add(step.operand)
    return positive


def _integer_input(workload: Workload, index: int, spec: TensorSpec,
                   rng: np.random.Generator) -> np.ndarray:
    if workload.op == "Gather" and index == 1:
        data = workload.inputs[0].shape
        dim = data[workload.attr("axis", 0) % len(data)]
        return rng.integers(-dim, dim, size=spec.shape).astype(spec.dtype)
    if workload.op == "GatherElements" and index == 1:
        dim = workload.inputs[0].shape[workload.attr("axis", 0) % len(workload.inputs[0].shape)]
        return rng.integers(0, dim, size=spec.shape).astype(spec.dtype)
    # Unknown index semantics: stay below every dimension of the data input, so any
    # axis it may index (GatherND, ScatterElements, OneHot...) stays in range.
    data = workload.inputs[0] if index > 0 and workload.inputs else None
    high = min([4] + [d for d in data.shape if d > 0]) if data is not None else 4
    return rng.integers(0, max(high, 1), size=spec.shape).astype(spec.dtype)


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, low: float,
             high: float) -> np.ndarray:
    """U(low, high) of `dtype`, float32 drawn as float32 (a large weight, 100M values, in a
    third of the time and half the memory of float64 draws)."""
    if dtype == np.float32:
        value = rng.random(size=shape, dtype=np.float32)
        value *= np.float32(high - low)
        value += np.float32(low)
        return value
    return np.array(rng.uniform(low, high, size=shape), dtype=dtype, order="C")


def _zero_outside_groups(weight: np.ndarray, width: int) -> None:
    """Zero a widened filter of narrow groups outside each output channel's own group, as
    the layout pass's filters are (`nchwc_format.GROUP_WIDTH`)."""
    lanes = narrow_group_lanes(weight.shape[0], weight.shape[1], width)
    weight[~lanes] = 0


def _zero_outside_sparse_groups(weight: np.ndarray, groups: int) -> None:
    """Zero a dense filter [O, C, ...] outside each output channel's own group of the
    `groups`, as the layout pass's are (`nchwc_format.SPARSE_GROUPS`)."""
    out_group, in_group = weight.shape[0] // groups, weight.shape[1] // groups
    own = (np.arange(weight.shape[0])[:, None] // out_group
           == np.arange(weight.shape[1])[None, :] // in_group)
    weight[~own] = 0


def random_inputs(workload: Workload, rng: np.random.Generator) -> list[np.ndarray | None]:
    """One array (or None for an absent input) per workload input, drawn with `rng`."""
    positive = _positive_inputs(workload)
    arrays: list[np.ndarray | None] = []
    for index, spec in enumerate(workload.inputs):
        if spec is None:
            arrays.append(None)
            continue
        fixed = workload.static_value(index)
        if fixed is not None:
            arrays.append(np.array(fixed, dtype=spec.dtype).reshape(spec.shape))
            continue
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            low, high = (0.5, 1.5) if index in positive else (-1.0, 1.0)
            fan_in = None if index in positive else _fan_in(workload, index)
            scale = 1.0 / math.sqrt(max(fan_in, 1)) if fan_in else 1.0
            arrays.append(_uniform(rng, spec.shape, dtype, low * scale, high * scale))
            if index == 1 and workload.op == "Conv" and workload.attr(GROUP_WIDTH, 0):
                _zero_outside_groups(arrays[-1], int(workload.attr(GROUP_WIDTH)))
            if index == 1 and workload.op == "Conv" and workload.attr(SPARSE_GROUPS, 0):
                _zero_outside_sparse_groups(arrays[-1], int(workload.attr(SPARSE_GROUPS)))
        elif dtype.kind == "b":
            arrays.append(np.asarray(rng.random(size=spec.shape) < 0.5))
        elif dtype.kind in "iu":
            arrays.append(np.asarray(_integer_input(workload, index, spec, rng)))
        else:
            arrays.append(np.zeros(spec.shape, dtype=dtype))
    return arrays
