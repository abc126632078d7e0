"""`recurrent.c`: ONNX LSTM and GRU as one C kernel.

A recurrent layer is two kinds of work. The input projection, X_t W^T + biases for every
time step at once, is one matrix product ([T*B, I] x [I, gates*H]) with no dependence
between steps; the recurrence, H_{t-1} R^T per step, is a matrix-vector product whose
weights (R, 1 MB for a 256-wide LSTM direction) are read again at every step, followed by
the gates' sigmoids and tanhs. onnxruntime's CPU kernels (a CRNN text recognizer's two
bidirectional 256-wide LSTMs over 80 steps: 4.1 and 3.1 ms, two thirds of the model) pay
for the weights through the cache hierarchy and a thread hand-off per step. Here:

- the projection runs first, every direction at once, as a register-tiled product over
  packed W^T (6 rows x 2 vectors of accumulators, columns shared out to the threads);
- the recurrence keeps one OpenMP team for the whole sequence: each thread owns whole
  directions, or a share of one direction's hidden units (chunks of two vectors), so it
  reads only its own slice of R, packed [chunk][k][gate][units] to stream contiguously,
  and its cell state never leaves it; one barrier a step publishes H_t. GRU with
  `linear_before_reset` 0 needs r * H_{t-1} whole before its candidate: a second
  barrier in the step;
- the gates use the micro-kernels' vector sigmoid and tanh (`vector_c`).

Hidden units are padded to whole chunks with zero weights (a padded unit's state stays 0).
Covered: float32, `layout` 0, forward, reverse and bidirectional, any batch, the default
activations, no `clip`, no `input_forget`, no peepholes, no `sequence_lens` or a constant
one that runs every sequence to its end (torch's exports, tf2onnx's of unmasked Keras
layers); Y, Y_h and Y_c written where the node has them. Anything else is left to
onnxruntime's kernels.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.devices import host_cpu
from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

# ISO C (-std=c11) turns floating-point contraction off; the kernel wants its FMAs.
EXTRA_FLAGS = ("-ffp-contract=fast",)
# Gates per op, in ONNX's order of W's rows: LSTM i, o, f, c; GRU z, r, h.
GATES = {"LSTM": 4, "GRU": 3}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}
# The projection's register tile: rows (time steps x batch) of 2 vectors each.
PROJECTION_ROWS = 6
ARGUMENTS = 11   # x, W packed, R packed, bias, R's h-gate bias, h0, c0, y, y_h, y_c, work
# The largest scratch buffer (projected gates of every step) a kernel may hold.
MAX_WORK_BYTES = 1 << 30

_SOURCE = r"""
#include <omp.h>

#define T {t}L
#define B {b}L
#define I {i}L
#define H {h}L
#define HP {hp}L
#define G {g}L
#define DIRS {dirs}
#define REVERSE0 {reverse0}
#define LSTM {lstm}
#define LBR {lbr}
#define PAR {par}
#define VW {lanes}
#define UC (2 * VW)
#define NCH (HP / UC)
#define N (G * HP)
#define MR {mr}
#define NB {nb}   /* batch rows sharing each load of R */

/* work: projected gates [DIRS][T*B][N], h [2][DIRS][B][HP], c [DIRS][B][HP],
   z and r*h [DIRS][B][HP] each */
#define GATES_FLOATS ((long)DIRS * T * B * N)
#define STATE_FLOATS ((long)DIRS * B * HP)

/* rows [m0, m0 + rows) of direction d's projection, columns [n0, n0 + UC) */
INLINE void project(const float *restrict x, const float *restrict wp,
                    const float *restrict bias, float *restrict gates, long d, long nc,
                    long m0, const int rows) {{
    const float *restrict w = wp + ((long)d * (N / UC) + nc) * I * UC;
    vf acc[MR][2];
    vf b0 = vload(bias + d * N + nc * UC), b1 = vload(bias + d * N + nc * UC + VW);
    for (int r = 0; r < rows; ++r) {{ acc[r][0] = b0; acc[r][1] = b1; }}
    const float *restrict xr = x + m0 * I;
    for (long k = 0; k < I; ++k) {{
        vf w0 = vload(w + k * UC), w1 = vload(w + k * UC + VW);
        for (int r = 0; r < rows; ++r) {{
            vf xv = vsplat(xr[r * I + k]);
            acc[r][0] += xv * w0;
            acc[r][1] += xv * w1;
        }}
    }}
    float *restrict out = gates + ((long)d * T * B + m0) * N + nc * UC;
    for (int r = 0; r < rows; ++r) {{
        vstore(out + r * N, acc[r][0]);
        vstore(out + r * N + VW, acc[r][1]);
    }}
}}

static void projection(const float *restrict x, const float *restrict wp,
                       const float *restrict bias, float *restrict gates) {{
    const long blocks = (T * B + MR - 1) / MR;
    #pragma omp for collapse(2) schedule(static)
    for (long dn = 0; dn < DIRS * (N / UC); ++dn)
        for (long mb = 0; mb < blocks; ++mb) {{
            long d = dn / (N / UC), nc = dn % (N / UC), m0 = mb * MR;
            long rows = T * B - m0 < MR ? T * B - m0 : MR;
            /* whole tiles unrolled; the one short tail tile of a column chunk as it comes */
            if (rows == MR) project(x, wp, bias, gates, d, nc, m0, MR);
            else project(x, wp, bias, gates, d, nc, m0, (int)rows);
        }}
}}

/* acc[r][g][v] += sum_k h_r[k] R[g*H + unit][k] over the chunk's units (R packed
   [d][chunk][k][gate][UC]) for nb batch rows at once, each vector of R loaded once for
   all of them; gates [first, last) only */
INLINE void recur(vf acc[NB][G][2], const float *const h[NB], const int nb,
                  const float *restrict rp, const int first, const int last) {{
    for (long k = 0; k < H; ++k) {{
        const float *restrict row = rp + k * G * UC;
        vf hk[NB];
        for (int r = 0; r < nb; ++r) hk[r] = vsplat(h[r][k]);
        for (int g = first; g < last; ++g) {{
            vf w0 = vload(row + g * UC), w1 = vload(row + g * UC + VW);
            for (int r = 0; r < nb; ++r) {{
                acc[r][g][0] += hk[r] * w0;
                acc[r][g][1] += hk[r] * w1;
            }}
        }}
    }}
}}

/* Where batch row b's vectors of chunk c start in direction d: its state, its projected
   gates at time t. */
#define STATE_AT(d, b, c) (((d) * B + (b)) * HP + (c) * UC)
#define GATES_AT(d, t, b, c) ((((d) * T + (t)) * B + (b)) * N + (c) * UC)

/* One step of chunk c of direction d (time t) for batch rows [b0, b0 + nb): the whole cell
   update (LSTM; GRU with linear_before_reset), or a GRU's z and r * h (without). */
INLINE void step_rows(const float *restrict gates, const float *restrict rc,
                      const float *restrict rbh, const float *restrict hprev,
                      float *restrict hnext, float *restrict cbuf, float *restrict zbuf,
                      float *restrict rhbuf, long d, long t, long c, long b0, const int nb) {{
    vf acc[NB][G][2];
    const float *h[NB];
    for (int r = 0; r < nb; ++r) {{
        const float *restrict gx = gates + GATES_AT(d, t, b0 + r, c);
        for (int g = 0; g < G; ++g) {{
            acc[r][g][0] = vload(gx + g * HP);
            acc[r][g][1] = vload(gx + g * HP + VW);
        }}
        h[r] = hprev + STATE_AT(d, b0 + r, 0);
    }}
    (void)rbh; (void)cbuf; (void)zbuf; (void)rhbuf;
#if LSTM
    recur(acc, h, nb, rc, 0, 4);
    for (int r = 0; r < nb; ++r) {{
        const long state = STATE_AT(d, b0 + r, c);
        for (int v = 0; v < 2; ++v) {{
            vf in = vsigmoid(acc[r][0][v]), out = vsigmoid(acc[r][1][v]);
            vf forget = vsigmoid(acc[r][2][v]), cell = vtanh(acc[r][3][v]);
            vf cs = forget * vload(cbuf + state + v * VW) + in * cell;
            vstore(cbuf + state + v * VW, cs);
            vstore(hnext + state + v * VW, out * vtanh(cs));
        }}
    }}
#elif LBR
    vf hh[NB][G][2];   /* the h gate's recurrent part, R_h h + Rb_h */
    for (int r = 0; r < nb; ++r) {{
        hh[r][2][0] = vload(rbh + d * HP + c * UC);
        hh[r][2][1] = vload(rbh + d * HP + c * UC + VW);
    }}
    recur(acc, h, nb, rc, 0, 2);
    recur(hh, h, nb, rc, 2, 3);
    for (int r = 0; r < nb; ++r) {{
        const long state = STATE_AT(d, b0 + r, c);
        for (int v = 0; v < 2; ++v) {{
            vf z = vsigmoid(acc[r][0][v]), reset = vsigmoid(acc[r][1][v]);
            vf n = vtanh(acc[r][2][v] + reset * hh[r][2][v]);
            vf hp = vload(hprev + state + v * VW);
            vstore(hnext + state + v * VW, n + z * (hp - n));
        }}
    }}
#else
    recur(acc, h, nb, rc, 0, 2);
    for (int r = 0; r < nb; ++r) {{
        const long state = STATE_AT(d, b0 + r, c);
        for (int v = 0; v < 2; ++v) {{
            vstore(zbuf + state + v * VW, vsigmoid(acc[r][0][v]));
            vstore(rhbuf + state + v * VW,
                   vsigmoid(acc[r][1][v]) * vload(hprev + state + v * VW));
        }}
    }}
#endif
}}

/* The second half of a GRU step without linear_before_reset: the candidate from r * h,
   then the new state, for batch rows [b0, b0 + nb). */
INLINE void candidate_rows(const float *restrict gates, const float *restrict rc,
                           const float *restrict hprev, float *restrict hnext,
                           const float *restrict zbuf, const float *restrict rhbuf,
                           long d, long t, long c, long b0, const int nb) {{
    vf acc[NB][G][2];
    const float *rh[NB];
    for (int r = 0; r < nb; ++r) {{
        const float *restrict gx = gates + GATES_AT(d, t, b0 + r, c);
        acc[r][2][0] = vload(gx + 2 * HP);
        acc[r][2][1] = vload(gx + 2 * HP + VW);
        rh[r] = rhbuf + STATE_AT(d, b0 + r, 0);
    }}
    recur(acc, rh, nb, rc, 2, 3);
    for (int r = 0; r < nb; ++r) {{
        const long state = STATE_AT(d, b0 + r, c);
        for (int v = 0; v < 2; ++v) {{
            vf n = vtanh(acc[r][2][v]), z = vload(zbuf + state + v * VW);
            vf hp = vload(hprev + state + v * VW);
            vstore(hnext + state + v * VW, n + z * (hp - n));
        }}
    }}
}}

/* the time index of step s in direction d */
INLINE long time_of(long d, long s) {{
    int reverse = d == 0 ? REVERSE0 : 1;
    return reverse ? T - 1 - s : s;
}}

void wpk_recurrent(const float *restrict x, const float *restrict wp,
                   const float *restrict rp, const float *restrict bias,
                   const float *restrict rbh, const float *restrict h0,
                   const float *restrict c0, float *restrict y, float *restrict yh,
                   float *restrict yc, float *restrict work) {{
    float *restrict gates = work;
    float *restrict hbuf = gates + GATES_FLOATS;          /* [2][DIRS][B][HP] */
    float *restrict cbuf = hbuf + 2 * STATE_FLOATS;
    float *restrict zbuf = cbuf + STATE_FLOATS;
    float *restrict rhbuf = zbuf + STATE_FLOATS;
    #pragma omp parallel if (PAR)
    {{
        const long nt = omp_get_num_threads(), tid = omp_get_thread_num();
        /* initial state, padded units 0 */
        #pragma omp for schedule(static)
        for (long row = 0; row < DIRS * B; ++row)
            for (long u = 0; u < HP; ++u) {{
                hbuf[row * HP + u] = h0 && u < H ? h0[row * H + u] : 0.0f;
                cbuf[row * HP + u] = LSTM && c0 && u < H ? c0[row * H + u] : 0.0f;
            }}
        projection(x, wp, bias, gates);   /* ends in the implied barrier of its omp for */
        /* this thread's (direction, chunk) items: a contiguous share of DIRS * NCH */
        const long items = (long)DIRS * NCH;
        const long first = items * tid / nt, last = items * (tid + 1) / nt;
        for (long s = 0; s < T; ++s) {{
            const float *restrict hprev = hbuf + (s & 1) * STATE_FLOATS;
            float *restrict hnext = hbuf + ((s + 1) & 1) * STATE_FLOATS;
            for (long item = first; item < last; ++item) {{
                const long d = item / NCH, c = item % NCH, t = time_of(d, s);
                const float *restrict rc = rp + (d * NCH + c) * H * G * UC;
                for (long b0 = 0; b0 < B; b0 += NB) {{
                    if (B - b0 >= NB)
                        step_rows(gates, rc, rbh, hprev, hnext, cbuf, zbuf, rhbuf, d, t, c,
                                  b0, NB);
                    else
                        step_rows(gates, rc, rbh, hprev, hnext, cbuf, zbuf, rhbuf, d, t, c,
                                  b0, 1);
                }}
            }}
#if !LSTM && !LBR
            #pragma omp barrier
            for (long item = first; item < last; ++item) {{
                const long d = item / NCH, c = item % NCH, t = time_of(d, s);
                const float *restrict rc = rp + (d * NCH + c) * H * G * UC;
                for (long b0 = 0; b0 < B; b0 += NB) {{
                    if (B - b0 >= NB)
                        candidate_rows(gates, rc, hprev, hnext, zbuf, rhbuf, d, t, c, b0, NB);
                    else
                        candidate_rows(gates, rc, hprev, hnext, zbuf, rhbuf, d, t, c, b0, 1);
                }}
            }}
#endif
            /* Y[t][d][b][:H] from this thread's chunks */
            if (y)
                for (long item = first; item < last; ++item) {{
                    const long d = item / NCH, c = item % NCH, t = time_of(d, s);
                    const long units = H - c * UC < UC ? H - c * UC : UC;
                    for (long b = 0; b < B; ++b)
                        for (long u = 0; u < units; ++u)
                            y[((t * DIRS + d) * B + b) * H + c * UC + u] =
                                hnext[(d * B + b) * HP + c * UC + u];
                }}
            #pragma omp barrier
        }}
        /* the last state: h after step T - 1 is in buffer T & 1 */
        #pragma omp for schedule(static)
        for (long row = 0; row < DIRS * B; ++row)
            for (long u = 0; u < H; ++u) {{
                if (yh) yh[row * H + u] = hbuf[(T & 1) * STATE_FLOATS + row * HP + u];
                if (LSTM && yc) yc[row * H + u] = cbuf[row * HP + u];
            }}
    }}
}}
"""


def _padded_units(hidden: int, lanes: int) -> int:
    chunk = 2 * lanes
    return -(-hidden // chunk) * chunk


def _activations(workload: Workload) -> tuple[str, ...]:
    value = workload.attr("activations")
    if value is None:
        return DEFAULT_ACTIVATIONS[workload.op]
    names = [v.decode() if isinstance(v, bytes) else str(v) for v in value]
    return tuple(n.lower().capitalize() if n.lower() in ("sigmoid", "tanh") else n
                 for n in names)


def _direction_count(workload: Workload) -> int:
    return 2 if _direction(workload) == "bidirectional" else 1


def _direction(workload: Workload) -> str:
    value = workload.attr("direction", "forward")
    return value.decode() if isinstance(value, bytes) else str(value)


def _full_lengths(workload: Workload) -> bool:
    """Whether `sequence_lens` is a constant that runs every batch entry to the end (as
    tf2onnx writes it for a Keras layer without masking): the same as no lengths."""
    lengths = workload.static_value(4)
    return lengths is not None and bool(np.all(np.asarray(lengths) ==
                                               workload.inputs[0].shape[0]))


def recurrent_reason(workload: Workload) -> str | None:
    """None when `recurrent.c` computes the workload, else why not."""
    op = workload.op
    if op not in GATES or workload.domain not in ("", "ai.onnx"):
        return "recurrent.c computes ONNX LSTM and GRU only"
    inputs, outputs = workload.inputs, workload.outputs
    if len(inputs) < 3 or any(s is None for s in inputs[:3]) or not outputs:
        return f"{op} takes X, W and R"
    floats = [s for i, s in enumerate(inputs) if i != 4] + list(outputs)   # 4: sequence_lens
    if any(s is not None and s.dtype != "float32" for s in floats):
        return "recurrent.c computes float32 only"
    if int(workload.attr("layout", 0)) != 0:
        return "recurrent.c takes layout 0 ([seq, batch, input])"
    if _direction(workload) not in ("forward", "reverse", "bidirectional"):
        return f"unknown direction {_direction(workload)!r}"
    defaults = DEFAULT_ACTIVATIONS[op]
    if _activations(workload) not in (defaults, defaults * _direction_count(workload)):
        return "recurrent.c applies the default activations only"
    if workload.attr("clip") is not None:
        return "recurrent.c does not clip"
    if op == "LSTM" and int(workload.attr("input_forget", 0)):
        return "recurrent.c does not couple the input and forget gates"
    if len(inputs) > 4 and inputs[4] is not None and not _full_lengths(workload):
        return ("recurrent.c runs every sequence to its full length (sequence_lens absent, "
                "or constant and equal to the sequence's length)")
    if op == "LSTM" and len(inputs) > 7 and inputs[7] is not None:
        return "recurrent.c has no peepholes"
    if workload.epilogue:
        return "recurrent.c fuses no epilogue"
    x = inputs[0].shape
    if len(x) != 3 or len(outputs[0].shape) != 4:
        return "recurrent.c writes Y first (X [seq, batch, input], Y [seq, dirs, batch, hidden])"
    if len(outputs) > (3 if op == "LSTM" else 2):
        return f"{op} has at most {3 if op == 'LSTM' else 2} outputs"
    if 4 * work_floats(workload, 16) > MAX_WORK_BYTES:
        return "recurrent.c would hold over 1 GiB of projected gates"
    return None


def _geometry(workload: Workload) -> dict:
    t, b, i = workload.inputs[0].shape
    hidden = int(workload.attr("hidden_size", workload.inputs[2].shape[-1]))
    return {"t": t, "b": b, "i": i, "h": hidden, "g": GATES[workload.op],
            "dirs": _direction_count(workload)}


def batch_rows(batch: int, lanes: int) -> int:
    """Batch rows that share each load of R: 2 where the register file holds their
    accumulators (AVX-512's 32 vectors: 16 for an LSTM's two rows), else 1."""
    return 2 if batch > 1 and lanes >= 16 else 1


def recurrent_source(workload: Workload, config: Mapping, lanes: int) -> str:
    """The C source of `wpk_recurrent` for the workload, vectors of `lanes` floats."""
    geo = _geometry(workload)
    return VECTOR_HEADER.format(lanes=lanes) + _SOURCE.format(
        **geo, hp=_padded_units(geo["h"], lanes), reverse0=int(_direction(workload) == "reverse"),
        lstm=int(workload.op == "LSTM"), lbr=int(workload.attr("linear_before_reset", 0) != 0),
        par=int(config.get("par", 1)), lanes=lanes, mr=PROJECTION_ROWS,
        nb=batch_rows(geo["b"], lanes))


def pack_weights(workload: Workload, w: np.ndarray, r: np.ndarray, bias: np.ndarray | None,
                 lanes: int) -> tuple[np.ndarray, ...]:
    """(W^T, R and the biases) in the kernel's layouts: W^T [dir][column chunk][input][UC]
    over the padded gate columns, R [dir][unit chunk][k][gate][UC], the projection's bias
    [dir][gates * HP] (W's and R's, except R's h-gate bias of a GRU with
    `linear_before_reset`, applied inside the reset: returned apart, [dir][HP])."""
    geo = _geometry(workload)
    dirs, g, hidden, inputs = geo["dirs"], geo["g"], geo["h"], geo["i"]
    hp, uc = _padded_units(hidden, lanes), 2 * lanes
    w = np.asarray(w, np.float32).reshape(dirs, g, hidden, inputs)
    r = np.asarray(r, np.float32).reshape(dirs, g, hidden, hidden)
    wt = np.zeros((dirs, g, hp, inputs), np.float32)
    wt[:, :, :hidden] = w
    wt = wt.reshape(dirs, g * hp // uc, uc, inputs).transpose(0, 1, 3, 2)
    rt = np.zeros((dirs, g, hp, hidden), np.float32)
    rt[:, :, :hidden] = r
    rt = rt.reshape(dirs, g, hp // uc, uc, hidden).transpose(0, 2, 4, 1, 3)
    b = (np.zeros((dirs, 2, g, hidden), np.float32) if bias is None
         else np.asarray(bias, np.float32).reshape(dirs, 2, g, hidden))
    projected = b[:, 0] + b[:, 1]
    rbh = np.zeros((dirs, hp), np.float32)
    if workload.op == "GRU" and workload.attr("linear_before_reset", 0):
        projected[:, 2] = b[:, 0, 2]
        rbh[:, :hidden] = b[:, 1, 2]
    bias_p = np.zeros((dirs, g, hp), np.float32)
    bias_p[:, :, :hidden] = projected
    return tuple(np.ascontiguousarray(a).reshape(-1) for a in (wt, rt, bias_p, rbh))


def work_floats(workload: Workload, lanes: int) -> int:
    """The scratch buffer's floats: the projected gates and five state planes (h twice, c,
    z, r * h)."""
    geo = _geometry(workload)
    hp = _padded_units(geo["h"], lanes)
    state = geo["dirs"] * geo["b"] * hp
    return geo["dirs"] * geo["t"] * geo["b"] * geo["g"] * hp + 5 * state


class RecurrentC(Implementation):
    """LSTM and GRU as one C kernel (see the module docstring)."""

    name = "recurrent.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return recurrent_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        return [{"par": 1}, {"par": 0}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "projection, then the recurrence" + ("" if config.get("par", 1)
                                                   else ", one thread")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = recurrent_reason(workload)
        if reason or int(config.get("par", 1)) not in (0, 1):
            raise ValueError(f"{workload.label}: {reason or 'par is 0 or 1'}")
        lanes = host_cpu().vector_lanes
        build.openmp_defaults()
        fn = load_function(build.compile_c(recurrent_source(workload, config, lanes),
                                           (*c_flags(), *EXTRA_FLAGS)),
                           "wpk_recurrent", [ctypes.c_void_p] * ARGUMENTS)
        weights = (1, 2, 3)
        constant = all(i in consts or i >= len(workload.inputs) or workload.inputs[i] is None
                       for i in weights)
        work = np.zeros(work_floats(workload, lanes), np.float32)

        def packed(inputs) -> tuple[np.ndarray, ...]:
            def given(i):
                if i in consts:
                    return consts[i]
                return inputs[i] if i < len(inputs) else None
            return pack_weights(workload, given(1), given(2), given(3), lanes)

        fixed = packed([]) if constant else None
        states = {i: np.ascontiguousarray(consts[i], np.float32).reshape(-1)
                  for i in (5, 6) if i in consts}
        count = len(workload.outputs)

        def pointers(inputs, outputs) -> tuple:
            """(arrays to keep alive during the call, the C function's arguments)."""
            wt, rt, bias, rbh = fixed if fixed is not None else packed(inputs)
            state = [states[i] if i in states else
                     np.ascontiguousarray(inputs[i], np.float32)
                     if i < len(inputs) and inputs[i] is not None else None for i in (5, 6)]
            x = np.ascontiguousarray(inputs[0], np.float32)
            outs = [outputs[j].ctypes.data if j < count else None for j in range(3)]
            keep = (x, wt, rt, bias, rbh, *state)
            return keep, (x.ctypes.data, wt.ctypes.data, rt.ctypes.data, bias.ctypes.data,
                          rbh.ctypes.data, *(None if s is None else s.ctypes.data
                                             for s in state), *outs, work.ctypes.data)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not all(plain(o) for o in outputs):
                raise ValueError("recurrent.c writes C-contiguous float32 outputs")
            _alive, args = pointers(inputs, outputs)   # copies made for the call live on
            fn(*args)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when every operand is passed as it is."""
            if fixed is None:
                return None
            given = [inputs[i] for i in (0, 5, 6) if i < len(inputs) and i not in states
                     and inputs[i] is not None]
            if not all(plain(a) for a in (*given, *outputs)):
                return None
            _, args = pointers(inputs, outputs)
            return function_address(fn), args

        kernel.native = native
        kernel.keep = (work, *(fixed or ()), *states.values())
        return kernel


RECURRENT_C = register(RecurrentC())
