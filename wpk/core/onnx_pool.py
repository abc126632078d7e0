"""`MaxPool` for `onnx.reference.ReferenceEvaluator`, its ceil_mode at unit strides mended.

onnx.reference (1.23) computes a MaxPool whose strides are all 1 with `ceil_mode=1` as if
its pads counted twice: a 5x5 pool with pads 2 over a 2x2 image gives 6x6, where the ONNX
spec and onnxruntime give 2x2. At unit strides the output size
`(in + pads - dilation * (kernel - 1) - 1) / 1 + 1` is a whole number, so rounding it up
or down is the same: `ceil_mode` changes nothing there, and this MaxPool evaluates such a
node without it. Found by the passes' fuzzer (`tests/fuzzing/mutations.py`): a YOLO whose
SPPF MaxPool had `ceil_mode` set could not have its shapes evaluated ("cannot determine
the shapes ...") while onnxruntime ran it.

Its `AveragePool` with `ceil_mode` set is wrong in values wherever the rounded-up last
window reaches past the end padding: over 1..7 with kernel 3 and stride 3 it gives
(1.5, 4, 6) where the spec, onnxruntime and torch give (2, 5, 7) (every window's sum
shifted). wpk folds constants and references nodes with it, so `AveragePool` here
computes those pools itself: each window summed over the input it covers, divided by the
count of its elements in the input (`count_include_pad` 0) or in the input and its pads
(1); the output size is the spec's (`spec_pool_size`).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.ops.op_average_pool import AveragePool_19
from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool


class MaxPool(ReferenceMaxPool):
    """onnx.reference's MaxPool, `ceil_mode` dropped where every stride is 1."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             pads=None, storage_order=None, strides=None):
        if ceil_mode and (strides is None or all(s == 1 for s in strides)):
            ceil_mode = 0
        return super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                            kernel_shape=kernel_shape, pads=pads,
                            storage_order=storage_order, strides=strides)


class AveragePool(AveragePool_19):
    """onnx.reference's AveragePool, computed here where `ceil_mode` is set with explicit
    pads (module docstring)."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             pads=None, strides=None, count_include_pad=None):
        if not ceil_mode or auto_pad not in (None, "NOTSET", b"NOTSET"):
            return super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                dilations=dilations, kernel_shape=kernel_shape, pads=pads,
                                strides=strides, count_include_pad=count_include_pad)
        rank = len(kernel_shape)
        return (ceil_mode_average_pool(x, list(kernel_shape), list(strides or [1] * rank),
                                       list(dilations or [1] * rank),
                                       list(pads or [0] * (2 * rank)),
                                       bool(count_include_pad)),)


def spec_pool_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                   dilation: int = 1) -> int:
    """One axis' output size of a pool with `ceil_mode` set, as the ONNX spec (and
    onnxruntime) computes it: rounded up, the last window dropped when it would start in
    the end padding."""
    out = rounded_up_pool_size(size, dilation * (kernel - 1) + 1, stride, pad_begin + pad_end)
    if (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def rounded_up_pool_size(size: int, extent: int, stride: int, pads: int) -> int:
    """The output size ONNX's inference gives a `ceil_mode` pool (no window dropped)."""
    return -(-(size + pads - extent) // stride) + 1


def ceil_mode_average_pool(x: np.ndarray, kernel: list[int], strides: list[int],
                           dilations: list[int], pads: list[int],
                           count_include_pad: bool) -> np.ndarray:
    """AveragePool of `x` (N, C, *spatial) with `ceil_mode` set, as onnxruntime and torch
    compute it: a window's elements past the end padding count as neither input nor pad."""
    rank = len(kernel)
    spatial = x.shape[2:]
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    outs = [max(0, spec_pool_size(n, k, s, pads[a], pads[a + rank], d))   # 0: no window fits
            for a, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations))]
    # zeros around x, long enough for every window (and never shorter than x's end)
    lengths = [max((o - 1) * s + e, pads[a] + n, e)
               for a, (o, s, e, n) in enumerate(zip(outs, strides, extents, spatial))]
    padded = np.zeros((*x.shape[:2], *lengths), dtype=x.dtype)
    padded[(..., *(slice(pads[a], pads[a] + n) for a, n in enumerate(spatial)))] = x
    total = _window_sums(padded, extents, dilations, strides, outs)
    counts = np.ones((), dtype=x.dtype)
    for a, n in enumerate(spatial):   # a window's count is the product of its axes' counts
        inside = np.zeros(lengths[a], dtype=x.dtype)
        end = pads[a] + n + pads[a + rank] if count_include_pad else pads[a] + n
        inside[0 if count_include_pad else pads[a]:end] = 1
        along = _window_sums(inside, extents[a:a + 1], dilations[a:a + 1], strides[a:a + 1],
                             outs[a:a + 1])
        counts = np.multiply.outer(counts, along)
    return (total / counts).astype(x.dtype)


def _window_sums(array: np.ndarray, extents, dilations, strides, outs) -> np.ndarray:
    """Sums of the last len(extents) axes' windows (extent, dilation), `outs` of them at
    `strides`."""
    rank = len(extents)
    axes = tuple(range(array.ndim - rank, array.ndim))
    windows = sliding_window_view(array, extents, axis=axes)
    picked = windows[(..., *(slice(0, o * s, s) for o, s in zip(outs, strides)),
                      *(slice(None, None, d) for d in dilations))]
    return picked.sum(axis=tuple(range(-rank, 0)))
