"""A workload's own invariants from the ONNX spec of its op, checked before any kernel is
tried, so that a model error is reported as one (with what to fix), not as every kernel
failing to compute it.

    problem = op_problem(workload)    # None, or why the node violates its op's spec

The ONNX checker and shape inference let some of these through (a Conv with
`group=0`, or with channel counts that do not divide by its groups, passes both
when the model declares its output shapes).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wpk.core.workload import Workload

_CONV_OPS = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
_WINDOW_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger",
               "QLinearConv")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _positive_ints(workload: Workload) -> str | None:
    for name in ("strides", "dilations", "kernel_shape", "pads"):
        values = workload.attr(name)
        if values is None:
            continue
        if not isinstance(values, (tuple, list)) or not all(_is_int(v) for v in values):
            return f"attribute {name}={values!r} is not a list of integers"
        if name != "pads" and any(v < 1 for v in values):
            return f"attribute {name}={list(values)} has a value below 1"
    return None


def _conv_channels(workload: Workload) -> str | None:
    group = workload.attr("group", 1)
    if not _is_int(group):
        return f"attribute group={group!r} is not an integer"
    if group < 1:
        return f"attribute group={group}; it must be at least 1"
    weight_index = 3 if workload.op == "QLinearConv" else 1
    if len(workload.inputs) <= weight_index or not workload.inputs[0] \
            or not workload.inputs[weight_index]:
        return None
    x, w = workload.inputs[0].shape, workload.inputs[weight_index].shape
    if len(x) < 2 or len(w) < 2:
        return None
    if workload.op == "ConvTranspose":
        if x[1] != w[0]:
            return (f"input X has {x[1]} channels but the weight W (shape {list(w)}) expects "
                    f"{w[0]}")
        return None
    if x[1] % group:
        return f"input X has {x[1]} channels, which group={group} does not divide"
    if w[0] % group:
        return f"the weight W has {w[0]} output channels, which group={group} does not divide"
    if x[1] != w[1] * group:
        return (f"input X has {x[1]} channels but the weight W (shape {list(w)}) with "
                f"group={group} expects {w[1] * group} (W's dim 1 times group)")
    kernel = workload.attr("kernel_shape")
    if kernel is not None and tuple(kernel) != tuple(w[2:]):
        return f"attribute kernel_shape={list(kernel)} but the weight W has shape {list(w)}"
    return _conv_output(workload, x, w)


def _conv_output(workload: Workload, x, w) -> str | None:
    """Conv's output spatial dims from its explicit pads, strides and dilations."""
    if workload.op != "Conv" or workload.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") \
            or not workload.outputs or len(workload.outputs[0].shape) != len(x):
        return None
    rank = len(x) - 2
    pads = tuple(workload.attr("pads") or (0,) * 2 * rank)
    strides = tuple(workload.attr("strides") or (1,) * rank)
    dilations = tuple(workload.attr("dilations") or (1,) * rank)
    if len(pads) != 2 * rank or len(strides) != rank or len(dilations) != rank:
        return (f"pads {list(pads)}, strides {list(strides)} or dilations {list(dilations)} "
                f"do not fit a {rank}-d convolution")
    expected = tuple((x[2 + i] + pads[i] + pads[rank + i] - dilations[i] * (w[2 + i] - 1) - 1)
                     // strides[i] + 1 for i in range(rank))
    if min(expected, default=1) < 1:
        padded = [x[2 + i] + pads[i] + pads[rank + i] for i in range(rank)]
        return (f"its kernel {list(w[2:])} (dilations {list(dilations)}) is larger than its "
                f"padded input {padded}: the output would have spatial dims {list(expected)}")
    declared = tuple(workload.outputs[0].shape[2:])
    if expected != declared:
        return (f"its output is declared with spatial dims {list(declared)}, but its input, "
                f"weight, pads, strides and dilations give {list(expected)}")
    return None


def _pool_output(workload: Workload) -> str | None:
    """A pool's window fits its padded input (explicit pads, floor mode)."""
    kernel = workload.attr("kernel_shape")
    if (not workload.inputs or workload.inputs[0] is None or not kernel
            or workload.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
            or workload.attr("ceil_mode", 0)):
        return None
    x = workload.inputs[0].shape
    rank = len(kernel)
    pads = tuple(workload.attr("pads") or (0,) * 2 * rank)
    dilations = tuple(workload.attr("dilations") or (1,) * rank)
    if len(x) != rank + 2 or len(pads) != 2 * rank or len(dilations) != rank:
        return None
    padded = [x[2 + i] + pads[i] + pads[rank + i] for i in range(rank)]
    if any(dilations[i] * (kernel[i] - 1) + 1 > padded[i] for i in range(rank)):
        return (f"its window {list(kernel)} (dilations {list(dilations)}) is larger than "
                f"its padded input {padded}")
    return None


def _axis_in_range(workload: Workload) -> str | None:
    """`axis` within [-rank, rank - 1] of the first input."""
    axis = workload.attr("axis")
    if axis is None or not workload.inputs or workload.inputs[0] is None:
        return None
    rank = len(workload.inputs[0].shape)
    if not _is_int(axis) or not -max(rank, 1) <= axis <= max(rank - 1, 0):
        return f"attribute axis={axis!r} is outside [-{rank}, {rank - 1}] for its rank-{rank} input"
    return None


def _pixel_shuffle_shape(workload: Workload) -> str | None:
    """DepthToSpace / SpaceToDepth: a positive blocksize r that divides what it must, and
    the output shape r gives (blocked DepthToSpace: its NCHW output of `channels`)."""
    r = workload.attr("blocksize")
    if not _is_int(r) or r < 1:
        return f"attribute blocksize={r!r} is not a positive integer"
    if not workload.inputs or workload.inputs[0] is None or not workload.outputs:
        return None
    x, declared = workload.inputs[0].shape, tuple(workload.outputs[0].shape)
    if workload.domain == _BLOCKED_DOMAIN:
        channels = workload.attr("channels")
        if not _is_int(channels) or len(x) != 5 or x[1] * x[4] < channels * r * r:
            return f"attributes channels={channels!r}, blocksize={r} do not fit its input"
        expected = (x[0], channels, x[2] * r, x[3] * r)
    elif len(x) != 4:
        return f"its input has rank {len(x)}; {workload.op} takes 4-d tensors"
    elif workload.op == "DepthToSpace":
        if x[1] % (r * r):
            return f"input has {x[1]} channels, which blocksize^2 = {r * r} does not divide"
        expected = (x[0], x[1] // (r * r), x[2] * r, x[3] * r)
    else:
        if x[2] % r or x[3] % r:
            return f"input height and width {list(x[2:])} are not multiples of blocksize {r}"
        expected = (x[0], x[1] * r * r, x[2] // r, x[3] // r)
    if declared != expected:
        return (f"its output is declared with shape {list(declared)}, but blocksize {r} "
                f"gives {list(expected)}")
    return None


def _index_shape(workload: Workload) -> str | None:
    """ArgMax / ArgMin: the output is the input with `axis` kept as 1 or dropped."""
    if not workload.inputs or workload.inputs[0] is None or not workload.outputs:
        return None
    x, declared = tuple(workload.inputs[0].shape), tuple(workload.outputs[0].shape)
    axis = workload.attr("axis", 0) % max(len(x), 1)
    keep = workload.attr("keepdims", 1)
    expected = x[:axis] + ((1,) if keep else ()) + x[axis + 1:]
    if declared != expected:
        return (f"its output is declared with shape {list(declared)}, but axis {axis} "
                f"(keepdims={keep}) gives {list(expected)}")
    return None


def _gemm_shapes(workload: Workload) -> str | None:
    """Gemm: 2-d A and B whose inner dims (after transA / transB) agree, and a C that
    broadcasts to the (M, N) result (ONNX's shape inference checks neither)."""
    specs = workload.inputs
    if len(specs) < 2 or specs[0] is None or specs[1] is None:
        return None
    a, b = specs[0].shape, specs[1].shape
    if len(a) != 2 or len(b) != 2:
        return f"A has shape {list(a)} and B {list(b)}; Gemm takes 2-d A and B"
    m, k = (a[1], a[0]) if workload.attr("transA", 0) else (a[0], a[1])
    k2, n = (b[1], b[0]) if workload.attr("transB", 0) else (b[0], b[1])
    if k != k2:
        return (f"A (shape {list(a)}, transA={workload.attr('transA', 0)}) has {k} columns "
                f"but B (shape {list(b)}, transB={workload.attr('transB', 0)}) has {k2} rows")
    if len(specs) > 2 and specs[2] is not None:
        c = tuple(specs[2].shape)
        if len(c) > 2 or any(d not in (1, full) for d, full in zip(c[::-1], (n, m))):
            return f"C has shape {list(c)}, which does not broadcast to the result's [{m}, {n}]"
    return None


_CHECKS: dict[str, tuple[Callable[[Workload], str | None], ...]] = {}
for _op in _WINDOW_OPS:
    _CHECKS[_op] = (_positive_ints,)
for _op in _CONV_OPS:
    _CHECKS[_op] = (*_CHECKS.get(_op, ()), _conv_channels)
for _op in ("MaxPool", "AveragePool", "LpPool"):
    _CHECKS[_op] = (*_CHECKS.get(_op, ()), _pool_output)
for _op in ("Softmax", "LogSoftmax", "Hardmax", "Concat", "Gather", "Split"):
    _CHECKS[_op] = (*_CHECKS.get(_op, ()), _axis_in_range)
for _op in ("DepthToSpace", "SpaceToDepth"):
    _CHECKS[_op] = (_pixel_shuffle_shape,)
for _op in ("ArgMax", "ArgMin"):
    _CHECKS[_op] = (_axis_in_range, _index_shape)
_CHECKS["Gemm"] = (_gemm_shapes,)


# The blocked layout's windowed ops (domain `wpk.kernels.nchwc_logical.NCHWC_DOMAIN`;
# core sits below kernels): a plan's manifest must give them their block, channels and
# window, whole and positive (a compiled kernel would run without reading them).
_BLOCKED_DOMAIN = "wpk.nchwc"


def _blocked_window(workload: Workload) -> str | None:
    counts = {"block": workload.attr("block"), "channels": workload.attr("channels")}
    if workload.op == "Conv":
        counts["group"] = workload.attr("group", 1)
    for name, value in counts.items():
        if not _is_int(value) or value < 1:
            return f"attribute {name}={value!r} is not a positive integer"
    if workload.attr("kernel_shape") is None:
        return "attribute kernel_shape is missing"
    return _positive_ints(workload)


def _gather_lanes(workload: Workload) -> str | None:
    """A blocked ChannelGather: blocked inputs of its output's batch, size and block, and
    `channels` indices, each a lane of the inputs, that fill the output's last block."""
    out = workload.outputs[0].shape
    if len(out) != 5 or not workload.inputs or any(
            spec is None or len(spec.shape) != 5 or spec.shape[:1] + spec.shape[2:]
            != out[:1] + out[2:] for spec in workload.inputs):
        return "its inputs and output must be blocked tensors of one batch, size and block"
    block, indices = out[4], workload.attr("indices")
    if workload.attr("block") != block:
        return f"attribute block={workload.attr('block')!r} is not its tensors' block {block}"
    if not isinstance(indices, (tuple, list)) or not all(_is_int(i) for i in indices):
        return "attribute indices is not a list of integers"
    lanes = sum(spec.shape[1] for spec in workload.inputs) * block
    if any(i < 0 or i >= lanes for i in indices):
        return f"an index of attribute indices is not one of the inputs' {lanes} lanes"
    count = len(indices)
    if workload.attr("channels") != count or not (out[1] - 1) * block < count <= out[1] * block:
        return (f"{count} indices do not give attribute channels={workload.attr('channels')!r} "
                f"in {out[1]} blocks of {block}")
    return None


_BLOCKED_CHECKS = {**{op: (_blocked_window,) for op in ("Conv", "MaxPool", "AveragePool")},
                   "DepthToSpace": (_pixel_shuffle_shape,), "ChannelGather": (_gather_lanes,)}


def op_problem(workload: Workload) -> str | None:
    """Why `workload` violates the ONNX spec of its op (one sentence), or None; for the
    blocked layout's Conv, pools, DepthToSpace and ChannelGather, why their attributes
    cannot be theirs."""
    checks = _BLOCKED_CHECKS if workload.domain == _BLOCKED_DOMAIN else \
        _CHECKS if workload.domain in ("", "ai.onnx") else {}
    for check in checks.get(workload.op, ()):
        problem = check(workload)
        if problem:
            return problem
    return None
