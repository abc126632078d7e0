"""`resize.c`: an interpolating Resize (linear, cubic) as a C kernel, plain or blocked.

Resizing is separable (`wpk.kernels.cpu.resize`): every output row of a plane blends a few
input rows (the vertical taps), and every output element of a row a few elements of it
(the horizontal taps). Per output row the kernel blends either the input rows first, into
a row buffer, then its columns (`order` rows), or, with each input row resized along W
once per thread and kept in a few slots, those resized rows (`order` columns: fewer
column blends, the ones that gather, when the height grows). Numpy's formula multiplies
each axis by a dense (output x input) weight matrix instead (work quadratic in the
length: a 2x upsample of 1x64x80x80 took 4.9 ms there, onnxruntime 1.2 ms).

The taps and weights of each axis come from the same function as the float64 reference
(`axis_weights`, the spec's every coordinate mode, `cubic_coeff_a`, `exclude_outside`,
`antialias`), kept as tables of (index, weight) per output position; positions
tf_crop_and_resize puts outside the input take `extrapolation_value`. Only the last two
axes may be resized (NCHW's H and W; leading axes pass through as planes). A blocked
(NCHWc) linear Upsample, which the layout pass makes of a whole-number Resize between
convs, is the same computation with a pixel of `block` channels (its spec: the logical
Resize, `wpk.kernels.nchwc_logical`), vectorised over the block. The C source depends
only on the sizes and tap counts; it goes through the compile cache, keyed by the host's
ISA like every generated kernel, and the kernel joins the plan's native chain.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.resize import (
    ResizeSpec,
    axis_weights,
    outside_along,
    static_resize_spec,
)
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN, logical_workload
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

# gcc's cost model declines the gathers of the horizontal taps; they pay off here.
EXTRA_FLAGS = ("-fsimd-cost-model=unlimited",)
# A thread's row buffer lives on its stack: at most this many floats (64 KiB); the
# columns-first slots at most twice that.
MAX_WIDTH = 1 << 14
# Chunks of output rows per thread (consecutive rows: their taps share input rows, which
# the columns-first order resizes once per chunk): about this many per core, of at least
# MIN_CHUNK_ROWS rows.
CHUNKS_PER_CORE = 8
MIN_CHUNK_ROWS = 16
# Below this many output elements the kernel runs on the calling thread alone.
PARALLEL_ELEMENTS = 1 << 14

_SOURCE = r"""
#include <stdint.h>

/* Planes of H x W pixels of BLOCK floats each (1: NCHW; 8 or 16: the blocked NCHWc
   layout, a pixel's vector of channels):
   Y[p, oy, ox, c] = sum_t HW[oy, t] * sum_u WW[ox, u] * X[p, HI[oy, t], WI[ox, u], c],
   or EXTRAP where OUT_H[oy] or OUT_W[ox] is set. */
static inline void blend_columns(const float *restrict row, float *restrict y,
                                 const int32_t *restrict WI, const float *restrict WW) {
#if BLOCK == 1
    #pragma omp simd
    for (int ox = 0; ox < OW; ox++) {
        float acc = 0.0f;
        for (int u = 0; u < TW; u++) acc += WW[ox * TW + u] * row[WI[ox * TW + u]];
        y[ox] = acc;
    }
#else
    for (int ox = 0; ox < OW; ox++) {
        float acc[BLOCK] = {0.0f};
        for (int u = 0; u < TW; u++) {
            const float w = WW[ox * TW + u];
            const float *s = row + (int64_t)WI[ox * TW + u] * BLOCK;
            #pragma omp simd
            for (int c = 0; c < BLOCK; c++) acc[c] += w * s[c];
        }
        #pragma omp simd
        for (int c = 0; c < BLOCK; c++) y[ox * BLOCK + c] = acc[c];
    }
#endif
}

/* y[0:n] = sum_t weights[t] * rows[t][0:n] */
static inline void blend_rows(const float *const *rows, const float *restrict weights,
                              float *restrict y, int64_t n) {
    const float w0 = weights[0];
    const float *restrict s0 = rows[0];
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = w0 * s0[i];
    for (int t = 1; t < TH; t++) {
        const float wt = weights[t];
        const float *restrict s = rows[t];
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) y[i] += wt * s[i];
    }
}

void wpk_resize(const float *restrict X, float *restrict Y, const int32_t *restrict HI,
                const float *restrict HW, const int32_t *restrict WI,
                const float *restrict WW, const uint8_t *restrict OUT_H,
                const uint8_t *restrict OUT_W) {
    #pragma omp parallel if ((int64_t)PLANES * OH * OW * BLOCK >= PARALLEL_ELEMENTS)
    {
#if COLUMNS_FIRST
        /* each input row resized along W once per thread and chunk, kept in SLOTS rows
           (the stack: SLOTS * OW * BLOCK <= 2 * MAX_WIDTH floats, `order_reason`) */
        float cache[SLOTS * OW * BLOCK];
        int64_t tag[SLOTS];
        for (int s = 0; s < SLOTS; s++) tag[s] = -1;
#else
        float row[W * BLOCK];   /* the input rows blended along H */
#endif
        /* chunks of consecutive rows (their taps meet the same input rows), taken as
           threads come free: a descheduled thread holds up one chunk, not a share */
        #pragma omp for schedule(dynamic, ROWS_PER_CHUNK)
        for (int64_t r = 0; r < (int64_t)PLANES * OH; r++) {
            const int64_t p = r / OH, oy = r % OH;
            const float *plane = X + p * (int64_t)H * W * BLOCK;
            float *y = Y + r * OW * BLOCK;
            const float *taps[TH];
#if COLUMNS_FIRST
            for (int t = 0; t < TH; t++) {
                const int64_t source = HI[oy * TH + t], key = p * H + source;
                float *slot = cache + (source % SLOTS) * OW * BLOCK;
                if (tag[source % SLOTS] != key) {
                    blend_columns(plane + source * W * BLOCK, slot, WI, WW);
                    tag[source % SLOTS] = key;
                }
                taps[t] = slot;
            }
            blend_rows(taps, HW + oy * TH, y, (int64_t)OW * BLOCK);
#else
            for (int t = 0; t < TH; t++)
                taps[t] = plane + (int64_t)HI[oy * TH + t] * W * BLOCK;
            blend_rows(taps, HW + oy * TH, row, (int64_t)W * BLOCK);
            blend_columns(row, y, WI, WW);
#endif
            if (EXTRAPOLATES) {
                for (int ox = 0; ox < OW; ox++)
                    if (OUT_H[oy] || OUT_W[ox])
                        for (int c = 0; c < BLOCK; c++) y[ox * BLOCK + c] = EXTRAP;
            }
        }
    }
}
"""


def _blocked_upsample(workload: Workload) -> bool:
    return workload.domain == NCHWC_DOMAIN and workload.op == "Upsample"


def resize_native_reason(workload: Workload) -> str | None:
    """None when `resize.c` computes the workload, else why not."""
    if _blocked_upsample(workload):
        return _blocked_reason(workload)
    if workload.op != "Resize" or workload.domain not in ("", "ai.onnx"):
        return "not a Resize"
    if workload.opset < 11:
        return "Resize before opset 11 (Upsample's semantics) is not resize.c's"
    x, out = workload.inputs[0], workload.outputs[0]
    if x is None or x.dtype != "float32" or out.dtype != "float32":
        return "resize.c computes float32 only"
    if len(x.shape) < 2:
        return "resize.c resizes the last two axes of a tensor of rank 2 or more"
    if any(workload.inputs[i] is not None and workload.static_value(i) is None
           for i in range(1, len(workload.inputs))):
        return "a Resize with computed roi, scales or sizes is not resize.c's"
    spec = static_resize_spec(workload)
    if spec.mode not in ("linear", "cubic"):
        return "resize.c interpolates (linear, cubic); a nearest Resize is an index copy"
    if not all(_passes_through(spec, a) for a in range(len(spec.in_shape) - 2)):
        return "resize.c resizes the last two axes only"
    if spec.in_shape[-1] > MAX_WIDTH:
        return f"resize.c keeps an input row of at most {MAX_WIDTH} floats"
    return None


def _blocked_reason(workload: Workload) -> str | None:
    """Why resize.c does not compute a blocked (wpk.nchwc) Upsample, or None."""
    if str(workload.attr("mode")) not in ("linear", "cubic"):
        return "resize.c interpolates; a nearest blocked Upsample is native.nchwc's copy"
    if workload.epilogue or len(workload.outputs) != 1:
        return "resize.c has no fused epilogue"
    if any(s.dtype != "float32" for s in (workload.inputs[0], *workload.outputs)):
        return "resize.c computes float32 only"
    x = workload.inputs[0].shape
    if x[3] * x[4] > MAX_WIDTH:
        return f"resize.c keeps an input row of at most {MAX_WIDTH} floats"
    return None


def geometry(workload: Workload) -> tuple[ResizeSpec, int, int]:
    """(the spec of its NCHW resize, planes, floats per pixel) of a workload resize.c
    computes: a Resize's planes are its leading dims, one float per pixel; a blocked
    Upsample's are N x channel blocks, a pixel the block's vector (its spec is the logical
    Resize over the padded channels, `wpk.kernels.nchwc_logical`)."""
    if _blocked_upsample(workload):
        logical = logical_workload(workload)
        x = workload.inputs[0].shape
        return static_resize_spec(logical), int(x[0] * x[1]), int(x[4])
    spec = static_resize_spec(workload)
    return spec, int(np.prod(spec.in_shape[:-2], dtype=np.int64)), 1


def _passes_through(spec: ResizeSpec, axis: int) -> bool:
    """Whether the Resize leaves `axis` as it is (tf_crop_and_resize counts every axis as
    resized: its roi of a leading axis is usually the whole axis)."""
    if axis not in spec.resized_axes():
        return True
    if spec.in_shape[axis] != spec.out_shape[axis] or outside_along(spec, axis).any():
        return False
    return bool((axis_weights(spec, axis) == np.eye(spec.in_shape[axis])).all())


def tap_table(spec: ResizeSpec, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 index, float32 weight) tables of shape (output length, taps) of `axis`: the
    nonzero entries of its row of `axis_weights` (an axis that is not resized: the identity),
    padded to the largest count of a row with weight-0 repeats of the row's last tap."""
    length, size = spec.in_shape[axis], spec.out_shape[axis]
    if axis not in spec.resized_axes():
        return np.arange(size, dtype=np.int32)[:, None], np.ones((size, 1), np.float32)
    matrix = axis_weights(spec, axis)
    taps = max(1, int((matrix != 0).sum(axis=1).max()))
    index = np.zeros((size, taps), np.int32)
    weight = np.zeros((size, taps), np.float32)
    for row in range(size):
        (columns,) = np.nonzero(matrix[row])
        index[row] = columns[-1] if len(columns) else 0   # padding: the last tap, weight 0
        index[row, :len(columns)] = columns
        weight[row, :len(columns)] = matrix[row, columns]
    assert index.max(initial=0) < length
    return index, weight


ORDERS = ("rows", "columns")   # which axis a kernel blends first: H (rows) or W (columns)


def order_reason(spec: ResizeSpec, order: str, block: int = 1) -> str | None:
    """None when the kernel may blend `order` first, else why not. Columns first keeps
    2 x TH resized rows per thread on its stack (at most 2 x MAX_WIDTH floats), slot =
    source row % slots: the distinct source rows of one output row must fall in distinct
    slots."""
    if order not in ORDERS:
        return f"order is one of {', '.join(ORDERS)}"
    if order == "rows":
        return None
    index, _ = tap_table(spec, len(spec.in_shape) - 2)
    slots = 2 * index.shape[1]
    if slots * spec.out_shape[-1] * block > MAX_WIDTH * 2:
        return f"{slots} resized rows of {spec.out_shape[-1]} pixels do not fit a thread's stack"
    for rows in index:
        distinct = np.unique(rows)
        if len(np.unique(distinct % slots)) != len(distinct):
            return "the taps of an output row do not fall in distinct slots"
    return None


@cache
def _function(planes: int, h: int, w: int, oh: int, ow: int, th: int, tw: int,
              extrapolates: bool, extrapolation: float, columns_first: bool, block: int):
    defines = dict(PLANES=planes, H=h, W=w, BLOCK=block, OH=oh, OW=ow, TH=th, TW=tw,
                   SLOTS=2 * th,
                   COLUMNS_FIRST=int(columns_first), EXTRAPOLATES=int(extrapolates),
                   EXTRAP=f"{float(np.float32(extrapolation))!r}f",
                   PARALLEL_ELEMENTS=PARALLEL_ELEMENTS,
                   ROWS_PER_CHUNK=max(MIN_CHUNK_ROWS,
                                      planes * oh // (CHUNKS_PER_CORE * (os.cpu_count() or 1))))
    source = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _SOURCE
    library = build.compile_c(source, (*c_flags(), *EXTRA_FLAGS))
    build.openmp_defaults()
    return load_function(library, "wpk_resize", [ctypes.c_void_p] * 8)


class ResizeC(Implementation):
    """The interpolating Resize kernel (see the module docstring). Its configs: which axis
    it blends first (`order`), both measured where both apply: rows first (H) blends the
    input rows of an output row once per output row, then the columns; columns first (W)
    resizes each input row once per thread, then blends those (fewer column blends, the
    gathering ones, when the height grows)."""

    name = "resize.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return resize_native_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        spec, _, block = geometry(workload)
        return [{"order": order} for order in ORDERS
                if order_reason(spec, order, block) is None]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        mode = geometry(workload)[0].mode
        return f"separable {mode}, {config.get('order', 'rows')} first"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = resize_native_reason(workload)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        spec, planes, block = geometry(workload)
        order = str(config.get("order", "rows"))
        reason = order_reason(spec, order, block)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        rank = len(spec.in_shape)
        (hi, hw), (wi, ww) = tap_table(spec, rank - 2), tap_table(spec, rank - 1)
        out_h, out_w = (outside_along(spec, a).astype(np.uint8) for a in (rank - 2, rank - 1))
        extrapolates = bool(out_h.any() or out_w.any())
        if extrapolates and not np.isfinite(spec.extrapolation_value):
            raise ValueError(f"{workload.label}: resize.c extrapolates finite values only")
        fn = _function(planes, *spec.in_shape[-2:], *spec.out_shape[-2:], hi.shape[1],
                       wi.shape[1], extrapolates, float(spec.extrapolation_value),
                       order == "columns", block)
        tables = (hi, hw, wi, ww, out_h, out_w)
        table_pointers = tuple(t.ctypes.data for t in tables)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            out = outputs[0]
            if not plain(out):
                raise ValueError("resize.c writes C-contiguous float32 outputs")
            fn(x.ctypes.data, out.ctypes.data, *table_pointers)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when both are passed as they are."""
            if not (plain(inputs[0]) and plain(outputs[0])):
                return None
            return function_address(fn), (inputs[0].ctypes.data, outputs[0].ctypes.data,
                                          *table_pointers)

        kernel.native = native
        kernel.keep = tables
        return kernel


RESIZE_C = register(ResizeC())
