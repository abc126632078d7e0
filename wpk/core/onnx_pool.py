"""MaxPool, AveragePool and LpPool for `onnx.reference.ReferenceEvaluator`, computed here.

wpk evaluates shapes, folds constants and references nodes with onnx.reference
(`wpk.core.onnx_quantize.REFERENCE_OPS`), whose pooling (onnx 1.23) is wrong in many
cases that onnxruntime and torch compute alike. Found by the passes' fuzzer
(`tests/fuzzing/mutations.py`) and then by `scripts/pool_grids.py`:

- a MaxPool at unit strides with `ceil_mode` counts its pads twice: a 5x5 pool with pads 2
  over a 2x2 image gives 6x6 (the spec and onnxruntime: 2x2); a YOLO whose SPPF pool had
  `ceil_mode` set could not have its shapes evaluated ("cannot determine the shapes ...");
- `ceil_mode` pools whose last window reaches past the end padding shift every window's
  sum: an AveragePool over 1..7 with kernel 3 and stride 3 gives (1.5, 4, 6) for the
  spec's (2, 5, 7); LpPool likewise;
- uneven pads, dilations, 1-D pools and `auto_pad` give wrong output sizes or values, or
  raise (IndexError, ValueError), with or without `ceil_mode`.

So the three pools are computed here with numpy (`pool`): the input padded, each window
reduced over the elements it covers (max; a sum divided by its count of input elements,
or of input and pad elements with `count_include_pad`; the p-norm), the output size the
spec's (`pool_size`: rounded down, or up with `ceil_mode`, a last window that would start
in the end padding dropped). Elements a rounded-up window reaches past the end padding
count as neither input nor pad. `auto_pad` SAME_UPPER/SAME_LOWER gives the spec's pads
(`auto_pads`), split as onnxruntime splits them (toward zero: a negative total crops the
input of an AveragePool or LpPool; onnxruntime refuses it in a MaxPool, which clamps it at
zero here, as wpk's MaxPool kernels do); onnxruntime leaves dilations out of SAME's pads,
the spec and this module do not.
MaxPool's optional Indices output stays onnx.reference's.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.ops.op_average_pool import AveragePool_19
from onnx.reference.ops.op_lp_pool import LpPool as ReferenceLpPool
from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool


class MaxPool(ReferenceMaxPool):
    """MaxPool computed by `pool` where it has explicit pads and one output."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             pads=None, storage_order=None, strides=None):
        if len(self.output) == 1:   # SAME pads below zero clamped (onnxruntime refuses them)
            pads = [max(0, p) for p in _pads(auto_pad, pads, x, kernel_shape, strides,
                                             dilations) or []] or None
            return (pool(x, "max", kernel_shape, strides, dilations, pads, ceil_mode),)
        if ceil_mode and (strides is None or all(s == 1 for s in strides)):
            ceil_mode = 0   # no size changes at unit strides; onnx.reference's is wrong
        return super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                            kernel_shape=kernel_shape, pads=pads,
                            storage_order=storage_order, strides=strides)


class AveragePool(AveragePool_19):
    """AveragePool computed by `pool` where it has explicit pads."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             pads=None, strides=None, count_include_pad=None):
        pads = _pads(auto_pad, pads, x, kernel_shape, strides, dilations)
        return (pool(x, "average", kernel_shape, strides, dilations, pads, ceil_mode,
                     count_include_pad=bool(count_include_pad)),)


class LpPool(ReferenceLpPool):
    """LpPool computed by `pool` where it has explicit pads."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             p=2, pads=None, strides=None, count_include_pad=None):
        pads = _pads(auto_pad, pads, x, kernel_shape, strides, dilations)
        return (pool(x, "lp", kernel_shape, strides, dilations, pads, ceil_mode, p=p),)


def _pads(auto_pad, pads, x: np.ndarray, kernel, strides, dilations) -> list[int] | None:
    """The node's pads, or those its `auto_pad` gives."""
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in (None, "", "NOTSET"):
        return pads
    return auto_pads(auto_pad, x.shape[2:], kernel, strides, dilations)


def auto_pads(auto_pad: str, spatial, kernel, strides=None, dilations=None) -> list[int]:
    """The explicit pads (begins, then ends) of `auto_pad` SAME_UPPER, SAME_LOWER or VALID,
    as onnxruntime's pools take them: SAME gives ceil(size / stride) outputs, the total
    halved toward zero, the odd pad at the end (UPPER) or begin; negative where the total
    is (the window shorter than the stride: the input cropped)."""
    rank = len(kernel)
    strides, dilations = list(strides or [1] * rank), list(dilations or [1] * rank)
    begins, ends = [0] * rank, [0] * rank
    if auto_pad.startswith("SAME"):
        for a, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            total = (-(-n // s) - 1) * s + d * (k - 1) + 1 - n   # < 0: the input cropped
            # halved toward zero, as onnxruntime splits a negative total too
            begins[a] = int(total / 2) if auto_pad == "SAME_UPPER" else int((total + 1) / 2)
            ends[a] = total - begins[a]
    return begins + ends


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


def pool_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
              dilation: int, ceil_mode: bool) -> int:
    """One axis' output size (at least 0)."""
    if ceil_mode:
        out = spec_pool_size(size, kernel, stride, pad_begin, pad_end, dilation)
    else:
        out = (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1
    return max(0, out)


def pool(x: np.ndarray, kind: str, kernel, strides=None, dilations=None, pads=None,
         ceil_mode=0, count_include_pad: bool = False, p: int = 2) -> np.ndarray:
    """A pool ("max", "average" or "lp") of `x` (N, C, *spatial) as onnxruntime and torch
    compute it (module docstring)."""
    rank = len(kernel)
    strides, dilations = list(strides or [1] * rank), list(dilations or [1] * rank)
    pads = list(pads or [0] * (2 * rank))
    for a in range(rank):   # a negative pad (auto_pad SAME) crops the input there
        if pads[a] < 0 or pads[a + rank] < 0:
            x = x[(..., slice(max(0, -pads[a]), x.shape[2 + a] - max(0, -pads[a + rank])),
                   *[slice(None)] * (rank - 1 - a))]
            pads[a], pads[a + rank] = max(0, pads[a]), max(0, pads[a + rank])
    spatial = x.shape[2:]
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    outs = [pool_size(n, k, s, pads[a], pads[a + rank], d, bool(ceil_mode))
            for a, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations))]
    # the input at its begin pads' offset, in a frame long enough for every window
    lengths = [max((o - 1) * s + e, pads[a] + n, e)
               for a, (o, s, e, n) in enumerate(zip(outs, strides, extents, spatial))]
    if kind == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        framed = np.full((*x.shape[:2], *lengths), fill, dtype=x.dtype)
    else:
        framed = np.zeros((*x.shape[:2], *lengths), dtype=x.dtype)
    framed[(..., *(slice(pads[a], pads[a] + n) for a, n in enumerate(spatial)))] = \
        np.abs(x) ** p if kind == "lp" else x
    windows = _windows(framed, extents, dilations, strides, outs)
    axes = tuple(range(-rank, 0))
    if kind == "max":
        return windows.max(axis=axes) if windows.size else windows.sum(axis=axes)
    total = windows.sum(axis=axes)
    if kind == "lp":
        return (total ** (1.0 / p)).astype(x.dtype)
    return (total / _counts(spatial, pads, lengths, extents, dilations, strides, outs,
                            count_include_pad, x.dtype)).astype(x.dtype)


def _counts(spatial, pads, lengths, extents, dilations, strides, outs, count_include_pad,
            dtype) -> np.ndarray:
    """Each window's count of input elements (or input and pad elements): the product of
    its axes' counts."""
    rank = len(spatial)
    counts = np.ones((), dtype=dtype)
    for a, n in enumerate(spatial):
        inside = np.zeros(lengths[a], dtype=dtype)
        begin, end = (0, pads[a] + n + pads[a + rank]) if count_include_pad \
            else (pads[a], pads[a] + n)
        inside[begin:end] = 1
        along = _windows(inside, extents[a:a + 1], dilations[a:a + 1], strides[a:a + 1],
                         outs[a:a + 1]).sum(axis=-1)
        counts = np.multiply.outer(counts, along)
    return counts


def _windows(array: np.ndarray, extents, dilations, strides, outs) -> np.ndarray:
    """The windows of the last len(extents) axes: `outs` of them at `strides`, each of
    its `extents` every `dilations` element; the window's axes last."""
    rank = len(extents)
    axes = tuple(range(array.ndim - rank, array.ndim))
    view = sliding_window_view(array, extents, axis=axes)
    return view[(..., *(slice(0, o * s, s) for o, s in zip(outs, strides)),
                 *(slice(None, None, d) for d in dilations))]
