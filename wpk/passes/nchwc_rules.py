"""Which nodes the NCHWc layout pass may rewrite (see `wpk.passes.nchwc_layout`).

Pure predicates over the graph: whether a Conv can run on MLAS's NCHWc
kernels and how it reads its input, whether an elementwise step keeps the
zero padding lanes at zero, and explicit pads for auto_pad.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.epilogue import FAKE_QUANT
from wpk.core.graph import Graph, Node
from wpk.core.workload import EpilogueStep, as_text
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.nchwc_format import CONV_ACTIVATIONS
from wpk.passes.base import readers_of

# Unary steps with f(0) == 0 (clip is checked on its bounds).
_ZERO_UNARY = frozenset({"relu", "leaky_relu", "tanh", "neg", "abs", "silu", "gelu",
                         "gelu_tanh", "hard_swish", "quick_gelu", "mish", "erf", "sqrt"})
_ZERO_BINARY_DATA = frozenset({"add", "sub", "mul", "max", "min"})


def explicit_pads(node: Node, in_hw: Sequence[int], out_hw: Sequence[int],
                  kernel: Sequence[int]) -> tuple[int, int, int, int]:
    """The node's (top, left, bottom, right) pads, with auto_pad resolved from the shapes."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    strides = tuple(node.attr("strides", (1, 1)))
    dilations = tuple(node.attr("dilations", (1, 1)))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i, o, s, k, d in zip(in_hw, out_hw, strides, kernel, dilations):
            total = max((o - 1) * s + (k - 1) * d + 1 - i, 0)
            first = total // 2 if auto_pad == "SAME_UPPER" else (total + 1) // 2
            begin.append(first)
            end.append(total - first)
        return (begin[0], begin[1], end[0], end[1])
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    pads = tuple(int(p) for p in node.attr("pads", (0, 0, 0, 0)))
    return pads if len(pads) == 4 else (0, 0, 0, 0)


def is_float4d(graph: Graph, name: str) -> bool:
    """Whether `name` is a 4-d float32 tensor."""
    info = graph.tensors.get(name)
    return info is not None and info.dtype == "float32" and len(info.shape) == 4


def _activation_keeps_zero(step: EpilogueStep) -> bool:
    if step.op == "clip":
        lo, hi = step.attr("min"), step.attr("max")
        return (lo is None or lo <= 0) and (hi is None or hi >= 0)
    if step.op == FAKE_QUANT:   # 0 quantizes to the zero point, which dequantizes to 0
        return step.attr("low") <= step.attr("zero_point") <= step.attr("high")
    return step.op in _ZERO_UNARY


def conv_epilogue_prefix(graph: Graph, node: Node, out_channels: int, block: int) -> int:
    """How many leading epilogue steps the blocked Conv carries: [add(same-shape tensor)]
    then one activation of `CONV_ACTIVATIONS` (one that maps 0 elsewhere makes the output's
    padding lanes dirty: `fused_dirty`)."""
    steps = list(node.epilogue)
    taken = 0
    if steps and steps[0].op == "add" and steps[0].operand is not None \
            and steps[0].operand < len(node.inputs):
        name = node.inputs[steps[0].operand]
        if name not in graph.constants and is_float4d(graph, name) \
                and graph.tensors[name].shape == graph.tensors[node.outputs[0]].shape:
            taken = 1
    if taken < len(steps) and steps[taken].op in CONV_ACTIVATIONS:
        taken += 1
    return taken


def fused_dirty(steps: Sequence[EpilogueStep], residual_dirty: bool = False) -> bool:
    """Whether MLAS's fused epilogue `steps` ([add(R)] [act]) can leave non-zero values in
    padding lanes: act(0 + R's padding) with R dirty, or an activation with act(0) != 0."""
    dirty = residual_dirty and bool(steps) and steps[0].op == "add"
    for step in steps:
        if step.op != "add" and not _activation_keeps_zero(step):
            dirty = True
    return dirty


def conv_bias(graph: Graph, node: Node) -> str | None:
    """The Conv's constant bias name, '' when it has none, None when it has a non-constant one.

    Input 2 may also be an epilogue operand (operands follow the op's own inputs).
    """
    if len(node.inputs) < 3 or not node.inputs[2]:
        return ""
    if any(s.operand == 2 for s in node.epilogue):
        return ""
    bias = graph.constants.get(node.inputs[2])
    weight = graph.constants[node.inputs[1]]
    return node.inputs[2] if bias is not None and bias.shape == (weight.shape[0],) else None


def _little_padding(channels: int, block: int) -> bool:
    """Whether `channels` is even and padding it to whole blocks adds at most a quarter
    more lanes."""
    return channels % 2 == 0 and fmt.round_up(channels, block) * 4 <= channels * 5


def _half_real(channels: int, block: int) -> bool:
    """Whether at least 8 channels fill at least half the lanes of their whole blocks
    (NASNet's 11 and 22 channels in 16-lane blocks)."""
    return channels >= 8 and fmt.round_up(channels, block) <= 2 * channels


# What a tensor passes through, unchanged in layout, on its way to the next conv
_LAYOUT_NEUTRAL = frozenset({"Add", "Sum", "Mul", "Sub", "Div", "Relu", "Clip", "Sigmoid",
                             "LeakyRelu", "HardSigmoid", "HardSwish", "Elementwise",
                             "BatchNormalization", "Concat", "AveragePool", "MaxPool",
                             "Pad", "Slice"})
_READER_HOPS = 4


def _feeds_conv(graph: Graph, name: str) -> bool:
    """Whether a conv reads `name` within `_READER_HOPS` nodes of layout-neutral steps
    (activations, a batch norm, pools, a concat): a tensor inside the network, not a
    head's output (a segmentation head's 21 classes, resized to the image and returned,
    ran slower padded to 32 lanes, `docs/BENCHMARKS.md`)."""
    readers_by_name = readers_of(graph)
    frontier = {name}
    for _ in range(_READER_HOPS):
        readers = [n for t in frontier for n in readers_by_name.get(t, ())]
        if any(n.op == "Conv" for n in readers):
            return True
        frontier = {o for n in readers if n.op in _LAYOUT_NEUTRAL for o in n.outputs if o}
        if not frontier:
            return False
    return False


def _pooled(graph: Graph, name: str) -> bool:
    """Whether a 4-d tensor is 1x1 spatially (pooled features, as in squeeze-excitation):
    padding its channels to whole blocks costs nothing there, and a conv producing it
    stays blocked with the rest of the block (as onnxruntime's NchwcTransformer does)."""
    shape = graph.tensors[name].shape
    return len(shape) == 4 and shape[2] == 1 and shape[3] == 1


def pixel_shuffle_form(graph: Graph, node: Node) -> str:
    """The mode ('DCR' or 'CRD') of a DepthToSpace node the blocked layout computes (a
    4-d float32 input whose channels the blocksize squared divides), '' for any other."""
    if node.op != "DepthToSpace" or node.domain not in ("", "ai.onnx") \
            or len(node.inputs) != 1 or len(node.outputs) != 1 or node.epilogue:
        return ""
    mode = as_text(node.attr("mode", "DCR"))
    size = node.attr("blocksize")
    if mode not in ("DCR", "CRD") or not isinstance(size, int) or size < 1 \
            or not is_float4d(graph, node.inputs[0]) or not is_float4d(graph, node.outputs[0]):
        return ""
    return mode if graph.tensors[node.inputs[0]].shape[1] % (size * size) == 0 else ""


def _read_only_by_pixel_shuffles(graph: Graph, name: str) -> bool:
    """Whether every reader of a tensor is a DepthToSpace the blocked layout computes (and
    it is no graph output)."""
    readers = [n for n in graph.nodes if name in n.inputs]
    return bool(readers) and name not in graph.outputs \
        and all(pixel_shuffle_form(graph, n) for n in readers)


def conv_input_mode(graph: Graph, node: Node, block: int, blocked: set[str]) -> str:
    """'blocked' or 'nchw' (how an NCHWc Conv reads its input), '' if it must stay NCHW."""
    if node.op != "Conv" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return ""
    if len(node.inputs) < 2 or node.inputs[1] not in graph.constants:
        return ""
    x, weight = node.inputs[0], graph.constants[node.inputs[1]]
    if weight.ndim != 4 or weight.dtype != np.float32 or not is_float4d(graph, x) \
            or not is_float4d(graph, node.outputs[0]):
        return ""
    if conv_bias(graph, node) is None:
        return ""
    out_channels, per_group = int(weight.shape[0]), int(weight.shape[1])
    in_channels = graph.tensors[x].shape[1]
    group = int(node.attr("group", 1))
    if group < 1 or per_group * group != in_channels or out_channels % group:
        return ""   # not a valid conv: the standard op's checks name the problem
    # output channels a multiple of 4, padded to whole blocks (a YOLO box head's 4 too:
    # it stays in the layout rather than reordering its input), or even and padded by at
    # most a quarter (ShuffleNet's 58 and 116: their blocks stay blocked; odd counts are
    # a network's image outputs, 3 or 27 for a pixel shuffle, left as before), or at
    # least half the lanes real where a conv reads the result (NASNet's 11 and 22:
    # onnxruntime's NCHW depthwise convs of them ran 6-15x slower than blocked ones);
    # any count when only pixel shuffles read the output (they read its real lanes)
    if out_channels % 4 and not _little_padding(out_channels, block) \
            and not (_half_real(out_channels, block) and _feeds_conv(graph, node.outputs[0])) \
            and not _pooled(graph, node.outputs[0]) \
            and not _read_only_by_pixel_shuffles(graph, node.outputs[0]):
        return ""
    if group > 1:
        if per_group == 1 and out_channels == group == in_channels:
            return "blocked"  # depthwise
        return "blocked" if block_groups(in_channels, out_channels, group, block) \
            or sparse_groups_fit(in_channels, out_channels, group, block) else ""
    if x in blocked:
        return "blocked"  # already blocked: the packed filter is zero in its padding lanes
    if in_channels < block:
        return "nchw"     # a network's first layer reads its NCHW input directly
    return "blocked" if in_channels % 4 == 0 else ""


def block_groups(in_channels: int, out_channels: int, group: int, block: int) -> int:
    """The group count a grouped conv takes in the blocked layout, 0 when none: its own
    when each group's input and output channels are whole blocks; else, when several
    groups make one block (ResNeXt's 4 or 8 channels per group), one group per input
    block (`widen_groups`), provided each holds whole blocks of outputs. A partial last
    block counts when it holds whole groups and the groups that would fill it (of zero
    weights: `pad_groups`) fill the output's padding lanes exactly (RegNet's 104 and 440
    channels in groups of 8, with 16-lane blocks)."""
    per_group = in_channels // group
    if per_group % block == 0 and (out_channels // group) % block == 0:
        return group
    if per_group < 2 or block % per_group:
        return 0
    fake = _zero_groups(in_channels, per_group, block)
    padded_out = out_channels + fake * (out_channels // group)
    if fake and padded_out != fmt.round_up(out_channels, block):
        return 0
    merged = fmt.round_up(in_channels, block) // block
    return merged if padded_out % merged == 0 and (padded_out // merged) % block == 0 \
        else 0


# Groups that are not whole blocks (ShuffleNet's 34, 68 or 136 channels a group) go dense
# (`widen_groups` to one group, `nchwc_format.SPARSE_GROUPS`) when the bands of input
# blocks a kernel then reduces each output block over hold at most this many times the
# groups' own multiply-adds. In ShuffleNet's plan onnxruntime's NCHW kernel ran its
# grouped 1x1 convs at 52-66 GFLOP/s with a reorder on each side; the banded micro-kernel
# runs them at 35-136 GFLOP/s of the groups' own multiply-adds (two AVX-512 cores; alone
# 0.52-1.46x onnxruntime's grouped conv without its reorders), no reorder around them:
# the untuned plan went from 1.5x onnxruntime's latency to a tie (docs/BENCHMARKS.md).
# 4 lets in ShuffleNet's first one (24 -> 112 channels, 3.8x).
MAX_SPARSE_WORK = 4.0


def sparse_groups_fit(in_channels: int, out_channels: int, group: int, block: int) -> bool:
    """Whether a grouped conv whose groups are not whole blocks (`block_groups` 0) runs
    blocked as one dense group with its filter zero outside the groups (`SPARSE_GROUPS`):
    the bands of input blocks its output blocks read cost at most `MAX_SPARSE_WORK` times
    the grouped conv's multiply-adds."""
    return 1 < group < in_channels and in_channels % group == 0 and out_channels % group == 0 \
        and fmt.sparse_group_work(in_channels, out_channels, group, block) <= MAX_SPARSE_WORK


def _zero_groups(in_channels: int, per_group: int, block: int) -> int:
    """How many groups of `per_group` channels fill the last block of `in_channels`."""
    return (fmt.round_up(in_channels, block) - in_channels) // per_group


def pad_groups(weight: np.ndarray, bias: np.ndarray | None, group: int, block: int
               ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(filter, bias, group) of a grouped conv with groups of zero weights and bias added
    until its input channels fill whole blocks (`block_groups`); their outputs land in the
    output's padding lanes, which stay epilogue(0)."""
    out_channels, per_group = weight.shape[:2]
    fake = _zero_groups(per_group * group, per_group, block)
    if not fake:
        return weight, bias, group
    added = fake * (out_channels // group)
    weight = np.concatenate([weight, np.zeros((added, *weight.shape[1:]), weight.dtype)])
    if bias is not None:
        bias = np.concatenate([bias, np.zeros(added, bias.dtype)])
    return weight, bias, group + fake


def widen_groups(weight: np.ndarray, group: int, merged: int) -> np.ndarray:
    """The filter [O, C/group, KH, KW] of a conv as one of `merged` groups (a divisor of
    `group`): [O, C/merged, KH, KW], each output channel's weights at its own group's
    input channels and zero at the other groups' of its merged group. The same conv, with
    group/merged times the multiply-adds."""
    out_channels, per_group = weight.shape[:2]
    fold = group // merged
    wide = np.zeros((out_channels, per_group * fold, *weight.shape[2:]), weight.dtype)
    out_per_group = out_channels // group
    for o in range(out_channels):
        at = (o // out_per_group) % fold * per_group   # its group within the merged one
        wide[o, at:at + per_group] = weight[o]
    return wide


def constant_pad_value(step: EpilogueStep) -> float | None:
    """The padding-lane value a constant operand of `step` needs so that f(0, pad) == 0."""
    if step.op in ("add", "sub", "mul", "max", "min"):
        return 0.0
    if step.op in ("div", "pow") and not step.swap:
        return 1.0
    return None


def per_channel_vector(value: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant that broadcasts per channel (or as a scalar) as a (C,) vector, else None."""
    if value.dtype != np.float32 or value.ndim > 4:
        return None
    shape = (1,) * (4 - value.ndim) + tuple(value.shape)
    if shape[0] != 1 or shape[2] != 1 or shape[3] != 1 or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(shape[1]), (channels,)).astype(np.float32)


def step_keeps_zero(step: EpilogueStep, operand_is_constant: bool | None) -> bool:
    """Whether a step maps a zero padding lane to zero (operand: None, data or constant).

    Constant operands are re-blocked with `constant_pad_value` in their padding lanes;
    data operands are blocked tensors whose padding lanes are zero.
    """
    if operand_is_constant is None:
        return _activation_keeps_zero(step)
    if operand_is_constant:
        return constant_pad_value(step) is not None
    return step.op in _ZERO_BINARY_DATA
