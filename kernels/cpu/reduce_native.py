"""`reduce.c`: ReduceMean, ReduceSum and the norms (ReduceL1, ReduceL2, ReduceSumSquare) over
one run of adjacent axes, as one C kernel.

Exporters write pooling and averaging as reductions: SVTR's mean over the feature map's
height (`x.mean(2)`), Keras' global average pool as a ReduceMean over H and W of NHWC;
torch's F.normalize as a ReduceL2 (Swin V2's cosine attention normalizes its queries and
keys in every block, 24 ReduceL2 in Swin-V2-T, which onnxruntime ran one at a time). A
norm sums |x|, or x squared, and takes the root last for L2.
As numpy or onnxruntime steps they split a plan's native chain (the chain's threads hand
the cores over and back; SVTR's 37 us mean took 180 us there). Seen as
[outer, reduced, inner] -- the axes before, in and after the reduced run -- the kernel
sums each output over the reduced extent: along the row, vectorised by an `omp simd`
reduction, when nothing follows the run (inner 1); else down the rows, a vector of
adjacent outputs per step. Units (an outer index and a chunk of inner outputs) run on the
OpenMP threads for inputs of at least `PAR_MIN` floats, else on the calling thread. The
kernel joins the plan's native chain.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c_shared, load_function
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

OPS = ("ReduceMean", "ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare")
# what each op sums per element (of v), and how an output becomes its value (of the sum s)
_TERMS = {"ReduceL1": "fabsf(v)", "ReduceL2": "(v * v)", "ReduceSumSquare": "(v * v)"}
_FINISH = {"ReduceMean": "(s) * SCALE", "ReduceL2": "sqrtf(s)"}
PAR_MIN = 1 << 15
# inner outputs per unit: a cache line of floats down the rows
CHUNK = 16

_SOURCE = r"""
#include <math.h>
#include <stdint.h>

void wpk_reduce(const float *restrict x, float *restrict y) {
    const int64_t chunks = (INNER + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (PAR)
    for (int64_t u = 0; u < OUTER * chunks; u++) {
        const int64_t o = u / chunks, i0 = u % chunks * CHUNK;
        const float *xo = x + o * R * INNER;
        if (INNER == 1) {
            float s = 0.0f;
            #pragma omp simd reduction(+:s)
            for (int64_t r = 0; r < R; r++) { const float v = xo[r]; s += TERM(v); }
            y[o] = FINISH(s);
            continue;
        }
        const int64_t n = INNER - i0 < CHUNK ? INNER - i0 : CHUNK;
        float acc[CHUNK] = {0};
        for (int64_t r = 0; r < R; r++) {
            const float *row = xo + r * INNER + i0;
            #pragma omp simd
            for (int64_t k = 0; k < CHUNK; k++)
                if (k < n) { const float v = row[k]; acc[k] += TERM(v); }
        }
        for (int64_t k = 0; k < n; k++) y[o * INNER + i0 + k] = FINISH(acc[k]);
    }
}
"""


def reduced_axes(workload: Workload) -> tuple[int, ...] | None:
    """The sorted axes the reduction covers (every axis when none are given), or None when
    they are not known at build time or the op is a no-op on empty axes."""
    rank = len(workload.inputs[0].shape)
    if workload.opset >= 18 or workload.op == "ReduceSum" and workload.opset >= 13:
        axes = workload.static_value(1) if len(workload.inputs) > 1 and \
            workload.inputs[1] is not None else ()
        if axes is None:
            return None
    else:
        axes = workload.attr("axes") or ()
    axes = tuple(sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)}))
    if not axes:
        return None if workload.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return axes


def geometry(workload: Workload) -> tuple[int, int, int] | str:
    """(outer, reduced, inner) extents, or why the reduction is not one run of axes."""
    shape = workload.inputs[0].shape
    axes = reduced_axes(workload)
    if axes is None:
        return "the reduced axes must be constants (and not a no-op)"
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        return "reduce.c reduces one run of adjacent axes"
    return (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
            math.prod(shape[axes[-1] + 1:]))


def reduce_reason(workload: Workload) -> str | None:
    """None when `reduce.c` computes the workload, else why not."""
    if workload.op not in OPS or workload.domain not in ("", "ai.onnx"):
        return f"reduce.c computes {' and '.join(OPS)}"
    x = workload.inputs[0]
    if x is None or not x.shape or any(s.dtype != "float32" for s in (x, *workload.outputs)):
        return "float32 tensors of rank >= 1 only"
    if workload.epilogue or len(workload.outputs) != 1:
        return "no fused epilogue"
    found = geometry(workload)
    return found if isinstance(found, str) else None


class ReduceC(Implementation):
    """ReduceMean, ReduceSum and the norms in C (see the module docstring)."""

    name = "reduce.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return reduce_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "along rows" if geometry(workload)[2] == 1 else "down rows"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = reduce_reason(workload)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        outer, r, inner = geometry(workload)
        op = workload.op
        defines = {"OUTER": f"{outer}L", "R": f"{r}L", "INNER": f"{inner}L", "CHUNK": CHUNK,
                   "SCALE": f"{1.0 / r!r}f", "PAR": int(outer * r * inner >= PAR_MIN),
                   "TERM(v)": _TERMS.get(op, "(v)"), "FINISH(s)": _FINISH.get(op, "(s)")}
        source = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _SOURCE
        build.openmp_defaults()
        fn = load_function(compile_c_shared(source), "wpk_reduce", [ctypes.c_void_p] * 2)
        out_shape = workload.outputs[0].shape

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0], out_shape):
                raise ValueError("reduce.c writes C-contiguous float32 outputs")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            fn(x.ctypes.data, outputs[0].ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when X and Y are passed as they are."""
            if not (plain(inputs[0]) and plain(outputs[0], out_shape)):
                return None
            return function_address(fn), (inputs[0].ctypes.data, outputs[0].ctypes.data)

        kernel.native = native
        return kernel


REDUCE_C = register(ReduceC())
