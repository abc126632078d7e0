"""Gemm and MatMul through numpy's BLAS (`np.matmul(..., out=)`), epilogue in place.

Constant right-hand matrices are pre-packed in `prepare`: transposed to the
layout BLAS reads fastest and, for Gemm, pre-scaled by alpha; a constant C is
pre-scaled by beta.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.library import NumpyImplementation, finish_epilogue
from wpk.kernels.registry import Kernel, register


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
        if 1 in consts:   # one copy at most (a big FC weight is hundreds of MB)
            b = np.asarray(consts[1], dtype=dtype)
            b = b.T if trans_b else b
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
        packed_b = (np.ascontiguousarray(np.asarray(consts[1], dtype=dtype))
                    if 1 in consts else None)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            b = packed_b if packed_b is not None else inputs[1]
            np.matmul(inputs[0], b, out=outputs[0])
            finish_epilogue(outputs[0], steps, inputs)

        return kernel


NUMPY_GEMM = register(NumpyGemm())
NUMPY_MATMUL = register(NumpyMatMul())
