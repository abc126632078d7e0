"""`convtranspose.c` vectorized over output channels: ConvTransposes of small inputs.

    kv, np_ = tile_shape(geometry)
    source = channels_source(geometry, kv, np_, lanes, geometry.parallel())
    packed = pack_channel_weights(w, kv * lanes, geometry)   # per tile, each phase's taps

The position-vectorized kernel (`conv_transpose_native`) puts VW consecutive output
positions of a row in a vector: a DCGAN's 4x4 and 8x8 inputs have 4 or 8 positions a
row, so most of a 16-lane vector computes nothing (measured up to 4x slower than
onnxruntime's GEMM and col2im). This one keeps the phase split (each output phase
(r, c) a dense correlation with its own taps and input offsets) but holds KV vectors
of output channels x NP positions in registers, the positions (q, j) taken in row-major
order across rows (a small input's positions all in one tile, so a weight is loaded
once per unit, not once per row: the weights of a 512 -> 256 layer are 8 MB): per input
channel and tap it loads the tap's KV weight vectors (packed at prepare time, the
channels of a tile contiguous) and adds each position's input value, broadcast, times
them (KV + NP loads for KV x NP FMAs, as the conv micro-kernels do). The input is read
from a copy with zero borders (made in the same call), so no tap checks the image; the
last tile of positions ends at the last position (recomputing some), and the lanes of
each vector are stored to their channels' planes one by one. OpenMP runs the units
(image x tile of output channels x tile of positions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER

if TYPE_CHECKING:   # the geometry's module registers the implementation that uses this one
    from wpk.kernels.cpu.conv_transpose_native import TransposeGeometry

IDENTITY = "INLINE vf act(vf v) { return v; }\n"   # no fused activation

# A tile: one vector of output channels x up to MAX_NP positions. Measured on a DCGAN's
# 512 -> 256 (4x4 input) and 256 -> 128 (8x8) layers, 2 threads, AVX-512 (2026-11-29):
# 1 x 8 ran 315 and 321 us, 1 x 16 392 and 318, 2 x 8 441 and 447, 3 x 8 454 and 469,
# 4 x 4 594 and 426 (onnxruntime 388 and 432): the weights stream from memory, and more,
# smaller units share them out better than wider tiles reuse the inputs
KV, MAX_NP = 1, 8

_BODY = r"""
#include <stdint.h>
#include <string.h>

/* the input with zero borders: PTOP rows above, LP columns left, rows XW wide, XH high */
static void pad_input(const float *restrict x, float *restrict xs) {
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < N * CI * H; r++) {
        const int64_t plane = r / H, row = r % H;
        memcpy(xs + (plane * XH + row + PTOP) * XW + LP, x + r * W, W * sizeof(float));
    }
}

PHASES

void wpk_conv_transpose(const float *restrict x, const float *restrict wp,
                        const float *restrict bias, float *restrict y,
                        float *restrict scratch) {
    const int64_t units = N * COT * NPT;
    #pragma omp parallel if (PAR)
    {
        pad_input(x, scratch);
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t pt = u % NPT, cot = u / NPT % COT, n = u / (NPT * COT);
            int64_t p0 = pt * NP;
            if (p0 + NP > NQ * NJ)
                p0 = NQ * NJ - NP;   /* the last tile ends at the last position */
            int64_t q[NP], j[NP], at[NP];   /* each position, and where it reads the copy */
            for (int i = 0; i < NP; i++) {
                q[i] = (p0 + i) / NJ;
                j[i] = (p0 + i) % NJ;
                at[i] = (q[i] + PTOP) * XW + j[i] + LP;
            }
CALLS
        }
    }
}
"""


def tile_shape(g: TransposeGeometry) -> tuple[int, int]:
    """(KV, NP): one vector of output channels by all positions, up to MAX_NP."""
    nq, nj = g.positions()
    return KV, min(nq * nj, MAX_NP)


def phase_taps(g: TransposeGeometry) -> list[tuple[int, int, list[tuple[int, int, int, int]]]]:
    """(r, c, taps) of every output phase: its taps (ky, row offset, kx, column offset)."""
    return [(r, c, [(ky, ro, kx, co) for pr, ky, ro in g.taps(0) if pr == r
                    for pc, kx, co in g.taps(1) if pc == c])
            for r in range(g.sh) for c in range(g.sw)]


def pack_channel_weights(w: np.ndarray, tk: int, g: TransposeGeometry) -> np.ndarray:
    """W [CI, CO, KH, KW] as, per tile of TK output channels (zero past CO), each phase's
    [CI, its taps, TK] one after the other: what a phase reads, in the order it reads it."""
    ci, co, kh, kw = w.shape
    tiles = -(-co // tk)
    padded = np.zeros((ci, tiles * tk, kh, kw), np.float32)
    padded[:, :co] = w
    tiled = padded.reshape(ci, tiles, tk, kh, kw).transpose(1, 0, 3, 4, 2)  # [T, CI, KH, KW, TK]
    parts = [tiled[:, :, [ky for ky, _, _, _ in taps], [kx for _, _, kx, _ in taps]]
             .reshape(tiles, -1) for _, _, taps in phase_taps(g) if taps]
    return np.ascontiguousarray(np.concatenate(parts, axis=1) if parts else
                                np.zeros((tiles, 0), np.float32))


def borders(g: TransposeGeometry) -> tuple[int, int, int, int]:
    """(PTOP, LP, XH, XW): zero rows above and columns left of the input copy, and its
    height and width, so every tap of every position reads inside it."""
    rows = [offset for _, _, offset in g.taps(0)] or [0]
    columns = [offset for _, _, offset in g.taps(1)] or [0]
    nq, nj = g.positions()
    top, left = max(0, -min(rows)), max(0, -min(columns))
    height = top + max(g.h, nq + max(rows))
    width = left + max(g.w, nj + max(columns))
    return top, left, height, width


def scratch_floats(g: TransposeGeometry) -> int:
    """Floats of the zero-bordered input copy."""
    _, _, height, width = borders(g)
    return g.n * g.ci * height * width


def _phase(r: int, c: int, taps: list, base: int, kv: int, np_: int,
           fixed: list[tuple[int, int, int]] | None) -> str:
    """The C function computing output phase (r, c) of one tile (positions at `at` in the
    input copy, position rows `q` and columns `j`; with `fixed`, the (q, j, at) of every
    position, baked in: one tile holds them all): its `taps`, whose weights start at float
    `base` of a tile's packed weights."""
    acc = [[f"a{v}_{p}" for p in range(np_)] for v in range(kv)]
    lines = [f"static void phase_{r}_{c}(const float *restrict xs, const float *restrict wp,",
             "                       const float *restrict bias, float *restrict y,",
             "                       int64_t n, int64_t cot, const int64_t *q, const int64_t *j,",
             "                       const int64_t *at) {"]
    for v in range(kv):
        lines.append(f"    const vf b{v} = vload(bias + cot * TK + {v} * VW);")
        lines += [f"    vf {acc[v][p]} = b{v};" for p in range(np_)]
    if fixed:   # constants: no offset takes a register
        lines.append("    (void)q; (void)j; (void)at;")
        lines += [f"    enum {{ at{p} = {a} }};" for p, (_, _, a) in enumerate(fixed)]
    else:
        lines += [f"    const int64_t at{p} = at[{p}];" for p in range(np_)]
    lines += ["    const float *xb = xs + n * CI * XH * XW;",
              f"    const float *wb = wp + cot * CI * KH * KW * TK + {base};",
              "    for (int64_t ci = 0; ci < CI; ci++) {",
              "        const float *xc = xb + ci * XH * XW;",
              f"        const float *wc = wb + ci * {len(taps)} * TK;"]
    for t, (_, ro, _, co) in enumerate(taps):
        lines.append("        {")
        lines.append(f"            const float *xt = xc + {ro} * XW + {co};")
        lines += [f"            const vf w{v} = vload(wc + {t} * TK + {v} * VW);"
                  for v in range(kv)]
        for p in range(np_):
            lines.append(f"            const vf x{p} = vsplat(xt[at{p}]);")
            lines += [f"            {acc[v][p]} += x{p} * w{v};" for v in range(kv)]
        lines.append("        }")
    lines += ["    }", "    float lane[VW] __attribute__((aligned(64)));"]
    for p in range(np_):
        qp, jp = (f"q[{p}]", f"j[{p}]") if not fixed else (str(fixed[p][0]), str(fixed[p][1]))
        lines += [f"    if (SH * {qp} + {r} < OH && SW * {jp} + {c} < OW) {{",
                  f"        float *out = y + (n * CO * OH + SH * {qp} + {r}) * OW"
                  f" + SW * {jp} + {c};"]
        for v in range(kv):
            lines += [f"        vstore(lane, act({acc[v][p]}));",
                      f"        for (int l = 0; l < VW && cot * TK + {v} * VW + l < CO; l++)",
                      f"            out[(cot * TK + {v} * VW + l) * OH * OW] = lane[l];"]
        lines.append("    }")
    lines.append("}")
    return "\n".join(lines)


def channels_source(g: TransposeGeometry, kv: int, np_: int, lanes: int, par: bool,
                    act: str = "") -> str:
    """The C source of `wpk_conv_transpose(x, packed W, bias, y, scratch)` vectorized over
    output channels (`scratch` holds `scratch_floats(g)` floats, zero at first), `act` the
    C of its activation (`INLINE vf act(vf v)`; none: the identity)."""
    nq, nj = g.positions()
    top, left, height, width = borders(g)
    tk = kv * lanes
    defines = dict(N=g.n, CI=g.ci, H=g.h, W=g.w, CO=g.co, KH=g.kh, KW=g.kw, SH=g.sh, SW=g.sw,
                   OH=g.oh, OW=g.ow, VW=lanes, TK=tk, COT=-(-g.co // tk), NQ=nq, NJ=nj,
                   NP=np_, NPT=-(-(nq * nj) // np_), PTOP=top, LP=left, XH=height, XW=width,
                   PAR=int(par))
    fixed = None
    if nq * nj == np_:   # one tile of positions: every offset a constant
        fixed = [(p // nj, p % nj, (p // nj + top) * width + p % nj + left) for p in range(np_)]
    phases, base = [], 0
    every = phase_taps(g)
    for r, c, taps in every:
        phases.append(_phase(r, c, taps, base, kv, np_, fixed))
        base += g.ci * len(taps) * tk
    calls = "\n".join(f"            phase_{r}_{c}(scratch, wp, bias, y, n, cot, q, j, at);"
                       for r, c, _ in every)
    body = _BODY.replace("PHASES", "\n\n".join(phases))
    return (VECTOR_HEADER.format(lanes=lanes)
            + "".join(f"#define {k} {v}\n" for k, v in defines.items())
            + (act or IDENTITY) + body.replace("CALLS", calls))
