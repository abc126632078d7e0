"""C source of the fused inverted-residual kernel, every size baked in as a constant.

    source = block_source(geometry, config)   # void wpk_inverted_residual(x, w, y, scratch)

`w` points at the packed parameters (`inverted_residual.pack_block`): W1 as
[EV/KV1][CIN][KV1*VW] (the output channels of a register tile contiguous per
input channel), B1 [CE] (both absent at expansion 1), W2 [KBE][K][K][BLK], B2
[CE], W3 [OV/KV2][CE][KV2*VW], B3 [KBO*BLK], then with a gate WR as [CE][SQP],
BR [SQP], WE as [SQP][CE], BE [CE], all zero padded.

OpenMP runs strips of output rows (image, strip). A strip walks its rows; for
each it computes the rows of the expanded tensor H1 its depthwise window
needs and has not computed yet (all expanded channels, into a ring of the RIN
rows a row tile's window needs in a thread's buffer, row r in slot r mod RIN,
so each row is computed once per strip and the halo rows the next tile needs
stay where they are; at expansion 1 the depthwise reads X's rows in place),
then one row of the depthwise output H2 (a row buffer), then the output row:
the 1x1 project conv of that H2 row, bias and residual. H1 and H2 live only in
the thread's buffer, never in memory. (The kernel used to move the halo rows
to the front of the buffer before each tile: with row tiles of one or two
rows that moved two rows of H1 for each row computed, 7-9% of MobileNet-v2's
112x112, 56x56 and 28x28 blocks' time on two threads as AVX2, 2026-12-07.)

A squeeze-excitation gate needs all of H2 (its mean) before the first output
row, so a gated block runs in two phases of one parallel region: phase 1 is
the strips above writing H2 rows to `scratch` (the image's whole depthwise
output; H1 still lives only in the thread's buffer) and adding each row, still
in cache, to its strip's per-channel sums; then the means (the strips' sums
added) and the gate's two tiny 1x1 convs (vectors over their output channels,
activations in registers); phase 2 projects row tiles of H2 with the gate
folded into a copy of the project weights, project(H2 * gate) = (W3 * gate)
H2, or, where the weights are bigger than H2 (`folds_gate`), scales the rows
by the gate first. H2 thus goes to memory once and comes back once (before:
four passes over it, the mean and the scaling each a read, the scaling a
write). Phase 1 stores H2 rather than recomputing
it in phase 2: a recompute costs the expand and depthwise again (most of a
block's time), the store one write and one read of H2
(`scripts/bench_inverted_residual.py` shows a gated block's time against the
same block without its gate).

Strips of one per thread would compute the K - S rows of H1 at each boundary
twice. A block without a gate shares them instead (`shared_strips`, where that
spares the busiest strip at least a sixteenth of its rows: images up to about
28 rows on two threads): the strips at a boundary split its rows, the one
above computing the first half, the one below the rest (an odd row), and each
copies its half into an area of its buffer for the other, sets a flag and
copies the other's half in when it needs it, waiting for the flag. Even strips
walk their row tiles upwards (the first tile whole), odd ones downwards, so
both strips at a boundary reach it in the same tile, their first or both
their last, with runs of equal length; a strip gives its rows before it waits
for its neighbour's, so no strip waits for ever (each has its own thread; a
smaller team computes the rows twice). Against the strips computing them,
alternating in one process, MobileNet-v2's 14x14 blocks ran 2-6% faster on
two threads of the Zen 4 VM, with AVX-512 and as AVX2 (2026-12-06). A
stride-1 strip then reads only its own rows of X, so the output may alias the
input. On small images with large filters (EfficientNet's 14x14 and 7x7
blocks, 5x5 depthwise, two threads) the halo is 30-60% more expand work. A gated
block's phase 1 then splits each image by expanded channel blocks instead
(`wpk_ir_channel_chunks`: all rows, some channels per unit; the depthwise is per
channel and H2 goes to `scratch` anyway), unless a tuned config fixes the
strip height (`rows` > 0). Splitting a block without a gate the same way (H2 to
scratch, then the project by output tiles or rows) ran at 0.72-1.04x the strips'
speed on MobileNet-v2's 14x14 and 7x7 blocks on two threads (2026-11-27). Where
such a block's 1x1 weights outweigh its activations many times over (7x7 images,
960 expanded channels: `splits_channels`), the strips stream all the weights on
every thread; there it splits by channels, one chunk a thread, each thread
projecting its own chunk's depthwise rows (still in its buffer) into a partial
sum of the output that the threads then add up (`channel_chunks`): every weight
is read once per run and no halo row is computed twice.

The two 1x1 convs are register tiles of KV vectors of output channels by NP
pixels of a row: per input channel, KV weight vectors and NP broadcasts, KV x
NP FMAs; the accumulators start at the bias and end in the activation (and
the residual add) before the store. Where a conv's last output vector holds at most
half a vector of real channels (24 or 40 channels in blocks of 16: `half_last`), its
tile computes that vector as a half vector (256-bit FMAs, half the work of the padded
512-bit ones on the Zen 4 VM), the padding lanes stored as zeros: MobileNet-v2's blocks
with 24 output channels ran 4-8% faster, alternating in one process (2026-12-06).
The depthwise runs one vector of
channels at a time, the K x K weight vectors in registers, checked taps only
at the image's left and right edges; interior pixels go in tiles of DPX, then 4 and 2
(the rest of a row: 12 interior pixels of a 14-pixel row are a tile of 8 and one of 4,
not 8 and four single pixels; 1.4% faster over MobileNet-v2's blocks, 2026-12-06), each
filter row's input vectors loaded once for the tile's overlapping windows.
Activations are computed in registers, SiLU and Sigmoid with a float32
vector exp (range reduction and a degree-6 polynomial; AVX-512's round and scalef
instructions where they exist) and a reciprocal estimate refined by one Newton
step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from wpk.core.epilogue import EPILOGUE_TABLE
from wpk.kernels.c_expressions import c_float
from wpk.kernels.cpu.microkernels.ir_space import BlockGeometry, config_reason
from wpk.kernels.cpu.microkernels.isa import ISAS
from wpk.kernels.cpu.microkernels.vector_c import (
    INTRINSICS,
    VECTOR_FUNCTIONS,
    half_last,
    half_vectors,
)

_HEADER = INTRINSICS + r"""
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <sched.h>

typedef float vf __attribute__((vector_size({lanes} * 4)));
typedef float vfu __attribute__((vector_size({lanes} * 4), aligned(4), may_alias));
typedef int vi __attribute__((vector_size({lanes} * 4)));
#define INLINE static inline __attribute__((always_inline))
INLINE vf vload(const float *p) {{ return *(const vfu *)p; }}
INLINE void vstore(float *p, vf v) {{ *(vfu *)p = v; }}
INLINE vf vsplat(float v) {{ return v - (vf){{0}}; }}
INLINE vf vsel(vi m, vf a, vf b) {{ return (vf)((m & (vi)a) | (~m & (vi)b)); }}
""" + VECTOR_FUNCTIONS


def vector_header(lanes: int) -> str:
    """The includes and the vector types and helpers of a kernel of `lanes` float lanes."""
    return _HEADER.format(lanes=lanes) + half_vectors(lanes)


def activation_c(name: str, act: tuple) -> str:
    """`INLINE vf name(vf v)`: the activation step `act` ((step, attrs) or ('', ()))."""
    step, attrs = act
    body = "v"
    if step:
        values = EPILOGUE_TABLE[step].attr_values(dict(attrs))
        if step == "relu":
            body = "vmax(v, vsplat(0.0f))"
        elif step == "clip":
            lo, hi = values["min"], values["max"]
            if lo is not None:
                body = f"vmax({body}, vsplat({c_float(lo)}))"
            if hi is not None:
                body = f"vmin({body}, vsplat({c_float(hi)}))"
        elif step == "leaky_relu":
            body = f"vsel(v > 0.0f, v, v * {c_float(values['alpha'])})"
        elif step == "hard_sigmoid":
            body = (f"vmin(vmax(v * {c_float(values['alpha'])} + {c_float(values['beta'])}, "
                    "vsplat(0.0f)), vsplat(1.0f))")
        elif step == "hard_swish":
            body = "v * vmin(vmax(v * (1.0f / 6.0f) + 0.5f, vsplat(0.0f)), vsplat(1.0f))"
        elif step == "sigmoid":
            body = "vsigmoid(v)"
        elif step == "silu":
            body = "v * vsigmoid(v)"
        else:
            raise ValueError(f"the fused block has no activation {step!r}")
    return f"INLINE vf {name}(vf v) {{ return {body}; }}\n"


_POINTWISE = r"""
/* {kv} x {np} tile of a 1x1 conv: output vectors [t*{kv}, t*{kv}+{kv}) at pixels [p0, p0+{np})
   of a run, input blocks [c0, c1) of the run's [cf, ...); the source's block c starts at
   src + c * src_bs, the destination's at dst + c * dst_bs; res (the residual, laid out as
   dst) or NULL. The accumulators start at the bias (first pass of a run from block 0), zero
   (first pass of a run from a later block: a partial sum) or the partial sums in dst, and
   end in the residual add and the activation (last pass) or back in dst. With HALF the
   tile's last vector is a half vector (its real channels fit in its first half: half the
   FMAs where a vector FMA costs two half ones), stored with its padding lanes zero. */
INLINE void {name}(const float *src, size_t src_bs, const float *w, const float *bias,
                   float *dst, size_t dst_bs, const float *res, int t, int p0, int c0, int c1,
                   int cf) {{
    enum {{ HALF = {half}, KF = {kv} - HALF }};   /* full vectors */
    vf acc[{kv}][{np}];
    vh acch[{np}];
    size_t at[{kv}];
    const float *wt = w + (size_t)t * {cin} * {kv} * VW;
    _Pragma("GCC unroll 16") for (int j = 0; j < {kv}; ++j) {{
        int v = t * {kv} + j;
        at[j] = (size_t)(v / LG) * dst_bs + (size_t)(v % LG) * VW + (size_t)p0 * BLK;
        if (j < KF) {{
            vf b = cf == 0 ? vload(bias + v * VW) : vsplat(0.0f);
            _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p)
                acc[j][p] = c0 == cf ? b : vload(dst + at[j] + p * BLK);
        }} else {{
            vh b = cf == 0 ? vhload(bias + v * VW) : vhsplat(0.0f);
            _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p)
                acch[p] = c0 == cf ? b : vhload(dst + at[j] + p * BLK);
        }}
    }}
    for (int cb = c0; cb < c1; ++cb) {{
        const float *xp = src + (size_t)cb * src_bs + (size_t)p0 * BLK;
        const float *wc = wt + (size_t)cb * BLK * {kv} * VW;
        const int bn = cb == {real} / BLK ? {real} % BLK : BLK;   /* padding lanes: no FMAs */
        _Pragma("GCC unroll 4") for (int bi = 0; bi < bn; ++bi) {{
            vf wv[{kv}];
            _Pragma("GCC unroll 16") for (int j = 0; j < KF; ++j)
                wv[j] = vload(wc + (bi * {kv} + j) * VW);
            vh wh = HALF ? vhload(wc + (bi * {kv} + {kv} - 1) * VW) : vhsplat(0.0f);
            _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p) {{
                vf xv = vsplat(xp[p * BLK + bi]);
                _Pragma("GCC unroll 16") for (int j = 0; j < KF; ++j) acc[j][p] += xv * wv[j];
                if (HALF) acch[p] += vlow(xv) * wh;
            }}
        }}
    }}
    int last = c1 == {cin} / BLK;
    _Pragma("GCC unroll 16") for (int j = 0; j < {kv}; ++j) {{
        _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p) {{
            vf r = j < KF ? acc[j][p] : vwiden(acch[p]);
            if (last && res) r += vload(res + at[j] + p * BLK);
            vstore(dst + at[j] + p * BLK, last ? {act}(r) : r);
        }}
    }}
}}
"""


def _pointwise(prefix: str, kv: int, px: int, cin: str, real: int, act: str,
               tiles: int, half: bool) -> str:
    """Tiles of 1..px pixels and `{prefix}_run(src, src_bs, w, bias, dst, dst_bs, res,
    pixels, t_lo, t_hi, cb_lo, cb_hi)`: output tiles [t_lo, t_hi) of `tiles` of a run of
    `pixels` contiguous pixels (whole rows of a block) over input blocks [cb_lo, cb_hi) (all
    of them, or a channel chunk's: a partial sum), in passes of CBT blocks so a pass's
    weights stay in L1 over the run; the reduction skips the padding lanes past the `real`
    input channels. With `half` the last tile's last vector is a half vector
    (`half_last`)."""
    forms = [("", 0)] + ([("h", 1)] if half else [])
    parts = [_POINTWISE.format(name=f"{prefix}_{h}{np_}", kv=kv, np=np_, cin=cin, real=real,
                               act=act, half=flag) for h, flag in forms
             for np_ in range(1, px + 1)]
    args = "src, src_bs, w, bias, dst, dst_bs, res, t, p, c0, c1, cb_lo"

    def pixels(h: str) -> str:
        cases = "\n".join(f"                case {np_}: {prefix}_{h}{np_}({args}); break;"
                          for np_ in range(1, px))
        return f"""{{
                int p = 0;
                for (; p + {px} <= pixels; p += {px}) {prefix}_{h}{px}({args});
                switch (pixels - p) {{
{cases}
                default: break;
                }}
            }}"""
    body = pixels("")
    if half:
        body = f"if (t == {tiles - 1}) {pixels('h')} else {body}"
    parts.append(f"""
static void {prefix}_run(const float *src, size_t src_bs, const float *w, const float *bias,
                         float *dst, size_t dst_bs, const float *res, int pixels, int t_lo,
                         int t_hi, int cb_lo, int cb_hi) {{
    for (int c0 = cb_lo; c0 < cb_hi; c0 += CBT) {{
        int c1 = c0 + CBT < cb_hi ? c0 + CBT : cb_hi;
        for (int t = t_lo; t < t_hi; ++t)
            {body}
    }}
}}
""")
    return "".join(parts)


_BODY = r"""
/* one vector of channels of one depthwise output pixel from the expanded rows `rows`
   (valid filter rows [r0, r1)) */
INLINE vf dw_pixel(const float *const *rows, const vf wv[K][K], vf b, int r0, int r1, int ow,
                   int checked) {
    vf acc = b;
    for (int r = r0; r < r1; ++r) {
        const float *row = rows[r];
        _Pragma("GCC unroll 8") for (int s = 0; s < K; ++s) {
            int iw = ow * S - PL + s;
            if (checked && (iw < 0 || iw >= W)) continue;
            acc += vload(row + (size_t)iw * BLK) * wv[r][s];
        }
    }
    return act2(acc);
}

/* NP interior pixels from ow on (dw_tile_8, _4, _2): per filter row the input vectors the
   tile's windows cover are loaded once and reused by every pixel (registers, not reloads) */
#define DW_TILE(NP)                                                                          \
INLINE void dw_tile_##NP(const float *const *rows, const vf wv[K][K], vf b, int r0, int r1,  \
                         int ow, float *o) {                                                 \
    enum { SPAN = (NP - 1) * S + K };                                                        \
    vf acc[NP];                                                                              \
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p) acc[p] = b;                        \
    for (int r = r0; r < r1; ++r) {                                                          \
        const float *row = rows[r] + (ptrdiff_t)(ow * S - PL) * BLK;                         \
        vf xv[SPAN];                                                                         \
        _Pragma("GCC unroll 32") for (int q = 0; q < SPAN; ++q) xv[q] = vload(row + q * BLK); \
        _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p)                                \
            _Pragma("GCC unroll 8") for (int s = 0; s < K; ++s)                              \
                acc[p] += xv[p * S + s] * wv[r][s];                                          \
    }                                                                                        \
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p)                                    \
        vstore(o + (ow + p) * BLK, act2(acc[p]));                                            \
}
DW_TILE(8)
DW_TILE(4)
DW_TILE(2)

/* depthwise output row oh, channel blocks [kb0, kb1), into pixels [q * OW, q * OW + OW) of
   h2 ([KBE][h2_px][BLK]), from the rows of h1 ([KBE][H1_ROWS][W][BLK], a ring: row ih in
   slot ih % H1_ROWS; X itself at expansion 1) */
static void dw_row(const float *h1, const float *w2,
                   const float *b2, float *h2, size_t h2_px, int oh, int q, int kb0, int kb1) {
    int ih0 = oh * S - PT;
    int r0 = ih0 < 0 ? -ih0 : 0, r1 = H - ih0 < K ? H - ih0 : K;
    size_t slot[K];   /* a division each, once a row, not once a channel vector */
    for (int r = r0; r < r1; ++r)
#if H1_ROWS == H
        slot[r] = (size_t)(ih0 + r);   /* the ring holds the whole image: row ih in slot ih */
#else
        slot[r] = (size_t)(ih0 + r) % H1_ROWS;
#endif
    for (int kb = kb0; kb < kb1; ++kb) {
        for (int l = 0; l < LG; ++l) {
            vf wv[K][K];
            _Pragma("GCC unroll 8") for (int r = 0; r < K; ++r)
                _Pragma("GCC unroll 8") for (int s = 0; s < K; ++s)
                    wv[r][s] = vload(w2 + (((size_t)kb * K + r) * K + s) * BLK + l * VW);
            const float *rows[K];
            for (int r = r0; r < r1; ++r)
                rows[r] = h1 + (((size_t)kb * H1_ROWS + slot[r]) * W) * BLK + l * VW;
            vf b = vload(b2 + kb * BLK + l * VW);
            float *o = h2 + ((size_t)kb * h2_px + (size_t)q * OW) * BLK + l * VW;
            int ow = 0;
            for (; ow < OW && ow < OW_LO; ++ow)
                vstore(o + ow * BLK, dw_pixel(rows, wv, b, r0, r1, ow, 1));
#if DPX == 8
            for (; ow + 8 <= OW_HI; ow += 8) dw_tile_8(rows, wv, b, r0, r1, ow, o);
#endif
            for (; ow + 4 <= OW_HI; ow += 4) dw_tile_4(rows, wv, b, r0, r1, ow, o);
            for (; ow + 2 <= OW_HI; ow += 2) dw_tile_2(rows, wv, b, r0, r1, ow, o);
            for (; ow < OW_HI; ++ow) vstore(o + ow * BLK, dw_pixel(rows, wv, b, r0, r1, ow, 0));
            for (; ow < OW; ++ow) vstore(o + ow * BLK, dw_pixel(rows, wv, b, r0, r1, ow, 1));
        }
    }
}

#if SE
/* add depthwise output row oh of channel blocks [kb0, kb1) (still in cache) to the strip's
   per-channel sums */
static void row_sums(const float *h2n, float *part, int oh, int kb0, int kb1) {
    for (int kb = kb0; kb < kb1; ++kb)
        for (int l = 0; l < LG; ++l) {
            const float *row = h2n + ((size_t)kb * OH * OW + (size_t)oh * OW) * BLK + l * VW;
            vf acc = vload(part + kb * BLK + l * VW);
            for (int p = 0; p < OW; ++p) acc += vload(row + (size_t)p * BLK);
            vstore(part + kb * BLK + l * VW, acc);
        }
}
#endif

/* The expanded rows that output rows [oh0, oh1) need: [rows_from(oh0), rows_to(oh1)) */
INLINE int rows_from(int oh0) {
    int r = oh0 * S - PT;
    return r < 0 ? 0 : r;
}

INLINE int rows_to(int oh1) {
    int r = (oh1 - 1) * S - PT + K;
    return r > H ? H : r;
}

static _Thread_local float *thread_buffer;

/* Expanded rows [lo, hi) of an image that two adjacent strips need: the strip that computes
   them copies them into its area *area ([KBE][PUB_ROWS][W][BLK]) from row `at` on and
   sets *ready; the other waits for *ready and copies them out (reading the area's address
   only then). lo == hi: none. */
typedef struct {
    int lo, hi, at;
    float *const *area;
    int *ready;
} row_run;

/* A strip's shared rows (SHARE_ROWS): the neighbours' shares it takes and its own shares it
   gives them, each [above, below] */
typedef struct {
    row_run take[2], give[2];
} row_share;

#if defined(__x86_64__) || defined(__i386__)
#define PAUSE() __builtin_ia32_pause()
#else
#define PAUSE() ((void)0)
#endif

/* waits until *flag is set (by the thread of a neighbouring strip): spins, and once it has
   waited long (that thread descheduled) yields the core at each look */
static void wait_for(const int *flag) {
    for (unsigned spins = 0; !__atomic_load_n(flag, __ATOMIC_ACQUIRE); ++spins) {
        if (spins < (1u << 16))
            PAUSE();
        else
            sched_yield();
    }
}

#if EXPAND
/* expanded rows [r0, r1) of the image at xn, channel blocks [kb0, kb1), into their slots of
   the ring h1, one run of contiguous slots at a time */
static void expand_rows(const float *xn, const float *w1, const float *b1, float *h1, int r0,
                        int r1, int kb0, int kb1) {
    while (r0 < r1) {
        int slot = r0 % RIN, end = r1 - r0 < RIN - slot ? r1 : r0 + RIN - slot;
        ex_run(xn + (size_t)r0 * W * BLK, (size_t)H * W * BLK, w1, b1,
               h1 + (size_t)slot * W * BLK, (size_t)RIN * W * BLK, NULL, (end - r0) * W,
               kb0 * LG / KV1, kb1 * LG / KV1, 0, CB);
        r0 = end;
    }
}

/* expanded rows [r0, r1) of the image at xn that no neighbour gives (sh: NULL, none), channel
   blocks [kb0, kb1), computed into the ring h1 */
static void compute_rows(const float *xn, const float *w1, const float *b1, float *h1, int r0,
                         int r1, int kb0, int kb1, const row_share *sh) {
    while (r0 < r1) {
        int end = r1, taken = 0;
        for (int i = 0; sh && i < 2 && !taken; ++i) {
            const row_run *t = &sh->take[i];
            if (t->lo <= r0 && r0 < t->hi) {
                taken = 1;
                end = t->hi < r1 ? t->hi : r1;
            } else if (r0 < t->lo && t->lo < t->hi && t->lo < end) {
                end = t->lo;
            }
        }
        if (!taken)
            expand_rows(xn, w1, b1, h1, r0, end, kb0, kb1);
        r0 = end;
    }
}

/* rows [lo, hi) of a run between the ring h1 and its area, either way */
static void copy_rows(float *h1, const row_run *run, int lo, int hi, int kb0, int kb1,
                      int give) {
    for (int kb = kb0; kb < kb1; ++kb)
        for (int r = lo; r < hi; ++r) {
            float *held = h1 + ((size_t)kb * RIN + r % RIN) * W * BLK;
            float *shared = *run->area
                            + ((size_t)kb * PUB_ROWS + run->at + r - run->lo) * W * BLK;
            memcpy(give ? shared : held, give ? held : shared, (size_t)W * BLK * sizeof(float));
        }
}

/* makes the ring h1, which holds expanded rows [first, done), hold rows [lo, hi) (at most
   RIN): the rows it holds stay in their slots, the others are computed, except those a
   neighbour gives; then the strip gives its shares that h1 now holds, and only then takes
   its neighbours' (waiting for them): a strip never waits before it has given what it can */
static void load_rows(const float *xn, const float *w1, const float *b1, float *h1, int first,
                      int done, int lo, int hi, int kb0, int kb1, const row_share *sh) {
    int keep_lo = lo > first ? lo : first, keep_hi = hi < done ? hi : done;
    if (keep_lo >= keep_hi)
        keep_lo = keep_hi = hi;
    compute_rows(xn, w1, b1, h1, lo, keep_lo, kb0, kb1, sh);
    compute_rows(xn, w1, b1, h1, keep_hi, hi, kb0, kb1, sh);
    for (int i = 0; sh && i < 2; ++i) {
        const row_run *g = &sh->give[i];
        if (g->lo < g->hi && lo <= g->lo && g->hi <= hi && !*g->ready) {
            copy_rows(h1, g, g->lo, g->hi, kb0, kb1, 1);
            __atomic_store_n(g->ready, 1, __ATOMIC_RELEASE);
        }
    }
    for (int i = 0; sh && i < 2; ++i) {
        const row_run *t = &sh->take[i];
        for (int m = 0; m < 2; ++m) {
            int a = m ? keep_hi : lo, b = m ? hi : keep_lo;
            a = a > t->lo ? a : t->lo;
            b = b < t->hi ? b : t->hi;
            if (a >= b) continue;
            wait_for(t->ready);
            copy_rows(h1, t, a, b, kb0, kb1, 0);
        }
    }
}
#endif

/* output rows [oh0, oh1) of image n, RT rows at a time: the expanded rows they need that
   the previous tile has not computed (into the ring h1, where the halo rows it did compute
   stay; without an expand conv the rows are X's own), RT
   depthwise rows, one project run (with a gate: the depthwise rows go to h2all, the
   image's whole depthwise output, and the project waits for the gate). A gated block's
   strip may cover only expanded channel blocks [kb0, kb1) (whole expand tiles of KV1
   vectors); without a gate it covers them all. */
static void strip(const float *x, const float *w, float *y, float *buf, float *h2all,
                  float *part, int n, int oh0, int oh1, int kb0, int kb1, const row_share *sh,
                  int up) {
    const float *w1 = w, *b1 = w1 + W1_SIZE, *w2 = b1 + B1_SIZE, *b2 = w2 + KBE * K * K * BLK;
    const float *w3 = b2 + CE, *b3 = w3 + W3_SIZE;
    const float *xn = x + (size_t)n * CB * H * W * BLK;
    float *h1 = buf, *h2 = buf + (size_t)KBE * RIN * W * BLK;
    int first = 0, done = 0;   /* h1 holds input rows [first, done) */
    (void)w1; (void)b1; (void)w3; (void)b3; (void)h1; (void)h2; (void)h2all; (void)y;
    (void)part; (void)sh;
#if SE
    memset(part + (size_t)kb0 * BLK, 0, (size_t)(kb1 - kb0) * BLK * sizeof(float));
#endif
    int tiles = (oh1 - oh0 + RT - 1) / RT;
    for (int i = 0; i < tiles; ++i) {
        /* upwards the tiles are cut from the bottom: the first one is whole */
        int t0 = up ? oh1 - (i + 1) * RT : oh0 + i * RT, t1 = up ? oh1 - i * RT : t0 + RT;
        t0 = t0 < oh0 ? oh0 : t0;
        t1 = t1 > oh1 ? oh1 : t1;
#if EXPAND
        int lo = rows_from(t0), hi = rows_to(t1);
        load_rows(xn, w1, b1, h1, first, done, lo, hi, kb0, kb1, sh);
        first = lo;
        done = hi;
        const float *rows = h1;
#else
        const float *rows = xn;
#endif
#if SE
        for (int oh = t0; oh < t1; ++oh) {
            float *h2n = h2all + (size_t)n * KBE * OH * OW * BLK;
            dw_row(rows, w2, b2, h2n, (size_t)OH * OW, oh, oh, kb0, kb1);
            row_sums(h2n, part, oh, kb0, kb1);
        }
#else
        for (int oh = t0; oh < t1; ++oh)
            dw_row(rows, w2, b2, h2, (size_t)RT * OW, oh, oh - t0, kb0, kb1);
        const float *res = RESIDUAL && kb1 == KBE ? xn + (size_t)t0 * W * BLK : NULL;
        pr_run(h2, (size_t)RT * OW * BLK, w3, b3, y + (((size_t)n * KBO * OH) + t0) * OW * BLK,
               (size_t)OH * OW * BLK, res, (t1 - t0) * OW, 0, PR_TILES, kb0, kb1);
#endif
    }
}

static float *own_buffer(void) {
    float *buf = thread_buffer;
    if (!buf) {
        buf = aligned_alloc(64, BUFFER_BYTES);
        thread_buffer = buf;
    }
    return buf;
}

#if SE
/* the per-channel means of an image's depthwise output from its strips' sums */
static void se_mean(const float *part, int strips, float *mean) {
    for (int c = 0; c < CE / VW; ++c) {
        vf acc = vsplat(0.0f);
        for (int s = 0; s < strips; ++s) acc += vload(part + (size_t)s * CE + c * VW);
        vstore(mean + c * VW, acc * (1.0f / (OH * OW)));
    }
}

#if FOLD
/* output tile t of the project weights ([PR_TILES][CE][KV2 * VW]) times the gate of
   each input channel: project(h2 * gate) = (W3 * gate) h2 */
static void se_fold(const float *w, const float *gate, float *w3s, int t) {
    const float *w3 = w + W1_SIZE + B1_SIZE + KBE * K * K * BLK + CE;
    const size_t tile = (size_t)CE * KV2 * VW;
    for (int c = 0; c < CE; ++c) {
        vf g = vsplat(gate[c]);
        _Pragma("GCC unroll 8") for (int j = 0; j < KV2; ++j) {
            size_t at = (size_t)t * tile + ((size_t)c * KV2 + j) * VW;
            vstore(w3s + at, vload(w3 + at) * g);
        }
    }
}
#endif

/* the gate of image n from its means: two 1x1 convs of the pooled vector */
static void se_gate(const float *w, const float *mean, float *squeezed, float *gate) {
    const float *wr = w + SE_OFFSET, *br = wr + CE * SQP, *we = br + SQP, *be = we + SQP * CE;
    for (int j = 0; j < SQP / VW; ++j) {
        vf acc = vload(br + j * VW);
        for (int c = 0; c < EXPANDED; ++c) acc += vsplat(mean[c]) * vload(wr + c * SQP + j * VW);
        vstore(squeezed + j * VW, se1(acc));
    }
    for (int c = 0; c < CE / VW; ++c) {
        vf acc = vload(be + c * VW);
        for (int j = 0; j < SQUEEZED; ++j) acc += vsplat(squeezed[j]) * vload(we + j * CE + c * VW);
        vstore(gate + c * VW, se2(acc));
    }
}

/* output rows [t0, t1) of image n: project its depthwise rows with the gate folded into
   the weights (w3s: FOLD), or scale the rows by the gate first */
static void se_project(const float *x, const float *w, float *y, float *h2all,
                       const float *gate, const float *w3s, int n, int t0, int t1) {
    const float *w3 = w + W1_SIZE + B1_SIZE + KBE * K * K * BLK + CE, *b3 = w3 + W3_SIZE;
    float *h2 = h2all + (size_t)n * KBE * OH * OW * BLK;
    (void)gate; (void)w3s;
#if FOLD
    w3 = w3s;
#else
    for (int kb = 0; kb < KBE; ++kb)
        for (int l = 0; l < LG; ++l) {
            vf g = vload(gate + kb * BLK + l * VW);
            float *row = h2 + ((size_t)kb * OH * OW + (size_t)t0 * OW) * BLK + l * VW;
            for (int p = 0; p < (t1 - t0) * OW; ++p)
                vstore(row + p * BLK, vload(row + p * BLK) * g);
        }
#endif
    const float *res = RESIDUAL ? x + ((size_t)n * CB * H + t0) * W * BLK : NULL;
    pr_run(h2 + (size_t)t0 * OW * BLK, (size_t)OH * OW * BLK, w3, b3,
           y + (((size_t)n * KBO * OH) + t0) * OW * BLK, (size_t)OH * OW * BLK, res,
           (t1 - t0) * OW, 0, PR_TILES, 0, KBE);
}
#endif

/* output rows per strip: ROWS, or as many strips as threads */
static int strip_rows(int threads) {
    int rows = ROWS > 0 ? ROWS : (OH * N + threads - 1) / threads;
    return rows > OH ? OH : rows < 1 ? 1 : rows;
}

/* the channel chunks a gated block's first phase splits each image into (0: split its rows):
   when the strips of one per thread would compute more than 1/8 of the expanded rows twice
   (their halo rows: small images, large filters), each thread takes whole images' worth of
   rows for some expanded channel blocks instead, as many chunks as channel units
   (CUNITS, of CU_BLOCKS blocks, whole expand tiles) so the threads share them
   evenly; a block without a gate whose weights outweigh its activations (CHANNEL_SPLIT)
   into one chunk a thread when it has as many channel units; only by default (ROWS 0), a
   tuned strip height keeps the rows */
int wpk_ir_channel_chunks(int threads) {
#if SE && EXPAND
    int rows = strip_rows(threads);
    if (ROWS > 0 || threads < 2 || CUNITS < threads) return 0;
    int computed = 0;
    for (int s0 = 0; s0 < OH; s0 += rows) {
        int s1 = s0 + rows < OH ? s0 + rows : OH;
        computed += rows_to(s1) - rows_from(s0);
    }
    if (computed * 8 <= H * 9) return 0;
    return CUNITS < 16 * threads ? CUNITS : 16 * threads;
#elif CHANNEL_SPLIT
    (void)strip_rows;
    return ROWS == 0 && threads > 1 && CUNITS >= threads ? threads : 0;
#else
    (void)threads; (void)strip_rows;
    return 0;
#endif
}

#if SHARE_ROWS
/* The expanded rows both strips at a boundary (output row oh) need, [lo, hi): the strip
   above computes [lo, mid), the one below [mid, hi), an odd row included (at a boundary
   both strips reach first, it is in the first run of the one below: computing it there, the
   strip above would give it only at the end of its own first run, longer by that row) */
typedef struct {
    int lo, mid, hi;
} boundary;

static boundary boundary_at(int oh) {
    boundary b = {rows_from(oh), 0, rows_to(oh)};
    b.hi = b.hi < b.lo ? b.lo : b.hi;
    b.mid = b.lo + (b.hi - b.lo) / 2;
    return b;
}

/* the rows the strip from output row oh0 gives the strip above it: its area's first ones */
static int top_rows(int oh0) {
    if (oh0 == 0) return 0;
    boundary b = boundary_at(oh0);
    return b.hi - b.mid;
}

/* strip u's shares (output rows [oh0, oh1), strips of `rows`, areas `pub`, two flags a
   strip in `ready`: its share for the strip above, for the one below) */
static row_share share_of(float *const *pub, int *ready, int u, int oh0, int oh1, int rows) {
    row_share sh = {{{0, 0, 0, NULL, NULL}, {0, 0, 0, NULL, NULL}},
                    {{0, 0, 0, NULL, NULL}, {0, 0, 0, NULL, NULL}}};
    if (oh0 > 0) {
        boundary b = boundary_at(oh0);
        sh.take[0] = (row_run){b.lo, b.mid, top_rows(oh0 - rows), pub + u - 1,
                               ready + 2 * (u - 1) + 1};
        sh.give[0] = (row_run){b.mid, b.hi, 0, pub + u, ready + 2 * u};
    }
    if (oh1 < OH) {
        boundary b = boundary_at(oh1);
        sh.give[1] = (row_run){b.lo, b.mid, top_rows(oh0), pub + u, ready + 2 * u + 1};
        sh.take[1] = (row_run){b.mid, b.hi, 0, pub + u + 1, ready + 2 * (u + 1)};
    }
    return sh;
}

/* strips that share the expanded rows two of them need (see the module's docstring), one
   a thread: the even strips of an image walk their row tiles upwards, the odd ones
   downwards, so both strips at a boundary reach its rows in the same tile (their first or
   both their last); a smaller team runs plain strips (halo rows computed twice) */
static void shared_strips(const float *x, const float *w, float *y, int rows, int strips) {
    int units = N * strips;
    float *pub[units];
    int ready[2 * units];
    memset(ready, 0, sizeof(ready));
    #pragma omp parallel
    {
        int shares = omp_get_num_threads() >= units;
        #pragma omp for schedule(static, 1) nowait
        for (int u = 0; u < units; ++u) {
            int n = u / strips, s = u % strips, oh0 = s * rows;
            int oh1 = oh0 + rows < OH ? oh0 + rows : OH;
            pub[u] = own_buffer() + PUB_AT;
            row_share sh = share_of(pub, ready, u, oh0, oh1, rows);
            strip(x, w, y, own_buffer(), NULL, NULL, n, oh0, oh1, 0, KBE, shares ? &sh : NULL,
                  shares && s % 2 == 0);
        }
    }
}
#endif

/* the strips an image splits into whose neighbours share the expanded rows both need, on
   `threads` threads (0: the strips compute them twice): a strip a thread, the image not split
   by channels, strips tall enough that only neighbours share rows, and sharing sparing the
   busiest strip at least a sixteenth of its rows */
int wpk_ir_shared_strips(int threads) {
#if SHARE_ROWS
    int rows = strip_rows(threads), strips = (OH + rows - 1) / rows;
    if (strips < 2 || N * strips > threads || rows * S < K - S || wpk_ir_channel_chunks(threads))
        return 0;
    int twice = 0, once = 0;
    for (int s0 = 0; s0 < OH; s0 += rows) {
        int s1 = s0 + rows < OH ? s0 + rows : OH;
        int lo = rows_from(s0), hi = rows_to(s1);
        twice = hi - lo > twice ? hi - lo : twice;
        lo = s0 > 0 ? boundary_at(s0).mid : lo;
        hi = s1 < OH ? boundary_at(s1).mid : hi;
        once = hi - lo > once ? hi - lo : once;
    }
    return (twice - once) * 16 >= twice ? strips : 0;
#else
    (void)threads;
    return 0;
#endif
}

#if !SE && CHANNEL_SPLIT
/* a block without a gate split by expanded channels, one chunk of whole units a thread:
   each thread computes its channels' expanded and depthwise rows for all the output rows
   (no halo row twice) and their share of the project conv, a partial sum in its buffer (the
   first chunk's with the bias, the last one's with the residual), then the threads add the
   partial sums into y, each a slice of it (y may be x's buffer: every read of x comes
   before the barrier) */
static void channel_chunks(const float *x, const float *w, float *y, int threads) {
    float *parts[threads];
    #pragma omp parallel num_threads(threads)
    {
        int team = omp_get_num_threads(), me = omp_get_thread_num();
        int g0 = me * CUNITS / team, g1 = (me + 1) * CUNITS / team;
        float *buf = own_buffer(), *dst = buf + PARTIAL_AT;
        parts[me] = dst;
        for (int n = 0; n < N; ++n)
            strip(x, w, dst, buf, NULL, NULL, n, 0, OH, g0 * CU_BLOCKS, g1 * CU_BLOCKS, NULL, 0);
        #pragma omp barrier
        size_t vectors = (size_t)N * KBO * OH * OW * LG;
        for (size_t i = vectors * me / team; i < vectors * (me + 1) / team; ++i) {
            vf acc = vload(parts[0] + i * VW);
            for (int t = 1; t < team; ++t) acc += vload(parts[t] + i * VW);
            vstore(y + i * VW, acc);
        }
    }
}
#endif

/* scratch: with a gate, [N][KBE][OH*OW][BLK] depthwise outputs, then N x CE means, N x CE
   gates, N x SQP squeezed values, N x OH x CE strip sums (at most OH strips an image) and,
   with FOLD, N gated copies of the project weights (`scratch_floats`); else unused */
void wpk_inverted_residual(const float *x, const float *w, float *y, float *scratch) {
    int threads = omp_get_max_threads(), rows = strip_rows(threads);
    int strips = (OH + rows - 1) / rows, units = N * strips;
    int chunks = wpk_ir_channel_chunks(threads);
    if (chunks) {
        strips = 1;
        units = N * chunks;
    }
    (void)scratch;
#if SE
    float *h2all = scratch, *mean = h2all + (size_t)N * KBE * OH * OW * BLK;
    float *gate = mean + (size_t)N * CE, *squeezed = gate + (size_t)N * CE;
    float *part = squeezed + (size_t)N * SQP, *w3s = part + (size_t)N * OH * CE;
    (void)w3s;
    /* phase 2's row tiles: RT rows, or a strip's when that is less (every thread gets one) */
    int prt = RT < rows ? RT : rows, tiles = (OH + prt - 1) / prt;
    #pragma omp parallel
    {
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < units; ++u) {
            if (chunks) {   /* all rows of image n, channel units [g0, g1) */
                int n = u / chunks, g0 = (u % chunks) * CUNITS / chunks;
                int g1 = (u % chunks + 1) * CUNITS / chunks;
                strip(x, w, y, own_buffer(), h2all, part + (size_t)n * CE, n, 0, OH,
                      g0 * CU_BLOCKS, g1 * CU_BLOCKS, NULL, 0);
            } else {
                int n = u / strips, s0 = (u % strips) * rows;
                strip(x, w, y, own_buffer(), h2all, part + (size_t)u * CE, n, s0,
                      s0 + rows < OH ? s0 + rows : OH, 0, KBE, NULL, 0);
            }
        }
        #pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) {
            se_mean(part + (size_t)n * strips * CE, strips, mean + (size_t)n * CE);
            se_gate(w, mean + (size_t)n * CE, squeezed + (size_t)n * SQP, gate + (size_t)n * CE);
        }
#if FOLD
        #pragma omp for schedule(static)
        for (int u = 0; u < N * PR_TILES; ++u)
            se_fold(w, gate + (size_t)(u / PR_TILES) * CE, w3s + (size_t)(u / PR_TILES) * W3_SIZE,
                    u % PR_TILES);
#endif
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < N * tiles; ++u) {
            int n = u / tiles, t0 = (u % tiles) * prt;
            se_project(x, w, y, h2all, gate + (size_t)n * CE, w3s + (size_t)n * W3_SIZE, n,
                       t0, t0 + prt < OH ? t0 + prt : OH);
        }
    }
#else
#if CHANNEL_SPLIT
    if (chunks) {
        channel_chunks(x, w, y, chunks);
        return;
    }
#endif
#if SHARE_ROWS
    if (wpk_ir_shared_strips(threads)) {
        shared_strips(x, w, y, rows, strips);
        return;
    }
#endif
    #pragma omp parallel for schedule(dynamic, 1) if (units > 1)
    for (int u = 0; u < units; ++u) {
        int n = u / strips, s0 = (u % strips) * rows;
        strip(x, w, y, own_buffer(), NULL, NULL, n, s0, s0 + rows < OH ? s0 + rows : OH, 0,
              KBE, NULL, 0);
    }
#endif
}
"""


# A block splits by channels when its 1x1 weights outweigh its activations this many times
SPLIT_WEIGHTS = 8
# and a thread's partial sum of the output takes at most this many floats
SPLIT_FLOATS = 64 * 1024


def _interior(g: BlockGeometry) -> tuple[int, int]:
    """[lo, hi): the depthwise output columns whose window lies inside the row."""
    lo = min(g.ow, -(-g.pl // g.s))
    last = g.w - 1 + g.pl - (g.k - 1)
    hi = 0 if last < 0 else min(g.ow, last // g.s + 1)
    return lo, max(lo, hi)


def gate_padded(g: BlockGeometry, lanes: int) -> int:
    """The gate's reduced channels padded to whole vectors (0 without a gate)."""
    return -(-g.squeezed // lanes) * lanes


def folds_gate(g: BlockGeometry) -> bool:
    """Whether a gated block folds its gate into a copy of the project weights (one read and
    write of the weights) rather than scaling the depthwise output (one of that): when the
    weights are the smaller of the two, as in all but the last three of EfficientNet-B0's
    blocks (those project from a 7x7 output)."""
    ce = g.kbe * g.block
    return bool(g.squeezed) and ce * g.kbo * g.block <= ce * g.oh * g.ow


def splits_channels(g: BlockGeometry) -> bool:
    """Whether a block without a gate splits by expanded channels on two or more threads
    (`channel_chunks`) when its config leaves the strips to the thread count (`rows` 0):
    where its two 1x1 convs' weights take more than `SPLIT_WEIGHTS` times the bytes of its
    input and output, so that each thread streams only its share of them, and a thread's
    partial sum of the output fits `SPLIT_FLOATS`. Against the strips of one per thread on
    two threads, the config otherwise the same, alternating in one process (2026-12-02,
    three runs with AVX-512 and two with AVX2 on one host): MobileNet-v2's 7x7 blocks
    (weights 20x their activations) ran 1.08-1.18x faster; its 14x14 stride-2 block (5.5x)
    0.92-1.09x, its 14x14 stride-1 ones (2-3x) 0.93-1.05x, and its 28x28 ones (a quarter)
    0.74-0.82x with AVX-512: those keep the strips."""
    if g.squeezed or not g.expand:
        return False
    cin, ce, co = g.cb * g.block, g.kbe * g.block, g.kbo * g.block
    weights = ce * (cin + co)
    activations = g.n * (cin * g.h * g.w + co * g.oh * g.ow)
    return weights > SPLIT_WEIGHTS * activations and g.n * co * g.oh * g.ow <= SPLIT_FLOATS


def shares_rows(g: BlockGeometry) -> bool:
    """Whether the kernel of a block without a gate has the code for strips that share the
    expanded rows both need (`shared_strips`): wherever the depthwise window overlaps from
    one output row to the next (K > S) and there is an expand conv. Whether its strips
    share them on a team of threads, the compiled kernel decides (`wpk_ir_shared_strips`)."""
    return not g.squeezed and g.expand and g.k > g.s


def scratch_floats(g: BlockGeometry, lanes: int) -> int:
    """Floats of the scratch memory the kernel's caller passes (0 without a gate)."""
    if not g.squeezed:
        return 0
    ce = g.kbe * g.block
    folded = ce * g.kbo * g.block if folds_gate(g) else 0
    return g.n * (g.kbe * g.oh * g.ow * g.block + 2 * ce + gate_padded(g, lanes)
                  + g.oh * ce + folded)


def block_source(g: BlockGeometry, config: Mapping) -> str:
    """The C source of `wpk_inverted_residual(x, w, y)` for `g` under `config`
    (ValueError for an invalid config)."""
    reason = config_reason(g, config)
    if reason:
        raise ValueError(reason)
    isa = ISAS[str(config["isa"])]
    lanes = isa.lanes
    kv1, px1, kv2, px2 = (int(config[k]) for k in ("kv1", "px1", "kv2", "px2"))
    lg = g.block // lanes
    unit = math.lcm(kv1, lg)   # vectors of a channel chunk's unit: whole blocks, whole tiles
    cin, ce = g.cb * g.block, g.kbe * g.block
    lo, hi = _interior(g)
    rt = min(int(config["rt"]), g.oh)
    rin = min((rt - 1) * g.s + g.k, g.h)
    rows_floats = -(-(rin * g.kbe * g.w + g.kbe * rt * g.ow) * g.block // 16) * 16
    share = shares_rows(g)
    pub_rows = max(1, g.k - g.s)   # the rows a strip gives its neighbours: at most K - S
    pub_floats = g.kbe * pub_rows * g.w * g.block if share else 0
    split = splits_channels(g)
    partial_floats = g.n * g.kbo * g.oh * g.ow * g.block if split else 0   # a partial sum
    buffer_floats = rows_floats + pub_floats + partial_floats
    defines = dict(N=g.n, CB=g.cb, H=g.h, W=g.w, KBE=g.kbe, KBO=g.kbo, OH=g.oh, OW=g.ow,
                   K=g.k, S=g.s, PT=g.pt, PL=g.pl, BLK=g.block, VW=lanes, LG=lg, CE=ce,
                   PR_TILES=g.kbo * lg // kv2, KV2=kv2,
                   KV1=kv1, CUNITS=g.kbe * lg // unit, CU_BLOCKS=unit // lg,
                   FOLD=int(folds_gate(g)),
                   W1_SIZE=cin * ce if g.expand else 0, B1_SIZE=ce if g.expand else 0,
                   W3_SIZE=ce * g.kbo * g.block, RESIDUAL=int(g.residual),
                   EXPAND=int(g.expand), SE=int(g.squeezed > 0), SQUEEZED=g.squeezed,
                   SQP=gate_padded(g, lanes), EXPANDED=g.expanded,
                   SE_OFFSET=(cin * ce + ce if g.expand else 0) + g.kbe * g.k * g.k * g.block
                   + ce + ce * g.kbo * g.block + g.kbo * g.block,
                   DPX=8 if isa.registers >= 32 and g.k == 3 else 4,
                   ROWS=int(config["rows"]), CBT=int(config["cbt"]), RT=rt, RIN=rin,
                   H1_ROWS=rin if g.expand else g.h, OW_LO=lo,
                   OW_HI=hi, CHANNEL_SPLIT=int(split), PARTIAL_AT=rows_floats + pub_floats,
                   SHARE_ROWS=int(share), PUB_ROWS=pub_rows, PUB_AT=rows_floats,
                   BUFFER_BYTES=-(-buffer_floats * 4 // 64) * 64)
    parts = [vector_header(lanes)]
    parts += [f"#define {k} {v}\n" for k, v in defines.items()]
    parts.append(activation_c("act1", g.act1))
    parts.append(activation_c("act2", g.act2))
    parts.append(activation_c("linear", ("", ())))
    parts.append(activation_c("se1", g.se_act1))
    parts.append(activation_c("se2", g.se_act2))
    ev, ov = g.kbe * lg, g.kbo * lg   # output vectors of the two 1x1 convs
    if g.expand:
        parts.append(_pointwise("ex", kv1, px1, str(cin), g.in_channels, "act1", ev // kv1,
                                half_last(g.expanded, ev, lanes)))
    parts.append(_pointwise("pr", kv2, px2, str(ce), g.expanded, "linear", ov // kv2,
                            half_last(g.out_channels, ov, lanes)))
    parts.append(_BODY)
    return "".join(parts)
