"""numpy formulations of elementwise, data-movement and reduction ONNX ops, in the inputs' dtype.

Each formula is `f(workload, inputs) -> list of output arrays` (the fused
epilogue is not applied here). They serve both the float64 references (called
with float64 inputs) and the numpy library kernels (called with the native
inputs). Output shapes are taken from the workload where ONNX defines them
through shape inference (Reshape, Squeeze, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from wpk.core.epilogue import step_from_onnx
from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.cpu.resize import resize, resize_spec
from wpk.kernels.epilogue import apply_epilogue
from wpk.kernels.support import ELEMENTWISE_UNARY_OPS

Formula = Callable[[Workload, Sequence[np.ndarray | None]], list[np.ndarray]]

# ONNX unary ops wpk computes as one epilogue step (which step: the epilogue table).
UNARY_AS_STEP = ELEMENTWISE_UNARY_OPS - {"Clip"}
BINARY_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
                 "Pow": np.power, "Max": np.maximum, "Min": np.minimum}


def unary_step(workload: Workload) -> EpilogueStep:
    """The epilogue step equivalent to a unary ONNX op."""
    return EpilogueStep(*step_from_onnx(workload.op, dict(workload.attrs)))


def static_clip_step(workload: Workload) -> EpilogueStep | None:
    """The `clip` step of a Clip whose bounds are fixed (attributes before opset 11, absent
    or static scalar inputs from it), or None (not a Clip, or a bound computed at run time)."""
    if workload.op != "Clip":
        return None
    bounds: list[float | None] = [None]
    for index in (1, 2) if workload.opset >= 11 else ():
        present = index < len(workload.inputs) and workload.inputs[index] is not None
        value = workload.static_value(index) if present else None
        if present and (value is None or np.size(value) != 1):
            return None
        bounds.append(None if value is None else float(np.asarray(value).reshape(-1)[0]))
    found = step_from_onnx("Clip", dict(workload.attrs), bounds)
    return None if found is None else EpilogueStep(*found)


def _unary(workload, inputs):
    y = np.array(inputs[0], copy=True)
    return [apply_epilogue(y, (unary_step(workload),), ())]


def clip_bounds(workload: Workload, inputs) -> tuple[float | None, float | None]:
    """Clip's bounds: inputs 1 and 2 from opset 11, attributes before."""
    if workload.opset < 11:
        return workload.attr("min"), workload.attr("max")
    lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    return (None if lo is None else lo.item()), (None if hi is None else hi.item())


def _clip(workload, inputs):
    lo, hi = clip_bounds(workload, inputs)
    y = np.array(inputs[0], copy=True)
    if lo is not None:
        np.maximum(y, lo, out=y)
    if hi is not None:
        np.minimum(y, hi, out=y)
    return [y]


def _binary(workload, inputs):
    ufunc = BINARY_UFUNCS[workload.op]
    args = [x for x in inputs if x is not None]
    y = args[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for x in args[1:]:  # Max/Min are variadic (one input is allowed too)
            y = ufunc(y, x)
    return [np.asarray(y)]


def _sum_or_mean(workload, inputs):
    args = [x for x in inputs if x is not None]
    y = args[0]
    for x in args[1:]:
        y = y + x
    return [y / len(args) if workload.op == "Mean" else y]


def _reshape_like_output(workload, inputs):
    return [np.reshape(inputs[0], workload.outputs[0].shape)]


def _transpose(workload, inputs):
    perm = workload.attr("perm") or tuple(reversed(range(inputs[0].ndim)))
    return [np.transpose(inputs[0], perm)]


def _concat(workload, inputs):
    return [np.concatenate([x for x in inputs if x is not None], axis=workload.attr("axis"))]


def _gather(workload, inputs):
    return [np.take(inputs[0], inputs[1].astype(np.int64), axis=workload.attr("axis", 0))]


def slice_index(workload: Workload, inputs, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The numpy index of an ONNX Slice (inputs from opset 10, attributes before)."""
    if workload.opset < 10:
        starts, ends = workload.attr("starts"), workload.attr("ends")
        axes, steps = workload.attr("axes"), None
    else:
        starts, ends = inputs[1].tolist(), inputs[2].tolist()
        axes = inputs[3].tolist() if len(inputs) > 3 and inputs[3] is not None else None
        steps = inputs[4].tolist() if len(inputs) > 4 and inputs[4] is not None else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


def _slice(workload, inputs):
    return [inputs[0][slice_index(workload, inputs, inputs[0].shape)]]


def _pad(workload, inputs):
    x = inputs[0]
    mode = workload.text_attr("mode", "constant")
    if workload.opset < 11:
        pads, value, axes = list(workload.attr("pads")), workload.attr("value", 0.0), None
    else:
        pads = inputs[1].tolist()
        value = inputs[2].item() if len(inputs) > 2 and inputs[2] is not None else 0
        axes = inputs[3].tolist() if len(inputs) > 3 and inputs[3] is not None else None
    axes = [a % x.ndim for a in axes] if axes is not None else list(range(x.ndim))
    widths = [[0, 0] for _ in range(x.ndim)]
    for k, axis in enumerate(axes):
        widths[axis] = [pads[k], pads[k + len(axes)]]
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=value)]
    return [np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]


def _resize(workload, inputs):
    return [resize(resize_spec(workload, inputs), inputs[0])]


def _identity(workload, inputs):
    return [inputs[0]]


def axis_bounds(specs, axis: int) -> list[tuple[int, int]]:
    """(start, end) of each tensor of `specs` laid end to end along `axis` (a Concat's
    inputs, a Split's outputs)."""
    ends = np.cumsum([spec.shape[axis] for spec in specs]).tolist()
    return list(zip([0] + ends[:-1], ends))


def split_bounds(workload) -> tuple[int, list[tuple[int, int]]]:
    """(axis, [(start, end) of each output along it]) of a Split, from its output shapes."""
    axis = int(workload.attr("axis", 0)) % len(workload.inputs[0].shape)
    return axis, axis_bounds(workload.outputs, axis)


def _sum_square(x, axis, keepdims):
    return np.sum(np.square(x), axis=axis, keepdims=keepdims)


REDUCTIONS = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max,
              "ReduceMin": np.min, "ReduceSumSquare": _sum_square,
              "ReduceL1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
              "ReduceL2": lambda x, axis, keepdims: np.sqrt(_sum_square(x, axis, keepdims))}


def reduce_axes(workload: Workload, inputs) -> tuple[int, ...]:
    """The axes a Reduce op reduces: its `axes` attribute, else its input 1 (opset 13 for
    ReduceSum, 18 for the others); none given means all, or none at all with
    `noop_with_empty_axes`."""
    axes = workload.attr("axes")
    if axes is None and len(workload.inputs) > 1:
        given = workload.static_value(1)
        given = inputs[1] if given is None and len(inputs) > 1 else given
        axes = None if given is None else [int(a) for a in np.asarray(given).ravel()]
    rank = len(workload.inputs[0].shape)
    if axes is None or len(axes) == 0:
        return () if workload.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted({int(a) % rank for a in axes}))


def _reduce(workload, inputs):
    axes, x = reduce_axes(workload, inputs), inputs[0]
    if not axes:
        return [np.array(x, copy=True)]
    y = REDUCTIONS[workload.op](x, axis=axes, keepdims=True)
    return [np.asarray(y).reshape(workload.outputs[0].shape)]


def _split(workload, inputs):
    axis, bounds = split_bounds(workload)
    lead = (slice(None),) * axis
    return [inputs[0][lead + (slice(lo, hi),)] for lo, hi in bounds]


TENSOR_FORMULAS: dict[str, Formula] = {
    **{op: _unary for op in UNARY_AS_STEP},
    **{op: _binary for op in BINARY_UFUNCS},
    "Clip": _clip,
    "Reshape": _reshape_like_output, "Flatten": _reshape_like_output,
    "Squeeze": _reshape_like_output, "Unsqueeze": _reshape_like_output,
    "Sum": _sum_or_mean, "Mean": _sum_or_mean, "Dropout": _identity,
    "Identity": _identity, "Transpose": _transpose, "Concat": _concat, "Gather": _gather,
    "Slice": _slice, "Pad": _pad, "Resize": _resize, "Split": _split,
    **{op: _reduce for op in REDUCTIONS},
}
