"""The blocked ChannelGather in C: each output channel one lane of one of the inputs.

A ShuffleNet block ends in a Concat of its two branches, a channel shuffle (Reshape,
Transpose, Reshape) and a Split of the result into the next block's two halves; with
channel counts that are not whole blocks (58, 116, 232), each of those left the blocked
layout: ReorderOutput, four onnxruntime copies, ReorderInput, about half of the block's
time (README, ShuffleNet). The layout pass composes the whole sequence into one
ChannelGather per piece (`wpk.passes.nchwc_gather`), computed here.

Semantics (`wpk.passes.nchwc_layout`): inputs X_0..X_k blocked (N, Cb_i, H, W, b), output
Y blocked with `channels` real lanes; `indices[j]` is the lane of the inputs' padded lanes
laid end to end (X_0's Cb_0*b lanes, then X_1's, ...) that output channel j copies; the
padding lanes of Y are zero.

Per output block, the lanes it takes from one source block form a *term*: that block's
vector at each pixel, permuted by a fixed index vector (one variable permute, vpermps on
AVX-512 and AVX2) and masked to those lanes. The output block is the OR of its terms,
zero where none writes. Terms come from the workload at prepare time, the addresses at
bind time (`native`: one table, so the step joins a native chain). Loops: (image, output
block) over OpenMP threads when the output is large; the block's terms (at most b) read
once, then per pixel the output vector built in registers, OR of its terms, and stored
once (terms outer, pixels inner, rewriting the output per term, took 1.2-1.5x as long on
ShuffleNet's half-shuffles at 28x28, 14x14 and 7x7, 2026-12-01).

Like every candidate it is verified against the float64 reference
(`wpk.kernels.nchwc_reference`) before the planner may choose it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build, toolchain
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER
from wpk.kernels.cpu.native_chain import NativeCall, function_address

# Outputs of at least this many floats share their (image, block) units out to the OpenMP
# threads (as the blocked reorders do, `nchwc_native.PAR_MIN`)
PAR_MIN = 1 << 15

_SOURCE = r"""
#include <stdint.h>

typedef int viu __attribute__((vector_size(B * 4), aligned(4), may_alias));

/* t: N, P (pixels a plane), OB (output blocks), y address, then OB + 1 term starts, then
   3 int64s a term: source block address (image 0), source image stride (floats), and
   the term's row of `perm` (B lanes: the source lane of each output lane, -1: none) */
void wpk_channel_gather(const int64_t *t, const int32_t *perm) {
    const int64_t N = t[0], P = t[1], OB = t[2];
    float *y = (float *)(intptr_t)t[3];
    const int64_t *start = t + 4, *term = t + 5 + OB;
    #pragma omp parallel for collapse(2) schedule(static) if (N * OB * P * B >= PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t ob = 0; ob < OB; ob++) {
            float *yo = y + (n * OB + ob) * P * B;
            const int64_t k0 = start[ob], terms = start[ob + 1] - k0;
            const float *src[MAX_TERMS];
            vi lane[MAX_TERMS], keep[MAX_TERMS];
            for (int64_t k = 0; k < terms; k++) {
                const int64_t *at = term + 3 * (k0 + k);
                src[k] = (const float *)(intptr_t)at[0] + n * at[1];
                const vi idx = *(const viu *)(perm + at[2] * B);
                keep[k] = idx >= 0;
                lane[k] = idx & (B - 1);
            }
            for (int64_t p = 0; p < P; p++) {
                vi picked = (vi){0};
                for (int64_t k = 0; k < terms; k++) {
#if defined(__clang__)
                    vf v = vload(src[k] + p * B), s;
                    for (int l = 0; l < B; l++) s[l] = v[lane[k][l]];
                    picked |= (vi)s & keep[k];
#else
                    picked |= (vi)__builtin_shuffle(vload(src[k] + p * B), lane[k]) & keep[k];
#endif
                }
                vstore(yo + p * B, (vf)picked);
            }
        }
    }
}
"""


@cache
def gather_function(block: int):
    """`wpk_channel_gather(table, perm)` for blocks of `block` lanes (compiled once)."""
    source = (VECTOR_HEADER.format(lanes=block)
              + f"#define B {block}\n#define PAR_MIN {PAR_MIN}\n#define MAX_TERMS {block}\n"
              + _SOURCE)
    build.openmp_defaults()
    library = toolchain.compile_c_shared(source)
    return toolchain.load_function(library, "wpk_channel_gather", [ctypes.c_void_p] * 2)


@dataclass(frozen=True)
class GatherTerms:
    """The terms of a ChannelGather (module docstring), fixed by its workload.

    starts: OB + 1 offsets into the terms, output block by block; sources: (input, source
    block) of each term; perm: (terms, b) int32, each output lane's source lane or -1."""

    starts: np.ndarray
    sources: tuple[tuple[int, int], ...]
    perm: np.ndarray


def gather_terms(workload: Workload) -> GatherTerms:
    """Group a ChannelGather's `indices` into per-output-block terms."""
    b = int(workload.attr("block"))
    lanes = [spec.shape[1] * b for spec in workload.inputs]
    first_lane = np.cumsum([0, *lanes])
    indices = [int(i) for i in workload.attr("indices")]
    out_blocks = workload.outputs[0].shape[1]
    starts, sources, rows = [0], [], []
    for ob in range(out_blocks):
        terms: dict[tuple[int, int], np.ndarray] = {}
        for lane, index in enumerate(indices[ob * b:(ob + 1) * b]):
            source = int(np.searchsorted(first_lane, index, side="right")) - 1
            local = index - int(first_lane[source])
            row = terms.setdefault((source, local // b), np.full(b, -1, np.int32))
            row[lane] = local % b
        sources += list(terms)
        rows += list(terms.values())
        starts.append(len(sources))
    perm = np.array(rows, np.int32).reshape(len(rows), b)
    return GatherTerms(np.array(starts, np.int64), tuple(sources), perm)


def gather_table(workload: Workload, terms: GatherTerms, inputs: Sequence[np.ndarray],
                 output: np.ndarray) -> np.ndarray:
    """`wpk_channel_gather`'s table for these (C-contiguous) buffers."""
    n, out_blocks, h, w, b = workload.outputs[0].shape
    pixels = h * w
    table = [n, pixels, out_blocks, output.ctypes.data, *terms.starts.tolist()]
    for row, (source, block) in enumerate(terms.sources):
        x = inputs[source]
        table += [x.ctypes.data + block * pixels * b * 4, x.shape[1] * pixels * b, row]
    return np.array(table, np.int64)


def gather_kernel(workload: Workload):
    """The kernel (and its native form) of a blocked ChannelGather (float32)."""
    function = gather_function(int(workload.attr("block")))
    terms = gather_terms(workload)
    address = function_address(function)

    def native(inputs, outputs) -> NativeCall | None:
        if not all(a.flags.c_contiguous for a in (*inputs, outputs[0])):
            return None
        if any(np.may_share_memory(x, outputs[0]) for x in inputs):
            return None
        table = gather_table(workload, terms, inputs, outputs[0])
        kernel.keep = (*kernel.keep, table)
        return address, (table.ctypes.data, terms.perm.ctypes.data)

    tables: dict[tuple[int, ...], np.ndarray] = {}   # the last buffers' table

    def kernel(inputs, outputs) -> None:
        sources = [np.ascontiguousarray(x, np.float32) for x in inputs]
        y = outputs[0]
        result = y if y.flags.c_contiguous and not any(
            np.may_share_memory(x, y) for x in sources) else np.empty(y.shape, np.float32)
        key = tuple(a.ctypes.data for a in (*sources, result))
        if key not in tables:
            tables.clear()
            tables[key] = gather_table(workload, terms, sources, result)
        function(tables[key].ctypes.data, terms.perm.ctypes.data)
        if result is not y:
            np.copyto(y, result)

    kernel.keep = (function, terms.perm)
    kernel.native = native
    return kernel


__all__ = ["GatherTerms", "gather_function", "gather_kernel", "gather_table", "gather_terms"]
