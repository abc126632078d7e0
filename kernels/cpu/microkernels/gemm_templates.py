"""C source of the GEMM micro-kernels, every size baked in as a constant.

    source = gemm_source(geometry, config)
    # void wpk_gemm_pack(const float *b, float *packed)     B -> panels, times alpha
    # void wpk_gemm(const float *a, const float *packed, float *y, const float *const *ops)

Packing: each B matrix becomes panels of NR = NV * lanes columns, for every k
the panel's NR values contiguous ([b][panel][k][NR], zero padded past N), so
the micro-kernel reads one row of a panel as NV vector loads. A constant B is
packed once at prepare time; a variable one at every call.

Product: OpenMP over units (batch x block of MB row tiles x block of NB
panels). A unit reduces over k in passes of KC; in a pass, for each panel of
its block, every MR-row tile of its rows keeps MR x NV accumulators in vector
registers, starts them at zero (first pass) or at the partial sums in y, and
for every k of the pass loads the panel's NV vectors and adds each row's A
value, broadcast, times them: NV + MR loads for MR x NV FMAs (and, with a `pf`
config, a prefetch of each cache line of the panel's row PF rows ahead). The panel's
KC x NR slice stays in L1 while the tiles sweep it. The last panel's columns
past N go through a small buffer on the stack; the rows past the last whole
tile take a smaller tile generated for that row count. After the last pass
the tile's values, still in L1, go through the epilogue (beta * C, the fused
steps, each step's formula from the epilogue table built as C by `CExpression`).
Vectors are GCC vector extensions (`isa.py`), loads and stores unaligned.
"""

from __future__ import annotations

from collections.abc import Mapping

from wpk.core.epilogue import epilogue_op, step_value
from wpk.kernels.c_expressions import CExpression, c_float
from wpk.kernels.cpu.microkernels.gemm_space import GemmGeometry, config_reason, prefetch_rows
from wpk.kernels.cpu.microkernels.isa import ISAS, LINE_FLOATS
from wpk.kernels.cpu.microkernels.vector_math import vector_math

_HEADER = r"""
#include <math.h>
#include <stddef.h>
#include <string.h>

typedef float vf __attribute__((vector_size({lanes} * 4)));
typedef float vfu __attribute__((vector_size({lanes} * 4), aligned(4), may_alias));
#define INLINE static inline __attribute__((always_inline))
INLINE vf vload(const float *p) {{ return *(const vfu *)p; }}
INLINE void vstore(float *p, vf v) {{ *(vfu *)p = v; }}
INLINE vf vsplat(float v) {{ return v - (vf){{0}}; }}
"""

def epilogue_statements(g: GemmGeometry) -> list[str]:
    """C statements updating `float v` at output (b, i, j): beta * C, then every step; the
    operand of input `x` is read as `o{x}[...]`."""
    def at(op) -> str:
        return f"o{op.index}[b * {op.sb} + i * {op.si} + j * {op.sj}]"

    lines = []
    if g.c is not None:
        term = at(g.c) if g.beta == 1.0 else f"{c_float(g.beta)} * {at(g.c)}"
        lines.append(f"v += {term};")
    by_index = {op.index: op for op in g.operands}
    builder = CExpression()
    for step in g.steps:
        operand = None
        if epilogue_op(step.op).arity == 2:
            operand = at(by_index[step.operand])
        lines.append(f"v = {step_value(builder, step, 'v', operand)};")
    return lines


def _epilogue(g: GemmGeometry) -> str:
    """`epilogue(ops, y, b, i0, j0, rows, cols)` over a finished tile (nothing when the
    workload has no epilogue)."""
    statements = epilogue_statements(g)
    if not statements:
        return "#define HAS_EPILOGUE 0\nINLINE void epilogue(const float *const *ops, float *y, " \
               "long b, int i0, int j0, int rows, int cols) { (void)ops; (void)y; (void)b; " \
               "(void)i0; (void)j0; (void)rows; (void)cols; }\n"
    indices = sorted({op.index for op in (*g.operands, *([g.c] if g.c else []))})
    declare = "".join(f"    const float *o{x} = ops[{x}];\n" for x in indices)
    body = "\n".join(f"            {s}" for s in statements)
    return f"""#define HAS_EPILOGUE 1
INLINE void epilogue(const float *const *ops, float *y, long b, int i0, int j0, int rows,
                     int cols) {{
{declare}    for (long i = i0; i < i0 + rows; ++i) {{
        float *yr = y + (b * M + i) * N;
        _Pragma("omp simd") for (long j = j0; j < j0 + cols; ++j) {{
            float v = yr[j];
{body}
            yr[j] = v;
        }}
    }}
}}
"""


_TILE = r"""
/* {mr} rows x NV vectors at A rows a (k0 applied), panel slice p (k0 applied), output y:
   kk products; starts at zero (first) or at y; `cols` < NR goes through a buffer */
INLINE void tile_{mr}(const float *a, const float *p, float *y, int kk, int first, int cols) {{
    float buf[{mr} * NR];
    float *t = cols == NR ? y : buf;
    const long ldt = cols == NR ? N : NR;
    if (cols < NR && !first)
        for (int r = 0; r < {mr}; ++r) memcpy(buf + r * NR, y + (long)r * N, cols * 4);
{init}
    _Pragma("GCC unroll {unroll}") for (int k = 0; k < kk; ++k) {{
{body}
    }}
{store}
    if (cols < NR)
        for (int r = 0; r < {mr}; ++r) memcpy(y + (long)r * N, buf + r * NR, cols * 4);
}}
"""


def _tile(mr: int, nv: int, unroll: int, prefetch_lines: int = 0) -> str:
    """The C function of an mr x nv register tile (see `_TILE`); each k prefetches
    `prefetch_lines` cache lines of the panel's row PF rows ahead."""
    init, body, store = [], [], []
    body += [f"        __builtin_prefetch(p + (long)(k + PF) * NR + {line * LINE_FLOATS}, 0, 3);"
             for line in range(prefetch_lines)]
    for r in range(mr):
        for v in range(nv):
            init.append(f"    vf c{r}_{v} = first ? vsplat(0.0f) : vload(t + {r} * ldt + "
                        f"{v} * VW);")
    body += [f"        const vf b{v} = vload(p + (long)k * NR + {v} * VW);" for v in range(nv)]
    for r in range(mr):
        body.append(f"        const vf a{r} = vsplat(a[{r} * LDM + (long)k * LDK]);")
        body += [f"        c{r}_{v} += a{r} * b{v};" for v in range(nv)]
    for r in range(mr):
        store += [f"    vstore(t + {r} * ldt + {v} * VW, c{r}_{v});" for v in range(nv)]
    return _TILE.format(mr=mr, unroll=unroll, init="\n".join(init), body="\n".join(body),
                        store="\n".join(store))


_MAIN = r"""
void wpk_gemm_pack(const float *b, float *packed) {
    #pragma omp parallel for schedule(static) if (BCOUNT * PANELS > 1 && K * N > 16384)
    for (long u = 0; u < BCOUNT * PANELS; ++u) {
        const float *src = b + (u / PANELS) * K * N;
        long j0 = (u % PANELS) * NR;
        float *dst = packed + u * K * NR;
        for (long k = 0; k < K; ++k)
            for (long c = 0; c < NR; ++c) {
                long j = j0 + c;
                dst[k * NR + c] = j < N ? ALPHA * src[TRANSB ? j * K + k : k * N + j] : 0.0f;
            }
    }
}

static void unit(const float *a, const float *packed, float *y, const float *const *ops,
                 long b, int rb, int cb) {
    const float *ab = a + A_OFF(b);
    const float *pb = packed + B_OFF(b) * PANELS * K * NR;
    float *yb = y + b * M * N;
    int i_end = (rb + 1) * MB * MR < M ? (rb + 1) * MB * MR : M;
    int p_end = (cb + 1) * NB < PANELS ? (cb + 1) * NB : PANELS;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kk = K - k0 < KC ? K - k0 : KC;
        int first = k0 == 0, last = k0 + kk == K;
        for (int p = cb * NB; p < p_end; ++p) {
            int j0 = p * NR, cols = N - j0 < NR ? N - j0 : NR;
            const float *pp = pb + ((long)p * K + k0) * NR;
            int i = rb * MB * MR;
            for (; i + MR <= i_end; i += MR) {
                tile_{mr}(ab + (long)i * LDM + (long)k0 * LDK, pp, yb + (long)i * N + j0, kk, first,
                          cols);
                if (HAS_EPILOGUE && last) epilogue(ops, y, b, i, j0, MR, cols);
            }
{rest}
        }
    }
}

void wpk_gemm(const float *a, const float *packed, float *y, const float *const *ops) {
    #pragma omp parallel for schedule(dynamic, 1) if (UNITS > 1)
    for (long u = 0; u < UNITS; ++u) {
        int cb = u % CBLOCKS;
        long t = u / CBLOCKS;
        unit(a, packed, y, ops, t / RBLOCKS, t % RBLOCKS, cb);
    }
}
"""

_REST = r"""            if (i < i_end) {{
                tile_{rest}(ab + (long)i * LDM + (long)k0 * LDK, pp, yb + (long)i * N + j0, kk,
                            first, cols);
                if (HAS_EPILOGUE && last) epilogue(ops, y, b, i, j0, {rest}, cols);
            }}"""


def _table(name: str, values: tuple[int, ...]) -> str:
    """`NAME(b)`: a constant when every batch has the same value, else a baked table."""
    if len(set(values)) == 1:
        return f"#define {name}(b) ((void)(b), {values[0]}L)\n"
    rows = ",".join(str(v) for v in values)
    return f"static const long {name}_TABLE[] = {{{rows}}};\n#define {name}(b) {name}_TABLE[b]\n"


def gemm_source(g: GemmGeometry, config: Mapping) -> tuple[str, tuple[str, ...]]:
    """(C source of `wpk_gemm_pack` and `wpk_gemm` for `g` under `config`, the libraries it
    links: libmvec when its epilogue calls math functions that has vector variants of);
    ValueError for an invalid config."""
    reason = config_reason(g, config)
    if reason:
        raise ValueError(reason)
    lanes = ISAS[str(config["isa"])].lanes
    mr, nv, kc, mb, nb, unroll = (int(config[k]) for k in ("mr", "nv", "kc", "mb", "nb",
                                                           "unroll"))
    nr = nv * lanes
    panels = -(-g.n // nr)
    mb, nb = min(mb, -(-g.m // mr)), min(nb, panels)
    rblocks, cblocks = -(-g.m // (mb * mr)), -(-panels // nb)
    defines = dict(M=g.m, K=g.k, N=g.n, VW=lanes, NV=nv, NR=nr, MR=mr, KC=min(kc, g.k),
                   MB=mb, NB=nb, PANELS=panels, RBLOCKS=rblocks, CBLOCKS=cblocks,
                   UNITS=g.batch * rblocks * cblocks, BCOUNT=g.b_count, LDM=g.lda_m,
                   LDK=g.lda_k, TRANSB=int(g.trans_b), ALPHA=c_float(g.alpha))
    pf = prefetch_rows(config)
    if pf:
        defines["PF"] = pf
    parts = [_HEADER.format(lanes=lanes)]
    parts += [f"#define {k} {v}\n" for k, v in defines.items()]
    parts.append(_table("A_OFF", g.a_offsets))
    parts.append(_table("B_OFF", g.b_offsets))
    epilogue = _epilogue(g)
    declarations, libraries = vector_math(epilogue, ISAS[str(config["isa"])])
    parts += [declarations, epilogue]
    lines = -(-nr // LINE_FLOATS) if pf else 0
    parts.append(_tile(mr, nv, unroll, lines))
    rest = g.m % mr
    if rest:
        parts.append(_tile(rest, nv, unroll, lines))
    main = _MAIN.replace("{mr}", str(mr))
    parts.append(main.replace("{rest}", _REST.format(rest=rest) if rest else ""))
    return "".join(parts), libraries
