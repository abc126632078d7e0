"""Data movement in native form, so Reshape, Transpose, Slice and Concat steps join a chain.

A transformer's plan runs a Reshape and a Transpose between every pair of MatMuls (the
attention heads split and merged). As numpy steps each is a Python call of its own and
breaks the run of consecutive generated kernels that `native_chain` executes as one
native call. Once the runtime has bound a step to its buffers, its copy is fixed: the
same bytes from the same strided source into the same destination on every run. So the
copy is described once as a table of int64s (addresses, shape, strides in bytes) and
executed by `wpk_moves(table)`, a plain C strided copy; the table is the step's only
argument. Dimensions that are contiguous in both source and destination merge first, so
a Reshape is one `memcpy` and a head transpose one `memcpy` per row; short rows (a
blocked layout's 64-byte block) are inline copies, and a move of `PAR_BYTES` or more
shares its rows out to the OpenMP threads.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

import numpy as np

from wpk.core.errors import ToolchainError
from wpk.dsl import build, toolchain
from wpk.kernels.cpu.native_chain import NativeCall, function_address

MAX_RANK = 8   # dims of one move after merging (ONNX tensors have few)

# Moves of at least this many bytes run on the OpenMP threads, each a share of the rows
# (measured, 2 threads, 2026-11-29: DeepLab's 4 MB phase transposes 310 -> 110 us, a
# ViT's 0.6 MB head transpose 20 -> 9 us, an SVTR's 0.3 MB one 11 -> 5 us)
PAR_BYTES = 1 << 17

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <omp.h>

/* one contiguous run; the common short ones (a blocked layout's 64-byte block, a head's
   row) as inline copies, not a libc call each */
static inline void copy_run(char *dst, const char *src, int64_t bytes) {
#if INLINE_RUNS
    switch (bytes) {
    case 32: __builtin_memcpy(dst, src, 32); return;
    case 64: __builtin_memcpy(dst, src, 64); return;
    case 128: __builtin_memcpy(dst, src, 128); return;
    case 256: __builtin_memcpy(dst, src, 256); return;
    default: memcpy(dst, src, (size_t)bytes);
    }
#else
    memcpy(dst, src, (size_t)bytes);
#endif
}

/* Rows [first, last) of one move: src, dst (addresses), rank, item (bytes), shape[rank],
   src strides[rank], dst strides[rank] (bytes); the last dim innermost, a row the
   innermost dim at one index of the outer ones. */
static void move_rows(const int64_t *m, int64_t first, int64_t last) {
    const char *src = (const char *)(intptr_t)m[0];
    char *dst = (char *)(intptr_t)m[1];
    const int64_t rank = m[2], item = m[3];
    const int64_t *shape = m + 4, *ss = shape + rank, *ds = ss + rank;
    const int64_t inner = shape[rank - 1], si = ss[rank - 1], di = ds[rank - 1];
    int64_t index[MAX_RANK] = {0};
    int64_t rest = first;
    for (int64_t k = rank - 2; k >= 0; k--) {   /* the odometer at row `first` */
        index[k] = rest % shape[k];
        rest /= shape[k];
        src += index[k] * ss[k];
        dst += index[k] * ds[k];
    }
    for (int64_t row = first; row < last; row++) {
        if (si == item && di == item) {
            copy_run(dst, src, inner * item);
        } else if (item == 4) {
            for (int64_t i = 0; i < inner; i++)
                *(int32_t *)(dst + i * di) = *(const int32_t *)(src + i * si);
        } else if (item == 8) {
            for (int64_t i = 0; i < inner; i++)
                *(int64_t *)(dst + i * di) = *(const int64_t *)(src + i * si);
        } else {
            for (int64_t i = 0; i < inner; i++)
                memcpy(dst + i * di, src + i * si, (size_t)item);
        }
        for (int64_t k = rank - 2; k >= 0; k--) {   /* the next row */
            src += ss[k];
            dst += ds[k];
            if (++index[k] < shape[k]) break;
            src -= ss[k] * shape[k];
            dst -= ds[k] * shape[k];
            index[k] = 0;
        }
    }
}

/* One move: its rows on the calling thread, or shared out when it is large (a single
   contiguous run stays one memcpy: measured, a second thread adds nothing to it). */
static void move_one(const int64_t *m) {
    const int64_t rank = m[2];
    int64_t rows = 1;
    for (int64_t k = 0; k < rank - 1; k++)
        rows *= m[4 + k];
    if (rows > 1 && rows * m[4 + rank - 1] * m[3] >= PAR_BYTES) {
        #pragma omp parallel
        {
            const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            move_rows(m, rows * t / n, rows * (t + 1) / n);
        }
    } else {
        move_rows(m, 0, rows);
    }
}

/* table: count, then `count` moves laid out as move_rows reads them. */
void wpk_moves(const int64_t *table) {
    const int64_t *m = table + 1;
    for (int64_t i = 0; i < table[0]; i++) {
        move_one(m);
        m += 4 + 3 * m[2];
    }
}
"""


@cache
def moves_function(par_bytes: int = PAR_BYTES, inline_runs: bool = True):
    """`wpk_moves(table)`, compiled once per form: moves of `par_bytes` or more on the
    threads, short rows copied inline or (`inline_runs` False, as before 2026-11-29) by
    libc's `memcpy` (the other forms: `scripts/bench_moves.py`)."""
    source = (_SOURCE.replace("MAX_RANK", str(MAX_RANK)).replace("PAR_BYTES", str(par_bytes))
              .replace("INLINE_RUNS", str(int(inline_runs))))
    build.openmp_defaults()
    library = toolchain.compile_c_shared(source)
    return toolchain.load_function(library, "wpk_moves", [ctypes.c_void_p])


def merged_dims(shape: Sequence[int], src_strides: Sequence[int],
                dst_strides: Sequence[int], item: int) -> tuple[list[int], list[int], list[int]]:
    """(shape, src strides, dst strides) of the same copy with size-1 dims dropped and
    neighbours that are contiguous in both arrays merged; at least one dim."""
    dims = [(n, s, d) for n, s, d in zip(shape, src_strides, dst_strides) if n != 1]
    merged: list[list[int]] = []
    for n, s, d in dims:
        if merged and merged[-1][1] == s * n and merged[-1][2] == d * n:
            merged[-1] = [merged[-1][0] * n, s, d]
        else:
            merged.append([n, s, d])
    if not merged:
        merged = [[1, item, item]]
    return [m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged]


def same_bytes(src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether copying view `src` into view `dst` has nothing to do: the same elements in
    the same places (a Reshape whose output shares its input's buffer)."""
    return src.dtype == dst.dtype and src.shape == dst.shape and \
        src.ctypes.data == dst.ctypes.data and (
            src.strides == dst.strides or src.flags.c_contiguous and dst.flags.c_contiguous)


def _move_entry(src: np.ndarray, dst: np.ndarray) -> list[int] | None:
    """The table entry copying view `src` into view `dst`, or None when the copy is not a
    plain byte copy (dtypes or shapes differ, overlapping memory, too many dims)."""
    if src.dtype != dst.dtype or src.shape != dst.shape or src.dtype.hasobject \
            or np.may_share_memory(src, dst):
        return None
    item = src.dtype.itemsize
    shape, ss, ds = merged_dims(src.shape, src.strides, dst.strides, item)
    if len(shape) > MAX_RANK:
        return None
    return [src.ctypes.data, dst.ctypes.data, len(shape), item, *shape, *ss, *ds]


def moves_call(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[NativeCall, object] | None:
    """The native call copying each (source view, destination view) pair in order, and the
    table it reads (keep it alive as long as the call), or None when a pair cannot be
    copied natively or no C compiler is at hand."""
    entries, count = [], 0
    for src, dst in pairs:
        if same_bytes(src, dst):
            continue
        entry = _move_entry(src, dst)
        if entry is None:
            return None
        if src.size:
            entries += entry
            count += 1
    try:
        function = moves_function()
    except ToolchainError:
        return None
    table = np.array([count, *entries], np.int64)
    return (function_address(function), (table.ctypes.data,)), table


def native_form(kernel, views, per_input: bool = False):
    """`kernel.native` of a data-movement step whose copies are the (source view,
    destination view) pairs `views(inputs, outputs)`: one `wpk_moves` call where every
    source is a view of the step's input (of its own input, one each: `per_input`, a
    Concat), else None. The runtime calls the native form even for a step outside a chain
    (faster than numpy's copy, `scripts/bench_moves.py`)."""

    def native(inputs, outputs):
        pairs = views(inputs, outputs)
        sources = inputs if per_input else [inputs[0]] * len(pairs)
        if not all(np.may_share_memory(src, given) for (src, _), given in
                   zip(pairs, sources) if src.size):   # a reshape that would copy
            return None
        if not all(any(np.may_share_memory(dst, out) for out in outputs)
                   for _, dst in pairs if dst.size):   # a destination that is a copy
            return None
        found = moves_call(pairs)
        if found is None:
            return None
        call, table = found
        kernel.keep = (*getattr(kernel, "keep", ()), table)
        return call

    return native
