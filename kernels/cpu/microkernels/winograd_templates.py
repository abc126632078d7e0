"""C source of the Winograd F(m x m, 3 x 3) NCHWc convolutions, every size baked in.

    source = winograd_source(geometry, config)
    # void wpk_winograd_conv(x, u, bias, sum, y, scratch)

The output is cut into m x m tiles, taken in rounds of TB tiles; each round
runs three OpenMP work-shared phases inside one parallel region:

1. input transform, per (tile, input block): the (m+2)^2 input vectors of a
   tile (a vector is VW channels of one pixel; pixels outside the image are
   zero, so any padding and the partial tiles at the bottom/right edges need
   nothing else) become V = B^T d B, stored at V[pos][tile][channel];
2. batched GEMM, per (tile position, tile of KV output vectors): for every PX
   tiles of the round, KV x PX vector accumulators, and for each input channel
   KV weight-vector loads of the transformed filter (packed at prepare time as
   U[pos][kt][channel][KV * VW]) and PX broadcasts of V, KV x PX FMAs, as the
   direct micro-kernel's inner loop; the sums go to M[pos][tile][channel];
   (V and M: one slice per tile position, a cache line of skew between slices);
3. output transform, per (tile, output vector): Y = A^T M A, plus the bias,
   then the direct kernel's fused epilogue (residual add, activation), stored
   for the pixels inside the output.

Every phase hands out its units dynamically (the transforms in chunks of 8, the GEMM in
chunks of consecutive units, about `GEMM_CHUNKS_PER_THREAD` a thread): on a shared machine
a thread that loses its core for a while holds up the phase's barrier by one chunk, not by
a static share of the round. A chunk reads one contiguous stretch of U, and the first
tile of each unit's pass prefetches U `PREFETCH_BYTES` ahead into L2: a transformed filter
larger than the last-level cache (ResNet-50's 14 x 14 and 7 x 7 convs: 9 and 17-38 MB) comes
from memory at every call of a run, and this overlaps its stream with the FMAs. On an
AVX2 host (two threads, alternating with the earlier one unit at a time and no
prefetch) those convs ran 0.73-0.85x the time with the filter in cache and 0.79-0.84x
with the cache evicted before each call; `local` rounds (filters of at most
`LOCAL_FILTER_BYTES`, read from cache every round) were a tie and take no prefetch.

The transforms are generated straight-line from the matrices of
`winograd_space.transforms` (no multiplications by 0 or +-1). The scratch
(V and M of one round) is the caller's: `winograd_scratch_floats` floats.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from wpk.kernels.c_expressions import c_float
from wpk.kernels.cpu.microkernels.isa import ISAS, LINE_FLOATS
from wpk.kernels.cpu.microkernels.space import ConvGeometry
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER, _epilogue
from wpk.kernels.cpu.microkernels.winograd_space import (
    LOCAL_THREADS,
    config_reason,
    is_local,
    tiles,
    transforms,
)


def _combination(row: np.ndarray, names: list[str]) -> str:
    """C expression of sum(row[k] * names[k]), skipping zeros and multiplications by +-1."""
    terms = []
    for coef, name in zip(row, names):
        if coef == 0:
            continue
        sign = "-" if coef < 0 else "+"
        mag = abs(float(coef))
        terms.append(f"{sign} {name}" if mag == 1 else f"{sign} {c_float(mag)} * {name}")
    if not terms:
        return "vsplat(0.0f)"
    first = terms[0][2:] if terms[0][0] == "+" else "-" + terms[0][2:]
    return " ".join([first, *terms[1:]])


def transform_2d(mat: np.ndarray, src: str, dst: str) -> list[str]:
    """C statements of dst = mat @ src @ mat^T for named vectors `{src}{r}_{c}` (square,
    mat's width) into `{dst}{i}_{j}` (mat's height), through the columns first."""
    rows, width = mat.shape
    lines = []
    for i in range(rows):
        for j in range(width):
            expr = _combination(mat[i], [f"{src}{k}_{j}" for k in range(width)])
            lines.append(f"    const vf {dst}t{i}_{j} = {expr};")
    for i in range(rows):
        for j in range(rows):
            expr = _combination(mat[j], [f"{dst}t{i}_{k}" for k in range(width)])
            lines.append(f"    const vf {dst}{i}_{j} = {expr};")
    return lines


@functools.cache
def _input_tile(m: int) -> str:
    """`input_tile(x, V, n, ty, tx, i, cb, checked)`: B^T d B of one tile and input block
    (the same text for every layer of a tile size: written once a process)."""
    t = m + 2
    bt = transforms(m)[0]
    lines = [
        "INLINE void input_tile(const float *x, float *V, int n, int ty, int tx, int i, int cb,",
        "                       int checked) {",
        "    const int ih0 = ty * M - PT, iw0 = tx * M - PL;",
        "    for (int l = 0; l < LG; ++l) {",
        "    const float *xb = x + ((size_t)(n * CB + cb) * H) * W * BLK + l * VW;",
        "    float *vb = V + (size_t)i * CP + cb * BLK + l * VW;",
    ]
    for r in range(t):
        for c in range(t):
            at = f"xb + ((ptrdiff_t)(ih0 + {r}) * W + iw0 + {c}) * BLK"
            inside = f"(ih0 + {r} >= 0 && ih0 + {r} < H && iw0 + {c} >= 0 && iw0 + {c} < W)"
            lines.append(f"    const vf d{r}_{c} = !checked || {inside} ? vload({at}) "
                         ": vsplat(0.0f);")
    lines += transform_2d(bt, "d", "v")
    for i in range(t):
        for j in range(t):
            lines.append(f"    vstore(vb + (size_t)({i * t + j}) * VPS, v{i}_{j});")
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


@functools.cache
def _output_tile(m: int) -> str:
    """`output_tile(Mb, bias, sum, y, n, ty, tx, i, v, checked)`: A^T M A + bias, the
    epilogue, stored for the pixels inside the output (written once a process)."""
    t = m + 2
    at = transforms(m)[2]
    lines = [
        "INLINE void output_tile(const float *Mb, const float *bias, const float *sum, float *y,",
        "                        int n, int ty, int tx, int i, int v, int checked) {",
        "    const float *mb = Mb + (size_t)i * KP + v * VW;",
    ]
    for r in range(t):
        for c in range(t):
            lines.append(f"    const vf s{r}_{c} = vload(mb + (size_t)({r * t + c}) * MPS);")
    lines += transform_2d(at, "s", "o")
    lines += [
        "    const vf bv = HAS_BIAS ? vload(bias + v * VW) : vsplat(0.0f);",
        "    const int kb = v * VW / BLK, off = (v * VW) % BLK;",
        "    const size_t base = (size_t)(n * KB + kb) * OH * OW * BLK + off;",
        "    const int oh0 = ty * M, ow0 = tx * M;",
    ]
    for a in range(m):
        for b in range(m):
            lines.append(f"    if (!checked || (oh0 + {a} < OH && ow0 + {b} < OW)) {{")
            lines.append(f"        size_t at = base + ((size_t)(oh0 + {a}) * OW + ow0 + {b}) "
                         "* BLK;")
            lines.append(f"        epilogue(o{a}_{b} + bv, sum + at, y + at);")
            lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_GEMM_TILE = r"""
/* KV output vectors x {np} tiles of one tile position, input channels [c0, c1): u =
   U[pos][kt], v = V[pos][tile 0], mo = M[pos][tile 0][kt * TK] (the partial sums of the
   passes before, when c0 > 0){pf_doc} */
NOINLINE void gemm_{name}(const float *u, const float *v, float *mo, int c0, int c1) {{
{init}
    _Pragma("GCC unroll {unroll}") for (int c = c0; c < c1; ++c) {{
{body}
    }}
{store}
}}
"""


def _gemm_tile(name: str, np_: int, kv: int, unroll: int, ahead: bool = False) -> str:
    """The C function of a KV x np_ register tile of the batched GEMM; `ahead`: each step
    of the reduction also prefetches the transformed filter `PF_ROWS` rows further on."""
    acc = [[f"a{j}_{p}" for p in range(np_)] for j in range(kv)]
    init = [f"    vf {acc[j][p]} = c0 == 0 ? vsplat(0.0f) : vload(mo + (size_t){p} * KP "
            f"+ {j} * VW);" for j in range(kv) for p in range(np_)]
    body = [f"        const vf w{j} = vload(u + (size_t)c * TK + {j} * VW);" for j in range(kv)]
    if ahead:   # a prefetch per cache line of a row of U (past its end at the last unit:
        # a prefetch never faults)
        body.append("        _Pragma(\"GCC unroll 16\") for (int l = 0; l < TK; l += LINE_FLOATS) "
                    "__builtin_prefetch(u + (size_t)(c + PF_ROWS) * TK + l, 0, 2);")
    for p in range(np_):
        body.append(f"        const vf x{p} = vsplat(v[(size_t){p} * CP + c]);")
        body += [f"        FMA_ACC({acc[j][p]}, x{p}, w{j});" for j in range(kv)]
    store = [f"    vstore(mo + (size_t){p} * KP + {j} * VW, {acc[j][p]});"
             for p in range(np_) for j in range(kv)]
    pf_doc = ", prefetching U PF_ROWS rows ahead" if ahead else ""
    return _GEMM_TILE.format(name=name, np=np_, unroll=unroll, init="\n".join(init), pf_doc=pf_doc,
                             body="\n".join(body), store="\n".join(store))


_HELPERS = r"""
/* one (tile position, output vector tile) of a round of nt tiles, the input channels in
   passes of CC, so a pass's slice of U stays in L1 while every tile group uses it */
static void gemm_row(const float *U, const float *V, float *Mb, int pos, int kt, int nt) {{
    const float *u = U + (size_t)(pos * KT + kt) * CP * TK;
    const float *v = V + (size_t)pos * VPS;
    float *mo = Mb + (size_t)pos * MPS + kt * TK;
    for (int c0 = 0; c0 < CP; c0 += CC) {{
        const int c1 = c0 + CC < CP ? c0 + CC : CP;
        int i = 0;   /* the first tile of the pass reads U from memory: it prefetches */
        if (nt >= PX) {{
            gemm_full_ahead(u, v, mo, c0, c1);
            i = PX;
        }} else {{
            switch (nt) {{
{first_cases}
            default: break;
            }}
            i = nt;
        }}
        for (; i + PX <= nt; i += PX)
            gemm_full(u, v + (size_t)i * CP, mo + (size_t)i * KP, c0, c1);
        switch (nt - i) {{
{cases}
        default: break;
        }}
    }}
}}

INLINE void tile_at(int g, int *n, int *ty, int *tx) {{
    *tx = g % TW; g /= TW; *ty = g % TH; *n = g / TH;
}}

/* item q of a round's input transform: tile q / CB of the round starting at tile r0, input
   block q % CB (tiles reaching outside the image check their pixels) */
INLINE void transform_in(const float *x, float *V, int r0, int q) {{
    int i = q / CB, cb = q % CB, n, ty, tx;
    tile_at(r0 + i, &n, &ty, &tx);
    int ih0 = ty * M - PT, iw0 = tx * M - PL;
    if (ih0 >= 0 && ih0 + T <= H && iw0 >= 0 && iw0 + T <= W)
        input_tile(x, V, n, ty, tx, i, cb, 0);
    else
        input_tile(x, V, n, ty, tx, i, cb, 1);
}}

/* item q of a round's output transform: tile q / KVEC, output vector q % KVEC */
INLINE void transform_out(const float *Mb, const float *bias, const float *sum, float *y,
                          int r0, int q) {{
    int i = q / KVEC, v = q % KVEC, n, ty, tx;
    tile_at(r0 + i, &n, &ty, &tx);
    if ((ty + 1) * M <= OH && (tx + 1) * M <= OW)
        output_tile(Mb, bias, sum, y, n, ty, tx, i, v, 0);
    else
        output_tile(Mb, bias, sum, y, n, ty, tx, i, v, 1);
}}

"""

# Phases shared by the threads: each phase of a round work-shared, a barrier after each
_MAIN = r"""
void wpk_winograd_conv(const float *x, const float *U, const float *bias, const float *sum,
                       float *y, float *scratch) {{
    float *V = scratch, *Mb = scratch + (size_t)T2 * VPS;
    #pragma omp parallel
    for (int r0 = 0; r0 < TILES; r0 += TB) {{
        const int nt = TILES - r0 < TB ? TILES - r0 : TB;
        #pragma omp for schedule(dynamic, 8)
        for (int q = 0; q < nt * CB; ++q) transform_in(x, V, r0, q);
        #pragma omp for schedule(dynamic, GEMM_CHUNK)
        for (int q = 0; q < T2 * KT; ++q) gemm_row(U, V, Mb, q / KT, q % KT, nt);
        #pragma omp for schedule(dynamic, 8)
        for (int q = 0; q < nt * KVEC; ++q) transform_out(Mb, bias, sum, y, r0, q);
    }}
}}
"""

# `local` rounds: each round on one thread, V and M in that thread's slice of the scratch,
# so no thread reads what another wrote (two vCPUs on different last-level caches make every
# such read slow: the VM's slow stretches, README); the rounds handed out one at a time
_MAIN_LOCAL = r"""
int omp_get_thread_num(void);
int omp_get_max_threads(void);

void wpk_winograd_conv(const float *x, const float *U, const float *bias, const float *sum,
                       float *y, float *scratch) {{
    const int most = omp_get_max_threads() < MAXT ? omp_get_max_threads() : MAXT;
    #pragma omp parallel num_threads(most)
    {{
        float *V = scratch + (size_t)omp_get_thread_num() * SLICE;
        float *Mb = V + (size_t)T2 * VPS;
        #pragma omp for schedule(dynamic, 1)
        for (int r0 = 0; r0 < TILES; r0 += TB) {{
            const int nt = TILES - r0 < TB ? TILES - r0 : TB;
            for (int q = 0; q < nt * CB; ++q) transform_in(x, V, r0, q);
            for (int q = 0; q < T2 * KT; ++q) gemm_row(U, V, Mb, q / KT, q % KT, nt);
            for (int q = 0; q < nt * KVEC; ++q) transform_out(Mb, bias, sum, y, r0, q);
        }}
    }}
}}
"""


# A shared round's GEMM prefetches the transformed filter this many bytes ahead of its reads,
# into L2 (in the first tile of each pass; later tiles find the slice in L1). Into L1
# instead, ResNet-50's 14 x 14 and 7 x 7 convs ran 1.13-1.22x slower (AVX2, 15 rounds)
PREFETCH_BYTES = 8 * 1024
# ... and hands out its (position, output tile) units in chunks of consecutive ones, about this
# many chunks a thread
GEMM_CHUNKS_PER_THREAD = 4


def gemm_chunk(units: int) -> int:
    """Consecutive GEMM units a shared round hands out at a time (`GEMM_CHUNKS_PER_THREAD`)."""
    return max(1, units // (GEMM_CHUNKS_PER_THREAD * LOCAL_THREADS))


# Floats between the tile positions' slices of V and M beyond the round's data: a cache line,
# so the (m+2)^2 vectors a transform stores or loads do not all fall in one L1 set (the
# slices would otherwise be a multiple of 4 KiB apart)
SKEW = 16


def round_tiles(g: ConvGeometry, config: Mapping) -> int:
    """Tiles per round: the config's tb, at most every tile."""
    return max(1, min(int(config["tb"]), tiles(g, int(config["m"]))))


def winograd_scratch_floats(g: ConvGeometry, config: Mapping) -> int:
    """Floats of the scratch buffer a call needs: V and M of one round (of one round per
    thread, `LOCAL_THREADS` slices, with `local`)."""
    return _slice_floats(g, config) * (LOCAL_THREADS if is_local(config) else 1)


def _slice_floats(g: ConvGeometry, config: Mapping) -> int:
    """Floats of V and M of one round."""
    lanes, kv, m = ISAS[str(config["isa"])].lanes, int(config["kv"]), int(config["m"])
    kp = -(-g.out_vectors(lanes) // kv) * kv * lanes
    tb = round_tiles(g, config)
    return (m + 2) ** 2 * (tb * (g.cb * g.block + kp) + 2 * SKEW)


def _remainders(total: int, tb: int, px: int) -> list[int]:
    """The smaller last GEMM tiles that occur: round sizes (tb, and the last round's) mod px."""
    sizes = {tb, total % tb or tb}
    return sorted({s % px for s in sizes} - {0})


def winograd_source(g: ConvGeometry, config: Mapping) -> str:
    """The C source of `wpk_winograd_conv(x, u, bias, sum, y, scratch)` for `g` under
    `config` (ValueError for an invalid config)."""
    reason = config_reason(g, config)
    if reason:
        raise ValueError(reason)
    isa = ISAS[str(config["isa"])]
    lanes, m, kv, px = isa.lanes, int(config["m"]), int(config["kv"]), int(config["px"])
    unroll = int(config["unroll"])
    vectors = g.out_vectors(lanes)
    kt = -(-vectors // kv)
    tb, total = round_tiles(g, config), tiles(g, m)
    defines = dict(CB=g.cb, H=g.h, W=g.w, KB=g.kb, OH=g.oh, OW=g.ow, PT=g.pt, PL=g.pl,
                   BLK=g.block, VW=lanes, LG=g.block // lanes, M=m, T=m + 2, T2=(m + 2) ** 2,
                   TH=-(-g.oh // m), TW=-(-g.ow // m), TILES=total, TB=tb, KV=kv, PX=px,
                   TK=kv * lanes, KT=kt, KVEC=vectors, CP=g.cb * g.block, KP=kt * kv * lanes,
                   HAS_BIAS=int(g.has_bias), VPS=tb * g.cb * g.block + SKEW,
                   MPS=tb * kt * kv * lanes + SKEW,
                   CC=min(int(config["cc"]), g.cb) * g.block)
    parts = [VECTOR_HEADER.format(lanes=lanes),
             f"#define GEMM_CHUNK {gemm_chunk((m + 2) ** 2 * kt)}\n",
             f"#define PF_ROWS {max(1, PREFETCH_BYTES // (kv * lanes * 4))}\n"
             f"#define LINE_FLOATS {LINE_FLOATS}\n"]
    parts += [f"#define {k} {v}\n" for k, v in defines.items()]
    parts.append(_epilogue(g))
    parts.append(_input_tile(m))
    parts.append(_output_tile(m))
    parts.append(_gemm_tile("full", px, kv, unroll))
    ahead = not is_local(config)   # a local round's filter is in cache: the plain tiles

    def first_tile(name: str, np_: int) -> str:
        """The tile that starts a pass: a prefetching copy, or the plain one by another name."""
        if ahead:
            return _gemm_tile(f"{name}_ahead", np_, kv, unroll, ahead=True)
        return f"#define gemm_{name}_ahead gemm_{name}\n"

    parts.append(first_tile("full", px))
    cases, first_cases = [], []
    for np_ in _remainders(total, tb, px):
        parts.append(_gemm_tile(f"rest{np_}", np_, kv, unroll))
        cases.append(f"        case {np_}: gemm_rest{np_}(u, v + (size_t)i * CP, "
                     f"mo + (size_t)i * KP, c0, c1); break;")
        if np_ in (tb, total % tb):   # a round of fewer tiles than PX: its only tile
            parts.append(first_tile(f"rest{np_}", np_))
            first_cases.append(f"            case {np_}: gemm_rest{np_}_ahead(u, v, mo, c0, c1); "
                               "break;")
    if is_local(config):
        parts.insert(1, f"#define MAXT {LOCAL_THREADS}\n"
                        f"#define SLICE {_slice_floats(g, config)}\n")
    parts.append(_HELPERS.format(cases="\n".join(cases), first_cases="\n".join(first_cases)))
    parts.append((_MAIN_LOCAL if is_local(config) else _MAIN).format())
    return "".join(parts)
