"""Convolution with numpy and BLAS: im2col + matmul, 1x1 as a plain matmul, depthwise direct.

`prepare` packs the weights once as [group, M/group, C/group * prod(kernel)]
matrices and allocates the scratch buffers (zero-bordered padded input,
column matrix) that every call reuses; those never alias the caller's arrays.
Strategies (the `strategy` config; `auto` picks by shape):

- `pointwise`: 1x1 kernel, stride 1, no padding: W @ X[n] straight into the output.
- `im2col`: windows copied into a column matrix, then one GEMM per group.
- `depthwise`: one input channel per group: a multiply-add over kernel taps on
  strided views of the padded input, no column matrix at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.library import NumpyImplementation, finish_epilogue
from wpk.kernels.cpu.window import WindowGeometry, window_geometry, windows
from wpk.kernels.registry import Kernel, register


def _strategy(workload: Workload, geom: WindowGeometry) -> str:
    channels = workload.inputs[0].shape[1]
    group = int(workload.attr("group", 1))
    if group == channels and group > 1:
        return "depthwise"
    if geom.is_identity_window:
        return "pointwise"
    return "im2col"


_ALGORITHMS = {"depthwise": "depthwise", "pointwise": "1x1 gemm", "im2col": "im2col gemm"}


class _PaddedInput:
    """A reusable zero-bordered buffer holding the input at its interior."""

    def __init__(self, shape: tuple[int, ...], geom: WindowGeometry, dtype: np.dtype):
        self.needed = any(geom.pads_begin) or any(e > 0 for e in geom.cover_end)
        if not self.needed:
            return
        rank = len(geom.kernel)
        padded = tuple(i + b + max(e, 0)
                       for i, b, e in zip(geom.in_size, geom.pads_begin, geom.cover_end))
        self.buffer = np.zeros(tuple(shape[:-rank]) + padded, dtype=dtype)
        self.interior = self.buffer[(Ellipsis,) + tuple(
            slice(b, b + i) for b, i in zip(geom.pads_begin, geom.in_size))]

    def fill(self, x: np.ndarray) -> np.ndarray:
        if not self.needed:
            return x
        np.copyto(self.interior, x)
        return self.buffer


class NumpyConv(NumpyImplementation):
    """Conv (any rank, groups, stride, dilation, pads, auto_pad) with bias and epilogue."""

    name = "numpy.conv"
    ops = ("Conv",)

    def configs(self, workload: Workload) -> list[dict]:
        geom = window_geometry(workload, tuple(workload.inputs[1].shape[2:]))
        best = _strategy(workload, geom)
        return [{"strategy": best}] if best != "depthwise" else [{"strategy": "depthwise"},
                                                                 {"strategy": "im2col"}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """Its strategy: 'depthwise', '1x1 gemm' (pointwise) or 'im2col gemm'."""
        return _ALGORITHMS.get(config.get("strategy", ""), self.name)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        dtype = np.dtype(workload.outputs[0].dtype)
        x_shape, w_shape = workload.inputs[0].shape, workload.inputs[1].shape
        kernel_shape = tuple(w_shape[2:])
        geom = window_geometry(workload, kernel_shape)
        strategy = config.get("strategy") or _strategy(workload, geom)
        if strategy == "pointwise" and not geom.is_identity_window:
            strategy = "im2col"
        group = int(workload.attr("group", 1))
        n, c, m = x_shape[0], x_shape[1], w_shape[0]
        cg, mg = c // group, m // group
        taps = int(np.prod(kernel_shape, dtype=np.int64))
        pixels = int(np.prod(geom.out_size, dtype=np.int64))
        rank = len(kernel_shape)
        has_bias = self.core_inputs(workload) > 2 and workload.inputs[2] is not None
        steps = workload.epilogue

        def pack(w):
            if strategy == "depthwise":   # [C, taps, 1, ..] per channel multiplier
                return np.ascontiguousarray(
                    np.asarray(w, dtype=dtype).reshape((m, taps) + (1,) * rank))
            return np.ascontiguousarray(np.asarray(w, dtype=dtype).reshape(group, mg, cg * taps))

        def pack_bias(b):
            return np.asarray(b, dtype=dtype).reshape((m,) + (1,) * rank)

        packed_w = pack(consts[1]) if 1 in consts else None
        packed_b = pack_bias(consts[2]) if has_bias and 2 in consts else None
        padded = _PaddedInput(x_shape, geom, dtype)

        if strategy == "depthwise":
            body = self._depthwise(geom, n, m, mg, dtype)
        elif strategy == "pointwise":
            def body(x, w, out):
                for i in range(n):
                    x_i = x[i].reshape(group, cg, pixels)
                    y_i = out[i].reshape(group, mg, pixels)
                    for g in range(group):
                        np.matmul(w[g], x_i[g], out=y_i[g])
        else:
            cols = np.empty((c,) + kernel_shape + geom.out_size, dtype=dtype)
            cols_matrix = cols.reshape(group, cg * taps, pixels)
            order = (0,) + tuple(range(1 + rank, 1 + 2 * rank)) + tuple(range(1, 1 + rank))

            def body(x, w, out):
                view = windows(x, geom)                       # [N, C, *out, *kernel]
                for i in range(n):
                    np.copyto(cols, view[i].transpose(order))
                    y_i = out[i].reshape(group, mg, pixels)
                    for g in range(group):
                        np.matmul(w[g], cols_matrix[g], out=y_i[g])

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            w = packed_w if packed_w is not None else pack(inputs[1])
            body(padded.fill(inputs[0]), w, out)
            if has_bias:
                out += packed_b if packed_b is not None else pack_bias(inputs[2])
            finish_epilogue(out, steps, inputs)

        return kernel

    @staticmethod
    def _depthwise(geom: WindowGeometry, n: int, m: int, multiplier: int, dtype: np.dtype):
        """Multiply-add over kernel taps; `multiplier` output channels per input channel."""
        out_shape = (n, m) + geom.out_size
        scratch = np.empty(out_shape, dtype=dtype)
        tap_slices = []
        for tap in np.ndindex(*geom.kernel):
            tap_slices.append((Ellipsis,) + tuple(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(tap, geom.dilations, geom.out_size, geom.strides)))

        def body(x, w, out):
            if multiplier > 1:
                x = np.repeat(x, multiplier, axis=1)
            for k, index in enumerate(tap_slices):
                if k == 0:
                    np.multiply(x[index], w[:, 0], out=out)
                else:
                    np.multiply(x[index], w[:, k], out=scratch)
                    out += scratch

        return body


NUMPY_CONV = register(NumpyConv())
