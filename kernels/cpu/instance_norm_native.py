"""`instancenorm.c`: InstanceNormalization as one C kernel, a (batch, channel) slice at a time.

ONNX's InstanceNormalization normalizes each (batch, channel) slice of an N x C x D1 x ...
input over its spatial axes to zero mean and unit variance, then scales and shifts it by
the channel's scale and bias. Both torch exporters write GroupNorm as a Reshape to
[N, groups, -1], an InstanceNormalization of unit scale and zero bias, a Reshape back and
the affine Mul and Add, so every diffusion UNet's block has it; without a kernel of its own
it ran as an onnxruntime node of its own (a fallback step). A thread takes slices one at a
time (dynamic: a descheduled vCPU holds up one) and makes the float64 reference's two
passes over it -- the mean, then the variance of the centred values, so no cancellation --
and a third for the output, the sums vectorised by `omp simd` reductions; a GroupNorm's
slice (a group's channels of an image) is tens of KB, so the passes after the first read
it from L2. One OpenMP region, or none (`par` 0: the calling thread, for small tensors).
The kernel joins the plan's native chain.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

_SOURCE = r"""
#include <math.h>

#define SLICES {slices}L
#define CHANNELS {channels}L
#define D {d}L
#define PAR {par}
static const float EPS = {eps!r}f;

void wpk_instancenorm(const float *restrict x, const float *restrict scale,
                      const float *restrict bias, float *restrict y) {{
    #pragma omp parallel for schedule(dynamic, 1) if (PAR)
    for (long s = 0; s < SLICES; ++s) {{
        const float *restrict xs = x + s * D;
        float *restrict ys = y + s * D;
        float sum = 0.0f;
        #pragma omp simd reduction(+:sum)
        for (long i = 0; i < D; ++i) sum += xs[i];
        const float mean = sum / (float)D;
        float squares = 0.0f;
        #pragma omp simd reduction(+:squares)
        for (long i = 0; i < D; ++i) {{
            const float t = xs[i] - mean;
            squares += t * t;
        }}
        const long c = s % CHANNELS;
        const float a = scale[c] / sqrtf(squares / (float)D + EPS), b = bias[c];
        /* centred first, as the reference: x * a + (b - mean * a) cancels where the mean
           is large next to the spread (a one-pixel slice: x * 316 - mean * 316) */
        #pragma omp simd
        for (long i = 0; i < D; ++i) ys[i] = (xs[i] - mean) * a + b;
    }}
}}
"""


def instance_norm_reason(workload: Workload) -> str | None:
    """None when `instancenorm.c` computes the workload, else why not."""
    if workload.op != "InstanceNormalization" or workload.domain not in ("", "ai.onnx"):
        return "instancenorm.c computes ONNX InstanceNormalization only"
    inputs = workload.inputs
    if len(inputs) != 3 or any(s is None for s in inputs) or len(inputs[0].shape) < 3:
        return "InstanceNormalization takes an N x C x D1 x ... input, scale and B"
    if any(s.dtype != "float32" for s in (*inputs, *workload.outputs)):
        return "instancenorm.c computes float32 only"
    if len(workload.outputs) != 1 or workload.epilogue:
        return "instancenorm.c writes its output only (no fused epilogue)"
    channels = inputs[0].shape[1]
    if any(tuple(s.shape) != (channels,) for s in inputs[1:]):
        return "instancenorm.c needs scale and B of one value per channel"
    return None


class InstanceNormC(Implementation):
    """InstanceNormalization as one C kernel (see the module docstring)."""

    name = "instancenorm.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return instance_norm_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        return [{"par": 1}, {"par": 0}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "a slice at a time, two passes" + ("" if config.get("par", 1) else
                                                  ", one thread")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = instance_norm_reason(workload)
        if reason or int(config.get("par", 1)) not in (0, 1):
            raise ValueError(f"{workload.label}: {reason or 'par is 0 or 1'}")
        shape = workload.inputs[0].shape
        source = _SOURCE.format(slices=shape[0] * shape[1], channels=shape[1],
                                d=math.prod(shape[2:]), par=int(config.get("par", 1)),
                                eps=float(workload.attr("epsilon", 1e-5)))
        build.openmp_defaults()
        fn = load_function(build.compile_c(source, c_flags()), "wpk_instancenorm",
                           [ctypes.c_void_p] * 4)
        prepared = {i: np.ascontiguousarray(np.asarray(consts[i], np.float32).reshape(-1))
                    for i in (1, 2) if i in consts}

        def operands(inputs) -> list[np.ndarray]:
            """x, scale, bias as float32 C-contiguous arrays (constants prepared once)."""
            return [prepared[i] if i in prepared else np.ascontiguousarray(inputs[i], np.float32)
                    for i in (0, 1, 2)]

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0]):
                raise ValueError("instancenorm.c writes C-contiguous float32 outputs")
            x, scale, bias = operands(inputs)
            fn(x.ctypes.data, scale.ctypes.data, bias.ctypes.data, outputs[0].ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when every operand is passed as it is."""
            given = [inputs[i] for i in (0, 1, 2) if i not in prepared]
            if not all(plain(a) for a in (*given, outputs[0])):
                return None
            x, scale, bias = operands(inputs)
            return function_address(fn), (x.ctypes.data, scale.ctypes.data, bias.ctypes.data,
                                          outputs[0].ctypes.data)

        kernel.native = native
        kernel.keep = tuple(prepared.values())
        return kernel


INSTANCE_NORM_C = register(InstanceNormC())
