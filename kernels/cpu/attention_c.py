"""The fused attention kernel as generated C: one query tile at a time, online softmax.

    source = attention_source(shape, heads, rank, config)   # sizes baked in as constants

For each (batch*head, query tile) pair (OpenMP over both): the tile of Q is
copied transposed and pre-scaled ([D, TQ], zero columns past Sq), then for
each key tile the scores are computed key-major, S^T = K Q^T, into a
[TK, TQ] block that stays in cache (keys read where they lie, K or K^T, as
broadcast scalars: no transposition), the mask is added, and the online
softmax runs vectorized over the queries (running max and sum per query, the
output accumulator rescaled by exp(m_old - m_new)); then P V is added to the
[TQ, Dv] accumulator, which is divided by the sums at the end. No
[seq, seq] tensor is ever written to memory. V is packed only when Dv is not
a multiple of the vector width.

Vectors are GCC vector extensions of `vw` floats (`vw` a config knob: the
host's lanes, fewer, or 1, the portable scalar path); gcc lowers them to
whatever the ISA flags of `toolchain.c_flags()` allow, and those flags are
part of the compile cache key.
"""

from __future__ import annotations

from collections.abc import Mapping

from wpk.kernels.cpu.attention_spec import AttentionShape, mask_strides

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
#define PACK_V {pack_v}
#define HAS_MASK {has_mask}
#define MS0 {ms0}
#define MS1 {ms1}
#define MS2 {ms2}
#define MS3 {ms3}
static const float SCALE = {scale!r}f;

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int vi __attribute__((vector_size(VW * 4)));
#define UNROLL _Pragma("GCC unroll 16")
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
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }

/* exp for x <= 0 (Cephes' single-precision polynomial on [-ln2/2, ln2/2]); 0 below the
   float range. */
static inline vf vexp(vf x) {
    vi tiny = x < -87.3f;
    x = vmax(x, vsplat(-87.3f));
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick: its low mantissa bits hold n */
    vf t = x * 1.44269504088896341f + 12582912.0f;
    vf fn = t - 12582912.0f;
    vi n = (vi)t - (vi)vsplat(12582912.0f);
    vf r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
    vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf y = p * r * r + r + 1.0f;
    vf scale = (vf)((n + 127) << 23);
    return vsel(tiny, vsplat(0.0f), y * scale);
}

/* Scores of keys [j0, j0 + jn) against the query tile, key-major: s[j][i] = K[j] . qt[:, i].
   Keys are read where they lie (K or K^T), as broadcast scalars; the last micro-tile's rows
   past the keys repeat the last key and are never read. */
static void scores(const float *k, const float *qt, int j0, int jn, float *s) {
    for (int j = 0; j < jn; j += MR) {
        const float *kr[MR];
        UNROLL for (int r = 0; r < MR; ++r) {
            int key = j0 + (j + r < jn ? j + r : jn - 1);
            kr[r] = k + (size_t)key * (KT_INPUT ? 1 : D);
        }
        for (int i0 = 0; i0 < TQ; i0 += NR * VW) {
            vf acc[MR][NR];
            UNROLL for (int r = 0; r < MR; ++r)
                UNROLL for (int n = 0; n < NR; ++n) acc[r][n] = vsplat(0.0f);
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
            UNROLL for (int r = 0; r < MR; ++r)
                UNROLL for (int n = 0; n < NR; ++n)
                    vstore(s + (j + r) * TQ + i0 + n * VW, acc[r][n]);
        }
    }
}

/* The mask, then the online softmax step, vectorized over the queries: s becomes P, the
   running max m and sum l are updated, alpha gets each query's rescale factor. */
static void softmax_step(float *s, const float *mask, int q0, int j0, int jn, float *m,
                         float *l, float *alpha) {
#if HAS_MASK
    for (int j = 0; j < jn; ++j) {
        float *row = s + j * TQ;
        const float *mk = mask + (size_t)(j0 + j) * MS3;
        if (MS2 == 0) {
            vf mv = vsplat(mk[0]);
            for (int i = 0; i < TQ; i += VW) vstore(row + i, vload(row + i) + mv);
        } else {
            int in = SQ - q0 < TQ ? SQ - q0 : TQ;
            for (int i = 0; i < in; ++i) row[i] += mk[(size_t)(q0 + i) * MS2];
        }
    }
#endif
    for (int i = 0; i < TQ; i += VW) {
        vf mx = vload(m + i);
        for (int j = 0; j < jn; ++j) mx = vmax(mx, vload(s + j * TQ + i));
        vf a = vexp(vload(m + i) - mx), sum = vsplat(0.0f);
        for (int j = 0; j < jn; ++j) {
            vf p = vexp(vload(s + j * TQ + i) - mx);
            vstore(s + j * TQ + i, p);
            sum += p;
        }
        vstore(l + i, vload(l + i) * a + sum);
        vstore(m + i, mx);
        vstore(alpha + i, a);
    }
}

/* o[TQ][DVP] = o * alpha + P^T[keys][TQ]^T V[keys][DVP] */
static void accumulate(const float *p, const float *v, int j0, int jn, const float *alpha,
                       float *o) {
    for (int i0 = 0; i0 < TQ; i0 += MR) {
        for (int d0 = 0; d0 < DVP; d0 += NV * VW) {
            vf acc[MR][NV];
            UNROLL for (int r = 0; r < MR; ++r) {
                vf a = vsplat(alpha[i0 + r]);
                UNROLL for (int n = 0; n < NV; ++n)
                    acc[r][n] = vload(o + (i0 + r) * DVP + d0 + n * VW) * a;
            }
            for (int j = 0; j < jn; ++j) {
                const float *vrow = v + (size_t)(j0 + j) * DVP + d0;
                vf vv[NV];
                UNROLL for (int n = 0; n < NV; ++n) {
                    vv[n] = vload(vrow + n * VW);
                    IN_REGISTER(vv[n]);
                }
                UNROLL for (int r = 0; r < MR; ++r) {
                    vf pb = vsplat(p[j * TQ + i0 + r]);
                    UNROLL for (int n = 0; n < NV; ++n) acc[r][n] += pb * vv[n];
                }
            }
            UNROLL for (int r = 0; r < MR; ++r)
                UNROLL for (int n = 0; n < NV; ++n)
                    vstore(o + (i0 + r) * DVP + d0 + n * VW, acc[r][n]);
        }
    }
}

static void query_tile(const float *q, const float *k, const float *v, const float *mask,
                       int q0, float *out) {
    float qt[D * TQ] __attribute__((aligned(64)));
    float s[TK * TQ] __attribute__((aligned(64)));
    float o[TQ * DVP] __attribute__((aligned(64)));
    float m[TQ] __attribute__((aligned(64))), l[TQ] __attribute__((aligned(64)));
    float alpha[TQ] __attribute__((aligned(64)));
    for (int i = 0; i < TQ; ++i) {
        for (int d = 0; d < D; ++d)
            qt[d * TQ + i] = q0 + i < SQ ? q[(size_t)(q0 + i) * D + d] * SCALE : 0.0f;
        m[i] = -FLT_MAX;
        l[i] = 0.0f;
    }
    memset(o, 0, sizeof(o));
    for (int j0 = 0; j0 < SK; j0 += TK) {
        int jn = SK - j0 < TK ? SK - j0 : TK;
        scores(k, qt, j0, jn, s);
        softmax_step(s, mask, q0, j0, jn, m, l, alpha);
        accumulate(s, v, j0, jn, alpha, o);
    }
    for (int i = 0; i < TQ && q0 + i < SQ; ++i) {
        float inv = 1.0f / l[i];
        for (int d = 0; d < DV; ++d) out[(size_t)(q0 + i) * DV + d] = o[i * DVP + d] * inv;
    }
}

void wpk_attention(const float *q, const float *k, const float *v, const float *mask,
                   float *out) {
    float *vp = PACK_V ? malloc(sizeof(float) * (size_t)BH * SK * DVP) : NULL;
    #pragma omp parallel if (PAR && BH * NQT > 1)
    {
        if (PACK_V) {
            #pragma omp for schedule(static)
            for (int bh = 0; bh < BH; ++bh)
                for (int j = 0; j < SK; ++j)
                    for (int d = 0; d < DVP; ++d)
                        vp[((size_t)bh * SK + j) * DVP + d] =
                            d < DV ? v[((size_t)bh * SK + j) * DV + d] : 0.0f;
        }
        /* (head, query tile) units taken as threads come free: a descheduled thread
           holds up one unit, not a static share (as the micro-kernels do) */
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int bh = 0; bh < BH; ++bh) {
            for (int t = 0; t < NQT; ++t) {
                const float *mk = NULL;
#if HAS_MASK
                mk = mask + (size_t)(bh / HEADS) * MS0 + (size_t)(bh % HEADS) * MS1;
#endif
                const float *vb = PACK_V ? vp + (size_t)bh * SK * DVP : v + (size_t)bh * SK * DV;
                query_tile(q + (size_t)bh * SQ * D, k + (size_t)bh * SK * D, vb, mk, t * TQ,
                           out + (size_t)bh * SQ * DV);
            }
        }
    }
    free(vp);
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
    if min(tq, tk, mr, nr) < 1 or tq % (nr * vw) or tq % mr or tk % mr:
        return "tq must be a multiple of nr*vw and of mr, tk a multiple of mr"
    tile_bytes = 4 * tq * (shape.d + tk + _round_up(shape.dv, vw) + 3)
    if tile_bytes > STACK_LIMIT:
        return f"the tiles need {tile_bytes} bytes of stack, more than {STACK_LIMIT}"
    return None


def attention_source(shape: AttentionShape, heads: int, rank: int, config: Mapping) -> str:
    """The C source of the kernel `wpk_attention(q, k, v, mask, out)` for one shape
    (`heads`: the size of dim 1 of rank-4 tensors, 1 for rank 3)."""
    reason = config_reason(shape, config)
    if reason:
        raise ValueError(reason)
    tq, tk, vw, mr, nr = (int(config[k]) for k in KNOBS)
    dvp = _round_up(shape.dv, vw)
    ms0, ms1, ms2, ms3 = mask_strides(shape, rank)
    registers = 32 if vw == 16 else 16   # AVX-512 has 32 vector registers, AVX2 16
    nv = max(n for n in range(1, min(dvp // vw, 4) + 1)
             if (dvp // vw) % n == 0 and (mr + 1) * n + 1 <= registers or n == 1)
    return _HEADER.format(
        bh=shape.batch, heads=heads, sq=shape.sq, sk=shape.sk,
        d=shape.d, dv=shape.dv, dvp=dvp, tq=tq, tk=tk, vw=vw, mr=mr, nr=nr,
        nqt=-(-shape.sq // tq), par=int(config.get("par", 1)), k_transposed=int(shape.k_transposed),
        pack_v=int(dvp != shape.dv), has_mask=int(shape.mask_shape is not None),
        ms0=ms0, ms1=ms1, ms2=ms2, ms3=ms3, scale=float(shape.scale),
    ) + f"#define NV {nv}\n" + _BODY
