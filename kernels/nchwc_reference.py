"""Float64 references of the `wpk.nchwc` ops (semantics in `wpk.passes.nchwc_layout`).

ReorderInput and ReorderOutput are exact layout changes, DepthToSpace one too (its
blocked input unblocked, then ONNX's DepthToSpace), and ChannelGather a pick of lanes.
Every other op is unblocked, computed as its logical NCHW op (`wpk.kernels.nchwc_logical`) by
the standard float64 reference `wpk.kernels.reference.reference`, and
re-blocked with the padding lanes the logical op gives them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.workload import TensorSpec, Workload, as_text
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.nchwc_logical import logical_inputs, logical_workload
from wpk.kernels.reference import reference, to_float64


def nchwc_reference(workload: Workload, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Float64 outputs of a `wpk.nchwc` workload."""
    b = int(workload.attr("block"))
    channels_last = fmt.channels_last(workload)
    if workload.op == "ReorderInput":
        x = np.asarray(inputs[0], dtype=np.float64)
        return [fmt.block(x.transpose(0, 3, 1, 2) if channels_last else x, b)]
    if workload.op == "ReorderOutput":
        y = fmt.unblock(np.asarray(inputs[0], dtype=np.float64), int(workload.attr("channels")))
        return [np.ascontiguousarray(y.transpose(0, 2, 3, 1)) if channels_last else y]
    if workload.op == "ChannelGather":
        return [gather_reference(workload, inputs)]
    if workload.op == "DepthToSpace":   # ONNX's own DepthToSpace of the real lanes
        x = unblocked_input(workload, np.asarray(inputs[0], dtype=np.float64))
        return reference(plain_depth_to_space(workload), [x])
    logical = logical_workload(workload)
    values = [to_float64(x) for x in logical_inputs(workload, inputs)]
    outputs = reference(logical, values)
    return [fmt.block(np.asarray(y, dtype=np.float64), b) for y in outputs]


def gather_reference(workload: Workload, inputs: Sequence[np.ndarray],
                     dtype: type = np.float64) -> np.ndarray:
    """A ChannelGather: output channel j is lane `indices[j]` of the inputs' padded lanes
    laid end to end; the output's padding lanes zero."""
    b = int(workload.attr("block"))
    lanes = np.concatenate([fmt.unblock(np.asarray(x, dtype=dtype), x.shape[1] * b)
                            for x in inputs], axis=1)
    picked = lanes[:, np.asarray(workload.attr("indices"), dtype=np.int64)]
    return fmt.block(picked, b)


def plain_depth_to_space(workload: Workload) -> Workload:
    """The default-domain DepthToSpace a blocked one computes, on its unblocked input of
    channels * r^2 channels."""
    r, channels = int(workload.attr("blocksize")), int(workload.attr("channels"))
    n, _, h, w, _ = workload.inputs[0].shape
    return Workload("DepthToSpace", (TensorSpec((n, channels * r * r, h, w), "float32"),),
                    (TensorSpec((n, channels, h * r, w * r), "float32"),),
                    (("blocksize", r), ("mode", as_text(workload.attr("mode", "DCR")))),
                    opset=max(workload.opset, 13))


def unblocked_input(workload: Workload, blocked: np.ndarray) -> np.ndarray:
    """The NCHW input of `plain_depth_to_space(workload)`: the real lanes of `blocked`."""
    r, channels = int(workload.attr("blocksize")), int(workload.attr("channels"))
    return fmt.unblock(blocked, channels * r * r)
