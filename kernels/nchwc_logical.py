"""The plain NCHW workload that a `wpk.nchwc` workload stands for.

Both the float64 reference and the library implementation compute a blocked
op by unblocking its inputs, running the logical (default-domain) op and
blocking the result. To pin down the padding lanes too, the logical op is
widened to the padded channel count: a Conv gets its filter and bias zero
padded to Op = ceil(O/b)*b output channels (so padding outputs are
epilogue(0 + operand padding)), a depthwise Conv and the pools run over all
Cb*b lanes. Padding lanes of a blocked Conv input are ignored (their filter
entries are zero). With zero padding in and an epilogue that keeps 0 at 0,
padding stays zero out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from wpk.core.errors import UnsupportedError
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_DOMAIN, GROUP_NORM_OP
from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS

NCHWC_DOMAIN = "wpk.nchwc"
LAYOUT_ATTRS = ("block", "channels", GROUP_WIDTH, SPARSE_GROUPS)


def is_depthwise(workload: Workload) -> bool:
    """A Conv whose every group has one input and one output channel."""
    w = workload.inputs[1].shape
    group = int(workload.attr("group", 1))
    return group > 1 and w[1] == 1 and w[0] == group


def _nchw(spec: TensorSpec, channels: int) -> TensorSpec:
    n, _, h, w, _ = spec.shape
    return TensorSpec((n, channels, h, w), spec.dtype)


def _padded_channels(spec: TensorSpec) -> int:
    return spec.shape[1] * spec.shape[4]


def logical_workload(workload: Workload) -> Workload:
    """The default-domain NCHW workload (padded channels, see the module doc) of a blocked one."""
    if workload.domain != NCHWC_DOMAIN:
        raise UnsupportedError(f"{workload.label}: not a wpk.nchwc workload")
    op = workload.op
    if op == "Upsample":
        return _logical_upsample(workload)
    if op == "ChannelSlice":
        return _logical_channel_slice(workload)
    if op == GROUP_NORM_OP:
        return _logical_group_norm(workload)
    if op not in ("Conv", "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"):
        raise UnsupportedError(f"{workload.label}: wpk.nchwc {op} has no logical workload",
                               hint="ReorderInput/ReorderOutput are pure layout changes")
    attrs = tuple((k, v) for k, v in workload.attrs if k not in LAYOUT_ATTRS)
    out = workload.outputs[0]
    out_padded = _padded_channels(out)
    inputs = list(workload.inputs)
    if op == "Conv":
        x, w = inputs[0], inputs[1]
        group = int(workload.attr("group", 1))
        if len(x.shape) == 5:
            in_channels = out_padded if is_depthwise(workload) else w.shape[1] * group
            inputs[0] = _nchw(x, in_channels)
        if is_depthwise(workload):
            attrs = tuple((k, out_padded if k == "group" else v) for k, v in attrs)
        inputs[1] = TensorSpec((out_padded, *w.shape[1:]), w.dtype)
        if len(inputs) > 2 and inputs[2] is not None:
            inputs[2] = TensorSpec((out_padded,), inputs[2].dtype)
        for i in range(3, len(inputs)):
            if inputs[i] is not None and len(inputs[i].shape) == 5:
                inputs[i] = _nchw(inputs[i], _padded_channels(inputs[i]))
    else:
        inputs[0] = _nchw(inputs[0], _padded_channels(inputs[0]))
    outputs = (_nchw(out, out_padded), *workload.outputs[1:])
    return replace(workload, domain="", attrs=attrs, inputs=tuple(inputs), outputs=outputs,
                   _key="")


def _logical_upsample(workload: Workload) -> Workload:
    """Resize(x, scales=[1, 1, sh, sw]) over all Cb*b lanes (nearest: replication)."""
    x, out = workload.inputs[0], workload.outputs[0]
    scales = np.array([1, 1, *workload.attr("scales")], dtype=np.float32)
    attrs = (("coordinate_transformation_mode", workload.attr("coordinate_transformation_mode")),
             ("mode", workload.attr("mode")), ("nearest_mode", "floor"))
    return Workload("Resize", (_nchw(x, _padded_channels(x)), None,
                               TensorSpec((4,), "float32")),
                    (_nchw(out, _padded_channels(out)),), attrs, const_inputs=(2,),
                    static_inputs=((2, scales),), opset=max(workload.opset, 13))


def _logical_group_norm(workload: Workload) -> Workload:
    """wpk's plain GroupNorm of the `channels` real channels (the blocked output's padding
    lanes are the zeros `fmt.block` writes, which the layout pass requires of its
    epilogue)."""
    attrs = tuple((k, v) for k, v in workload.attrs if k not in LAYOUT_ATTRS)
    channels = int(workload.attr("channels"))
    x = _nchw(workload.inputs[0], channels)
    return replace(workload, domain=GROUP_NORM_DOMAIN, attrs=attrs,
                   inputs=(x, *workload.inputs[1:]), outputs=(x,), _key="")


def _logical_channel_slice(workload: Workload) -> Workload:
    """Slice(x, starts=[start], ends=[start + padded count], axes=[1]) of the padded lanes."""
    x, out = workload.inputs[0], workload.outputs[0]
    start = int(workload.attr("start"))
    bounds = [np.array([start], np.int64), np.array([start + _padded_channels(out)], np.int64),
              np.array([1], np.int64)]
    index = TensorSpec((1,), "int64")
    return Workload("Slice", (_nchw(x, _padded_channels(x)), index, index, index),
                    (_nchw(out, _padded_channels(out)),), (), const_inputs=(1, 2, 3),
                    static_inputs=tuple(zip((1, 2, 3), bounds)),
                    opset=max(workload.opset, 13))


def logical_inputs(workload: Workload, inputs: Sequence[np.ndarray | None]
                   ) -> list[np.ndarray | None]:
    """The inputs of `logical_workload(workload)`: unblocked, filter and bias zero padded."""
    logical = logical_workload(workload)
    result: list[np.ndarray | None] = []
    for index, (value, spec) in enumerate(zip(inputs, logical.inputs)):
        if value is None or spec is None:
            result.append(None)
        elif value.ndim == 5:
            result.append(fmt.unblock(value, spec.shape[1]))
        elif workload.op == "Conv" and index in (1, 2) and value.shape != spec.shape:
            padded = np.zeros(spec.shape, dtype=value.dtype)
            padded[: value.shape[0]] = value
            result.append(padded)
        else:
            result.append(value)
    for index in range(len(result), len(logical.inputs)):  # the logical op's static inputs
        value = logical.static_value(index)
        result.append(None if value is None else np.asarray(value))
    return result


def logical_consts(workload: Workload, consts: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Constant inputs of the logical workload (filter and bias zero padded)."""
    padded = logical_inputs(workload, [consts.get(i) for i in range(len(workload.inputs))])
    return {i: padded[i] for i in consts}

