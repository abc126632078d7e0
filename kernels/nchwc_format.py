"""The NCHWc blocked activation layout and MLAS's packed filter formats.

A blocked tensor of logical shape (N, C, H, W) is stored with shape
(N, ceil(C/b), H, W, b): element (n, c, h, w) lives at
[n, c // b, h, w, c % b], and the channels from C up to the next multiple of
b are zero. The block size b is the SIMD width of the host in floats (16 with
AVX-512F, 8 with AVX2), the value onnxruntime's MLAS uses
(`MlasNchwcGetBlockSize`, read off onnxruntime by `mlas_block_size`). Its
memory is exactly what MLAS calls NCHWc with the 4-d shape
(N, ceil(C/b)*b, H, W), so a blocked buffer is handed to onnxruntime's
`com.microsoft.nchwc` kernels without a copy.

Filters stay in logical OIHW form in the graph; the kernels pack them here,
exactly as onnxruntime's NchwcTransformer does (MlasReorderFilterOIHWBiBo and
MlasReorderFilterOIHWBo):

- OIHWBiBo (regular and grouped convs on blocked input): O and I are zero
  padded to multiples of b; packed[ob, ib, kh, kw, bi, bo] = W[ob*b+bo, ib*b+bi, kh, kw],
  tensor dims (Op, Ip, KH, KW).
- OIHWBo (depthwise convs, and convs reading an NCHW input with fewer than b
  channels): O is zero padded; packed[ob, i, kh, kw, bo] = W[ob*b+bo, i, kh, kw],
  tensor dims (Op, I, KH, KW).
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from wpk.core.deferred import helper
from wpk.core.devices import cpu_flags
from wpk.core.errors import ShapeError

SUPPORTED_BLOCKS = (4, 8, 16)
# The activations (wpk epilogue step names) a blocked Conv carries after [add]: those MLAS
# fuses into its NCHWc conv, and the exporters' SiLU, HardSwish, (erf) GELU, QuickGELU and
# Mish, which wpk's micro-kernels apply on the registers and onnxruntime's candidate as the
# step's nodes after its conv
MLAS_CONV_ACTIVATIONS = frozenset({"relu", "clip", "leaky_relu", "tanh", "sigmoid",
                                   "hard_sigmoid"})
CONV_ACTIVATIONS = MLAS_CONV_ACTIVATIONS | {"silu", "hard_swish", "gelu", "quick_gelu", "mish",
                                           "fake_quant"}


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value`."""
    return -(-int(value) // int(multiple)) * int(multiple)


@functools.cache
def host_block_size() -> int:
    """The NCHWc block of this host: what MLAS uses, else 16 with avx512f, 8 otherwise."""
    return mlas_block_size() or (16 if "avx512f" in cpu_flags() else 8)


def mlas_block_size() -> int | None:
    """MLAS's block, read off onnxruntime: the padded channel count of a 4-channel ReorderInput."""
    try:
        node = helper.make_node("ReorderInput", ["x"], ["y"], domain="com.microsoft.nchwc")
        graph = helper.make_graph([node], "probe",
                                  [helper.make_tensor_value_info("x", 1, [1, 4, 1, 1])],
                                  [helper.make_tensor_value_info("y", 1, None)])
        model = helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft.nchwc", 1)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        padded = session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0].shape[1]
    except Exception:  # no onnxruntime, or a build without the NCHWc kernels
        return None
    return int(padded) if padded in SUPPORTED_BLOCKS else None


def blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """(N, C, H, W) -> (N, ceil(C/b), H, W, b)."""
    if len(shape) != 4:
        raise ShapeError(f"NCHWc layout needs a 4-d NCHW tensor, got shape {tuple(shape)}",
                         hint="only 2-d convolutions and pools are rewritten to NCHWc")
    n, c, h, w = shape
    return (n, -(-c // block), h, w, block)


def block(x: np.ndarray, block_size: int, out: np.ndarray | None = None) -> np.ndarray:
    """NCHW array -> blocked (N, ceil(C/b), H, W, b) array with zero padding channels."""
    n, c, h, w = x.shape
    if out is None:
        out = np.empty(blocked_shape(x.shape, block_size), dtype=x.dtype)
    view = out.transpose(0, 1, 4, 2, 3)  # (n, cb, b, h, w), a view of `out`
    full, rest = divmod(c, block_size)
    view[:, :full] = x[:, : full * block_size].reshape(n, full, block_size, h, w)
    if rest:
        view[:, full, :rest] = x[:, full * block_size:]
        view[:, full, rest:] = 0
    return out


def channels_last(workload) -> bool:
    """Whether a ReorderInput reads (a ReorderOutput writes) NHWC instead of NCHW."""
    return bool(int(workload.attr("channels_last", 0)))


def unblock(x: np.ndarray, channels: int) -> np.ndarray:
    """Blocked (N, Cb, H, W, b) array -> NCHW array with `channels` channels (a copy)."""
    n, cb, h, w, b = x.shape
    if not 0 < channels <= cb * b:
        raise ShapeError(f"{channels} channels do not fit a blocked tensor of shape {x.shape}")
    full = x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
    return np.ascontiguousarray(full[:, :channels])


def pack_filter_oihwbibo(weight: np.ndarray, block_size: int) -> np.ndarray:
    """OIHW filter -> MLAS OIHWBiBo layout, dims (Op, Ip, KH, KW) (see the module docstring)."""
    o, i, kh, kw = weight.shape
    op, ip = round_up(o, block_size), round_up(i, block_size)
    padded = np.zeros((op, ip, kh, kw), dtype=np.float32)
    padded[:o, :i] = weight
    packed = padded.reshape(op // block_size, block_size, ip // block_size, block_size, kh, kw)
    # (ob, bo, ib, bi, kh, kw) -> (ob, ib, kh, kw, bi, bo)
    packed = packed.transpose(0, 2, 4, 5, 3, 1)
    return np.ascontiguousarray(packed).reshape(op, ip, kh, kw)


def pack_filter_oihwbo(weight: np.ndarray, block_size: int) -> np.ndarray:
    """OIHW filter -> MLAS OIHWBo layout, dims (Op, I, KH, KW) (see the module docstring)."""
    o, i, kh, kw = weight.shape
    op = round_up(o, block_size)
    padded = np.zeros((op, i, kh, kw), dtype=np.float32)
    padded[:o] = weight
    packed = padded.reshape(op // block_size, block_size, i, kh, kw).transpose(0, 2, 3, 4, 1)
    return np.ascontiguousarray(packed).reshape(op, i, kh, kw)


# A blocked Conv's attribute: its groups, widened to one per input block by the layout
# pass (`wpk.passes.nchwc_rules.widen_groups`), are narrower groups of this many channels
# each, in as out; its filter is zero outside them (`narrow_group_lanes`).
GROUP_WIDTH = "group_width"


def narrow_group_lanes(out_channels: int, in_block: int, width: int) -> np.ndarray:
    """[out_channels, in_block] booleans: the input lanes of its widened group that output
    channel o reads, its own narrow group's `width` lanes (o's lane in the block // width)."""
    outputs = np.arange(out_channels)[:, None] % in_block // width
    return outputs == np.arange(in_block)[None, :] // width


# A blocked Conv's attribute: the group count of a grouped conv whose groups are not whole
# blocks (ShuffleNet's 68 channels a group), which the layout pass made one dense group
# (`wpk.passes.nchwc_rules.widen_groups`); its filter [O, C, KH, KW] is zero outside each
# output channel's own group, so a kernel may reduce a tile of output channels over the
# input blocks its groups touch only (`group_band`).
SPARSE_GROUPS = "sparse_groups"


def group_band(first: int, end: int, in_channels: int, out_channels: int, groups: int,
               block: int) -> tuple[int, int]:
    """(first input block, block count) that output channels [first, end) of a conv of
    `groups` groups read: the blocks of `block` channels holding their groups' inputs.
    Channels past `out_channels` (padding lanes, zero filter) count as the last real one."""
    end = min(end, out_channels)
    first = min(first, end - 1)
    out_group, in_group = out_channels // groups, in_channels // groups
    lo = first // out_group * in_group
    hi = ((end - 1) // out_group + 1) * in_group
    return lo // block, -(-hi // block) - lo // block


def sparse_group_work(in_channels: int, out_channels: int, groups: int, block: int) -> float:
    """The multiply-adds a kernel reducing each output block over `group_band`'s input
    blocks does, as a multiple of the grouped conv's own (1: the groups are whole blocks;
    `groups`-fold: every band is the whole input)."""
    padded = round_up(out_channels, block)
    read = sum(group_band(o, o + block, in_channels, out_channels, groups, block)[1]
               for o in range(0, padded, block))
    return read * block * block / (out_channels * in_channels / groups)


def pad_channels(vector: np.ndarray, block_size: int) -> np.ndarray:
    """A per-channel vector zero padded to a multiple of the block (float32)."""
    out = np.zeros(round_up(vector.shape[0], block_size), dtype=np.float32)
    out[: vector.shape[0]] = vector
    return out
