"""`groupnorm.c`: wpk's GroupNorm (`group_norm_spec`) as one C kernel, plain or NCHWc.

A diffusion UNet normalizes every block's input by GroupNorm (32 groups) and, mostly, a SiLU
after it; on blocked tensors that was a reorder to NCHW, an InstanceNormalization, the
affine Mul and Add and the SiLU, one step each. Here it is one kernel that reads the
tensor in the layout it has and writes the activated output.

The statistics are the float64 reference's, computed as the corrected two-pass algorithm:
pass 1 sums the group (m1, its rough mean); pass 2 sums d = x - m1 and d * d, so the mean
is m1 + sum(d) / n and the variance sum(d * d) / n - (sum(d) / n)^2, both of values about
the spread, not the mean (a group of values near 1000 with a spread of 1 keeps its digits);
pass 3 writes y = act((x - mean) * a_c + bias_c), a_c = scale_c / sqrt(var + eps). Sums run
in float vectors over at most `RUN` vectors, then go into double. A mean is subtracted as a
float pair (hi, lo): x - hi is exact near the mean and the float mean alone would cost its
rounding, 3e-5 at 1000, next to a spread of 1.

Blocked (`wpk.nchwc`, X of N x ceil(C/b) x H x W x b): the b lanes of a pixel are one GCC
vector (`VECTOR_HEADER`, so b of 8 or 16 compiles on any host); the work units are
(image, channel block, chunk of pixels), about `TARGET_UNITS` of them, taken statically by
the threads of one OpenMP region (the same units in every pass, so a thread reads back
what it read before), and two threads balance even on a tensor of two blocks. Each unit
leaves per-lane sums in a scratch array; after a barrier one thread folds the lanes into
their groups (lane -> channel -> group, so a group may span blocks, share one, or straddle
two) and writes per-lane mean, a_c and bias_c for the next pass. The input's padding lanes
may hold anything: no group reads them, and the output's are written 0 (the kernel refuses
an epilogue that does not map 0 to 0, as the layout pass does). Whole (image, block) units,
all three passes on one thread, where every group lies inside a block, measured no faster
(1x128x64x64 + SiLU, 2 threads: 187-195 us either way, 2026-12; the SiLU takes about 60%).

Plain (`wpk`, X of N x C x D1 x ...): a group of an image is (C / G) * D1 * ... contiguous
floats, a unit of work (tens of KB, so passes 2 and 3 read it from L2); units go to the
threads dynamically, the sums on vectors of the ISA's width.

One OpenMP region, or none (`par` 0: the calling thread, for small tensors). The kernel
joins the plan's native chain.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.group_norm_spec import group_norm_channels, group_norm_reason, is_group_norm
from wpk.kernels.cpu.microkernels.isa import host_isa
from wpk.kernels.cpu.microkernels.space import step_activation
from wpk.kernels.cpu.microkernels.templates import TARGET_UNITS, VECTOR_HEADER, activation_lines
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.epilogue import apply_epilogue
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

BLOCKED_DOMAIN = "wpk.nchwc"
# A work unit of the blocked kernel holds at least this many pixels.
MIN_CHUNK_PIXELS = 64
# The multiply-adds of passes 2 and 3 as FMAs (ISO C turns contraction off).
_FLAGS = ("-ffp-contract=fast",)

# Shared by both layouts, after VECTOR_HEADER and the #defines of L (lanes), RUN, PAR, EPS.
_COMMON = r"""
#include <string.h>
typedef double vd __attribute__((vector_size(L * 8)));
typedef double vdu __attribute__((vector_size(L * 8), aligned(8), may_alias));
#define TOD(v) __builtin_convertvector((v), vd)

/* the lane sums of the nv vectors from p, in double (float within runs of RUN vectors) */
INLINE vd vsum(const float *restrict p, long nv) {
    vd total = {0};
    for (long r = 0; r < nv; r += RUN) {
        const long e = r + RUN < nv ? r + RUN : nv;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        long q = r;
        for (; q + 4 <= e; q += 4) {
            a0 += vload(p + q * L);
            a1 += vload(p + (q + 1) * L);
            a2 += vload(p + (q + 2) * L);
            a3 += vload(p + (q + 3) * L);
        }
        for (; q < e; ++q) a0 += vload(p + q * L);
        total += TOD((a0 + a1) + (a2 + a3));
    }
    return total;
}

/* the lane sums of d = (x - hi) - lo and of d * d over the nv vectors from p */
INLINE void vcentred(const float *restrict p, long nv, vf hi, vf lo, vd *s1, vd *s2) {
    vd t1 = {0}, t2 = {0};
    for (long r = 0; r < nv; r += RUN) {
        const long e = r + RUN < nv ? r + RUN : nv;
        vf a0 = {0}, a1 = {0}, q0 = {0}, q1 = {0};
        long q = r;
        for (; q + 2 <= e; q += 2) {
            const vf d0 = (vload(p + q * L) - hi) - lo, d1 = (vload(p + (q + 1) * L) - hi) - lo;
            a0 += d0;
            a1 += d1;
            q0 += d0 * d0;
            q1 += d1 * d1;
        }
        if (q < e) {
            const vf d0 = (vload(p + q * L) - hi) - lo;
            a0 += d0;
            q0 += d0 * d0;
        }
        t1 += TOD(a0 + a1);
        t2 += TOD(q0 + q1);
    }
    *s1 = t1;
    *s2 = t2;
}

/* y = act(((x - hi) - lo) * a + b) over np vectors; lanes off in `keep` written 0 */
INLINE void output_run(const float *restrict xp, float *restrict yp, long np, vf hi, vf lo,
                       vf a, vf b, vi keep, int masked) {
    for (long p = 0; p < np; ++p) {
        vf v = ((vload(xp + p * L) - hi) - lo) * a + b;
        v = act(v);
        if (masked) v = vsel(keep, v, vsplat(0.0f));
        vstore(yp + p * L, v);
    }
}

/* the float pair (hi, lo) of a double: hi + lo == m to about 2^-48 */
static void split(double m, float *hi, float *lo) {
    *hi = (float)m;
    *lo = (float)(m - (double)*hi);
}

/* mean and 1 / sqrt(var + EPS) of a group from m1 and its centred sums over n values */
static void moments(double m1, double s1, double s2, double n, double *mean, double *rstd) {
    const double c = s1 / n;
    double var = s2 / n - c * c;
    if (var < 0.0) var = 0.0;
    *mean = m1 + c;
    *rstd = 1.0 / sqrt(var + EPS);
}
"""

# Blocked: #defines N, CB, HW, C, G, K (pixel chunks a block), CHUNK (pixels a chunk).
_BLOCKED = r"""
#define CPG (C / G)
#define UNITS (N * CB * K)
#define NL (N * CB * L)
#define COUNT ((double)CPG * (double)HW)

/* unit u: (image, block) nb and pixels [p0, p1) */
static void unit_range(long u, long *nb, long *p0, long *p1) {
    *nb = u / K;
    *p0 = (u % K) * CHUNK;
    *p1 = *p0 + CHUNK < HW ? *p0 + CHUNK : HW;
}

/* tot[g]: the sums of `part` (per unit and lane) over group g's lanes of image n */
static void group_totals(const double *restrict part, long n, double *restrict tot) {
    for (long g = 0; g < G; ++g) tot[g] = 0.0;
    for (long c = 0; c < C; ++c) {
        const double *p = part + (n * CB + c / L) * K * L + c % L;
        double s = 0.0;
        for (long k = 0; k < K; ++k) s += p[k * L];
        tot[c / CPG] += s;
    }
}

/* after pass 1: m1 per (image, group), and as (hi, lo) per lane (0 in padding lanes) */
static void first_means(const double *restrict s0, double *restrict m1, float *restrict hi,
                        float *restrict lo) {
    double tot[G];
    for (long n = 0; n < N; ++n) {
        group_totals(s0, n, tot);
        for (long g = 0; g < G; ++g) m1[n * G + g] = tot[g] / COUNT;
        for (long c = 0; c < CB * L; ++c) {
            const long i = n * CB * L + c;
            hi[i] = lo[i] = 0.0f;
            if (c < C) split(m1[n * G + c / CPG], hi + i, lo + i);
        }
    }
}

/* after pass 2: per lane the mean (hi, lo), a = scale * rstd and the bias */
static void coefficients(const double *restrict s1, const double *restrict s2,
                         const double *restrict m1, const float *restrict scale,
                         const float *restrict bias, float *restrict hi, float *restrict lo,
                         float *restrict a, float *restrict b) {
    double t1[G], t2[G], mean[G], rstd[G];
    for (long n = 0; n < N; ++n) {
        group_totals(s1, n, t1);
        group_totals(s2, n, t2);
        for (long g = 0; g < G; ++g) moments(m1[n * G + g], t1[g], t2[g], COUNT, mean + g,
                                             rstd + g);
        for (long c = 0; c < CB * L; ++c) {
            const long i = n * CB * L + c;
            hi[i] = lo[i] = a[i] = b[i] = 0.0f;
            if (c < C) {
                split(mean[c / CPG], hi + i, lo + i);
                a[i] = (float)((double)scale[c] * rstd[c / CPG]);
                b[i] = bias[c];
            }
        }
    }
}

INLINE void store_sums(double *p, vd v) { *(vdu *)p = v; }

void wpk_groupnorm_nchwc(const float *restrict x, const float *restrict scale,
                         const float *restrict bias, float *restrict y,
                         double *restrict ds, float *restrict fs) {
    double *s1 = ds, *s2 = ds + UNITS * L, *m1 = ds + 2 * UNITS * L;
    float *hi = fs, *lo = fs + NL, *a = fs + 2 * NL, *b = fs + 3 * NL;
    #pragma omp parallel if (PAR)
    {
        long nb, p0, p1;
        #pragma omp for schedule(static)
        for (long u = 0; u < UNITS; ++u) {
            unit_range(u, &nb, &p0, &p1);
            store_sums(s1 + u * L, vsum(x + (nb * HW + p0) * L, p1 - p0));
        }
        #pragma omp single
        first_means(s1, m1, hi, lo);
        #pragma omp for schedule(static)
        for (long u = 0; u < UNITS; ++u) {
            vd t1, t2;
            unit_range(u, &nb, &p0, &p1);
            vcentred(x + (nb * HW + p0) * L, p1 - p0, vload(hi + nb * L), vload(lo + nb * L),
                     &t1, &t2);
            store_sums(s1 + u * L, t1);
            store_sums(s2 + u * L, t2);
        }
        #pragma omp single
        coefficients(s1, s2, m1, scale, bias, hi, lo, a, b);
        #pragma omp for schedule(static) nowait
        for (long u = 0; u < UNITS; ++u) {
            unit_range(u, &nb, &p0, &p1);
            const long off = (nb * HW + p0) * L, cb = nb % CB;
            const vf h = vload(hi + nb * L), l = vload(lo + nb * L);
            const vf av = vload(a + nb * L), bv = vload(b + nb * L);
            vi keep;
            for (int j = 0; j < L; ++j) keep[j] = cb * L + j < C ? -1 : 0;
            if (C % L && cb == CB - 1)
                output_run(x + off, y + off, p1 - p0, h, l, av, bv, keep, 1);
            else
                output_run(x + off, y + off, p1 - p0, h, l, av, bv, keep, 0);
        }
    }
}
"""

# Plain: #defines N, G, CPG (channels a group), S (spatial size).
_PLAIN = r"""
#define GS (CPG * S)
#define NV (GS / L)

/* a channel's S values: act((x - mean) * a + b), the tail through a buffer */
static void output_channel(const float *restrict xc, float *restrict yc, vf hi, vf lo,
                           vf a, vf b) {
    const vi all = vsplat(0.0f) == vsplat(0.0f);
    output_run(xc, yc, S / L, hi, lo, a, b, all, 0);
    const long done = S / L * L;
    if (done < S) {
        float in[L] = {0}, out[L];
        memcpy(in, xc + done, (size_t)(S - done) * sizeof(float));
        output_run(in, out, 1, hi, lo, a, b, all, 0);
        memcpy(yc + done, out, (size_t)(S - done) * sizeof(float));
    }
}

INLINE double lanes_total(vd v) {
    double s = 0.0;
    for (int j = 0; j < L; ++j) s += v[j];
    return s;
}

/* one image's group g, its GS values from xg: the three passes */
static void group(const float *restrict xg, float *restrict yg, long g,
                  const float *restrict scale, const float *restrict bias) {
    double m1 = lanes_total(vsum(xg, NV));
    for (long i = NV * L; i < GS; ++i) m1 += xg[i];
    m1 /= (double)GS;
    float h, l;
    split(m1, &h, &l);
    vd v1, v2;
    vcentred(xg, NV, vsplat(h), vsplat(l), &v1, &v2);
    double s1 = lanes_total(v1), s2 = lanes_total(v2);
    for (long i = NV * L; i < GS; ++i) {
        const float d = (xg[i] - h) - l;
        s1 += d;
        s2 += (double)d * d;
    }
    double mean, rstd;
    moments(m1, s1, s2, (double)GS, &mean, &rstd);
    split(mean, &h, &l);
    for (long j = 0; j < CPG; ++j) {
        const long c = g * CPG + j;
        output_channel(xg + j * S, yg + j * S, vsplat(h), vsplat(l),
                       vsplat((float)((double)scale[c] * rstd)), vsplat(bias[c]));
    }
}

void wpk_groupnorm(const float *restrict x, const float *restrict scale,
                   const float *restrict bias, float *restrict y) {
    #pragma omp parallel for schedule(dynamic, 1) if (PAR)
    for (long u = 0; u < N * G; ++u) group(x + u * GS, y + u * GS, u % G, scale, bias);
}
"""


def _activation(workload: Workload) -> tuple[str | None, tuple[float, ...]] | str:
    """The epilogue as one vector activation (name, parameters), (None, ()) without one,
    or why the kernel cannot apply it."""
    steps = workload.epilogue
    if not steps:
        return None, ()
    if len(steps) > 1 or steps[0].operand is not None:
        return f"groupnorm.c applies one unary activation, not {[s.op for s in steps]}"
    try:
        return step_activation(steps[0])
    except (KeyError, TypeError, ValueError) as error:
        return f"activation {steps[0].op} has no vector form ({error})"


def group_norm_c_reason(workload: Workload) -> str | None:
    """None when `groupnorm.c` computes the workload, else why not."""
    if not is_group_norm(workload):
        return "groupnorm.c computes wpk's GroupNorm only"
    reason = group_norm_reason(workload)
    if reason:
        return reason
    activation = _activation(workload)
    if isinstance(activation, str):
        return activation
    if workload.domain == BLOCKED_DOMAIN and workload.epilogue:
        zero = apply_epilogue(np.zeros(1, np.float32), workload.epilogue, [])
        if zero[0] != 0:
            return "a blocked GroupNorm's epilogue must map 0 to 0 (its padding lanes)"
    return None


def blocked_split(workload: Workload) -> tuple[int, int]:
    """(K, CHUNK): a blocked workload's pixel chunks a block and pixels a chunk, so there
    are about `TARGET_UNITS` (image, block, chunk) units of `MIN_CHUNK_PIXELS` or more."""
    n, cb, h, w, _ = workload.inputs[0].shape
    hw = h * w
    chunks = max(1, min(-(-TARGET_UNITS // (n * cb)), hw // MIN_CHUNK_PIXELS))
    chunk = -(-hw // chunks)
    return -(-hw // chunk), chunk


def _defines(values: Mapping[str, int]) -> str:
    return "".join(f"#define {k} {v}L\n" for k, v in values.items())


def _head(lanes: int, act: tuple[str | None, tuple[float, ...]], par: int, eps: float) -> str:
    """VECTOR_HEADER, the common #defines, `act` and the shared functions."""
    act_fn = "\n".join(["INLINE vf act(vf v) {", *activation_lines(*act), "    return v;",
                        "}", ""])
    return (VECTOR_HEADER.format(lanes=lanes)
            + f"#define L {lanes}\n#define RUN 64\n#define PAR {par}\n"
            + f"static const double EPS = {float(eps)!r};\n" + act_fn + _COMMON)


def group_norm_source(workload: Workload, par: int) -> str:
    """The C source of the kernel for `workload` (`wpk_groupnorm_nchwc` blocked,
    `wpk_groupnorm` plain)."""
    act = _activation(workload)
    eps = float(workload.attr("epsilon", 1e-5))
    shape = workload.inputs[0].shape
    groups, channels = int(workload.attr("groups")), group_norm_channels(workload)
    if workload.domain == BLOCKED_DOMAIN:
        n, cb, h, w, block = shape
        k, chunk = blocked_split(workload)
        return _head(block, act, par, eps) + _defines(
            dict(N=n, CB=cb, HW=h * w, C=channels, G=groups, K=k, CHUNK=chunk)) + _BLOCKED
    return _head(host_isa().lanes, act, par, eps) + _defines(
        dict(N=shape[0], G=groups, CPG=channels // groups, S=math.prod(shape[2:]))) + _PLAIN


def _scratch(workload: Workload) -> list[np.ndarray]:
    """The blocked kernel's scratch: per-unit lane sums and m1 (double), per-lane
    coefficients (float); none for the plain one."""
    if workload.domain != BLOCKED_DOMAIN:
        return []
    n, cb, _, _, block = workload.inputs[0].shape
    units = n * cb * blocked_split(workload)[0]
    return [np.zeros(2 * units * block + n * int(workload.attr("groups")), np.float64),
            np.zeros(4 * n * cb * block, np.float32)]


class GroupNormC(Implementation):
    """GroupNorm as one C kernel, plain or blocked (see the module docstring)."""

    name = "groupnorm.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return group_norm_c_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        return [{"par": 1}, {"par": 0}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        text = "three passes" + (", blocked" if workload.domain == BLOCKED_DOMAIN else "")
        return text + ("" if config.get("par", 1) else ", one thread")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = group_norm_c_reason(workload)
        if reason or int(config.get("par", 1)) not in (0, 1):
            raise ValueError(f"{workload.label}: {reason or 'par is 0 or 1'}")
        blocked = workload.domain == BLOCKED_DOMAIN
        source = group_norm_source(workload, int(config.get("par", 1)))
        build.openmp_defaults()
        scratch = _scratch(workload)
        fn = load_function(build.compile_c(source, (*c_flags(), *_FLAGS)),
                           "wpk_groupnorm_nchwc" if blocked else "wpk_groupnorm",
                           [ctypes.c_void_p] * (4 + len(scratch)))
        prepared = {i: np.ascontiguousarray(np.asarray(consts[i], np.float32).reshape(-1))
                    for i in (1, 2) if i in consts}

        def operands(inputs) -> list[np.ndarray]:
            """x, scale, bias as float32 C-contiguous arrays (constants prepared once)."""
            return [prepared[i] if i in prepared else np.ascontiguousarray(inputs[i], np.float32)
                    for i in (0, 1, 2)]

        def pointers(arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
            """The call's arguments: x, scale, bias, y, then the scratch."""
            return tuple(a.ctypes.data for a in (*arrays, *scratch))

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0]):
                raise ValueError("groupnorm.c writes C-contiguous float32 outputs")
            arrays = [*operands(inputs), outputs[0]]
            fn(*pointers(arrays))

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when every operand is passed as it is."""
            given = [inputs[i] for i in (0, 1, 2) if i not in prepared]
            if not all(plain(a) for a in (*given, outputs[0])):
                return None
            return function_address(fn), pointers([*operands(inputs), outputs[0]])

        kernel.native = native
        kernel.keep = (*prepared.values(), *scratch)
        return kernel


GROUP_NORM_C = register(GroupNormC())
