"""`convtranspose.c`: a 2-d ConvTranspose (any kernel, stride and padding) as one C kernel.

    y[n, co, oy, ox] = b[co] + sum x[n, ci, iy, ix] * W[ci, co, ky, kx]
                       over oy = iy * SH - PT + ky, ox = ix * SW - PL + kx

Split by output phase: the output rows oy = SH * q + r (r in [0, SH)) take the kernel
rows ky = (r + PT) mod SH + SH * my from input rows iy = q + (r + PT) div SH - my, and the
columns ox = SW * j + c likewise. So the SH x SW output phases of a position (q, j) are
small dense correlations of the input, each with its own taps and input offsets, and
nothing is computed twice or for a zero of an upsampled input (what onnxruntime's GEMM
and col2im, and a Conv over a zero-stuffed input, do).

A unit (OpenMP over image x tile of CT output channels x q) holds CT x SH x SW vector
accumulators, VW consecutive positions j each; per input channel and input offset it
loads one vector of the input row and adds it, times each broadcast weight (packed at
prepare time in the order they are read), to every accumulator that has a tap at that
offset. The phases of an output row interleave into SW * VW consecutive outputs: two
shuffles for SW = 2, lane by lane otherwise; a run that ends past the row is stored
through a small buffer, the rest directly. A row's last vector ends at the row's last
position (recomputing some of the one before). Input rows outside the image are skipped;
input columns outside it are read as zeros from a padded copy of the input (made in the
same call; a kernel whose vectors never leave the input reads it directly). Small outputs
run on the calling thread. The generated kernels' chain used to stop at onnxruntime's
kernel; this one joins it. One fused activation (`transpose_activation`: those the conv
micro-kernels apply, `templates.activation_lines`) is applied to every accumulator before
it is stored, so DBNet's ReLU and Sigmoid and a DCGAN's ReLU and Tanh cost no pass of
their own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c_shared, load_function
from wpk.kernels.cpu.conv_transpose_channels import (
    IDENTITY,
    channels_source,
    pack_channel_weights,
    scratch_floats,
    tile_shape,
)
from wpk.kernels.cpu.microkernels.isa import usable_isas
from wpk.kernels.cpu.microkernels.space import step_activation
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER, activation_lines
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.window import conv_transpose_begin_pads
from wpk.kernels.nchwc_format import CONV_ACTIVATIONS
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

# Outputs of at least this many floats, or products of at least this many multiply-adds
# (a DCGAN's 512 -> 256 layer: 16K outputs, 34M multiply-adds), run on the OpenMP threads
PAR_MIN = 1 << 15
PAR_MIN_MACS = 1 << 20

_BODY = r"""
#include <stdint.h>
#include <string.h>

/* the input with LP zero columns before each row and zeros after it, rows XS wide */
static void pad_input(const float *restrict x, float *restrict xp) {
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < N * CI * H; r++)
        memcpy(xp + r * XS + LP, x + r * W, W * sizeof(float));
}

/* run[0, SW * VW) of one output row, from ox0 on: what lies inside the row */
static void store_run(float *restrict row, int64_t ox0, const float *restrict run) {
    for (int64_t i = 0; i < SW * VW && ox0 + i < OW; i++)
        row[ox0 + i] = run[i];
}

void wpk_conv_transpose(const float *restrict x, const float *restrict wp,
                        const float *restrict bias, float *restrict y,
                        float *restrict scratch) {
    const int64_t units = N * COT * NQ;
    #pragma omp parallel if (PAR)
    {
#if PADDED
        pad_input(x, scratch);
        const float *xs = scratch;
#else
        (void)scratch;
        const float *xs = x;
#endif
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t n = u / (COT * NQ), cot = u / NQ % COT, q = u % NQ;
            const float *wt = wp + cot * CI * CT * KH * KW;
            const float *bt = bias + cot * CT;
            for (int64_t v = 0; v < NV; v++) {
                int64_t j0 = v * VW;
                if (NJ >= VW && j0 + VW > NJ)
                    j0 = NJ - VW;   /* the last vector ends at the row's end */
TILE
            }
        }
    }
}
"""


@dataclass(frozen=True)
class TransposeGeometry:
    """What `convtranspose.c` is generated for."""

    n: int
    ci: int
    h: int
    w: int
    co: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    oh: int
    ow: int

    def taps(self, axis: int) -> list[tuple[int, int, int]]:
        """(phase, kernel index, input offset) of every tap along an axis (0: rows, 1:
        columns): output index stride * position + phase reads kernel index k from input
        index position + offset."""
        stride, size, pad = (self.sh, self.kh, self.pt) if axis == 0 else \
            (self.sw, self.kw, self.pl)
        found = []
        for phase in range(stride):
            shift, first = divmod(phase + pad, stride)
            found += [(phase, k, shift - m) for m, k in enumerate(range(first, size, stride))]
        return found

    def parallel(self) -> bool:
        """Whether the kernel runs on the OpenMP threads: a big output or much arithmetic
        (every input pixel meets KH x KW weights of each output channel)."""
        macs = self.n * self.ci * self.h * self.w * self.co * self.kh * self.kw
        return self.n * self.co * self.oh * self.ow >= PAR_MIN or macs >= PAR_MIN_MACS

    def positions(self) -> tuple[int, int]:
        """(NQ, NJ): the positions whose phases cover the output's rows and columns."""
        return -(-self.oh // self.sh), -(-self.ow // self.sw)

    def column_offsets(self) -> tuple[int, int]:
        """The least and greatest input column offset a tap reads (0, 0 without taps)."""
        offsets = [offset for _, _, offset in self.taps(1)] or [0]
        return min(offsets), max(offsets)

    def padded(self, lanes: int) -> bool:
        """Whether the kernel reads a zero-padded copy of the input: when a vector of
        positions would read a column left of the input or past its rows' end."""
        low, high = self.column_offsets()
        return low < 0 or max(self.positions()[1], lanes) + high > self.w

    def left_pad(self, lanes: int) -> int:
        """LP: the zero columns before each row of the input as read."""
        return max(0, -self.column_offsets()[0]) if self.padded(lanes) else 0

    def row_stride(self, lanes: int) -> int:
        """XS: the width of a row of the input as read (padded or not)."""
        if not self.padded(lanes):
            return self.w
        return self.left_pad(lanes) + max(self.w, max(self.positions()[1], lanes)
                                          + self.column_offsets()[1])


def _geometry(workload: Workload) -> TransposeGeometry:
    n, ci, h, w = workload.inputs[0].shape
    _, co, kh, kw = workload.inputs[1].shape
    sh, sw = tuple(workload.attr("strides") or (1, 1))
    pt, pl = conv_transpose_begin_pads(workload)
    _, _, oh, ow = workload.outputs[0].shape
    return TransposeGeometry(n, ci, h, w, co, kh, kw, int(sh), int(sw), int(pt), int(pl),
                             oh, ow)


def _tile(g: TransposeGeometry, ct: int, lanes: int) -> str:
    """C of one vector of positions of a unit: the CT x SH x SW accumulators, the
    reduction over the input channels, row offsets and column offsets, the stores."""
    phases = [(t, r, c) for t in range(ct) for r in range(g.sh) for c in range(g.sw)]
    lines = [f"                vf a{t}_{r}_{c} = vsplat(bt[{t}]);" for t, r, c in phases]
    rows, columns = g.taps(0), g.taps(1)
    for row_offset in sorted({offset for _, _, offset in rows}):
        lines += [f"                if (q + {row_offset} >= 0 && q + {row_offset} < H) {{",
                  "                    for (int64_t ci = 0; ci < CI; ci++) {",
                  f"                        const float *xr = xs + ((n * CI + ci) * H + q + "
                  f"{row_offset}) * XS + LP + j0;",
                  "                        const float *wc = wt + ci * CT * KH * KW;"]
        for column_offset in sorted({offset for _, _, offset in columns}):
            fmas = [f"a{t}_{r}_{c} += xv * wc[{(t * g.kh + ky) * g.kw + kx}];"
                    for t in range(ct) for r, ky, ro in rows if ro == row_offset
                    for c, kx, co in columns if co == column_offset]
            if fmas:
                lines.append(f"                        {{ const vf xv = vload(xr + "
                             f"({column_offset}));")
                lines += [f"                          {fma}" for fma in fmas]
                lines.append("                        }")
        lines += ["                    }", "                }"]
    lines += [f"                a{t}_{r}_{c} = act(a{t}_{r}_{c});" for t, r, c in phases]
    lines += ["                const int64_t ox0 = SW * j0;",
              "                const int inside = ox0 + SW * VW <= OW;"]
    if g.sw == 2:
        lo = ", ".join(str((lane % 2) * lanes + lane // 2) for lane in range(lanes))
        hi = ", ".join(str((lane % 2) * lanes + lanes // 2 + lane // 2) for lane in range(lanes))
        lines.append(f"                const vi lo = {{{lo}}}, hi = {{{hi}}};")
    for t in range(ct):
        lines.append(f"                if (cot * CT + {t} < CO) {{")
        for r in range(g.sh):
            lines += [f"                    if (SH * q + {r} < OH) {{",
                      f"                        float *row = y + ((n * CO + cot * CT + {t}) * OH"
                      f" + SH * q + {r}) * OW;",
                      "                        float run[SW * VW] __attribute__((aligned(64)));"]
            if g.sw == 2:
                pair = f"a{t}_{r}_0, a{t}_{r}_1"
                lines += [f"                        const vf r0 = __builtin_shuffle({pair}, lo);",
                          f"                        const vf r1 = __builtin_shuffle({pair}, hi);",
                          "                        if (inside) { vstore(row + ox0, r0); "
                          "vstore(row + ox0 + VW, r1); }",
                          "                        else { vstore(run, r0); vstore(run + VW, r1); "
                          "store_run(row, ox0, run); }"]
            elif g.sw == 1:
                lines += [f"                        if (inside) vstore(row + ox0, a{t}_{r}_0);",
                          f"                        else {{ vstore(run, a{t}_{r}_0); "
                          "store_run(row, ox0, run); }"]
            else:
                lines.append("                        for (int l = 0; l < VW; l++) {")
                lines += [f"                            run[l * SW + {c}] = a{t}_{r}_{c}[l];"
                          for c in range(g.sw)]
                lines += ["                        }",
                          "                        if (inside) memcpy(row + ox0, run, sizeof run);",
                          "                        else store_run(row, ox0, run);"]
            lines.append("                    }")
        lines.append("                }")
    return "\n".join(lines)


def transpose_activation(workload: Workload) -> tuple[str | None, tuple[float, ...]] | str:
    """The activation fused into the workload's epilogue as (name, parameters), (None, ())
    without one, or why the C kernels cannot apply it: one activation the conv micro-kernels
    apply too (the CPU's `epilogue_activation_conv_transpose` fuses no other)."""
    steps = workload.epilogue
    if not steps:
        return None, ()
    if len(steps) > 1 or steps[0].operand is not None or steps[0].op not in CONV_ACTIVATIONS:
        return f"epilogue {[s.op for s in steps]} is not one activation"
    return step_activation(steps[0])


def activation_function(workload: Workload) -> str:
    """C of `INLINE vf act(vf v)`: the workload's fused activation (the identity without
    one), applied to every accumulator before it is stored."""
    name, params = transpose_activation(workload)
    return "\n".join(["INLINE vf act(vf v) {", *activation_lines(name, params),
                      "    return v;", "}", ""])


def conv_transpose_reason(workload: Workload) -> str | None:
    """None when `convtranspose.c` computes the workload, else why not."""
    if workload.op != "ConvTranspose" or workload.domain not in ("", "ai.onnx"):
        return "convtranspose.c computes ONNX ConvTranspose only"
    inputs = workload.inputs
    if len(inputs) < 2 or any(s is None for s in inputs[:2]) or len(inputs[0].shape) != 4 \
            or len(inputs[1].shape) != 4 or len(workload.outputs[0].shape) != 4:
        return "a 2-d ConvTranspose of X and W"
    if any(s is not None and s.dtype != "float32" for s in (*inputs, *workload.outputs)):
        return "float32 only"
    if len(workload.outputs) != 1:
        return "one output"
    activation = transpose_activation(workload)
    if isinstance(activation, str):
        return activation
    if 1 not in workload.const_inputs or (len(inputs) > 2 and inputs[2] is not None
                                          and 2 not in workload.const_inputs):
        return "W and B must be constants (packed once)"
    if int(workload.attr("group", 1)) != 1:
        return "group 1 only"
    if tuple(workload.attr("dilations") or (1, 1)) != (1, 1):
        return "dilation 1 only"
    if any(0 in s.shape for s in (*inputs[:2], *workload.outputs)):
        return "empty tensors"
    g = _geometry(workload)
    if min(g.pt, g.pl) < 0 or min(g.sh, g.sw) < 1:
        return "begin pads >= 0 and strides >= 1"
    if g.sh * g.sw > 16:
        return "at most 16 output phases (strides up to 4 x 4)"
    return None


def channel_tile(co: int, phases: int, registers: int) -> int:
    """Output channels per unit: as many sets of `phases` accumulators (one per output
    phase) as leave two registers (the input vector and a broadcast weight) of the ISA's,
    at least one; of the tile counts that needs, the smallest tile (the least padding
    past CO)."""
    largest = max(1, min(co, (registers - 2) // phases))
    return -(-co // -(-co // largest))


def pack_weights(w: np.ndarray, ct: int) -> np.ndarray:
    """W [CI, CO, KH, KW] as [CO tiles, CI, CT, KH, KW] (zero past CO): a unit's weights in
    the order it reads them."""
    ci, co, kh, kw = w.shape
    tiles = -(-co // ct)
    padded = np.zeros((ci, tiles * ct, kh, kw), np.float32)
    padded[:, :co] = w
    return np.ascontiguousarray(padded.reshape(ci, tiles, ct, kh, kw).transpose(1, 0, 2, 3, 4))


def conv_transpose_source(g: TransposeGeometry, ct: int, lanes: int, act: str = "") -> str:
    """The C source of `wpk_conv_transpose(x, packed W, bias, y, scratch)` for `g`, `act`
    the C of its activation (`activation_function`; none: the identity)."""
    nq, nj = g.positions()
    defines = dict(N=g.n, CI=g.ci, H=g.h, W=g.w, CO=g.co, KH=g.kh, KW=g.kw, SH=g.sh,
                   SW=g.sw, OH=g.oh, OW=g.ow, CT=ct, COT=-(-g.co // ct), VW=lanes, NQ=nq,
                   NJ=nj, NV=-(-nj // lanes), PADDED=int(g.padded(lanes)),
                   LP=g.left_pad(lanes), XS=g.row_stride(lanes),
                   PAR=int(g.parallel()))
    return (VECTOR_HEADER.format(lanes=lanes)
            + "".join(f"#define {k} {v}\n" for k, v in defines.items())
            + (act or IDENTITY) + _BODY.replace("TILE", _tile(g, ct, lanes)))


class ConvTransposeC(Implementation):
    """ConvTranspose in C, by output phase (see the module docstring)."""

    name = "convtranspose.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return conv_transpose_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        """Both vectorizations: over output positions (wide rows) and over output channels
        (small inputs); the build measures both and keeps the faster."""
        return [{"along": "positions"}, {"along": "channels"}]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        along = config.get("along", "positions")
        return "direct by output phase" + (", channel vectors" if along == "channels" else "")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = conv_transpose_reason(workload)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        along = config.get("along", "positions")
        if along not in ("positions", "channels"):
            raise ValueError(f"{workload.label}: 'along' is positions or channels, not {along!r}")
        g = _geometry(workload)
        isa = usable_isas()[0]
        weight = np.asarray(consts[1], np.float32)
        if along == "channels":
            kv, np_ = tile_shape(g)
            tile = kv * isa.lanes
            packed = pack_channel_weights(weight, tile, g)
            # the zero borders of the input copy are written here, once; a call copies the rows
            scratch = np.zeros(scratch_floats(g), np.float32)
            source = channels_source(g, kv, np_, isa.lanes, g.parallel(),
                                     activation_function(workload))
        else:
            tile = channel_tile(g.co, g.sh * g.sw, isa.registers)
            packed = pack_weights(weight, tile)
            # the padded input's zero columns are written here, once; a call copies the rows
            scratch = np.zeros(g.n * g.ci * g.h * g.row_stride(isa.lanes)
                               if g.padded(isa.lanes) else 1, np.float32)
            source = conv_transpose_source(g, tile, isa.lanes, activation_function(workload))
        bias = np.zeros(packed.shape[0] * tile, np.float32)
        if 2 in consts and consts[2] is not None:
            bias[:g.co] = np.asarray(consts[2], np.float32).reshape(-1)
        build.openmp_defaults()
        fn = load_function(compile_c_shared(source), "wpk_conv_transpose",
                           [ctypes.c_void_p] * 5)
        in_shape, out_shape = workload.inputs[0].shape, workload.outputs[0].shape

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0], out_shape):
                raise ValueError("convtranspose.c writes C-contiguous float32 outputs")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            fn(x.ctypes.data, packed.ctypes.data, bias.ctypes.data, outputs[0].ctypes.data,
               scratch.ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when X and Y are passed as they are."""
            if not (plain(inputs[0], in_shape) and plain(outputs[0], out_shape)):
                return None
            return function_address(fn), (inputs[0].ctypes.data, packed.ctypes.data,
                                          bias.ctypes.data, outputs[0].ctypes.data,
                                          scratch.ctypes.data)

        kernel.native = native
        kernel.keep = (packed, bias, scratch)
        return kernel


CONV_TRANSPOSE_C = register(ConvTransposeC())
