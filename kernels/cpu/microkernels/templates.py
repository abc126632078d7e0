"""C source of the NCHWc micro-kernels, every size baked in as a constant.

    source = conv_source(geometry, config)   # void wpk_micro_conv(x, w, bias, sum, y, scratch)
    split_floats(geometry, config)           # floats of `scratch` (0: pass NULL)

Regular conv: for each (image, tile of KV output vectors, block of ROWS output
rows, column chunk) (OpenMP over all four) each row is cut into tiles of PX
pixels. (Units of a row block with every output tile inside, so a thread reuses
the row's input across the tiles, measured 0.53-1.18x these on ResNet-50's 1x1
convs on two threads, 2026-11-27: the weights then leave the cache instead.)
A tile keeps KV x PX accumulators in vector registers, starts them at
the bias and, for every input channel, filter row and column, loads the KV weight vectors
of that input channel (packed contiguously at prepare time: `pack_conv_filter`)
and adds each pixel's input value, broadcast, times them: KV + PX loads for
KV x PX FMAs. Then the epilogue runs on the registers (residual add,
activation) and the tile is stored. The input channels are reduced in passes
of CBT blocks over the whole row segment (partial sums parked in the output),
so a pass's weights stay in cache (the pass loop outside the unit's rows).
Pixels whose window leaves the image (left and right edges) take a one-pixel
tile that checks its columns; filter rows outside the image are skipped. The
interior's last tile takes a specialised smaller tile. An NCHW input (a stem)
is read as blocks of one channel (`IB` 1). The last tile of output vectors of an
ungrouped conv is compiled apart where it differs (`TILE`): it computes only the
vectors left (tiles of KV overhang 5 vectors in tiles of 2), the last of them a
half vector where its real channels fit in half of it (24, 56 or 116 channels in
blocks of 16: `half_last`, 256-bit FMAs, the padding lanes stored as zeros).
Against the tiles before, alternating in one process on the Zen 4 VM
(2026-12-06), 1x1 and 3x3 convs of 24-232 such channels ran 1.03-1.16x faster
with AVX-512; convs without such a tile compile as before.

Phase split (config `split`): the same parallel region first copies the input
into its SH x SW phases with the padding written out (`split_row`, into
`scratch`); a tap (r, s) then reads phase ((r*DH) % SH, (s*DW) % SW) at row
oh + r*DH/SH, column ow + s*DW/SW, so a tile's pixels are contiguous and no
tile checks edges. A strided 1x1 conv reads only phase (0, 0), OH x OW pixels:
a flattened 1x1 stride-1 conv of `_subsampled(geometry)` follows the copy. A
padded stride-1 KxK conv has one phase, the input with its padding written out.

Tiles are generated unrolled, every accumulator, weight vector and broadcast a
named variable, and the input pointer of each filter column is
hidden from the optimizer (`OPAQUE`): otherwise gcc shares the broadcasts of
overlapping columns across the unrolled taps and spills them (checked with
`gcc -S`: 700 stack accesses per tile sweep without it, none with it). Each tile
is a function of its own (`NOINLINE`) whose FMAs pin their accumulators
(`FMA_ACC`): inlined into the row loop, with plain `+=`, gcc 12 wrote vector
registers to the stack in 67 of 168 ResNet-50 configs on AVX2; as a function of its
own, in the hot tile of 23; with both, of 1 (a 7x7 stem tile using all 16 registers;
`tests/unit/test_microkernels.py` checks the assembly).

Depthwise conv: a tile is one vector of channels by PX pixels of a row; per
filter row the S weight vectors and the row's input vectors are loaded once and
reused by every pixel whose window covers them (registers, not reloads).

Vectors are GCC vector extensions of `lanes` floats (`isa.py`); `vload` and
`vstore` are unaligned, so any numpy buffer works.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import replace

from wpk.kernels.c_expressions import c_float
from wpk.kernels.cpu.microkernels.isa import ISAS, LINE_FLOATS
from wpk.kernels.cpu.microkernels.space import ConvGeometry, config_reason, prefetch_distance
from wpk.kernels.cpu.microkernels.vector_c import (
    INTRINSICS,
    VECTOR_FUNCTIONS,
    half_last,
    half_vectors,
)

# Parallel units per kernel call the column chunks aim at: a few per core, so the cores
# share the work evenly and each unit's tiles still reuse the weights they load.
TARGET_UNITS = max(32, 8 * (os.cpu_count() or 1))

# The C prelude of every vector kernel (a `str.format` template on `lanes`): the vector
# types, loads, stores, splat, select, and `vector_c`'s functions.
VECTOR_HEADER = INTRINSICS + r"""
#include <math.h>
#include <stddef.h>

typedef float vf __attribute__((vector_size({lanes} * 4)));
typedef float vfu __attribute__((vector_size({lanes} * 4), aligned(4), may_alias));
typedef int vi __attribute__((vector_size({lanes} * 4)));
#define INLINE static inline __attribute__((always_inline))
/* a register tile: compiled as a function of its own, so gcc allocates its registers alone */
#define NOINLINE static __attribute__((noinline))
/* hide a pointer's value from the optimizer (an empty asm that may change it) */
#define OPAQUE(p) __asm__("" : "+r"(p))
INLINE vf vload(const float *p) {{ return *(const vfu *)p; }}
INLINE void vstore(float *p, vf v) {{ *(vfu *)p = v; }}
INLINE vf vsplat(float v) {{ return v - (vf){{0}}; }}
INLINE vf vsel(vi m, vf a, vf b) {{ return (vf)((m & (vi)a) | (~m & (vi)b)); }}
""" + VECTOR_FUNCTIONS


def fake_quant_lines(scale: float, zero_point: float, low: float, high: float) -> list[str]:
    """`v` quantized and dequantized (the `fake_quant` step): round(clip(v / scale, low - zp,
    high - zp)) * scale, which equals (clip(round(v / scale) + zp, low, high) - zp) * scale
    as the bounds are integers. The rounding, half to even, adds and subtracts 1.5 * 2^23:
    exact for |x| < 2^22, which the clip ensures (gcc keeps both: no -ffast-math)."""
    s, lo, hi = c_float(scale), c_float(low - zero_point), c_float(high - zero_point)
    return [f"    v = vmin(vmax(v / {s}, vsplat({lo})), vsplat({hi}));",
            "    v = (v + 12582912.0f) - 12582912.0f;",
            f"    v = v * {s};"]


def activation_lines(act: str | None, params: tuple[float, ...]) -> list[str]:
    """C statements applying activation `act` (a name of `space.ACTIVATIONS` or of
    `space.VECTOR_ACTIVATIONS`' values; None: none) with `params` to the vector `v`."""
    p = [c_float(value) for value in params]
    if act == "Relu":
        return ["    v = vmax(v, vsplat(0.0f));"]
    if act == "Clip":
        return [f"    v = vmin(vmax(v, vsplat({p[0]})), vsplat({p[1]}));"]
    if act == "LeakyRelu":
        return [f"    v = vsel(v > 0.0f, v, v * {p[0]});"]
    if act == "HardSigmoid":
        return [f"    v = vmin(vmax(v * {p[0]} + {p[1]}, vsplat(0.0f)), vsplat(1.0f));"]
    if act == "Silu":
        return ["    v = v * vsigmoid(v);"]
    if act == "HardSwish":
        return ["    v = v * vmin(vmax(v * (1.0f / 6.0f) + 0.5f, vsplat(0.0f)), vsplat(1.0f));"]
    if act == "Gelu":   # erf's: x (1 + erf(x / sqrt 2)) / 2
        return ["    v = v * (verf(v * 0.70710678118654752f) * 0.5f + 0.5f);"]
    if act == "QuickGelu":   # x sigmoid(alpha x)
        return [f"    v = v * vsigmoid(v * {p[0]});"]
    if act == "Mish":   # x tanh(softplus(x)) = x p / (p + 2), p = e^x (e^x + 2); 1 from x = 20 on
        return ["    { vf e = vexp(vmin(v, vsplat(20.0f))), q = e * (e + 2.0f);",
                "      v = v * q * vrecip(q + 2.0f); }"]
    if act == "Sigmoid":   # NaN stays NaN (vsigmoid's clamp would make it 0)
        return ["    v = vsel(v != v, v, vsigmoid(v));"]
    if act == "Tanh":
        return ["    v = vtanh(v);"]
    if act == "FakeQuant":   # (scale, zero point, low, high): `fake_quant_lines`
        return fake_quant_lines(*params)
    if act is None:
        return []
    raise ValueError(f"no vector form of activation {act!r}")


def _epilogue(g: ConvGeometry) -> str:
    """`INLINE vf epilogue(vf v, const float *sum, float *y)`: residual add, activation,
    store, every activation on the vectors."""
    lines = ["INLINE void epilogue(vf v, const float *sum, float *y) {"]
    if g.sum_index is not None:
        lines.append("    v += vload(sum);")
    lines += activation_lines(g.activation, g.activation_params)
    lines.append("    vstore(y, v);")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _interior(g: ConvGeometry) -> tuple[int, int]:
    """[lo, hi): the output columns whose window lies inside the image's columns."""
    lo = min(g.ow, -(-g.pl // g.sw))
    last = (g.w - 1 + g.pl - (g.s - 1) * g.dw)
    hi = 0 if last < 0 else min(g.ow, last // g.sw + 1)
    return lo, max(lo, hi)


def _edge_cuts(g: ConvGeometry) -> list[int]:
    """0, OW and the output columns where some filter column's tap enters or leaves the
    image (ceil((PL - s*DW) / SW) and ceil((W + PL - s*DW) / SW)), sorted: between two
    of them every tap is inside the image for all pixels or for none."""
    cuts = {0, g.ow}
    for s in range(g.s):
        for edge in (g.pl - s * g.dw, g.w + g.pl - s * g.dw):
            cut = -(-edge // g.sw)
            if 0 < cut < g.ow:
                cuts.add(cut)
    return sorted(cuts)


def _chunks(g: ConvGeometry, rows: int, px: int) -> tuple[int, int]:
    """(column chunk width, chunks per row): rows split so there are about TARGET_UNITS
    units, each chunk a whole number of tiles."""
    want = max(1, min(_ceil_div(TARGET_UNITS, max(rows, 1)), _ceil_div(g.ow, px)))
    width = _ceil_div(_ceil_div(g.ow, want), px) * px
    return width, _ceil_div(g.ow, width)


_CONV_TILE = r"""
/* KV x {np} tile at output (n, kt, oh, ow), input blocks [c0, c1): the accumulators start at
   the bias (c0 == 0) or at the partial sums in y, and end in the epilogue (c1 == CR) or back
   in y. CHECKED tiles (one pixel) test their columns. Every accumulator, weight vector and
   broadcast is a named variable and every FMA pins its accumulator (`FMA_ACC`), so gcc keeps
   them all in registers. */
NOINLINE void tile_{name}(const float *x, const float *w, const float *bias, const float *sum,
                        float *y, int n, int kt, int oh, int ow, int c0, int c1) {{
{init}
    const float *wk = w + (size_t)kt * CR * R * S * IB * TK;
    for (int cb = c0; cb < c1; ++cb) {{
        for (int r = 0; r < R; ++r) {{
{row}
            const float *wr = wk + (size_t)((cb * R + r) * S) * IB * TK;
            for (int s = 0; s < S; ++s) {{
{column}
                OPAQUE(xp);   /* no sharing of broadcasts across taps: they would spill */
                const float *ws = wr + s * IB * TK;
{prefetch}
                _Pragma("GCC unroll {unroll}") for (int bi = 0; bi < IB; ++bi) {{
{body}
                }}
            }}
        }}
    }}
{store}
}}
"""

# Input addressing of a tap (filter row r, column s) of the tile's first pixel: the image
# itself (rows outside it skipped, columns checked in CHECKED tiles), or its phase split,
# whose padding is explicit (no checks; pixels of a phase row are contiguous).
_DIRECT_ROW = """\
            int ih = oh * SH - PT + r * DH;
            if (ih < 0 || ih >= H) continue;
            const float *xrow = x + (((size_t)n * CB + GROUP_BASE(kt) + cb) * H + ih) * W * IB;"""
_DIRECT_COLUMN = """\
                ptrdiff_t iw = (ptrdiff_t)ow * SW - PL + s * DW;
                if ({checked} && (iw < 0 || iw >= W)) continue;
                const float *xp = xrow + iw * IB;"""
_PHASE_ROW = """\
            const int ra = (r * DH) % SH, ri = oh + (r * DH) / SH;
            const float *xrow = x + ((((size_t)n * CB + GROUP_BASE(kt) + cb) * PA + ra) * PB * PH
                                      + ri) * PW * IB;"""
_PHASE_COLUMN = """\
                const float *xp = xrow + ((size_t)((s * DW) % SW) * PH * PW
                                          + ow + (s * DW) / SW) * IB;"""


def _prefetches(span: int) -> str:
    """Prefetches of the `span` floats a tap reads, PF input blocks (planes of PLANE floats)
    further along the reduction: one per cache line, and the span's last float (the pixels
    need not start on a line)."""
    offsets = sorted(set(range(0, span, LINE_FLOATS)) | {span - 1})
    return "\n".join(f"                __builtin_prefetch(xp + PF * PLANE + {o}, 0, 3);"
                     for o in offsets)


def _conv_tile(name: str, np_: int, kv: int, checked: int, unroll: int, phase: bool,
               span: int | None = None, half: bool = False) -> str:
    """The C function of a KV x np_ register tile (see `_CONV_TILE`) reading the image
    (`phase` False) or its phase split; with `span` (the floats a tap reads) each tap
    prefetches its pixels PF blocks ahead. `kv`: the tile's vectors (the last tile's may
    be fewer than KV); with `half` its last vector is a half vector (`half_last`), stored
    widened, its padding lanes zero."""
    acc = [[f"a{j}_{p}" for p in range(np_)] for j in range(kv)]
    short = [half and j == kv - 1 for j in range(kv)]   # the half vector
    init, body, store = [], [], []
    for j in range(kv):
        vec, load, splat = ("vh", "vhload", "vhsplat") if short[j] else ("vf", "vload", "vsplat")
        init.append(f"    const int v{j} = kt * KV + {j} < KVEC ? kt * KV + {j} : KVEC - 1;")
        init.append(f"    const size_t o{j} = ((((size_t)n * KB + v{j} * VW / BLK) * OH + oh) "
                    f"* OW + ow) * BLK + (v{j} * VW) % BLK;")
        init.append(f"    const {vec} b{j} = HAS_BIAS ? {load}(bias + (kt * KV + {j}) * VW) "
                    f": {splat}(0.0f);")
        for p in range(np_):
            init.append(f"    {vec} {acc[j][p]} = c0 == 0 ? b{j} : {load}(y + o{j} + {p} * BLK);")
        body.append(f"                    const {vec} w{j} = {load}(ws + bi * TK + {j} * VW);")
    for p in range(np_):
        body.append(f"                    const vf x{p} = vsplat(xp[{p} * XSTEP + bi]);")
        for j in range(kv):
            x = f"vlow(x{p})" if short[j] else f"x{p}"
            body.append(f"                    FMA_ACC({acc[j][p]}, {x}, w{j});")
    for j in range(kv):
        store.append(f"    if (kt * KV + {j} < KVEC) {{")
        for p in range(np_):
            at = f"o{j} + {p} * BLK"
            value = f"vwiden({acc[j][p]})" if short[j] else acc[j][p]
            store.append(f"        if (c1 == TILE_CR(kt)) epilogue({value}, sum + {at}, "
                         f"y + {at});")
            store.append(f"        else vstore(y + {at}, {value});")
        store.append("    }")
    row, column = (_PHASE_ROW, _PHASE_COLUMN) if phase else (_DIRECT_ROW, _DIRECT_COLUMN)
    return _CONV_TILE.format(name=name, np=np_, unroll=unroll, init="\n".join(init),
                             row=row, column=column.format(checked=checked),
                             prefetch=_prefetches(span) if span else "",
                             body="\n".join(body), store="\n".join(store))


_DW_TILE = r"""
/* {np} pixels x one vector of channels (lane group l of block kb) at output (n, oh, ow):
   each output channel reduces over its group's GW input channels, which lie in the same
   vector (GW 1, a depthwise conv: its own channel); input channel ci of each group reaches
   the group's lanes by a shuffle (GROUP_LANE) */
INLINE void tile_{name}(const float *x, const float *w, const float *bias, const float *sum,
                        float *y, int n, int kb, int l, int oh, int ow, int c0, int c1) {{
    (void)c0; (void)c1;   /* a depthwise tile reduces over its filter only */
    vf acc[{np}];
    vf b = HAS_BIAS ? vload(bias + kb * BLK + l * VW) : vsplat(0.0f);
    _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p) acc[p] = b;
    _Pragma("GCC unroll {unroll}") for (int r = 0; r < R; ++r) {{
        int ih = oh * SH - PT + r * DH;
        if (ih < 0 || ih >= H) continue;
        const float *xr = x + (((size_t)n * KB + kb) * H + ih) * W * BLK + l * VW;
        _Pragma("GCC unroll 16") for (int ci = 0; ci < GW; ++ci) {{
            const float *wr = w + ((size_t)(kb * R + r) * GW + ci) * S * BLK + l * VW;
            vf wv[S];
            _Pragma("GCC unroll 16") for (int s = 0; s < S; ++s) wv[s] = vload(wr + s * BLK);
            enum {{ SPAN = ({np} - 1) * SW + (S - 1) * DW + 1 }};
            vf xv[SPAN];
            _Pragma("GCC unroll 64") for (int q = 0; q < SPAN; ++q) {{
                int iw = ow * SW - PL + q;
                xv[q] = ({checked}) && (iw < 0 || iw >= W)
                    ? vsplat(0.0f) : GROUP_LANE(vload(xr + (ptrdiff_t)iw * BLK), ci);
            }}
            _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p)
                _Pragma("GCC unroll 16") for (int s = 0; s < S; ++s)
                    acc[p] += xv[p * SW + s * DW] * wv[s];
        }}
    }}
    size_t base = (((size_t)n * KB + kb) * OH + oh) * OW;
    _Pragma("GCC unroll 16") for (int p = 0; p < {np}; ++p) {{
        size_t at = (base + ow + p) * BLK + l * VW;
        epilogue(acc[p], sum + at, y + at);
    }}
}}
"""

_ROW = r"""
/* output columns [from, to) outside the interior: split at the columns where a filter
   column's taps enter or leave the image (CUTS), so in each piece every tap is inside or
   outside for all its pixels and a PX tile checks its first pixel's columns for all (a
   dilated conv's window can be wider than the image: no interior at all) */
static void edge(const float *x, const float *w, const float *bias, const float *sum,
                 float *y, {params}, int oh, int from, int to, int c0, int c1) {{
    static const int CUTS[] = {{ {cuts} }};
    for (int k = 0; k + 1 < (int)(sizeof CUTS / sizeof CUTS[0]); ++k) {{
        int ow = CUTS[k] > from ? CUTS[k] : from;
        int end = CUTS[k + 1] < to ? CUTS[k + 1] : to;
        for (; ow + PX <= end; ow += PX) TILE(edge)(x, w, bias, sum, y, {args}, oh, ow, c0, c1);
        for (; ow < end; ++ow) TILE(checked)(x, w, bias, sum, y, {args}, oh, ow, c0, c1);
    }}
}}

/* output columns [b0, b1) of rows [oh0, oh1): checked edges, PX tiles, one smaller tile;
   the input blocks in passes of CBT, so a pass's weights stay in cache while the tiles of
   all the rows run */
static void row(const float *x, const float *w, const float *bias, const float *sum, float *y,
                {params}, int oh0, int oh1, int b0, int b1) {{
    int hi = b1 < OW_HI ? b1 : OW_HI;
    for (int c0 = 0; c0 < PASSES * CBT && c0 < {cr}; c0 += CBT)
    for (int oh = oh0; oh < oh1; ++oh) {{
        int c1 = c0 + CBT < {cr} ? c0 + CBT : {cr};
        int ow = b1 < OW_LO ? b1 : OW_LO;
        if (b0 < ow) edge(x, w, bias, sum, y, {args}, oh, b0, ow, c0, c1);
        ow = b0 > ow ? b0 : ow;
        for (; ow + PX <= hi; ow += PX) TILE(full)(x, w, bias, sum, y, {args}, oh, ow, c0, c1);
        switch (hi - ow) {{
{cases}
        default: break;
        }}
        ow = ow > hi ? ow : hi;
        if (ow < b1) edge(x, w, bias, sum, y, {args}, oh, ow, b1, c0, c1);
    }}
}}

/* scratch: the phase split of x (split kernels; NULL otherwise) */
void wpk_micro_conv(const float *x, const float *w, const float *bias, const float *sum,
                    float *y, float *scratch) {{
    (void)scratch;
    #pragma omp parallel if (UNITS > 1)
    {{
{pre}
        #pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < UNITS; ++u) {{
            int c = u % NCH, t = u / NCH;
            int oh = t % OHB * ROWS; t /= OHB;
{decode}
            int b0 = c * CW, b1 = b0 + CW < OW ? b0 + CW : OW;
            row(xin, w, bias, sum, y, {args}, oh, oh + ROWS < OH ? oh + ROWS : OH, b0, b1);
        }}
    }}
}}
"""

_SPLIT = r"""
/* Phase split of the padded input: phase (a, b) holds pixels (XSH*i + a - XPT, XSW*j + b - XPL)
   of the image, zero outside it, as [N][CB][PA][PB][PH][PW][IB]. Unit q fills row i of the
   phases (a, *) of image n, input block cb. */
static void split_row(const float *x, float *xs, int q) {
    int i = q % PH, t = q / PH;
    int a = t % PA; t /= PA;                    /* t: n * CB + cb */
    int ih = i * XSH + a - XPT;
    const float *src = x + ((size_t)t * XH + (ih < 0 ? 0 : ih < XH ? ih : XH - 1)) * XW * IB;
    for (int b = 0; b < PB; ++b) {
        float *dst = xs + ((((size_t)t * PA + a) * PB + b) * PH + i) * PW * IB;
        for (int j = 0; j < PW; ++j) {
            ptrdiff_t iw = (ptrdiff_t)j * XSW + b - XPL;
            int inside = ih >= 0 && ih < XH && iw >= 0 && iw < XW;
            _Pragma("GCC unroll 16") for (int e = 0; e < IB; ++e)
                dst[j * IB + e] = inside ? src[iw * IB + e] : 0.0f;
        }
    }
}
"""
_SPLIT_CALL = """\
        #pragma omp for schedule(dynamic, 8)   /* a descheduled thread holds up little */
        for (int q = 0; q < SPLIT_UNITS; ++q) split_row(x, scratch, q);
        const float *xin = scratch;"""


def _group_lane(width: int, lanes: int) -> str:
    """`GROUP_LANE(v, ci)`: lane ci of each group of `width` lanes of v copied to the
    group's every lane (v itself for groups of one). The shuffle's mask is a constant once
    the loop over ci is unrolled: gcc picks an in-lane permute for groups within 128 bits."""
    if width == 1:
        return "#define GROUP_LANE(v, ci) (v)\n"
    first = ", ".join(str(lane // width * width) for lane in range(lanes))
    return ("#define GROUP_LANE(v, ci) __builtin_shuffle((v), "
            f"(vi){{ {first} }} + (ci))\n")


def _remainders(g: ConvGeometry, lo: int, hi: int, width: int, px: int) -> list[int]:
    """The smaller last tiles that occur: interior pixels of a column chunk modulo px (only
    those get a function; gcc is not left to reason about unreachable ones)."""
    found = set()
    for b0 in range(0, g.ow, width):
        found.add((min(b0 + width, g.ow, hi) - max(b0, lo)) % px if min(b0 + width, hi) >
                  max(b0, lo) else 0)
    return sorted(found - {0})


def _phases(g: ConvGeometry) -> dict[str, int]:
    """Sizes of the phase split: PA x PB phases (the row and column phases the filter taps
    read) of PH x PW pixels (every output pixel's window inside, padding explicit)."""
    return dict(PA=max(r * g.dh % g.sh for r in range(g.r)) + 1,
                PB=max(s * g.dw % g.sw for s in range(g.s)) + 1,
                PH=g.oh + (g.r - 1) * g.dh // g.sh, PW=g.ow + (g.s - 1) * g.dw // g.sw)


def split_floats(g: ConvGeometry, config: Mapping) -> int:
    """Floats of the scratch buffer a kernel built with `config` needs (0 without a split)."""
    if not int(config.get("split", 0)):
        return 0
    p = _phases(g)
    return g.n * g.cb * p["PA"] * p["PB"] * p["PH"] * p["PW"] * g.in_block


def _subsampled(g: ConvGeometry) -> ConvGeometry:
    """A strided 1x1 conv after its split: one phase of OH x OW pixels, i.e. a 1x1 stride-1
    conv over one row of OH * OW pixels."""
    return replace(g, h=1, w=g.oh * g.ow, oh=1, ow=g.oh * g.ow, sh=1, sw=1, pt=0, pl=0,
                   dh=1, dw=1, flattened=True)


def _bands(g: ConvGeometry, bands: list[tuple[int, int]]) -> str:
    """`GROUP_BASE(kt)` and `TILE_CR(kt)`: the first input block tile kt reduces from and
    how many (its group's, CR a group; all of them, ungrouped; sparse groups: a table of
    each tile's band, `ConvGeometry.tile_bands`)."""
    if not g.sparse_groups:
        return ("#define GROUP_BASE(kt) (GROUPS > 1 ? (kt) * TK / OCG * CR : 0)\n"
                "#define TILE_CR(kt) CR\n")
    first = ", ".join(str(b) for b, _ in bands)
    counts = ", ".join(str(c) for _, c in bands)
    return (f"static const int BAND_BASE[] = {{ {first} }};\n"
            f"static const int BAND_BLOCKS[] = {{ {counts} }};\n"
            "#define GROUP_BASE(kt) BAND_BASE[kt]\n#define TILE_CR(kt) BAND_BLOCKS[kt]\n")


def conv_source(g: ConvGeometry, config: Mapping) -> str:
    """The C source of `wpk_micro_conv(x, w, bias, sum, y, scratch)` for `g` under `config`
    (ValueError for an invalid config); `scratch` holds `split_floats(g, config)` floats."""
    reason = config_reason(g, config)
    if reason:
        raise ValueError(reason)
    isa = ISAS[str(config["isa"])]
    lanes, kv, px, unroll = isa.lanes, int(config["kv"]), int(config["px"]), int(config["unroll"])
    bands = [] if g.within_vector else g.tile_bands(lanes, kv)
    reduction = max(count for _, count in bands) if bands else g.reduction_blocks
    cbt = min(int(config["cbt"]), reduction)
    split = bool(int(config["split"]))
    original, phase = g, split and (g.r, g.s) != (1, 1)
    if split and not phase:
        g = _subsampled(g)
    row_block = min(int(config["rows"]), g.oh)
    vectors = g.out_vectors(lanes)
    tiles = -(-vectors // kv)
    # the last tile of an ungrouped conv, compiled apart where it differs: only its vectors
    # (tiles of KV overhang the channels), its last a half vector where its real channels
    # fit in half of it (116 channels in blocks of 16)
    last_kv, last_half = vectors - (tiles - 1) * kv, half_last(g.out_channels, vectors, lanes)
    last = not g.within_vector and g.groups == 1 and not g.sparse_groups \
        and (last_kv < kv or last_half)
    lo, hi = (0, g.ow) if phase else _interior(g)
    step = g.in_block * (1 if phase else g.sw)   # floats between a tile's pixels
    pf = prefetch_distance(config)
    if g.within_vector:
        groups = g.block // lanes
        rows = g.n * g.kb * groups * _ceil_div(g.oh, row_block)
        params, args = "int n, int kb, int l", "n, kb, l"
        decode = ("        int l = t % LG; t /= LG;\n        int kb = t % KB; int n = t / KB;")
        def tile(name, np_, checked):
            return _DW_TILE.format(name=name, np=np_, checked=checked, unroll=unroll)
    else:
        rows = g.n * tiles * _ceil_div(g.oh, row_block)
        params, args = "int n, int kt", "n, kt"
        decode = "        int n = t % N; int kt = t / N;"
        def tile(name, np_, checked):
            span = (np_ - 1) * step + g.in_block if pf else None
            source = _conv_tile(name, np_, kv, checked, unroll, phase, span)
            if last:
                source += _conv_tile(f"{name}_last", np_, last_kv, checked, unroll, phase, span,
                                     last_half)
            return source
    width, chunks = _chunks(g, rows, px)
    defines = dict(N=g.n, CB=g.cb, H=g.h, W=g.w, KB=g.kb, OH=g.oh, OW=g.ow, R=g.r, S=g.s,
                   SH=g.sh, SW=g.sw, PT=g.pt, PL=g.pl, DH=g.dh, DW=g.dw, BLK=g.block, VW=lanes,
                   KV=kv, PX=px, TK=kv * lanes, KVEC=vectors, LG=g.block // lanes,
                   CBT=cbt, PASSES=_ceil_div(reduction, cbt) if not g.within_vector
                   else 1, GW=g.taps_width,
                   CR=reduction, GROUPS=g.groups,
                   OCG=g.group_vectors(lanes) * lanes,
                   HAS_BIAS=int(g.has_bias), OW_LO=lo, OW_HI=hi, CW=width, NCH=chunks,
                   UNITS=rows * chunks, ROWS=row_block, OHB=_ceil_div(g.oh, row_block),
                   IB=g.in_block, XSTEP=step)
    if pf:
        # floats between input blocks: of the image, or of its phase split
        plane = g.h * g.w if not phase else math.prod(
            _phases(original)[k] for k in ("PA", "PB", "PH", "PW"))
        defines.update(PF=pf, PLANE=plane * g.in_block)
    if split:
        p = _phases(original)
        defines.update(p, XH=original.h, XW=original.w, XSH=original.sh, XSW=original.sw,
                       XPT=original.pt, XPL=original.pl,
                       SPLIT_UNITS=g.n * g.cb * p["PA"] * p["PH"])
    parts = [VECTOR_HEADER.format(lanes=lanes), half_vectors(lanes)]
    parts += [f"#define {k} {v}\n" for k, v in defines.items()]
    parts.append(_bands(g, bands))
    parts.append(_group_lane(g.taps_width, lanes))
    parts.append(_epilogue(g))
    parts.append(f"#define TILE(name) ((kt) == {tiles - 1} ? tile_##name##_last : tile_##name)\n"
                 if last else "#define TILE(name) tile_##name\n")
    parts.append(tile("checked", 1, 1))
    parts.append(tile("edge", px, 1))
    parts.append(tile("full", px, 0))
    cases = []
    for np_ in _remainders(g, lo, hi, width, px):
        parts.append(tile(f"rest{np_}", np_, 0))
        cases.append(f"        case {np_}: TILE(rest{np_})(x, w, bias, sum, y, {args}, oh, ow, "
                     f"c0, c1); ow += {np_}; break;")
    if split:
        parts.append(_SPLIT)
    pre = _SPLIT_CALL if split else "        const float *xin = x;"
    parts.append(_ROW.format(params=params, args=args, cases="\n".join(cases), decode=decode,
                             cr="CR" if g.within_vector else "TILE_CR(kt)",
                             pre=pre, cuts=", ".join(str(c) for c in _edge_cuts(g))))
    return "".join(parts)
