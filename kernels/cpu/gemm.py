"""Gemm and MatMul through numpy's BLAS (`np.matmul(..., out=)`), epilogue in place.

Constant right-hand matrices are pre-packed in `prepare`: laid out as BLAS reads them
fastest and, for Gemm, pre-scaled by alpha; a constant C is pre-scaled by beta. The
layout depends on the product's rows (`single_row_layout`): with several, B as [K, N]
rows; with one (a batch-1 classifier), B as [N, K] rows, handed to BLAS as a transposed
view, so its matrix-vector product reads each output's weights as one contiguous row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.library import NumpyImplementation, finish_epilogue
from wpk.kernels.registry import Kernel, register

# The side of the square tiles `transposed` copies: a tile's rows and columns stay in cache.
TRANSPOSE_TILE = 256


def transposed(matrix: np.ndarray) -> np.ndarray:
    """A new C-contiguous array holding `matrix.T` (2-d), copied tile by tile. numpy's copy
    of a transposed view walks the source down its columns, a cache miss per value on a
    large matrix: VGG-19's 4096 x 25088 classifier weight took 2.1 s, in 256 x 256 tiles
    0.39 s (every build prepares it once per measurement of a BLAS candidate)."""
    rows, cols = matrix.shape
    out = np.empty((cols, rows), matrix.dtype)
    for i in range(0, rows, TRANSPOSE_TILE):
        for j in range(0, cols, TRANSPOSE_TILE):
            out[j:j + TRANSPOSE_TILE, i:i + TRANSPOSE_TILE] = \
                matrix[i:i + TRANSPOSE_TILE, j:j + TRANSPOSE_TILE].T
    return out


def single_row_layout(b: np.ndarray, b_is_transposed: bool) -> np.ndarray:
    """The [K, N] operand of a one-row product as a transposed view of an [N, K] C-contiguous
    array: `b` itself when it is given transposed (no copy), else a tiled transpose. One row
    times [K, N] rows walks B as N-long axpys; as [N, K] rows it is N contiguous dot
    products, 1.2-1.8x faster in OpenBLAS's sgemv for the classifiers measured (4096 x 1000,
    3072 x 768; as fast for 25088 x 4096), while with 4 rows or more the [K, N] layout is
    up to 1.4x faster. `b` is [N, K] when `b_is_transposed`, else [K, N]."""
    rows = np.ascontiguousarray(b) if b_is_transposed else transposed(b)
    return rows.T


class NumpyGemm(NumpyImplementation):
    """Y = alpha * op(A) @ op(B) + beta * C with BLAS, then the epilogue."""

    name = "numpy.gemm"
    ops = ("Gemm",)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "gemm (BLAS)"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        trans_a = bool(workload.attr("transA", 0))
        trans_b = bool(workload.attr("transB", 0))
        alpha = float(workload.attr("alpha", 1.0))
        beta = float(workload.attr("beta", 1.0))
        dtype = np.dtype(workload.outputs[0].dtype)
        has_c = len(workload.inputs) > 2 and workload.inputs[2] is not None
        core_c = has_c and self.core_inputs(workload) > 2
        steps = workload.epilogue

        packed_b = None
        one_row = workload.outputs[0].shape[0] == 1
        if 1 in consts and one_row:
            b = np.asarray(consts[1], dtype=dtype)
            packed_b = single_row_layout(b if alpha == 1.0 else b * dtype.type(alpha), trans_b)
        elif 1 in consts:   # one copy at most (a big FC weight is hundreds of MB)
            b = np.asarray(consts[1], dtype=dtype)
            if trans_b:
                packed_b = transposed(b)   # a new array: scaled in place
                if alpha != 1.0:
                    packed_b *= dtype.type(alpha)
            else:
                packed_b = np.ascontiguousarray(b if alpha == 1.0 else b * dtype.type(alpha))
        packed_c = None
        if core_c and 2 in consts:
            c = np.asarray(consts[2], dtype=dtype)
            packed_c = np.ascontiguousarray(c if beta == 1.0 else c * dtype.type(beta))

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            a = inputs[0].T if trans_a else inputs[0]
            if packed_b is not None:
                np.matmul(a, packed_b, out=out)
            else:
                np.matmul(a, inputs[1].T if trans_b else inputs[1], out=out)
                if alpha != 1.0:
                    out *= dtype.type(alpha)
            if core_c:
                if packed_c is not None:
                    out += packed_c
                elif beta == 1.0:
                    out += inputs[2]
                else:
                    out += dtype.type(beta) * inputs[2]
            finish_epilogue(out, steps, inputs)

        return kernel


class NumpyMatMul(NumpyImplementation):
    """np.matmul into the output (batched and broadcast as ONNX MatMul), then the epilogue."""

    name = "numpy.matmul"
    ops = ("MatMul",)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "gemm (BLAS)"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        dtype = np.dtype(workload.outputs[0].dtype)
        steps = workload.epilogue
        packed_b = None
        if 1 in consts:
            b = np.asarray(consts[1], dtype=dtype)
            one_row = b.ndim == 2 and math.prod(workload.inputs[0].shape[:-1]) == 1
            packed_b = single_row_layout(b, False) if one_row else np.ascontiguousarray(b)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            b = packed_b if packed_b is not None else inputs[1]
            np.matmul(inputs[0], b, out=outputs[0])
            finish_epilogue(outputs[0], steps, inputs)

        return kernel


NUMPY_GEMM = register(NumpyGemm())
NUMPY_MATMUL = register(NumpyMatMul())
