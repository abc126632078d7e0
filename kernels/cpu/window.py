"""Sliding-window geometry shared by convolution and pooling (pads, auto_pad, ceil_mode),
and where a ConvTranspose's output starts in its full result (`conv_transpose_begin_pads`).

Output shapes come from the workload (shape inference already settled
ceil_mode and auto_pad), so the helpers here only need to find where the
first window starts and how much the input must be padded at each end so
that exactly the requested number of windows fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from wpk.core.workload import Workload


@dataclass(frozen=True)
class WindowGeometry:
    """Per spatial dimension: kernel, stride, dilation, pads, input and output sizes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]        # the declared end pads (for count_include_pad)
    cover_end: tuple[int, ...]       # end pads (may be negative) so the output windows fit exactly
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]

    @property
    def extent(self) -> tuple[int, ...]:
        """The span of one dilated window."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def is_identity_window(self) -> bool:
        """1x1 kernel, stride 1, no padding: the window view is the input itself."""
        return (all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides)
                and not any(self.pads_begin) and not any(self.cover_end))


def window_geometry(workload: Workload, kernel: tuple[int, ...]) -> WindowGeometry:
    """The window geometry of a Conv or pooling workload over input 0's spatial dims."""
    in_size = tuple(workload.inputs[0].shape[2:])
    out_size = tuple(workload.outputs[0].shape[2:])
    rank = len(in_size)
    strides = tuple(workload.attr("strides") or (1,) * rank)
    dilations = tuple(workload.attr("dilations") or (1,) * rank)
    auto_pad = workload.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = [max((o - 1) * s + e - i, 0)
                  for o, s, e, i in zip(out_size, strides, extent, in_size)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in totals]
        else:
            begin = [(t + 1) // 2 for t in totals]
        end = [t - b for t, b in zip(totals, begin)]
    elif auto_pad == "VALID":
        begin, end = [0] * rank, [0] * rank
    else:
        pads = tuple(workload.attr("pads") or (0,) * (2 * rank))
        begin, end = list(pads[:rank]), list(pads[rank:])
    cover = [(o - 1) * s + e - i - b
             for o, s, e, i, b in zip(out_size, strides, extent, in_size, begin)]
    return WindowGeometry(tuple(kernel), strides, dilations, tuple(begin), tuple(end),
                          tuple(cover), in_size, out_size)


def pad_spatial(x: np.ndarray, geom: WindowGeometry, value: float) -> np.ndarray:
    """`x` padded (or cropped) on its spatial dims so the output windows fit exactly."""
    rank = len(geom.kernel)
    lead = x.ndim - rank
    widths = [(0, 0)] * lead + [(b, max(e, 0)) for b, e in zip(geom.pads_begin, geom.cover_end)]
    if any(w != (0, 0) for w in widths):
        x = np.pad(x, widths, constant_values=value)
    if any(e < 0 for e in geom.cover_end):
        crop = tuple(slice(None) for _ in range(lead)) + tuple(
            slice(None, x.shape[lead + k] + e if e < 0 else None)
            for k, e in enumerate(geom.cover_end))
        x = x[crop]
    return x


def windows(xp: np.ndarray, geom: WindowGeometry) -> np.ndarray:
    """A strided view [..., *out_size, *kernel] of the windows of a padded input."""
    rank = len(geom.kernel)
    axes = tuple(range(xp.ndim - rank, xp.ndim))
    view = sliding_window_view(xp, geom.extent, axis=axes)
    lead = xp.ndim - rank
    index = (tuple(slice(None) for _ in range(lead))
             + tuple(slice(None, None, s) for s in geom.strides)
             + tuple(slice(None, None, d) for d in geom.dilations))
    view = view[index]
    out_index = (tuple(slice(None) for _ in range(lead))
                 + tuple(slice(0, o) for o in geom.out_size))
    return view[out_index]


def conv_transpose_begin_pads(workload: Workload) -> tuple[int, ...]:
    """The begin pads of a ConvTranspose: its `pads`, or, with `output_shape` or auto_pad
    SAME_UPPER/SAME_LOWER, the spec's split of the total padding (the full result
    stride x (in - 1) + output_padding + dilated kernel, less the output size): half of it,
    rounded down, at the begin for SAME_UPPER, the rest for the others."""
    x, w = workload.inputs[0].shape, workload.inputs[1].shape
    rank = len(x) - 2
    auto_pad = workload.text_attr("auto_pad", "NOTSET")
    if workload.attr("output_shape") is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return tuple(workload.attr("pads") or (0,) * (2 * rank))[:rank]
    strides = tuple(workload.attr("strides") or (1,) * rank)
    dilations = tuple(workload.attr("dilations") or (1,) * rank)
    extra = tuple(workload.attr("output_padding") or (0,) * rank)
    begin = []
    for size, stride, k, d, e, out in zip(x[2:], strides, w[2:], dilations, extra,
                                          workload.outputs[0].shape[2:]):
        total = stride * (size - 1) + e + (k - 1) * d + 1 - out
        begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return tuple(begin)


def pads_2d(workload: Workload, kernel: tuple[int, int]):
    """(pad_t, pad_l, pad_b, pad_r, strides, dilations) giving exactly the output size."""
    geom = window_geometry(workload, kernel)
    # The declared end pads, unless ceil_mode windows reach further (then exactly those).
    ends = tuple(max(c, e) for c, e in zip(geom.cover_end, geom.pads_end))
    for size, begin, end, ext, stride, out in zip(geom.in_size, geom.pads_begin, ends,
                                                  geom.extent, geom.strides, geom.out_size):
        if (size + begin + end - ext) // stride + 1 != out:
            return None
    return (*geom.pads_begin, *ends), geom
