"""Generated kernels of blocked (`wpk.nchwc`) convolutions: DSL operators written per workload.

The NCHWc pass turns a model's convolutions into `wpk.nchwc` Convs reading and
writing blocked activations [N, C/b, H, W, b] (`wpk.kernels.nchwc_format`).
Their generated kernels are DSL operators over the blocked layout, with the
filter packed once in `prepare` so the b output channels of a block are
contiguous (and vectorised):

- regular conv on a blocked input:
  Y[n, kb, oh, ow, kk] = sum(c, r, s) X[n, c/b, ih, iw, c%b] * Wp[kb, c, r, s, kk] + Bp[kb, kk]
- regular conv on an NCHW input (the first conv of a network): X[n, c, ih, iw];
- depthwise conv on a blocked input:
  Y[n, kb, oh, ow, kk] = sum(r, s) X[n, kb, ih, iw, kk] * Wp[kb, r, s, kk] + Bp[kb, kk].

Filters and biases are zero padded to whole blocks, so padding output lanes
are epilogue(0 + operand padding), as `wpk.kernels.nchwc_logical` defines.
"""

from __future__ import annotations

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.window import pads_2d
from wpk.kernels.generated_ops import parse_operator
from wpk.kernels.nchwc_logical import is_depthwise, logical_workload

NCHWC_DOMAIN = "wpk.nchwc"

_HEADER = ("stride_h: int, stride_w: int, pad_t: int, pad_l: int, pad_b: int, pad_r: int, "
           "dil_h: int, dil_w: int")
_LETS = """
    let OH = (H + pad_t + pad_b - dil_h * (R - 1) - 1) / stride_h + 1
    let OW = (W + pad_l + pad_r - dil_w * (S - 1) - 1) / stride_w + 1"""
_ROWS = "oh * stride_h - pad_t + r * dil_h"
_COLS = "ow * stride_w - pad_l + s * dil_w"


def pack_filter(w: np.ndarray, blocks: int, block: int) -> np.ndarray:
    """OIHW -> [KB, I, R, S, b], output channels zero padded to `blocks` x `block`."""
    k = w.shape[0]
    padded = np.zeros((blocks * block, *w.shape[1:]), np.float32)
    padded[:k] = w
    return np.ascontiguousarray(padded.reshape(blocks, block, *w.shape[1:]).transpose(
        0, 2, 3, 4, 1))


def pack_depthwise(w: np.ndarray, blocks: int, block: int) -> np.ndarray:
    """[K, 1, R, S] -> [KB, R, S, b], zero padded."""
    return np.ascontiguousarray(pack_filter(w, blocks, block)[:, 0])


def pack_bias(b: np.ndarray, blocks: int, block: int) -> np.ndarray:
    """[K] -> [KB, b], zero padded."""
    padded = np.zeros(blocks * block, np.float32)
    padded[: b.shape[0]] = b
    return padded.reshape(blocks, block)


PACKERS = {"filter": pack_filter, "depthwise": pack_depthwise, "bias": pack_bias}


def conv_source(kind: str, bias: bool) -> str:
    """DSL text of a blocked convolution (`kind`: blocked, nchw or depthwise)."""
    out = "Y: f32[N, KB, OH, OW, BL]"
    plus = " + Bp[kb, kk]" if bias else ""
    bias_param = ", Bp: f32[KB, BL]" if bias else ""
    if kind == "depthwise":
        return (f"op conv_nchwc_depthwise(X: f32[N, KB, H, W, BL], Wp: f32[KB, R, S, BL]"
                f"{bias_param}, {_HEADER}) -> {out} {{{_LETS}\n"
                f"    Y[n, kb, oh, ow, kk] = sum(r in R, s in S) {{\n"
                f"        X[n, kb, {_ROWS}, {_COLS}, kk] ?: 0 * Wp[kb, r, s, kk]\n"
                f"    }}{plus}\n}}\n")
    if kind == "nchw":
        x, load = "X: f32[N, C, H, W]", f"X[n, c, {_ROWS}, {_COLS}]"
    else:
        x, load = "X: f32[N, CB, H, W, BL]", f"X[n, c / BL, {_ROWS}, {_COLS}, c % BL]"
    return (f"op conv_nchwc({x}, Wp: f32[KB, C, R, S, BL]{bias_param}, {_HEADER}) -> {out} "
            f"{{{_LETS}\n"
            f"    Y[n, kb, oh, ow, kk] = sum(c in C, r in R, s in S) {{\n"
            f"        {load} ?: 0 * Wp[kb, c, r, s, kk]\n"
            f"    }}{plus}\n}}\n")


def map_nchwc_conv(w: Workload, core: int):
    """(op, shapes, scalars, feeds, packed) of a blocked Conv, or why it does not map.
    `packed` lists (param, input index, packer name, blocks, block)."""
    x, wt = w.inputs[0], w.inputs[1]
    out = w.outputs[0].shape
    if len(out) != 5 or wt is None or len(wt.shape) != 4:
        return "only 2-D blocked convolutions map"
    if 1 not in w.const_inputs:
        return "a blocked conv's filter must be a constant (it is packed once)"
    has_bias = core > 2 and w.inputs[2] is not None
    if has_bias and 2 not in w.const_inputs:
        return "a blocked conv's bias must be a constant (it is packed once)"
    blocks, block = int(out[1]), int(out[4])
    group = int(w.attr("group", 1))
    depthwise = len(x.shape) == 5 and is_depthwise(w)
    if group != 1 and not depthwise:
        return "grouped blocked convolutions do not map"
    # The pads giving the output size, computed on the logical NCHW geometry.
    found = pads_2d(logical_workload(w), tuple(wt.shape[2:]))
    if found is None:
        return "the padding does not give the output size"
    (pt, pl, pb, pr), geom = found
    kind = "depthwise" if depthwise else ("nchw" if len(x.shape) == 4 else "blocked")
    op = parse_operator(conv_source(kind, has_bias), "<nchwc conv>")
    scalars = dict(stride_h=geom.strides[0], stride_w=geom.strides[1], pad_t=pt, pad_l=pl,
                   pad_b=pb, pad_r=pr, dil_h=geom.dilations[0], dil_w=geom.dilations[1])
    packed_w = ((blocks, *wt.shape[2:], block) if depthwise
                else (blocks, wt.shape[1], *wt.shape[2:], block))
    shapes = {"X": x.shape, "Wp": packed_w}
    packed = [("Wp", 1, "depthwise" if depthwise else "filter", blocks, block)]
    if has_bias:
        shapes["Bp"] = (blocks, block)
        packed.append(("Bp", 2, "bias", blocks, block))
    return op, shapes, scalars, {"X": 0}, tuple(packed)
