"""`layernorm.c`: LayerNormalization as one C kernel, a row at a time.

ONNX's LayerNormalization normalizes each row of the trailing axes (from `axis` on) to zero
mean and unit variance, then scales and shifts it element by element. As a generated DSL
operator it is three stages (mean, variance, normalize), each an OpenMP region of its own
that reads the whole tensor: ViT's 197 x 192 took 28 us a call on 2 threads, as long as
onnxruntime's kernel, where the data is 150 KB. Here a thread takes rows in chunks and
does all three passes on a row while it is in L1 (the mean, the variance of the centred
row -- two passes, as the float64 reference, so no cancellation --, then the output),
the sums vectorised by `omp simd` reductions. One OpenMP region, or none (`par` 0: the
calling thread, for small tensors). The kernel joins the plan's native chain. The same
kernel computes wpk's RMSNorm (`rms_norm_spec`: no mean; the sum of squares, then the
output).
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.rms_norm_spec import is_rms_norm, rms_norm_reason
from wpk.kernels.generated_ops import strip_leading_ones
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

# Chunks of rows per core (dynamic: a descheduled vCPU holds up one chunk, not a share).
CHUNKS_PER_CORE = 4

_SOURCE = r"""
#include <math.h>

#define ROWS {rows}L
#define D {d}L
#define CHUNK {chunk}L
#define PAR {par}
#define HAS_BIAS {has_bias}
#define RMS {rms}
static const float EPS = {eps!r}f;

void wpk_layernorm(const float *restrict x, const float *restrict gamma,
                   const float *restrict beta, float *restrict y) {{
    #pragma omp parallel for schedule(dynamic, 1) if (PAR)
    for (long c = 0; c < ROWS; c += CHUNK) {{
        long end = c + CHUNK < ROWS ? c + CHUNK : ROWS;
        for (long r = c; r < end; ++r) {{
            const float *restrict xr = x + r * D;
            float *restrict yr = y + r * D;
#if RMS
            const float mean = 0.0f;   /* RMSNorm: no centring */
#else
            float sum = 0.0f;
            #pragma omp simd reduction(+:sum)
            for (long i = 0; i < D; ++i) sum += xr[i];
            const float mean = sum / (float)D;
#endif
            float squares = 0.0f;
            #pragma omp simd reduction(+:squares)
            for (long i = 0; i < D; ++i) {{
                const float t = xr[i] - mean;
                squares += t * t;
            }}
            const float inv = 1.0f / sqrtf(squares / (float)D + EPS);
            #pragma omp simd
            for (long i = 0; i < D; ++i)
                yr[i] = (xr[i] - mean) * inv * gamma[i] + (HAS_BIAS ? beta[i] : 0.0f);
        }}
    }}
}}
"""


def geometry(workload: Workload) -> tuple[int, int]:
    """(rows, d): the rows normalized and their length (the axes from `axis` on)."""
    x = workload.inputs[0].shape
    axis = int(workload.attr("axis", -1)) % len(x)
    return math.prod(x[:axis]), math.prod(x[axis:])


def layernorm_reason(workload: Workload) -> str | None:
    """None when `layernorm.c` computes the workload, else why not."""
    if is_rms_norm(workload):
        reason = rms_norm_reason(workload)
        if reason is None and workload.inputs[0].dtype != "float32":
            return "layernorm.c computes float32 only"
        return reason
    if workload.op != "LayerNormalization" or workload.domain not in ("", "ai.onnx"):
        return "layernorm.c computes ONNX LayerNormalization only (and wpk's RMSNorm)"
    inputs = workload.inputs
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None or not inputs[0].shape:
        return "LayerNormalization takes X and Scale"
    if any(s is not None and s.dtype != "float32" for s in (*inputs, *workload.outputs)):
        return "layernorm.c computes float32 only"
    if len(workload.outputs) != 1 or workload.epilogue:
        return "layernorm.c writes Y only (no Mean/InvStdDev outputs, no fused epilogue)"
    x = inputs[0].shape
    axis = int(workload.attr("axis", -1))
    if not -len(x) <= axis < len(x):
        return f"axis {axis} is out of range for rank {len(x)}"
    tail = strip_leading_ones(x[axis % len(x):])
    for spec in inputs[1:3]:
        if spec is not None and strip_leading_ones(spec.shape) != tail:
            return "layernorm.c needs Scale and B of the normalized axes' shape"
    return None


class LayerNormC(Implementation):
    """LayerNormalization as one C kernel (see the module docstring)."""

    name = "layernorm.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return layernorm_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        return [{"par": 1}, {"par": 0}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        passes = "rows in L1, one pass" if is_rms_norm(workload) else "rows in L1, two passes"
        return passes + ("" if config.get("par", 1) else ", one thread")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = layernorm_reason(workload)
        if reason or int(config.get("par", 1)) not in (0, 1):
            raise ValueError(f"{workload.label}: {reason or 'par is 0 or 1'}")
        rows, d = geometry(workload)
        has_bias = len(workload.inputs) > 2 and workload.inputs[2] is not None
        chunk = max(1, -(-rows // (CHUNKS_PER_CORE * (os.cpu_count() or 1))))
        source = _SOURCE.format(rows=rows, d=d, chunk=chunk, par=int(config.get("par", 1)),
                                has_bias=int(has_bias), rms=int(is_rms_norm(workload)),
                                eps=float(workload.attr("epsilon", 1e-5)))
        build.openmp_defaults()
        fn = load_function(build.compile_c(source, c_flags()), "wpk_layernorm",
                           [ctypes.c_void_p] * 4)
        prepared = {i: np.ascontiguousarray(np.asarray(consts[i], np.float32).reshape(-1))
                    for i in (1, 2) if i in consts}

        def operands(inputs) -> list:
            """x, gamma, beta as float32 C-contiguous arrays (constants prepared once)."""
            return [prepared[i] if i in prepared else
                    np.ascontiguousarray(inputs[i], np.float32)
                    if i < len(inputs) and inputs[i] is not None else None
                    for i in (0, 1, 2)]

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0]):
                raise ValueError("layernorm.c writes C-contiguous float32 outputs")
            x, gamma, beta = operands(inputs)
            fn(x.ctypes.data, gamma.ctypes.data, None if beta is None else beta.ctypes.data,
               outputs[0].ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when every operand is passed as it is."""
            x, gamma, beta = operands(inputs)
            given = [inputs[i] for i in (0, 1, 2) if i < len(inputs) and i not in prepared
                     and inputs[i] is not None]
            if not all(plain(a) for a in (*given, outputs[0])):
                return None
            return function_address(fn), (x.ctypes.data, gamma.ctypes.data,
                                          None if beta is None else beta.ctypes.data,
                                          outputs[0].ctypes.data)

        kernel.native = native
        kernel.keep = tuple(prepared.values())
        return kernel


LAYERNORM_C = register(LayerNormC())
