"""`convtranspose.c`: the upsampling ConvTranspose (kernel = stride) as one C kernel.

A ConvTranspose whose kernel equals its stride, without padding, dilation or groups --
what FPNs, U-Nets and DBNet's head upsample with (2x2, stride 2) -- spreads every input
pixel over its own k_h x k_w block of the output:

    y[n, co, h*kh + i, w*kw + j] = b[co] + sum_ci x[n, ci, h, w] * W[ci, co, i, j]

Nothing overlaps, so it is a GEMM per input row with the output interleaved. A unit
(OpenMP over image x tile of CT output channels x input row) holds CT x kh x kw
accumulators, each a vector of VW input pixels of the row; per input channel it loads the
row's vector once and adds it, times each broadcast weight (packed at prepare time in the
order they are read), to every accumulator. A 2-wide kernel's two accumulators of an
output row are interleaved with two shuffles into two output vectors; wider ones are
stored pixel by pixel. A row's last vector ends at the row's end (recomputing pixels of
the one before); a row shorter than a vector takes a scalar loop. Small outputs run on
the calling thread. onnxruntime computes it as a GEMM and col2im, the
generated kernels' chain stopping there; this kernel joins the chain.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c_shared, load_function
from wpk.kernels.cpu.microkernels.isa import usable_isas
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.window import conv_transpose_begin_pads
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

# Outputs of at least this many floats are computed on the OpenMP threads
PAR_MIN = 1 << 15

_BODY = r"""
#include <stdint.h>

void wpk_conv_transpose(const float *restrict x, const float *restrict wp,
                        const float *restrict bias, float *restrict y) {
    const int64_t OH = H * KH, OW = W * KW, units = N * COT * H;
    #pragma omp parallel for schedule(static) if (PAR)
    for (int64_t u = 0; u < units; u++) {
        const int64_t n = u / (COT * H), cot = u / H % COT, h = u % H;
        const float *xr = x + (n * CI * H + h) * W;
        const float *wt = wp + cot * CI * CT * KH * KW;
        const float *bt = bias + cot * CT;
        float *yt = y + ((n * CO + cot * CT) * OH + h * KH) * OW;
        for (int64_t v = 0; v < (W + VW - 1) / VW && W >= VW; v++) {
            /* the last vector ends at the row's end, recomputing pixels of the one before */
            const int64_t w0 = v * VW + VW <= W ? v * VW : W - VW;
TILE
        }
        for (int64_t w0 = 0; w0 < W && W < VW; w0++)
            for (int t = 0; t < CT && cot * CT + t < CO; t++)
                for (int i = 0; i < KH; i++)
                    for (int j = 0; j < KW; j++) {
                        float s = bt[t];
                        for (int64_t ci = 0; ci < CI; ci++)
                            s += xr[ci * H * W + w0] * wt[(ci * CT + t) * KH * KW + i * KW + j];
                        yt[(t * OH + i) * OW + w0 * KW + j] = s;
                    }
    }
}
"""


def _tile(ct: int, kh: int, kw: int, lanes: int) -> str:
    """C of one vector of a row's pixels: CT x KH x KW named accumulators, the reduction
    over the input channels, the stores (interleaved by shuffles for a 2-wide kernel)."""
    taps = [(t, i, j) for t in range(ct) for i in range(kh) for j in range(kw)]
    lines = [f"            vf a{t}_{i}_{j} = vsplat(bt[{t}]);" for t, i, j in taps]
    lines += ["            for (int64_t ci = 0; ci < CI; ci++) {",
              "                const vf xv = vload(xr + ci * H * W + w0);",
              "                const float *wc = wt + ci * CT * KH * KW;"]
    lines += [f"                a{t}_{i}_{j} += xv * wc[{(t * kh + i) * kw + j}];"
              for t, i, j in taps]
    lines.append("            }")
    if kw == 2:
        lo = ", ".join(str((lane % 2) * lanes + lane // 2) for lane in range(lanes))
        hi = ", ".join(str((lane % 2) * lanes + lanes // 2 + lane // 2) for lane in range(lanes))
        lines += [f"            const vi lo = {{{lo}}}, hi = {{{hi}}};"]
    for t in range(ct):
        lines.append(f"            if (cot * CT + {t} < CO) {{")
        for i in range(kh):
            row = f"yt + ({t} * OH + {i}) * OW + w0 * KW"
            pair = f"a{t}_{i}_0, a{t}_{i}_1"
            if kw == 2:
                lines += [f"                vstore({row}, __builtin_shuffle({pair}, lo));",
                          f"                vstore({row} + VW, __builtin_shuffle({pair}, hi));"]
            else:
                lines += ["                for (int w = 0; w < VW; w++) {"]
                lines += [f"                    ({row})[w * KW + {j}] = a{t}_{i}_{j}[w];"
                          for j in range(kw)]
                lines.append("                }")
        lines.append("            }")
    return "\n".join(lines)


def conv_transpose_reason(workload: Workload) -> str | None:
    """None when `convtranspose.c` computes the workload, else why not."""
    if workload.op != "ConvTranspose" or workload.domain not in ("", "ai.onnx"):
        return "convtranspose.c computes ONNX ConvTranspose only"
    inputs = workload.inputs
    if len(inputs) < 2 or any(s is None for s in inputs[:2]) or len(inputs[0].shape) != 4:
        return "a 2-d ConvTranspose of X and W"
    if any(s is not None and s.dtype != "float32" for s in (*inputs, *workload.outputs)):
        return "float32 only"
    if workload.epilogue or len(workload.outputs) != 1:
        return "no fused epilogue"
    if 1 not in workload.const_inputs or (len(inputs) > 2 and inputs[2] is not None
                                          and 2 not in workload.const_inputs):
        return "W and B must be constants (packed once)"
    kernel = tuple(inputs[1].shape[2:])
    if int(workload.attr("group", 1)) != 1:
        return "group 1 only"
    if tuple(workload.attr("dilations") or (1, 1)) != (1, 1):
        return "dilation 1 only"
    if tuple(workload.attr("strides") or (1, 1)) != kernel:
        return "the kernel must equal the stride (each input pixel its own output block)"
    n, ci, h, w = inputs[0].shape
    if conv_transpose_begin_pads(workload) != (0, 0) or \
            tuple(workload.outputs[0].shape) != (n, inputs[1].shape[1], h * kernel[0],
                                                 w * kernel[1]):
        return "no padding: the output is the input's size times the stride"
    return None


def channel_tile(co: int, kh: int, kw: int, registers: int) -> int:
    """Output channels per unit: as many kh x kw accumulator sets as leave two registers
    (the input vector and a broadcast weight) of the ISA's, at least one."""
    return max(1, min(co, (registers - 2) // (kh * kw)))


def pack_weights(w: np.ndarray, ct: int) -> np.ndarray:
    """W [CI, CO, KH, KW] as [CO tiles, CI, CT, KH, KW] (zero past CO): a unit's weights in
    the order it reads them."""
    ci, co, kh, kw = w.shape
    tiles = -(-co // ct)
    padded = np.zeros((ci, tiles * ct, kh, kw), np.float32)
    padded[:, :co] = w
    return np.ascontiguousarray(padded.reshape(ci, tiles, ct, kh, kw).transpose(1, 0, 2, 3, 4))


class ConvTransposeC(Implementation):
    """The upsampling ConvTranspose in C (see the module docstring)."""

    name = "convtranspose.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return conv_transpose_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "GEMM per input row, output interleaved"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = conv_transpose_reason(workload)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        n, ci, h, w = workload.inputs[0].shape
        _, co, kh, kw = workload.inputs[1].shape
        isa = usable_isas()[0]
        ct = channel_tile(co, kh, kw, isa.registers)
        tiles = -(-co // ct)
        packed = pack_weights(np.asarray(consts[1], np.float32), ct)
        bias = np.zeros(tiles * ct, np.float32)
        if 2 in consts and consts[2] is not None:
            bias[:co] = np.asarray(consts[2], np.float32).reshape(-1)
        defines = dict(N=n, CI=ci, H=h, W=w, CO=co, KH=kh, KW=kw, CT=ct, COT=tiles,
                       VW=isa.lanes, PAR=int(n * co * h * kh * w * kw >= PAR_MIN))
        source = (VECTOR_HEADER.format(lanes=isa.lanes)
                  + "".join(f"#define {k} {v}\n" for k, v in defines.items())
                  + _BODY.replace("TILE", _tile(ct, kh, kw, isa.lanes)))
        build.openmp_defaults()
        fn = load_function(compile_c_shared(source), "wpk_conv_transpose",
                           [ctypes.c_void_p] * 4)
        out_shape = workload.outputs[0].shape

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            if not plain(outputs[0], out_shape):
                raise ValueError("convtranspose.c writes C-contiguous float32 outputs")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            fn(x.ctypes.data, packed.ctypes.data, bias.ctypes.data, outputs[0].ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when X and Y are passed as they are."""
            if not (plain(inputs[0]) and plain(outputs[0], out_shape)):
                return None
            return function_address(fn), (inputs[0].ctypes.data, packed.ctypes.data,
                                          bias.ctypes.data, outputs[0].ctypes.data)

        kernel.native = native
        kernel.keep = (packed, bias)
        return kernel


CONV_TRANSPOSE_C = register(ConvTransposeC())
