"""The fused attention kernel as generated C: one query tile at a time, online softmax.

    source = attention_source(shape, heads, rank, config)   # sizes baked in as constants

For each (batch*head, query tile) pair (OpenMP over both): the tile of Q is
copied transposed and pre-scaled ([D, TQ], zero columns past Sq), then for
each key tile the scores are computed key-major, S^T = K Q^T, into a
[TK, TQ] block that stays in cache (keys read where they lie, K or K^T, as
broadcast scalars: no transposition), each sum starting from the mask (a value
per key broadcast, or the key step's block of a per-query mask transposed to the
same key-major layout) and the running max taken as the block is stored, and
the online softmax runs vectorized over the queries (running max and sum per query, the
output accumulator rescaled by exp(m_old - m_new)); then P V is added to the
[TQ, Dv] accumulator, which is divided by the sums at the end. No [seq, seq]
tensor is ever written to memory. V is packed only when Dv is not a multiple of
the vector width. Scores are kept in base-2 units (log2(e) folded into Q's scale,
and into the mask as it is added), so each exponential is a power of two:
2^round(x) from its exponent bits times a polynomial, no range reduction by ln 2.

Where the mask is additive (per key, as a padding mask, or per query and key, as a
causal one), keys that cannot matter are left out, per query tile: a key tile from
the key the tile's first query's mask favours most goes first, and then a key whose
every score in the tile lies more than 104 below the score each query has reached
weighs under exp(-104), less than the smallest float, in its softmax (for that first
tile, before any score, the bound on each query's score with its first key stands in
for the score reached). The bound is Cauchy-Schwarz's, |q.k| <= |q||k| (norms summed
in float vectors, with a margin for their rounding); a NaN in the mask or a norm that
is not finite leaves every key in, and a mask plane that spans less than 104 is not
looked at again (the planes' rows are scanned once per call, shared among the threads).
Each key tile's range is trimmed of such keys at both ends (padding on either side, the
future of a causal mask), a tile of them skipped whole.

Vectors are GCC vector extensions of `vw` floats (`vw` a config knob: the
host's lanes, fewer, or 1, the portable scalar path); gcc lowers them to
whatever the ISA flags of `toolchain.c_flags()` allow, and those flags are
part of the compile cache key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from wpk.kernels.cpu.attention_spec import AttentionShape, mask_strides
from wpk.kernels.cpu.microkernels.vector_c import transpose_macro

# Scores are kept in base-2 units: Q is scaled by the op's scale times this.
LOG2E = 1 / math.log(2)
# A query tile's buffers live on its thread's stack: at most this many bytes.
STACK_LIMIT = 512 * 1024
# Optional knobs and their defaults: par 0 runs on the calling thread only (no OpenMP wake-up,
# for problems too small to share).
OPTIONAL_KNOBS = {"par": 1}
# Config knobs: query tile, key tile, vector width (floats), the score micro-tile's keys
# (the P V micro-tile's queries too) and its vectors of queries.
KNOBS = ("tq", "tk", "vw", "mr", "nr")

_HEADER = r"""
#include <math.h>
#include <float.h>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#define BH {bh}
#define HEADS {heads}
#define SQ {sq}
#define SK {sk}
#define D {d}
#define DV {dv}
#define DVP {dvp}
#define TQ {tq}
#define TK {tk}
#define VW {vw}
#define MR {mr}
#define NR {nr}
#define NQT {nqt}
#define PAR {par}
#define KT_INPUT {k_transposed}
/* Where each head's Q, K, V and output start (batch and head strides) and the step from
   one of its rows to the next: [B, H, S, D] or, for the operands the graph keeps before
   its head split, [B, S, H, D]. */
#define Q_B {q_b}
#define Q_H {q_h}
#define Q_ROW {q_row}
#define K_B {k_b}
#define K_H {k_h}
#define K_ROW {k_row}
#define V_B {v_b}
#define V_H {v_h}
#define V_ROW {v_row}
#define O_B {o_b}
#define O_H {o_h}
#define O_ROW {o_row}
#define BASE(X, bh) ((size_t)((bh) / HEADS) * X##_B + (size_t)((bh) % HEADS) * X##_H)
#define V_STEP (PACK_V ? DVP : V_ROW)
#define PACK_V {pack_v}
#define HAS_MASK {has_mask}
#define MS0 {ms0}
#define MS1 {ms1}
#define MS2 {ms2}
#define MS3 {ms3}
/* Scores are kept in base-2 units (the scale times log2(e), folded into Q; mask values
   times LOG2E as they are added), so the softmax's exponentials are powers of two. */
#define LOG2E {log2e!r}f
static const float QSCALE = {qscale!r}f;

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int vi __attribute__((vector_size(VW * 4)));
#define UNROLL _Pragma("GCC unroll 16")
#define UNROLL4 _Pragma("GCC unroll 4")
/* the micro-kernels keep their own functions: inlined into the query tile's loop, gcc
   spilled the score tile's query vectors to the stack (10-20% slower without a mask) */
#define NOINLINE __attribute__((noinline))
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && VW >= 4
/* keep a loaded vector in a register: gcc would otherwise fold the load into every FMA
   that uses it, and the loads, not the FMAs, would bound the micro-kernels */
#define IN_REGISTER(x) __asm__("" : "+v"(x))
#else
#define IN_REGISTER(x) (void)0
#endif
"""

_BODY = r"""
static inline vf vload(const float *p) { return *(const vfu *)p; }
static inline void vstore(float *p, vf x) { *(vfu *)p = x; }
static inline vf vsplat(float x) { return x - (vf){0}; }  /* x - 0 == x: a broadcast */
static inline vf vsel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
/* a > b ? a : b per lane (b where either is a NaN): one max instruction where the ISA has
   one of this width (gcc keeps the select as compare and masked moves otherwise) */
#if defined(__AVX512F__) && VW == 16
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
#elif defined(__AVX__) && VW == 8
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
#elif defined(__SSE__) && VW == 4
static inline vf vmax(vf a, vf b) { return (vf)_mm_max_ps((__m128)a, (__m128)b); }
#else
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }
#endif

/* The sum of a vector's lanes: halves folded onto each other, log2(VW) constant shuffles
   (HSUM_FOLDS). */
static inline float vhsum(vf x) {
    HSUM_FOLDS(x);
    return x[0];
}

/* 2^x for x <= 0: 2^n 2^f with n = round(x), f = x - n in [-1/2, 1/2], 2^f = 1 + f q(f)
   (q of degree 5, fitted to 2^f's relative error: under 1e-7 in float arithmetic). Below
   -127 x is clamped there, where 2^n's exponent bits are all zero: the result is 0 without
   a select. A NaN stays NaN (the comparison is false for it). */
static inline vf vexp2(vf x) {
    x = vmax(vsplat(-127.0f), x);   /* -127 > NaN is false: a NaN stays */
    /* n = round(x) by the 1.5 * 2^23 trick: its low mantissa bits hold n */
    vf t = x + 12582912.0f;
    vf f = x - (t - 12582912.0f);
    vi n = (vi)t - (vi)vsplat(12582912.0f);
    vf q = 1.535335322842002e-4f * f + 1.3398875016719103e-3f;
    q = q * f + 9.618437848985195e-3f;
    q = q * f + 5.5503323674201965e-2f;
    q = q * f + 2.4022647738456726e-1f;
    q = q * f + 6.931471824645996e-1f;
    return (q * f + 1.0f) * (vf)((n + 127) << 23);
}

/* The mask starts the score accumulators: a mask of one value per key (a padding mask)
   as a broadcast, one of a value per query and key (a causal mask, or a padding mask
   expanded to [B, 1, S, S]) from the key step's block of it transposed to [key][query]
   (ROW_MASK, mask_block). */
#define FOLD_MASK (HAS_MASK && MS2 == 0)
#define ROW_MASK (HAS_MASK && MS2 != 0)

static inline float mask_at(const float *mask, int query, int key) {
    return mask[(size_t)query * MS2 + (size_t)key * MS3];
}

#if ROW_MASK
/* Keys [j0, j0 + jn) of the mask rows of queries [q0, q0 + TQ) as mt[key][query] in base-2
   units (0 past the queries): VW x VW blocks transposed in registers where the keys lie
   contiguous, the edges one float at a time. The rows past the keys up to a multiple of MR
   repeat the last key's, as the score micro-tile's do. */
static void mask_block(const float *mask, int q0, int j0, int jn, float *mt) {
    int in = SQ - q0 < TQ ? SQ - q0 : TQ;
    for (int j = 0; j < jn; j += VW) {
        for (int i = 0; i < TQ; i += VW) {
            if (VW > 1 && MS3 == 1 && j + VW <= jn && i + VW <= in) {
                const float *at = mask + (size_t)(q0 + i) * MS2 + j0 + j;
                vf rows[VW];
                UNROLL for (int r = 0; r < VW; ++r) rows[r] = vload(at + (size_t)r * MS2) * LOG2E;
                TRANSPOSE_BLOCK(rows);
                UNROLL for (int r = 0; r < VW; ++r) vstore(mt + (j + r) * TQ + i, rows[r]);
                continue;
            }
            for (int jj = j; jj < j + VW && jj < jn; ++jj)
                for (int ii = i; ii < i + VW; ++ii)
                    mt[jj * TQ + ii] = ii < in ? mask_at(mask, q0 + ii, j0 + jj) * LOG2E : 0.0f;
        }
    }
    for (int j = jn; j % MR; ++j) memcpy(mt + j * TQ, mt + (jn - 1) * TQ, sizeof(float) * TQ);
}
#endif

/* Scores of keys [j0, j0 + jn) against the query tile, key-major: s[j][i] = K[j] . qt[:, i]
   + the mask (the key's value, or mt[j][i] with ROW_MASK), and mx[i] raised to the query's
   largest score. Keys are read where they lie (K or K^T), as broadcast scalars; the last
   micro-tile's rows past the keys repeat the last key and are never read. */
NOINLINE static void scores(const float *k, const float *qt, const float *mask,
                            const float *mt, int j0, int jn, float *s, float *mx) {
    (void)mask;
    (void)mt;
    for (int j = 0; j < jn; j += MR) {
        const float *kr[MR];
        float kmask[MR];
        UNROLL for (int r = 0; r < MR; ++r) {
            int key = j0 + (j + r < jn ? j + r : jn - 1);
            kr[r] = k + (size_t)key * (KT_INPUT ? 1 : K_ROW);
            kmask[r] = FOLD_MASK ? mask[(size_t)key * MS3] * LOG2E : 0.0f;
        }
        for (int i0 = 0; i0 < TQ; i0 += NR * VW) {
            vf acc[MR][NR];
            UNROLL for (int r = 0; r < MR; ++r)
                UNROLL for (int n = 0; n < NR; ++n)
                    acc[r][n] = ROW_MASK ? vload(mt + (j + r) * TQ + i0 + n * VW)
                                         : vsplat(kmask[r]);
            UNROLL4   /* 4 steps a loop: 4-15% faster than gcc's 1 on the AVX2 VM */
            for (int d = 0; d < D; ++d) {
                vf qv[NR];
                UNROLL for (int n = 0; n < NR; ++n) {
                    qv[n] = vload(qt + d * TQ + i0 + n * VW);
                    IN_REGISTER(qv[n]);
                }
                UNROLL for (int r = 0; r < MR; ++r) {
                    vf kb = vsplat(kr[r][(size_t)d * (KT_INPUT ? SK : 1)]);
                    UNROLL for (int n = 0; n < NR; ++n) acc[r][n] += kb * qv[n];
                }
            }
            vf top[NR];
            UNROLL for (int n = 0; n < NR; ++n) top[n] = vload(mx + i0 + n * VW);
            UNROLL for (int r = 0; r < MR; ++r)
                UNROLL for (int n = 0; n < NR; ++n) {
                    vstore(s + (j + r) * TQ + i0 + n * VW, acc[r][n]);
                    top[n] = vmax(top[n], acc[r][n]);
                }
            UNROLL for (int n = 0; n < NR; ++n) vstore(mx + i0 + n * VW, top[n]);
        }
    }
}

/* The online softmax step, vectorized over the queries (the mask and the max folded into
   the scores): s becomes P, the running max m becomes mx and the sum l is updated, alpha
   gets each query's rescale factor. */
static void softmax_step(float *s, int jn, float *m, const float *mx, float *l, float *alpha) {
    for (int i = 0; i < TQ; i += VW) {
        vf top = vload(mx + i);
        vf a = vexp2(vload(m + i) - top), sum = vsplat(0.0f);
        for (int j = 0; j < jn; ++j) {
            vf p = vexp2(vload(s + j * TQ + i) - top);
            vstore(s + j * TQ + i, p);
            sum += p;
        }
        vstore(l + i, vload(l + i) * a + sum);
        vstore(m + i, top);
        vstore(alpha + i, a);
    }
}

#if HAS_MASK
/* Keys that cannot matter to a query tile (see the module's docstring): SKIP_BELOW in
   the mask's units, SKIP_BELOW2 in the scores' base-2 ones. */
#define SKIP_BELOW (-104.0)
#define SKIP_BELOW2 (SKIP_BELOW * (double)LOG2E)
/* A mask plane's distinct rows (one per query, or one for all) and the heads of a batch
   with planes of their own. */
#define PLANE_ROWS (MS2 != 0 ? SQ : 1)
#define PLANE_HEADS (MS1 != 0 ? HEADS : 1)

/* The key the tile's first query's mask favours most: the key tile from it goes first. */
static int best_masked_key(const float *mask, int q0) {
    int best = 0;
    float top = mask_at(mask, q0, 0);
    for (int j = 1; j < SK; ++j) {
        float value = mask_at(mask, q0, j);
        if (value > top) top = value, best = j;
    }
    return best;
}

/* What tells a dead key in a query tile: a score each query is known to reach, at least
   (the floor), and the largest norm of the scaled queries. `on` is 0 where the floor is
   not finite. */
typedef struct {
    int q0, qn, on;
    double floor, qnorm;
    const float *qt, *knorm;
} dead_test;

static void set_floor(dead_test *t, double floor) {
    t->floor = floor;
    t->on = isfinite(floor) && floor > -FLT_MAX;
}

/* After the first key step: every query's running max is a score it reaches, their lowest
   the floor. */
static void floor_from_scores(dead_test *t, const float *m) {
    double floor = INFINITY;
    for (int i = 0; i < t->qn; ++i) floor = fmin(floor, m[i]);
    set_floor(t, floor);
}

static double query_norm(const dead_test *t) {
    float n2[TQ];
    for (int i = 0; i < TQ; ++i) n2[i] = 0.0f;
    for (int d = 0; d < D; ++d)
        for (int i = 0; i < TQ; ++i) n2[i] += t->qt[d * TQ + i] * t->qt[d * TQ + i];
    double top = 0.0;
    for (int i = 0; i < t->qn; ++i) top = fmax(top, sqrt((double)n2[i]));
    return isfinite(top) ? top * (1.0 + 1e-4) : INFINITY;   /* float sums: a margin */
}

/* Before any score: each query's score with key a0 is at least its mask there less the
   largest scaled query norm times the key's norm (Cauchy-Schwarz), so the lowest of those
   bounds is a floor. */
static dead_test dead_test_before(const float *qt, const float *knorm, const float *mask,
                                  int q0, int a0) {
    dead_test t = {q0, SQ - q0 < TQ ? SQ - q0 : TQ, 0, INFINITY, 0.0, qt, knorm};
    float low = mask_at(mask, q0, a0);
    for (int i = 1; MS2 != 0 && i < t.qn; ++i) {
        float value = mask_at(mask, q0 + i, a0);
        low = value < low ? value : low;
    }
    t.qnorm = query_norm(&t);
    set_floor(&t, (double)low * LOG2E - t.qnorm * knorm[a0]);
    return t;
}

/* 1 when every score of `key` in the tile lies more than -SKIP_BELOW2 under the floor (base
   2), its mask being at most `top` for the tile's queries (as the scores add it). */
static int key_is_dead(const dead_test *t, float top, int key) {
    double gap = (double)(top * LOG2E) - t->floor;
    if (!(gap < SKIP_BELOW2)) return 0;   /* a NaN: the key stays */
    double reach = t->qnorm * t->knorm[key];
    return reach + gap < SKIP_BELOW2 - 1e-6 * (reach + fabs(t->floor));
}

/* Narrows [*lo, *hi) (at most TK keys) to its first and last keys that are not dead. A
   mask of one value per query and key is reduced over the tile's queries first, along
   its rows (a plane with a NaN never gets here: mask_may_kill). */
static void trim_dead(const dead_test *t, const float *mask, int *lo, int *hi) {
    if (!t->on) return;
    float top[TK];
    int n = *hi - *lo;
    for (int j = 0; j < n; ++j) top[j] = mask_at(mask, t->q0, *lo + j);
    for (int i = 1; MS2 != 0 && i < t->qn; ++i) {
        const float *row = mask + (size_t)(t->q0 + i) * MS2 + (size_t)*lo * MS3;
        for (int j = 0; j < n; ++j) {
            float value = row[(size_t)j * MS3];
            top[j] = value <= top[j] ? top[j] : value;
        }
    }
    int first = 0, last = n;
    while (first < last && key_is_dead(t, top[first], *lo + first)) ++first;
    while (last > first && key_is_dead(t, top[last - 1], *lo + last - 1)) --last;
    *hi = *lo + last;
    *lo += first;
}

/* The lowest and highest value of one row of a mask plane (one query's keys) and whether
   it holds a NaN: mask_may_kill's part of a row, so that threads share a plane's rows. */
typedef struct {
    float lo, hi;
    int nan;
} row_span;

static row_span mask_row_span(const float *row) {
    row_span span = {INFINITY, -INFINITY, 0};
    int j = 0;
#if MS3 == 1 && VW > 1
    vf lo = vsplat(INFINITY), hi = vsplat(-INFINITY);
    vi nan = (vi){0};
    for (; j + VW <= SK; j += VW) {
        vf x = vload(row + j);
        lo = vsel(x < lo, x, lo);
        hi = vsel(x > hi, x, hi);
        nan |= x != x;
    }
    for (int u = 0; u < VW; ++u) {
        span.lo = lo[u] < span.lo ? lo[u] : span.lo;
        span.hi = hi[u] > span.hi ? hi[u] : span.hi;
        span.nan |= nan[u] != 0;
    }
#endif
    for (; j < SK; ++j) {
        float value = row[(size_t)j * MS3];
        span.lo = value < span.lo ? value : span.lo;
        span.hi = value > span.hi ? value : span.hi;
        span.nan |= value != value;
    }
    return span;
}

/* 1 when the mask plane whose rows' spans are `rows` spans more than -SKIP_BELOW, so that
   it may leave keys dead (a NaN anywhere: 0). */
static int mask_may_kill(const row_span *rows) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < PLANE_ROWS; ++i) {
        if (rows[i].nan) return 0;
        lo = rows[i].lo < lo ? rows[i].lo : lo;
        hi = rows[i].hi > hi ? rows[i].hi : hi;
    }
    return (double)hi - lo > -SKIP_BELOW;
}

/* The norms of one head's keys, for key_is_dead, summed in float vectors (along each key,
   or across keys where K comes transposed), with a margin for the float sums' rounding
   (under D units of the last place, halved by the square root). */
static void key_norms(const float *k, float *knorm) {
    const float margin = 1.0f + 1e-6f + (float)D * 6e-8f;
    for (int j = 0; j < SK; ++j) knorm[j] = 0.0f;
    if (KT_INPUT) {
        for (int d = 0; d < D; ++d) {
            const float *row = k + (size_t)d * SK;
            for (int j = 0; j < SK; ++j) knorm[j] += row[j] * row[j];
        }
    } else {
        for (int j = 0; j < SK; ++j) {
            const float *row = k + (size_t)j * K_ROW;
            vf acc = vsplat(0.0f);
            int d = 0;
            for (; d + VW <= D; d += VW) acc += vload(row + d) * vload(row + d);
            float n2 = vhsum(acc);
            for (; d < D; ++d) n2 += row[d] * row[d];
            knorm[j] = n2;
        }
    }
    for (int j = 0; j < SK; ++j) knorm[j] = sqrtf(knorm[j]) * margin;
}
#endif

/* Rows [i0, i0 + R) of o[TQ][DVP] = o * alpha + P^T[keys][TQ]^T V[keys][DVP] (o taken as
   zero on a query tile's first key step, `fresh`): R queries by NV vectors of V's columns
   at a time (R a constant where it is inlined). */
static inline __attribute__((always_inline)) void
accumulate_rows(const float *p, const float *v, int j0, int jn, const float *alpha, float *o,
                int fresh, int i0, int R) {
    for (int d0 = 0; d0 < DVP; d0 += NV * VW) {
        vf acc[MR][NV];
        UNROLL for (int r = 0; r < R; ++r) {
            vf a = vsplat(alpha[i0 + r]);
            UNROLL for (int n = 0; n < NV; ++n)
                acc[r][n] = fresh ? vsplat(0.0f) : vload(o + (i0 + r) * DVP + d0 + n * VW) * a;
        }
        UNROLL4
        for (int j = 0; j < jn; ++j) {
            const float *vrow = v + (size_t)(j0 + j) * V_STEP + d0;
            vf vv[NV];
            UNROLL for (int n = 0; n < NV; ++n) {
                vv[n] = vload(vrow + n * VW);
                IN_REGISTER(vv[n]);
            }
            UNROLL for (int r = 0; r < R; ++r) {
                vf pb = vsplat(p[j * TQ + i0 + r]);
                UNROLL for (int n = 0; n < NV; ++n) acc[r][n] += pb * vv[n];
            }
        }
        UNROLL for (int r = 0; r < R; ++r)
            UNROLL for (int n = 0; n < NV; ++n)
                vstore(o + (i0 + r) * DVP + d0 + n * VW, acc[r][n]);
    }
}

/* o[TQ][DVP] = o * alpha + P^T[keys][TQ]^T V[keys][DVP]: MR queries a micro-tile, the
   last TQ % MR of them in one narrower tile (the score micro-tile's MR keys need not
   divide the query tile). */
NOINLINE static void accumulate(const float *p, const float *v, int j0, int jn,
                                const float *alpha, float *o, int fresh) {
    int i0 = 0;
    for (; i0 + MR <= TQ; i0 += MR) accumulate_rows(p, v, j0, jn, alpha, o, fresh, i0, MR);
#if TQ % MR
    accumulate_rows(p, v, j0, jn, alpha, o, fresh, i0, TQ % MR);
#endif
}

/* qt[d][i] = Q[q0 + i][d] * QSCALE, zero past the queries: VW x VW blocks transposed in
   registers (TRANSPOSE_BLOCK: one shuffle stage per bit of the lane index), the edges
   one float at a time. */
static void scaled_queries_transposed(const float *q, int q0, float *qt) {
    for (int i0 = 0; i0 < TQ; i0 += VW) {
        for (int d0 = 0; d0 < D; d0 += VW) {
            if (VW > 1 && q0 + i0 + VW <= SQ && d0 + VW <= D) {
                vf rows[VW];
                UNROLL for (int r = 0; r < VW; ++r)
                    rows[r] = vload(q + (size_t)(q0 + i0 + r) * Q_ROW + d0) * QSCALE;
                TRANSPOSE_BLOCK(rows);
                UNROLL for (int r = 0; r < VW; ++r) vstore(qt + (d0 + r) * TQ + i0, rows[r]);
                continue;
            }
            for (int i = i0; i < i0 + VW; ++i)
                for (int d = d0; d < d0 + VW && d < D; ++d)
                    qt[d * TQ + i] = q0 + i < SQ ? q[(size_t)(q0 + i) * Q_ROW + d] * QSCALE : 0.0f;
        }
    }
}

/* One query tile's buffers: Q^T scaled, the scores (then P), the key step's mask block
   (ROW_MASK), the output accumulator (unwritten while `fresh`), the running max and sum,
   the max after a key step and the rescale factors. */
typedef struct {
    float qt[D * TQ] __attribute__((aligned(64)));
    float s[TK * TQ] __attribute__((aligned(64)));
    float mt[ROW_MASK ? TK * TQ : 1] __attribute__((aligned(64)));
    float o[TQ * DVP] __attribute__((aligned(64)));
    float m[TQ] __attribute__((aligned(64)));
    float l[TQ] __attribute__((aligned(64)));
    float mx[TQ] __attribute__((aligned(64)));
    float alpha[TQ] __attribute__((aligned(64)));
    int fresh;
} tile_state;

/* Keys [first, last) (at most TK) into the tile's online softmax and output. */
static void key_step(tile_state *t, const float *k, const float *v, const float *mask, int q0,
                     int first, int last) {
    (void)q0;
    memcpy(t->mx, t->m, sizeof(t->mx));
#if ROW_MASK
    mask_block(mask, q0, first, last - first, t->mt);
#endif
    scores(k, t->qt, mask, t->mt, first, last - first, t->s, t->mx);
    softmax_step(t->s, last - first, t->m, t->mx, t->l, t->alpha);
    accumulate(t->s, v, first, last - first, t->alpha, t->o, t->fresh);
    t->fresh = 0;
}

static void query_tile(const float *q, const float *k, const float *v, const float *mask,
                       const float *knorm, int q0, float *out) {
    tile_state t;
    scaled_queries_transposed(q, q0, t.qt);
    for (int i = 0; i < TQ; ++i) {
        t.m[i] = -FLT_MAX;
        t.l[i] = 0.0f;
    }
    t.fresh = 1;
    /* With a mask, the key tile from the first query's best-masked key goes first (less
       its keys the score bound alone shows dead): the scores it gives every query are
       the floor that tells dead keys in the others. */
    int a0 = 0, a1 = 0;
#if HAS_MASK
    dead_test dead = {0};
    if (knorm) {   /* NULL where the mask cannot leave a key dead */
        a0 = best_masked_key(mask, q0);
        a1 = a0 + TK < SK ? a0 + TK : SK;
        int last = a1;
        dead = dead_test_before(t.qt, knorm, mask, q0, a0);
        trim_dead(&dead, mask, &a0, &last);   /* a0 stays: its bound is the floor */
        if (a0 < last) key_step(&t, k, v, mask, q0, a0, last);
        floor_from_scores(&dead, t.m);
    }
#endif
    for (int j0 = 0; j0 < SK; j0 += TK) {
        int j1 = j0 + TK < SK ? j0 + TK : SK;
        /* the tile less the anchor's keys: [j0, a0) and [a1, j1), where not empty */
        int pieces[2][2] = {{j0, j1 < a0 ? j1 : a0}, {j0 > a1 ? j0 : a1, j1}};
        for (int p = 0; p < 2; ++p) {
            int first = pieces[p][0], last = pieces[p][1];
#if HAS_MASK
            if (first < last) trim_dead(&dead, mask, &first, &last);
#endif
            if (first < last) key_step(&t, k, v, mask, q0, first, last);
        }
    }
    if (t.fresh) memset(t.o, 0, sizeof(t.o));   /* defensive: a tile always has a key step */
    for (int i = 0; i < TQ && q0 + i < SQ; ++i) {
        float inv = 1.0f / t.l[i];
        for (int d = 0; d < DV; ++d) out[(size_t)(q0 + i) * O_ROW + d] = t.o[i * DVP + d] * inv;
    }
}

static const float *head_mask(const float *mask, int bh) {
    return mask + (size_t)(bh / HEADS) * MS0 + (size_t)(bh % HEADS) * MS1;
}

#if HAS_MASK
/* The mask's distinct [query, key] planes: one per batch and head it does not broadcast
   over; mask_plane(bh) is head bh's, plane_head(p) a head that reads plane p. */
#define MASK_PLANES ((MS0 != 0 ? BH / HEADS : 1) * PLANE_HEADS)

static int mask_plane(int bh) {
    return (MS0 != 0 ? bh / HEADS : 0) * PLANE_HEADS + (MS1 != 0 ? bh % HEADS : 0);
}

static int plane_head(int p) {
    return (MS0 != 0 ? p / PLANE_HEADS : 0) * HEADS + (MS1 != 0 ? p % PLANE_HEADS : 0);
}
#endif

void wpk_attention(const float *q, const float *k, const float *v, const float *mask,
                   float *out) {
    float *vp = PACK_V ? malloc(sizeof(float) * (size_t)BH * SK * DVP) : NULL;
    float *knorm = HAS_MASK ? malloc(sizeof(float) * (size_t)BH * SK) : NULL;
    int *kills = NULL;   /* per head: 1 where its mask plane may leave keys dead */
#if HAS_MASK
    kills = malloc(sizeof(int) * BH);
    row_span *spans = malloc(sizeof(row_span) * MASK_PLANES * PLANE_ROWS);
#endif
    #pragma omp parallel if (PAR && BH * NQT > 1)
    {
#if HAS_MASK
        /* once per row of each distinct plane of the mask (heads or batches it broadcasts
           over share a plane), the rows shared among the threads */
        #pragma omp for schedule(static)
        for (int r = 0; r < MASK_PLANES * PLANE_ROWS; ++r)
            spans[r] = mask_row_span(head_mask(mask, plane_head(r / PLANE_ROWS)) +
                                     (size_t)(r % PLANE_ROWS) * MS2);
#endif
        if (PACK_V || HAS_MASK) {
            #pragma omp for schedule(static)
            for (int bh = 0; bh < BH; ++bh) {
                for (int j = 0; PACK_V && j < SK; ++j)
                    for (int d = 0; d < DVP; ++d)
                        vp[((size_t)bh * SK + j) * DVP + d] =
                            d < DV ? v[BASE(V, bh) + (size_t)j * V_ROW + d] : 0.0f;
#if HAS_MASK
                kills[bh] = mask_may_kill(spans + (size_t)mask_plane(bh) * PLANE_ROWS);
                if (kills[bh]) key_norms(k + BASE(K, bh), knorm + (size_t)bh * SK);
#endif
            }
        }
        /* (head, query tile) units taken as threads come free: a descheduled thread
           holds up one unit, not a static share (as the micro-kernels do) */
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int bh = 0; bh < BH; ++bh) {
            for (int t = 0; t < NQT; ++t) {
                const float *mk = NULL, *kn = NULL;   /* kn: NULL where no key can die */
#if HAS_MASK
                mk = head_mask(mask, bh);
                kn = kills[bh] ? knorm + (size_t)bh * SK : NULL;
#endif
                const float *vb = PACK_V ? vp + (size_t)bh * SK * DVP : v + BASE(V, bh);
                query_tile(q + BASE(Q, bh), k + BASE(K, bh), vb, mk, kn, t * TQ,
                           out + BASE(O, bh));
            }
        }
    }
    free(vp);
    free(knorm);
    free(kills);
#if HAS_MASK
    free(spans);
#endif
}
"""


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def config_reason(shape: AttentionShape, config: Mapping) -> str | None:
    """None when `config` is a valid schedule of the shape, else why not."""
    if not set(KNOBS) <= set(config) <= set(KNOBS) | set(OPTIONAL_KNOBS):
        return (f"an attention config has the knobs {', '.join(KNOBS)} and optionally "
                f"{', '.join(OPTIONAL_KNOBS)}")
    if int(config.get("par", 1)) not in (0, 1):
        return "par is 1 (OpenMP threads) or 0 (the calling thread only)"
    tq, tk, vw, mr, nr = (int(config[k]) for k in KNOBS)
    if vw not in (1, 2, 4, 8, 16):
        return "vw must be 1, 2, 4, 8 or 16 floats"
    if min(tq, tk, mr, nr) < 1 or tq % (nr * vw) or tk % mr:
        return "tq must be a multiple of nr*vw, tk a multiple of mr"
    mask_rows = tk if shape.mask_shape is not None else 0   # at most (one per key per query)
    tile_bytes = 4 * tq * (shape.d + tk + mask_rows + _round_up(shape.dv, vw) + 4)
    if tile_bytes > STACK_LIMIT:
        return f"the tiles need {tile_bytes} bytes of stack, more than {STACK_LIMIT}"
    return None


def _hsum_macro(vw: int) -> str:
    """C for HSUM_FOLDS(x): adds the upper half of `x`'s lanes onto the lower, then the
    upper half of those, ..., so lane 0 ends with the sum (each a constant shuffle)."""
    folds = []
    width = vw // 2
    while width >= 1:
        lanes = ", ".join(str((lane + width) % vw) for lane in range(vw))
        folds.append(f"(x) += __builtin_shuffle((x), (vi){{{lanes}}});")
        width //= 2
    return "#define HSUM_FOLDS(x) do { " + " ".join(folds) + " } while (0)\n"


def _operand_strides(tag: str, rows: int, width: int, heads: int, bshd: bool) -> dict:
    """Batch, head and row strides (elements) of one operand, [B, H, S, D] or [B, S, H, D]."""
    if bshd:
        return {f"{tag}_b": rows * heads * width, f"{tag}_h": width, f"{tag}_row": heads * width}
    return {f"{tag}_b": heads * rows * width, f"{tag}_h": rows * width, f"{tag}_row": width}


def attention_source(shape: AttentionShape, heads: int, rank: int, config: Mapping,
                     bshd: tuple[bool, ...] = (False,) * 4) -> str:
    """The C source of the kernel `wpk_attention(q, k, v, mask, out)` for one shape
    (`heads`: the size of dim 1 of rank-4 tensors, 1 for rank 3; `bshd`: which of Q, K, V
    and the output are stored [B, S, H, D])."""
    reason = config_reason(shape, config)
    if reason:
        raise ValueError(reason)
    tq, tk, vw, mr, nr = (int(config[k]) for k in KNOBS)
    dvp = _round_up(shape.dv, vw)
    ms0, ms1, ms2, ms3 = mask_strides(shape, rank)
    registers = 32 if vw == 16 else 16   # AVX-512 has 32 vector registers, AVX2 16
    nv = max(n for n in range(1, min(dvp // vw, 4) + 1)
             if (dvp // vw) % n == 0 and (mr + 1) * n + 1 <= registers or n == 1)
    strides = {}
    for tag, rows, width, flag in (("q", shape.sq, shape.d, bshd[0]),
                                   ("k", shape.sk, shape.d, bshd[1]),
                                   ("v", shape.sk, shape.dv, bshd[2]),
                                   ("o", shape.sq, shape.dv, bshd[3])):
        strides.update(_operand_strides(tag, rows, width, heads, flag))
    return _HEADER.format(
        **strides, bh=shape.batch, heads=heads, sq=shape.sq, sk=shape.sk,
        d=shape.d, dv=shape.dv, dvp=dvp, tq=tq, tk=tk, vw=vw, mr=mr, nr=nr,
        nqt=-(-shape.sq // tq), par=int(config.get("par", 1)), k_transposed=int(shape.k_transposed),
        pack_v=int(dvp != shape.dv), has_mask=int(shape.mask_shape is not None),
        ms0=ms0, ms1=ms1, ms2=ms2, ms3=ms3, log2e=LOG2E,
        qscale=float(np.float32(shape.scale * LOG2E)),
    ) + f"#define NV {nv}\n" + transpose_macro(vw) + _hsum_macro(vw) + _BODY
