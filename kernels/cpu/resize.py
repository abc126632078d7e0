"""ONNX Resize (opset 11 on) in numpy: every mode and coordinate transformation of the spec.

    spec = resize_spec(workload, [x, roi, scales, sizes])   # static roi/scales/sizes
    y = resize(spec, x)                                      # x's dtype (float64 for the reference)

Resizing is separable: each resized axis is one 1-D interpolation, a matrix of
weights (output positions x input positions) applied along that axis
(`axis_weights`). What the spec defines per axis:

- the scale: `scales[axis]`, or from `sizes` (per axis `size / length` with
  `keep_aspect_ratio_policy` "stretch"; the smallest or largest of those over
  the resized axes with "not_larger" / "not_smaller"); `axes` (opset 18) names
  the axes that `roi`, `scales` and `sizes` list;
- the source coordinate of every output position (`source_coordinates`):
  half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners,
  asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize (with `roi`).
  align_corners divides by the resized length `length * scale` unrounded, as
  ONNX's conformance cases expect (onnxruntime divides by the output length and
  fails the two whose scaled lengths are not whole);
- the taps and weights: nearest (one tap, `nearest_mode` rounding), linear (2
  taps) and cubic (4 taps, Keys' kernel with `cubic_coeff_a`); with
  `antialias` and a scale below 1 the linear and cubic kernels are stretched
  by 1/scale (more taps). Weights are normalised to sum to 1. Taps outside the
  input repeat the edge, or get weight 0 (then renormalised) with
  `exclude_outside`;
- with tf_crop_and_resize, output positions whose source coordinate lies
  outside the input on any axis take `extrapolation_value`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.workload import Workload

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                    "tf_crop_and_resize")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class ResizeSpec:
    """Everything of a Resize but its data: per axis the input and output length, the
    scale and the crop box (start, end), and the attributes."""

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...]
    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False

    def resized_axes(self) -> list[int]:
        """The axes whose interpolation is not the identity."""
        return [a for a in range(len(self.in_shape))
                if not _identity(self, a)]


def _identity(spec: ResizeSpec, axis: int) -> bool:
    if spec.in_shape[axis] != spec.out_shape[axis] or spec.coordinates == "tf_crop_and_resize":
        return False
    if spec.scales[axis] == 1.0:
        return True
    # A scale other than 1 with equal lengths (sizes rounded): the coordinates still move,
    # except where the mode ignores the scale.
    return spec.coordinates == "align_corners"


def resize_spec(workload: Workload, inputs: Sequence[np.ndarray | None]) -> ResizeSpec:
    """The ResizeSpec of a Resize workload (opset 11 on); `inputs` holds at least the
    static roi, scales and sizes (input 0 may be anything: only the workload's shapes
    are read)."""
    in_shape = tuple(int(d) for d in workload.inputs[0].shape)
    out_shape = tuple(int(d) for d in workload.outputs[0].shape)
    rank = len(in_shape)
    axes = workload.attr("axes")
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    roi, scales, sizes = (_vector(inputs, i) for i in (1, 2, 3))
    per_axis = [1.0] * rank
    if scales is not None:
        for axis, scale in zip(axes, scales):
            per_axis[axis] = float(scale)
    elif sizes is not None:
        ratios = [float(size) / in_shape[axis] for axis, size in zip(axes, sizes)]
        policy = workload.text_attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(ratios)
        for axis, ratio in zip(axes, ratios):
            per_axis[axis] = ratio
    boxes = [(0.0, 1.0)] * rank
    if roi is not None and len(roi) == 2 * len(axes):
        for k, axis in enumerate(axes):
            boxes[axis] = (float(roi[k]), float(roi[k + len(axes)]))
    return ResizeSpec(
        in_shape, out_shape, tuple(per_axis), tuple(boxes),
        mode=workload.text_attr("mode", "nearest"),
        coordinates=workload.text_attr("coordinate_transformation_mode", "half_pixel"),
        nearest_mode=workload.text_attr("nearest_mode", "round_prefer_floor"),
        cubic_coeff_a=float(workload.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(workload.attr("exclude_outside", 0)),
        extrapolation_value=float(workload.attr("extrapolation_value", 0.0)),
        antialias=bool(workload.attr("antialias", 0)))


def static_resize_spec(workload: Workload) -> ResizeSpec:
    """The ResizeSpec of a Resize workload from its static roi, scales and sizes."""
    return resize_spec(workload, [None] + [workload.static_value(i)
                                           for i in range(1, len(workload.inputs))])


def _vector(inputs: Sequence[np.ndarray | None], index: int) -> np.ndarray | None:
    if index >= len(inputs) or inputs[index] is None:
        return None
    value = np.asarray(inputs[index]).ravel()
    return value if value.size else None


def source_coordinates(spec: ResizeSpec, axis: int, dtype=np.float64) -> np.ndarray:
    """The input coordinate of every output position along `axis`, computed in `dtype`."""
    length, size = dtype(spec.in_shape[axis]), spec.out_shape[axis]
    scale = dtype(spec.scales[axis])
    x = np.arange(size, dtype=dtype)
    mode = spec.coordinates
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = size / (scale * length)
        offset = length / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if size > 1 else np.zeros_like(x)
    if mode == "align_corners":   # the resized length unrounded, as ONNX's own cases expect
        resized = length * scale
        return x * (length - 1) / (resized - 1) if resized != 1 else np.zeros_like(x)
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = (dtype(v) for v in spec.roi[axis])
        if size > 1:
            return start * (length - 1) + x * (end - start) * (length - 1) / (size - 1)
        return np.full_like(x, 0.5 * (start + end) * (length - 1))
    return x / scale   # asymmetric


def _round(x: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "floor":
        return np.floor(x)
    if rounding == "ceil":
        return np.ceil(x)
    if rounding == "round_prefer_ceil":
        return np.floor(x + 0.5)
    return np.ceil(x - 0.5)   # round_prefer_floor


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False   # cached and shared: no caller may change it
    return array


@functools.lru_cache(maxsize=256)
def nearest_indices(spec: ResizeSpec, axis: int) -> np.ndarray:
    """The source index of every output position along `axis` in nearest mode (clipped
    to the input; tf_crop_and_resize's outside positions are masked separately). The
    coordinates are computed in float32, the scales' type, as onnxruntime does: at an exact
    rounding boundary (scale 0.6, half_pixel, floor) float64 picks the other element.
    Cached per spec: a kernel computes it once, not on every run."""
    x = _round(source_coordinates(spec, axis, np.float32), spec.nearest_mode)
    return _frozen(np.clip(x, 0, spec.in_shape[axis] - 1).astype(np.intp))


def nearest_source(size_in: int, size_out: int, scale: float, mode: str, rounding: str
                   ) -> np.ndarray:
    """The source index of every output position along one axis of a nearest-mode Resize
    (coordinate transformation `mode`, `nearest_mode` `rounding`)."""
    spec = ResizeSpec((size_in,), (size_out,), (scale,), ((0.0, 1.0),), coordinates=mode,
                      nearest_mode=rounding)
    return nearest_indices(spec, 0)


def is_index_copy(spec: ResizeSpec) -> bool:
    """Whether the Resize only copies elements (nearest, nothing extrapolated): an index
    gather per axis, as `numpy.copy` runs it."""
    return spec.mode == "nearest" and spec.coordinates != "tf_crop_and_resize"


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _kernel(spec: ResizeSpec, axis: int):
    """(tap offsets relative to floor(x), weight of a tap at distance d from x): linear's
    triangle or Keys' cubic, stretched by 1/scale when antialiasing a reduction."""
    stretch = min(spec.scales[axis], 1.0) if spec.antialias else 1.0
    support = 1.0 if spec.mode == "linear" else 2.0
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 2 - first)
    if spec.mode == "linear":
        return offsets, lambda d: np.maximum(0.0, 1 - np.abs(d * stretch))
    return offsets, lambda d: _cubic(d * stretch, spec.cubic_coeff_a)


@functools.lru_cache(maxsize=256)
def axis_weights(spec: ResizeSpec, axis: int) -> np.ndarray:
    """The (output length x input length) float64 interpolation matrix of `axis` (linear
    or cubic), cached per spec: a kernel builds it once, not on every run."""
    length, size = spec.in_shape[axis], spec.out_shape[axis]
    x = source_coordinates(spec, axis)
    matrix = np.zeros((size, length), dtype=np.float64)
    rows = np.arange(size)
    offsets, weight = _kernel(spec, axis)
    base = np.floor(x)
    taps = base[:, None] + offsets[None, :]             # (size, taps) input positions
    weights = weight(x[:, None] - taps)
    if spec.exclude_outside:
        weights = np.where((taps >= 0) & (taps <= length - 1), weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = weights / np.where(total == 0, 1.0, total)
    index = np.clip(taps, 0, length - 1).astype(np.intp)   # edge taps repeat the edge
    np.add.at(matrix, (np.broadcast_to(rows[:, None], index.shape), index), weights)
    return _frozen(matrix)


@functools.lru_cache(maxsize=64)
def _outside(spec: ResizeSpec) -> np.ndarray | None:
    """tf_crop_and_resize: the output positions whose source lies outside the input on
    some axis (they take extrapolation_value), broadcastable to the output; None if none."""
    outside = None
    for axis in range(len(spec.in_shape)):
        mask = outside_along(spec, axis).reshape(
            [-1 if a == axis else 1 for a in range(len(spec.in_shape))])
        outside = mask if outside is None else outside | mask
    return None if outside is None or not outside.any() else _frozen(outside)


def outside_along(spec: ResizeSpec, axis: int) -> np.ndarray:
    """True where tf_crop_and_resize's source coordinate of an output position along `axis`
    lies outside the input (the position takes extrapolation_value); all False for the
    other coordinate modes."""
    if spec.coordinates != "tf_crop_and_resize":
        return np.zeros(spec.out_shape[axis], bool)
    x = source_coordinates(spec, axis)
    return (x < 0) | (x > spec.in_shape[axis] - 1)


def _along(x: np.ndarray, matrix: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(moved @ matrix.T.astype(x.dtype, copy=False), -1, axis)


def resize(spec: ResizeSpec, x: np.ndarray) -> np.ndarray:
    """Resize `x` (of spec.in_shape) to spec.out_shape, in x's float dtype."""
    y = x
    for axis in spec.resized_axes():
        if spec.mode == "nearest":
            y = np.take(y, nearest_indices(spec, axis), axis=axis)
        else:
            y = _along(y, axis_weights(spec, axis), axis)
    outside = _outside(spec) if spec.coordinates == "tf_crop_and_resize" else None
    if outside is not None:
        y = np.where(outside, np.asarray(spec.extrapolation_value, y.dtype), y)
    return np.ascontiguousarray(y)
