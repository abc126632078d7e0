"""Native C kernels of the blocked data movement and pooling, so they join a chain.

A YOLO-style detector's plan on generated kernels still called onnxruntime 17 times a run
between its generated convolutions: the blocked channel slices of every C2f Split, the
SPPF MaxPools, the FPN's nearest Upsamples and the heads' ReorderOutputs. Each is a few
microseconds alone, but every one hands the cores from the generated kernels' OpenMP
threads to onnxruntime's and back, and in the run they took 2.3-5.6x their lone time
(README, the YOLO profile). Computed here in C, on the calling thread or (the large
reorders and global pools) on the generated kernels' own OpenMP threads, each with a
native form (`native_chain`), they join the chain of the generated kernels around them.

- ChannelSlice: whole blocks copied, in the chain as a `native_moves` table; of one image,
  a view the buffer plan may keep inside its input (`slices_input`), the copy then skipped.
- ChannelGather: lanes picked from several blocked inputs by per-block permutes
  (`channel_gather`).
- Upsample (nearest, whole-number scales: replication): each pixel's vector stored sw
  times along its output row, the row then copied sh - 1 times.
- ReorderOutput (to NCHW or NHWC): to NCHW, tiles of b pixels x b lanes, b pixel
  vectors transposed in registers into b channel rows (the real lanes of a partial last
  block only); to NHWC, a whole block one vector a pixel. ReorderInput (from NCHW or NHWC)
  the mirror, the padding lanes zero. Units of (image, block, 256 pixels) over OpenMP
  threads from 32768 floats on: ConvNeXt's 96x56x56 reorders took 108-183 us on the
  calling thread, lane by lane (onnxruntime's 41-50 us), 18-31 us so (2 cores).
- GlobalAveragePool, GlobalMaxPool: one vector per plane, four accumulators over its
  pixels, the planes over OpenMP threads when large (like the reorders).
- DepthToSpace (blocked in, NCHW out): per input row (image, h), over OpenMP threads when
  large, each output row (c, h*r + i) gathered from the r input channels of its phase i,
  pixel by pixel (the r lanes of a pixel next to each other in CRD mode); the input row of
  every block stays in L1 while its r^2 C output rows are written in order.
- MaxPool: the window's maximum per output pixel, one vector of the block's lanes per
  pixel, padding ignored; any kernel, stride, dilation, pads and ceil_mode. A NaN input
  drops out of its window (the ISA's max instruction keeps the other operand).
  AveragePool the same way: the window's sum over the count of its real pixels (or of
  those within the declared pads, with count_include_pad).

The C is written on GCC vector extensions of b lanes (`VECTOR_HEADER`), so it compiles
for either block size on any host.

The implementation is a library one (`native.nchwc`) with no thread pool but the generated
kernels' (`one_pool`), so a plan on generated kernels may keep its steps
(`wpk.plans.planner.on_generated_kernels`). Like
every candidate it is verified against the float64 reference before the planner may
choose it.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from functools import cache

import numpy as np

from wpk.core.workload import Workload, as_text
from wpk.dsl import build, toolchain
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.channel_gather import gather_kernel
from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER
from wpk.kernels.cpu.microkernels.vector_c import transpose_macro
from wpk.kernels.cpu.native_chain import NativeCall, function_address
from wpk.kernels.cpu.native_moves import native_form
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN
from wpk.kernels.registry import LIBRARY, Implementation, Kernel, register

OPS = ("ChannelSlice", "ChannelGather", "ReorderInput", "ReorderOutput", "Upsample", "MaxPool",
       "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "DepthToSpace")

# params: planes (N * Cb), H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW; one vector a pixel;
# the output rows of every plane over OpenMP threads when the input has at least PAR_MIN
# floats (ResNet's stem pool has only 4 planes of 16 channels: rows balance any thread count)
_MAXPOOL_SOURCE = r"""
#include <stdint.h>

void wpk_maxpool_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t planes = p[0], H = p[1], W = p[2], OH = p[3], OW = p[4];
    const int64_t KH = p[5], KW = p[6], SH = p[7], SW = p[8], PT = p[9], PL = p[10];
    const int64_t DH = p[11], DW = p[12];
    #pragma omp parallel for schedule(static) if (planes * H * W * {lanes} >= PAR_MIN)
    for (int64_t row = 0; row < planes * OH; row++) {{
        const int64_t c = row / OH, oh = row % OH;
        const float *xc = x + c * H * W * {lanes};
        float *yr = y + (c * OH + oh) * OW * {lanes};
        for (int64_t ow = 0; ow < OW; ow++) {{
            vf acc = vsplat(-INFINITY);
            for (int64_t kh = 0; kh < KH; kh++) {{
                const int64_t ih = oh * SH - PT + kh * DH;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kw = 0; kw < KW; kw++) {{
                    const int64_t iw = ow * SW - PL + kw * DW;
                    if (iw >= 0 && iw < W) acc = vmax(vload(xc + (ih * W + iw) * {lanes}), acc);
                }}
            }}
            vstore(yr + ow * {lanes}, acc);
        }}
    }}
}}
"""


# params: those of the MaxPool, then the end pads PB, PR and count_include_pad: each
# output pixel's window summed, one vector a pixel, divided by the count of its real
# pixels, or of those within the declared pads with count_include_pad (never the extra
# end ceil_mode adds); the planes over OpenMP threads when the output is large
_AVGPOOL_SOURCE = r"""
#include <stdint.h>

void wpk_avgpool_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t planes = p[0], H = p[1], W = p[2], OH = p[3], OW = p[4];
    const int64_t KH = p[5], KW = p[6], SH = p[7], SW = p[8], PT = p[9], PL = p[10];
    const int64_t DH = p[11], DW = p[12], PB = p[13], PR = p[14], WITH_PAD = p[15];
    #pragma omp parallel for schedule(static) if (planes * OH * OW * {lanes} >= PAR_MIN)
    for (int64_t c = 0; c < planes; c++) {{
        const float *xc = x + c * H * W * {lanes};
        float *yc = y + c * OH * OW * {lanes};
        for (int64_t oh = 0; oh < OH; oh++) {{
            for (int64_t ow = 0; ow < OW; ow++) {{
                vf acc = vsplat(0.0f);
                int64_t real = 0, declared = 0;
                for (int64_t kh = 0; kh < KH; kh++) {{
                    const int64_t ih = oh * SH - PT + kh * DH;
                    if (ih < -PT || ih >= H + PB) continue;
                    for (int64_t kw = 0; kw < KW; kw++) {{
                        const int64_t iw = ow * SW - PL + kw * DW;
                        if (iw < -PL || iw >= W + PR) continue;
                        declared++;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W) {{
                            acc += vload(xc + (ih * W + iw) * {lanes});
                            real++;
                        }}
                    }}
                }}
                vstore(yc + (oh * OW + ow) * {lanes}, acc / (float)(WITH_PAD ? declared : real));
            }}
        }}
    }}
}}
"""

# params: planes (N * Cb), H, W, SH, SW: each pixel's vector stored SW times along its
# output row, the row then copied SH - 1 times
_UPSAMPLE_SOURCE = r"""
#include <stdint.h>
#include <string.h>

void wpk_upsample_nearest_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t planes = p[0], H = p[1], W = p[2], SH = p[3], SW = p[4], OW = W * SW;
    for (int64_t r = 0; r < planes * H; r++) {{
        const float *xr = x + r * W * {lanes};
        float *row = y + r * SH * OW * {lanes};
        for (int64_t iw = 0; iw < W; iw++) {{
            const vf v = vload(xr + iw * {lanes});
            for (int64_t j = 0; j < SW; j++) vstore(row + (iw * SW + j) * {lanes}, v);
        }}
        for (int64_t k = 1; k < SH; k++)
            memcpy(row + k * OW * {lanes}, row, (size_t)(OW * {lanes}) * sizeof(float));
    }}
}}
"""

# params: planes (N * Cb), HW, average (1) or maximum (0): one vector of the block's lanes
# a plane, four accumulators over its pixels; the planes over OpenMP threads when the input
# has at least PAR_MIN floats. A NaN drops out of a maximum (as in MaxPool)
_GLOBAL_POOL_SOURCE = r"""
#include <stdint.h>

void wpk_global_pool_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t planes = p[0], HW = p[1], AVERAGE = p[2];
    #pragma omp parallel for schedule(static) if (planes * HW * B >= PAR_MIN)
    for (int64_t c = 0; c < planes; c++) {{
        const float *xc = x + c * HW * B;
        const vf start = vsplat(AVERAGE ? 0.0f : -INFINITY);
        vf a0 = start, a1 = start, a2 = start, a3 = start;
        int64_t q = 0;
        if (AVERAGE) {{
            for (; q + 4 <= HW; q += 4) {{
                a0 += vload(xc + q * B); a1 += vload(xc + (q + 1) * B);
                a2 += vload(xc + (q + 2) * B); a3 += vload(xc + (q + 3) * B);
            }}
            for (; q < HW; q++) a0 += vload(xc + q * B);
            vstore(y + c * B, ((a0 + a1) + (a2 + a3)) * (1.0f / (float)HW));
        }} else {{
            for (; q + 4 <= HW; q += 4) {{
                a0 = vmax(vload(xc + q * B), a0); a1 = vmax(vload(xc + (q + 1) * B), a1);
                a2 = vmax(vload(xc + (q + 2) * B), a2); a3 = vmax(vload(xc + (q + 3) * B), a3);
            }}
            for (; q < HW; q++) a0 = vmax(vload(xc + q * B), a0);
            vstore(y + c * B, vmax(vmax(a0, a1), vmax(a2, a3)));
        }}
    }}
}}
"""

# The reorders' parallel units: (image, channel block, a run of RUN pixels), over OpenMP
# threads when the tensor has at least PAR_MIN floats (a smaller one on the calling thread:
# waking the team costs more than the copy)
RUN = 256
PAR_MIN = 1 << 15

# params: N, Cb, HW, channels, batch stride of y, channel stride of y, pixel stride of y
# (NCHW: C*HW, HW, 1; NHWC: HW*C, 1, C). NCHW: tiles of B pixels x B lanes, B pixel
# vectors transposed in registers into B channel rows; NHWC with a whole block: one vector
# a pixel; the rest (a run's last pixels, a partial last block in NHWC) lane by lane, the
# real lanes of a partial last block only.
_REORDER_OUTPUT_SOURCE = r"""
#include <stdint.h>

void wpk_reorder_output_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t N = p[0], CB = p[1], HW = p[2], C = p[3], YN = p[4], YC = p[5], YP = p[6];
    const int64_t runs = (HW + RUN - 1) / RUN, units = N * CB * runs;
    #pragma omp parallel for schedule(static) if (N * CB * HW * B >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {{
        const int64_t nc = u / runs, n = nc / CB, cb = nc % CB;
        const int64_t q0 = (u % runs) * RUN, q1 = q0 + RUN < HW ? q0 + RUN : HW;
        const int64_t lanes = C - cb * B < B ? C - cb * B : B;
        const float *xb = x + nc * HW * B;
        float *yb = y + n * YN + cb * B * YC;
        int64_t q = q0;
        if (YP == 1) {{
            for (; q + B <= q1; q += B) {{
                vf rows[B];
                for (int i = 0; i < B; i++) rows[i] = vload(xb + (q + i) * B);
                TRANSPOSE_BLOCK(rows);
                for (int64_t l = 0; l < lanes; l++) vstore(yb + l * YC + q, rows[l]);
            }}
        }} else if (YC == 1 && lanes == B) {{
            for (; q < q1; q++) vstore(yb + q * YP, vload(xb + q * B));
        }}
        for (; q < q1; q++)
            for (int64_t l = 0; l < lanes; l++) yb[l * YC + q * YP] = xb[q * B + l];
    }}
}}
"""
# params: N, Cb, HW, channels, batch stride of x, channel stride of x, pixel stride of x
# (NCHW: C*HW, HW, 1; NHWC: HW*C, 1, C): the mirror of the ReorderOutput (B channel rows
# of B pixels transposed into B pixel vectors; an NHWC pixel's whole block one vector);
# the padding lanes of a partial last block zero
_REORDER_INPUT_SOURCE = r"""
#include <stdint.h>

void wpk_reorder_input_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t N = p[0], CB = p[1], HW = p[2], C = p[3], XN = p[4], XC = p[5], XP = p[6];
    const int64_t runs = (HW + RUN - 1) / RUN, units = N * CB * runs;
    #pragma omp parallel for schedule(static) if (N * CB * HW * B >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {{
        const int64_t nc = u / runs, n = nc / CB, cb = nc % CB;
        const int64_t q0 = (u % runs) * RUN, q1 = q0 + RUN < HW ? q0 + RUN : HW;
        const int64_t lanes = C - cb * B < B ? C - cb * B : B;
        const float *xb = x + n * XN + cb * B * XC;
        float *yb = y + nc * HW * B;
        int64_t q = q0;
        if (XP == 1) {{
            for (; q + B <= q1; q += B) {{
                vf rows[B];
                for (int64_t l = 0; l < B; l++)
                    rows[l] = l < lanes ? vload(xb + l * XC + q) : vsplat(0.0f);
                TRANSPOSE_BLOCK(rows);
                for (int i = 0; i < B; i++) vstore(yb + (q + i) * B, rows[i]);
            }}
        }} else if (XC == 1 && lanes == B) {{
            for (; q < q1; q++) vstore(yb + q * B, vload(xb + q * XP));
        }}
        for (; q < q1; q++)
            for (int64_t l = 0; l < B; l++) yb[q * B + l] = l < lanes ? xb[l * XC + q * XP] : 0.0f;
    }}
}}
"""

# params: N, Cb, H, W, C (output channels), R (blocksize), CRD (1) or DCR (0): output row
# (n, c, h*R + i) takes, at pixel w*R + j, input channel (c*R + i)*R + j (CRD) or
# (i*R + j)*C + c (DCR) at pixel (h, w); units of one input row (n, h), over OpenMP threads
# from PAR_MIN floats on
_DEPTH_TO_SPACE_SOURCE = r"""
#include <stdint.h>

void wpk_depth_to_space_nchwc(const int64_t *p, const float *x, float *y) {{
    const int64_t N = p[0], CB = p[1], H = p[2], W = p[3], C = p[4], R = p[5], CRD = p[6];
    const int64_t OW = W * R;
    #pragma omp parallel for schedule(static) if (N * C * R * R * H * W >= PAR_MIN)
    for (int64_t nh = 0; nh < N * H; nh++) {{
        const int64_t n = nh / H, h = nh % H;
        const float *xr = x + (n * CB * H + h) * W * B;   /* (n, block 0, h, pixel 0) */
        for (int64_t c = 0; c < C; c++) {{
            for (int64_t i = 0; i < R; i++) {{
                float *row = y + ((n * C + c) * H * R + h * R + i) * OW;
                for (int64_t j = 0; j < R; j++) {{
                    const int64_t k = CRD ? (c * R + i) * R + j : (i * R + j) * C + c;
                    const float *src = xr + (k / B) * H * W * B + k % B;
                    for (int64_t w = 0; w < W; w++) row[w * R + j] = src[w * B];
                }}
            }}
        }}
    }}
}}
"""


@cache
def compiled(function: str, block: int):
    """The C function `function` of this module (a key of `FUNCTIONS`) for blocks of
    `block` lanes: `function(params, x, y)`."""
    source = (VECTOR_HEADER.format(lanes=block)
              + f"#define B {block}\n#define VW B\n#define RUN {RUN}\n#define PAR_MIN {PAR_MIN}\n"
              + transpose_macro(block) + FUNCTIONS[function].format(lanes=block))
    build.openmp_defaults()
    library = toolchain.compile_c_shared(source)
    return toolchain.load_function(library, function, [ctypes.c_void_p] * 3)


def maxpool_params(workload: Workload) -> list[int]:
    """`wpk_maxpool_nchwc`'s params of a blocked MaxPool."""
    x, y = workload.inputs[0].shape, workload.outputs[0].shape
    kh, kw = workload.attr("kernel_shape")
    sh, sw = workload.attr("strides") or (1, 1)
    dh, dw = workload.attr("dilations") or (1, 1)
    pt, pl = (workload.attr("pads") or (0, 0, 0, 0))[:2]
    return [x[0] * x[1], x[2], x[3], y[2], y[3], kh, kw, sh, sw, pt, pl, dh, dw]


def global_pool_params(workload: Workload) -> list[int]:
    """`wpk_global_pool_nchwc`'s params of a blocked GlobalAveragePool or GlobalMaxPool."""
    n, cb, h, w, _ = workload.inputs[0].shape
    return [n * cb, h * w, int(workload.op == "GlobalAveragePool")]


def avgpool_params(workload: Workload) -> list[int]:
    """`wpk_avgpool_nchwc`'s params of a blocked AveragePool."""
    pads = workload.attr("pads") or (0, 0, 0, 0)
    return [*maxpool_params(workload), pads[2], pads[3],
            int(workload.attr("count_include_pad", 0))]


def upsample_params(workload: Workload) -> list[int]:
    """`wpk_upsample_nearest_nchwc`'s params of a blocked nearest Upsample."""
    n, cb, h, w, _ = workload.inputs[0].shape
    sh, sw = (int(v) for v in workload.attr("scales"))
    return [n * cb, h, w, sh, sw]


def _reorder_params(blocked: tuple[int, ...], channels: int, channels_last: bool) -> list[int]:
    """The reorders' params: N, Cb, HW, channels, then the batch, channel and pixel
    strides of the NCHW (or NHWC) side."""
    n, cb, h, w, _ = blocked
    pixel, channel = (channels, 1) if channels_last else (1, h * w)
    return [n, cb, h * w, channels, channels * h * w, channel, pixel]


def reorder_output_params(workload: Workload) -> list[int]:
    """`wpk_reorder_output_nchwc`'s params of a ReorderOutput (to NCHW or NHWC)."""
    return _reorder_params(workload.inputs[0].shape, int(workload.attr("channels")),
                           fmt.channels_last(workload))


def reorder_input_params(workload: Workload) -> list[int]:
    """`wpk_reorder_input_nchwc`'s params of a ReorderInput (from NCHW or NHWC)."""
    last = fmt.channels_last(workload)
    return _reorder_params(workload.outputs[0].shape,
                           int(workload.inputs[0].shape[3 if last else 1]), last)


def depth_to_space_params(workload: Workload) -> list[int]:
    """`wpk_depth_to_space_nchwc`'s params of a blocked DepthToSpace."""
    n, cb, h, w, _ = workload.inputs[0].shape
    return [n, cb, h, w, int(workload.attr("channels")), int(workload.attr("blocksize")),
            int(as_text(workload.attr("mode", "DCR")) == "CRD")]


FUNCTIONS = {"wpk_maxpool_nchwc": _MAXPOOL_SOURCE,
             "wpk_avgpool_nchwc": _AVGPOOL_SOURCE,
             "wpk_global_pool_nchwc": _GLOBAL_POOL_SOURCE,
             "wpk_reorder_input_nchwc": _REORDER_INPUT_SOURCE,
             "wpk_upsample_nearest_nchwc": _UPSAMPLE_SOURCE,
             "wpk_reorder_output_nchwc": _REORDER_OUTPUT_SOURCE,
             "wpk_depth_to_space_nchwc": _DEPTH_TO_SPACE_SOURCE}
# op -> (its C function, the function's params of a workload)
FUNCTION_OF = {"MaxPool": ("wpk_maxpool_nchwc", maxpool_params),
               "AveragePool": ("wpk_avgpool_nchwc", avgpool_params),
               "GlobalAveragePool": ("wpk_global_pool_nchwc", global_pool_params),
               "GlobalMaxPool": ("wpk_global_pool_nchwc", global_pool_params),
               "Upsample": ("wpk_upsample_nearest_nchwc", upsample_params),
               "ReorderOutput": ("wpk_reorder_output_nchwc", reorder_output_params),
               "ReorderInput": ("wpk_reorder_input_nchwc", reorder_input_params),
               "DepthToSpace": ("wpk_depth_to_space_nchwc", depth_to_space_params)}


def channel_slice_pairs(workload: Workload) -> Callable:
    """`pairs(inputs, outputs)`: the whole blocks of X from block `start / b` on."""
    first = int(workload.attr("start")) // int(workload.attr("block"))
    count = workload.outputs[0].shape[1]
    return lambda inputs, outputs: [(inputs[0][:, first:first + count], outputs[0])]


def moves_kernel(pairs: Callable) -> Kernel:
    """A kernel copying `pairs(inputs, outputs)`: numpy copies when called, one
    `wpk_moves` call as its native form (`native_moves.native_form`)."""

    def kernel(inputs, outputs) -> None:
        for src, dst in pairs(inputs, outputs):
            np.copyto(dst, src)

    kernel.native = native_form(kernel, pairs)
    return kernel


def function_kernel(workload: Workload) -> Kernel:
    """A kernel calling the op's C function on (params, x, y) with C-contiguous buffers
    (a caller's other arrays go through contiguous copies)."""
    name, params_of = FUNCTION_OF[workload.op]
    function = compiled(name, int(workload.attr("block")))
    params = np.array(params_of(workload), np.int64)
    address, p = function_address(function), params.ctypes.data

    def native(inputs, outputs) -> NativeCall | None:
        if not (inputs[0].flags.c_contiguous and outputs[0].flags.c_contiguous):
            return None
        return address, (p, inputs[0].ctypes.data, outputs[0].ctypes.data)

    def kernel(inputs, outputs) -> None:
        x, y = np.ascontiguousarray(inputs[0]), outputs[0]
        if y.flags.c_contiguous:
            function(p, x.ctypes.data, y.ctypes.data)
            return
        result = np.empty(y.shape, np.float32)
        function(p, x.ctypes.data, result.ctypes.data)
        np.copyto(y, result)

    kernel.keep = (params, function)
    kernel.native = native
    return kernel


class NativeNchwc(Implementation):
    """Blocked ChannelSlice, ChannelGather, ReorderInput, ReorderOutput, nearest Upsample,
    MaxPool, AveragePool, the global pools and DepthToSpace in C (see the module
    docstring)."""

    name = "native.nchwc"
    kind = LIBRARY
    uses_blas = False
    one_pool = True

    def native_chain(self, workload: Workload) -> bool:
        return True

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.domain != NCHWC_DOMAIN or workload.op not in OPS:
            return f"{self.name} implements the blocked {', '.join(OPS)}"
        tensors = workload.inputs if workload.op == "ChannelGather" else workload.inputs[:1]
        if any(s is None or s.dtype != "float32" for s in (*tensors, *workload.outputs)):
            return "float32 only"
        if workload.epilogue:
            return "no fused epilogue"
        if len(workload.outputs) != 1:
            return "one output only"
        if workload.op == "Upsample" and workload.attr("mode") != "nearest":
            return f"{workload.attr('mode')} Upsample is not a copy"
        if workload.op in ("MaxPool", "AveragePool"):
            return _maxpool_reason(workload)
        return None

    def slices_input(self, workload: Workload) -> int | None:
        """The byte offset of a ChannelSlice's output inside its input where the output is one
        contiguous piece of it (one image: whole blocks side by side), else None: the buffer
        plan may then keep the output there, and the copy onto itself is skipped."""
        if workload.op != "ChannelSlice" or workload.inputs[0].shape[0] != 1:
            return None
        x = workload.inputs[0]
        first = int(workload.attr("start")) // int(workload.attr("block"))
        return first * math.prod(x.shape[2:]) * np.dtype(x.dtype).itemsize

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'view (no copy)' for a ChannelSlice a CPU plan may keep inside its input
        (`slices_input`), else the op's name."""
        if self.slices_input(workload) is not None:
            return "view (no copy)"
        return super().algorithm(workload, config)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        if workload.op == "ChannelSlice":
            return moves_kernel(channel_slice_pairs(workload))
        if workload.op == "ChannelGather":
            return gather_kernel(workload)
        return function_kernel(workload)


def _maxpool_reason(workload: Workload) -> str | None:
    if str(workload.attr("auto_pad", "NOTSET")) not in ("NOTSET", ""):
        return "auto_pad must be resolved to explicit pads"
    if len(workload.attr("kernel_shape") or ()) != 2:
        return "2-d pooling only"
    if int(workload.attr("storage_order", 0)):
        return "storage_order 1 is not implemented"
    return None


NATIVE_NCHWC = register(NativeNchwc())
