"""Data movement in native form, so Reshape, Transpose, Slice and Concat steps join a chain.

A transformer's plan runs a Reshape and a Transpose between every pair of MatMuls (the
attention heads split and merged). As numpy steps each is a Python call of its own and
breaks the run of consecutive generated kernels that `native_chain` executes as one
native call. Once the runtime has bound a step to its buffers, its copy is fixed: the
same bytes from the same strided source into the same destination on every run. So the
copy is described once as a table of int64s (addresses, shape, strides in bytes) and
executed by `wpk_moves(table)`, a plain C strided copy; the table is the step's only
argument. Dimensions that are contiguous in both source and destination merge first, so
a Reshape is one `memcpy` and a head transpose one `memcpy` per row.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

import numpy as np

from wpk.core.errors import ToolchainError
from wpk.dsl import toolchain
from wpk.kernels.cpu.native_chain import NativeCall, function_address

MAX_RANK = 8   # dims of one move after merging (ONNX tensors have few)

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

/* One move: src, dst (addresses), rank, item (bytes), shape[rank], src strides[rank],
   dst strides[rank] (bytes); the last dim innermost. */
static void move_one(const int64_t *m) {
    const char *src = (const char *)(intptr_t)m[0];
    char *dst = (char *)(intptr_t)m[1];
    const int64_t rank = m[2], item = m[3];
    const int64_t *shape = m + 4, *ss = shape + rank, *ds = ss + rank;
    const int64_t inner = shape[rank - 1], si = ss[rank - 1], di = ds[rank - 1];
    int64_t index[MAX_RANK] = {0};
    for (;;) {
        if (si == item && di == item) {
            memcpy(dst, src, (size_t)(inner * item));
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
        int64_t k = rank - 2;
        for (; k >= 0; k--) {   /* the next row: an odometer over the outer dims */
            src += ss[k];
            dst += ds[k];
            if (++index[k] < shape[k]) break;
            src -= ss[k] * shape[k];
            dst -= ds[k] * shape[k];
            index[k] = 0;
        }
        if (k < 0) return;
    }
}

/* table: count, then `count` moves laid out as move_one reads them. */
void wpk_moves(const int64_t *table) {
    const int64_t *m = table + 1;
    for (int64_t i = 0; i < table[0]; i++) {
        move_one(m);
        m += 4 + 3 * m[2];
    }
}
"""


@cache
def _moves_function():
    source = _SOURCE.replace("MAX_RANK", str(MAX_RANK))
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
        function = _moves_function()
    except ToolchainError:
        return None
    table = np.array([count, *entries], np.int64)
    return (function_address(function), (table.ctypes.data,)), table


def native_form(kernel, views, per_input: bool = False):
    """`kernel.native` of a data-movement step whose copies are the (source view,
    destination view) pairs `views(inputs, outputs)`: one `wpk_moves` call where every
    source is a view of the step's input (of its own input, one each: `per_input`, a
    Concat), else None."""

    def native(inputs, outputs):
        pairs = views(inputs, outputs)
        sources = inputs if per_input else [inputs[0]] * len(pairs)
        if not all(np.may_share_memory(src, given) for (src, _), given in
                   zip(pairs, sources) if src.size):   # a reshape that would copy
            return None
        found = moves_call(pairs)
        if found is None:
            return None
        call, table = found
        kernel.keep = (*getattr(kernel, "keep", ()), table)
        return call

    return native
