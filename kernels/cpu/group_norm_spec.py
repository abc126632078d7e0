"""wpk's group normalization op: what it computes, its float64 formula and its ONNX form.

    GroupNorm(X, Scale, Bias) (domain 'wpk', attributes groups, epsilon)
      = (X - mean) / sqrt(var + epsilon) * Scale[c] + Bias[c], then the node's epilogue

X is N x C x D1 x ... (rank >= 3); the mean and the (biased) variance of channel c's value
are those of its group -- the C / groups channels from (c // (C / groups)) * C / groups on --
over every spatial position of the image. Scale and Bias have one value per channel. The
epilogue holds unary steps only (an activation: a diffusion UNet's SiLU).

Both torch exporters write GroupNorm as Reshape to [N, groups, -1],
InstanceNormalization of unit scale and zero bias, Reshape back, Mul and Add; ONNX's own
GroupNormalization (opset 18: scale and bias per group; opset 21: per channel) says the
same. The CPU rule `group_norm` (`wpk.passes.norm_rules`) writes the node from either;
`group_norm_onnx_nodes` expands it back into the exporters' nodes (onnxruntime's candidate
and `to_onnx`). The NCHWc layout pass keeps it blocked (domain `wpk.nchwc`, attributes
`block` and `channels` too): X and Y blocked, Scale and Bias logical.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.deferred import helper, numpy_helper
from wpk.core.workload import Workload

GROUP_NORM_OP = "GroupNorm"
GROUP_NORM_DOMAIN = "wpk"
_DOMAINS = (GROUP_NORM_DOMAIN, "wpk.nchwc")


def is_group_norm(workload: Workload) -> bool:
    """Whether the workload is wpk's group normalization (plain or blocked)."""
    return workload.op == GROUP_NORM_OP and workload.domain in _DOMAINS


def group_norm_channels(workload: Workload) -> int:
    """C, the logical channel count (a blocked X holds it padded to whole blocks)."""
    if workload.domain == "wpk.nchwc":
        return int(workload.attr("channels"))
    return int(workload.inputs[0].shape[1])


def group_norm_reason(workload: Workload) -> str | None:
    """None when the workload is a valid GroupNorm wpk computes, else why not."""
    inputs = workload.inputs
    if len(inputs) != 3 or any(s is None for s in inputs) or len(inputs[0].shape) < 3:
        return "GroupNorm takes X (N x C x D1 x ...), Scale and Bias"
    if len(workload.outputs) != 1 or tuple(workload.outputs[0].shape) != tuple(inputs[0].shape):
        return "GroupNorm writes one output of X's shape"
    if any(s.dtype != "float32" for s in (*inputs, *workload.outputs)):
        return "GroupNorm computes float32 only"
    if any(step.operand is not None for step in workload.epilogue):
        return "GroupNorm's epilogue holds unary steps only"
    channels, groups = group_norm_channels(workload), int(workload.attr("groups", 0))
    if groups < 1 or channels % groups:
        return f"groups ({groups}) must divide the {channels} channels"
    if any(tuple(s.shape) != (channels,) for s in inputs[1:]):
        return "Scale and Bias hold one value per channel"
    if workload.domain == "wpk.nchwc":
        block = int(workload.attr("block", 0))
        if len(inputs[0].shape) != 5 or block < 1 or inputs[0].shape[4] != block \
                or inputs[0].shape[1] != -(-channels // block):
            return "a blocked GroupNorm reads N x ceil(C/b) x H x W x b"
    return None


def group_norm_formula(workload: Workload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """[Y] in X's dtype (the epilogue not applied): the statistics in float64, the values
    centred before they are scaled. The float64 reference passes float64 inputs;
    `numpy.group_norm` float32 ones."""
    x, scale, bias = (np.asarray(a) for a in inputs[:3])
    groups, eps = int(workload.attr("groups")), float(workload.attr("epsilon", 1e-5))
    n, c = x.shape[:2]
    grouped = x.reshape(n, groups, -1)
    mean = grouped.mean(axis=2, dtype=np.float64, keepdims=True)
    centred = grouped - mean.astype(x.dtype)
    var = np.mean(np.square(centred, dtype=np.float64), axis=2, keepdims=True)
    y = (centred * (1.0 / np.sqrt(var + eps)).astype(x.dtype)).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    return [y * scale.astype(x.dtype).reshape(per_channel)
            + bias.astype(x.dtype).reshape(per_channel)]


def group_norm_onnx_nodes(inputs: Sequence[str], output: str, prefix: str,
                          shape: Sequence[int], groups: int, epsilon: float,
                          dtype: str = "float32"):
    """The exporters' nodes of the op on an X of `shape`: Reshape to [N, groups, -1],
    InstanceNormalization (unit scale, zero bias), Reshape back, Mul by Scale and Add Bias
    (both reshaped to [C, 1, ...]); Constant nodes for the shapes and the unit
    scale; names and intermediate tensors start with `prefix`."""
    x, scale, bias = inputs[:3]
    n, c, rank = int(shape[0]), int(shape[1]), len(shape)
    np_dtype = np.dtype(dtype)

    def constant(name: str, value: np.ndarray) -> str:
        nodes.append(helper.make_node("Constant", [], [prefix + name], prefix + name + "_constant",
                                      value=numpy_helper.from_array(value, prefix + name)))
        return prefix + name

    nodes: list = []
    grouped_shape = constant("grouped_shape", np.array([n, groups, -1], np.int64))
    shape_back = constant("shape", np.array(list(shape), np.int64))
    channel_shape = constant("channel_shape", np.array([c] + [1] * (rank - 2), np.int64))
    ones = constant("ones", np.ones(groups, np_dtype))
    zeros = constant("zeros", np.zeros(groups, np_dtype))
    nodes += [
        helper.make_node("Reshape", [x, grouped_shape], [prefix + "grouped"], prefix + "group"),
        helper.make_node("InstanceNormalization", [prefix + "grouped", ones, zeros],
                         [prefix + "normed"], prefix + "normalize", epsilon=float(epsilon)),
        helper.make_node("Reshape", [prefix + "normed", shape_back], [prefix + "ungrouped"],
                         prefix + "ungroup"),
        helper.make_node("Reshape", [scale, channel_shape], [prefix + "scale"],
                         prefix + "scale_shape"),
        helper.make_node("Reshape", [bias, channel_shape], [prefix + "bias"],
                         prefix + "bias_shape"),
        helper.make_node("Mul", [prefix + "ungrouped", prefix + "scale"], [prefix + "scaled"],
                         prefix + "scale_mul"),
        helper.make_node("Add", [prefix + "scaled", prefix + "bias"], [output],
                         prefix + "bias_add"),
    ]
    return nodes
