"""Match and rewrite of group normalization (CPU rules `group_norm`, `onnx_group_norm` and
`epilogue_activation_group_norm` in `wpk.passes.fusion_rules`).

Both torch exporters write GroupNorm as

    g = Reshape(x, [N, G, -1]); n = InstanceNormalization(g, s, b); y = Reshape(n, shape(x))
    y = y * gamma + beta         (gamma, beta constants of one value per channel)

and ONNX's GroupNormalization (opset 21: scale and bias per channel) says the same in
one node. Both become wpk's GroupNorm (`group_norm_spec`):
GroupNorm(x, scale, bias) with attrs `groups` and `epsilon`, the instance norm's per-group
s and b folded in (scale_c = s_g * gamma_c, bias_c = b_g * gamma_c + beta_c), the Mul and
the Add taken when their other operand is a constant per channel. The rules run before
the activation patterns, while Mul and Add are nodes of their own; an activation after the
node (a UNet's SiLU) joins its epilogue later (`epilogue_activation_group_norm`), and the
NCHWc layout keeps the node blocked between the convs.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Node
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_DOMAIN, GROUP_NORM_OP
from wpk.passes.base import add_constant
from wpk.passes.fusion import FusionContext


def _float32(ctx: FusionContext, name: str) -> bool:
    info = ctx.graph.tensors.get(name)
    return info is not None and info.dtype == "float32"


def _per_channel(value: np.ndarray | None, rank: int, channels: int) -> np.ndarray | None:
    """`value` as one float64 per channel when it broadcasts along axis 1 of a rank-`rank`
    tensor only (a scalar too), else None."""
    if value is None or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + tuple(value.shape)
    if any(d != 1 for k, d in enumerate(shape) if k != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,))


def _per_group(value: np.ndarray | None, groups: int) -> np.ndarray | None:
    """An InstanceNormalization's scale or bias as one float64 per group, or None."""
    if value is None or value.size not in (1, groups):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (groups,))


def _affine_after(ctx: FusionContext, node: Node, rank: int, channels: int):
    """The Mul and then the Add by constants per channel that follow `node` (each
    optional, in that order): (gamma, beta, the nodes taken)."""
    gamma, beta = np.ones(channels), np.zeros(channels)
    taken: list[Node] = []
    for op in ("Mul", "Add"):
        last = taken[-1] if taken else node
        nxt = ctx.single_consumer(last)
        if nxt is None or nxt.op != op or nxt.domain not in ("", "ai.onnx") \
                or len(nxt.inputs) != 2 or nxt.inputs.count(last.outputs[0]) != 1:
            continue
        other = nxt.inputs[1] if nxt.inputs[0] == last.outputs[0] else nxt.inputs[0]
        value = _per_channel(ctx.const(other), rank, channels)
        if value is None or ctx.graph.tensors[nxt.outputs[0]].shape \
                != ctx.graph.tensors[node.outputs[0]].shape:
            continue
        if op == "Mul":
            gamma = value
        else:
            beta = value
        taken.append(nxt)
    return gamma, beta, taken


def match_group_norm(ctx: FusionContext, norm: Node):
    """The exporters' pattern around InstanceNormalization `norm`: (x, groups, epsilon,
    scale, bias, the nodes after `norm` in order), or None."""
    graph = ctx.graph
    group = ctx.producers.get(norm.inputs[0]) if norm.inputs else None
    if group is None or group.op != "Reshape" or ctx.single_consumer(group) is not norm \
            or len(norm.inputs) != 3 or norm.epilogue:
        return None
    x = group.inputs[0]
    shape = tuple(graph.tensors[x].shape) if x in graph.tensors else ()
    grouped = tuple(graph.tensors[group.outputs[0]].shape)
    if len(shape) < 3 or len(grouped) != 3 or not _float32(ctx, x) \
            or any(not isinstance(d, int) or d < 1 for d in shape):
        return None
    channels, groups = shape[1], grouped[1]
    if grouped[0] != shape[0] or channels % groups \
            or grouped[2] != int(np.prod(shape[1:])) // groups:
        return None
    s, b = (_per_group(ctx.const(name), groups) for name in norm.inputs[1:3])
    back = ctx.single_consumer(norm)
    if s is None or b is None or back is None or back.op != "Reshape" \
            or tuple(graph.tensors[back.outputs[0]].shape) != shape:
        return None
    gamma, beta, taken = _affine_after(ctx, back, len(shape), channels)
    per_group = channels // groups
    scale = np.repeat(s, per_group) * gamma
    bias = np.repeat(b, per_group) * gamma + beta
    return (x, groups, float(norm.attr("epsilon", 1e-5)), scale, bias,
            [group, back, *taken])


def rewrite_group_norm(ctx: FusionContext, norm: Node, found) -> None:
    """Replace the pattern with one wpk GroupNorm node."""
    x, groups, epsilon, scale, bias, others = found
    _become_group_norm(ctx, norm, x, groups, epsilon, scale, bias)
    ctx.absorb(norm, others[-1], remove=others[:-1])


def _become_group_norm(ctx: FusionContext, node: Node, x: str, groups: int, epsilon: float,
                       scale: np.ndarray | str, bias: np.ndarray | str) -> None:
    """`node` as wpk's GroupNorm of x; scale and bias new constants of the values given, or
    the tensors named."""
    def operand(value, tag: str) -> str:
        return value if isinstance(value, str) else \
            add_constant(ctx.graph, f"{node.name}_{tag}", value.astype(np.float32))

    node.op, node.domain, node.epilogue = GROUP_NORM_OP, GROUP_NORM_DOMAIN, ()
    node.inputs = [x, operand(scale, "scale"), operand(bias, "bias")]
    node.attrs = {"groups": int(groups), "epsilon": float(epsilon)}


def match_onnx_group_norm(ctx: FusionContext, node: Node):
    """ONNX's GroupNormalization of a float32 X (rank >= 3), scale and bias per channel
    (opset 21; onnx's checker refuses the per-group form of opsets 18-20): (x, groups,
    epsilon, scale, bias, the nodes after it), or None. Constant scale and bias take the
    Mul and Add by constants per channel after the node along; graph inputs stay its own."""
    graph = ctx.graph
    if node.domain not in ("", "ai.onnx") or len(node.inputs) != 3 or node.epilogue:
        return None
    x = node.inputs[0]
    shape = tuple(graph.tensors[x].shape) if x in graph.tensors else ()
    if len(shape) < 3 or not _float32(ctx, x) or \
            any(not isinstance(d, int) or d < 1 for d in shape):
        return None
    channels, groups = shape[1], int(node.attr("num_groups", 0))
    if groups < 1 or channels % groups:
        return None
    values = [ctx.const(name) for name in node.inputs[1:3]]
    if any(v is None for v in values):   # graph inputs: the node's own, nothing folded
        infos = [graph.tensors.get(name) for name in node.inputs[1:3]]
        if any(i is None or tuple(i.shape) != (channels,) or i.dtype != "float32"
               for i in infos):
            return None
        return x, groups, float(node.attr("epsilon", 1e-5)), *node.inputs[1:3], []
    if any(v.size != channels for v in values):
        return None
    scale, bias = (v.reshape(-1).astype(np.float64) for v in values)
    gamma, beta, taken = _affine_after(ctx, node, len(shape), channels)
    return (x, groups, float(node.attr("epsilon", 1e-5)), scale * gamma,
            bias * gamma + beta, taken)


def rewrite_onnx_group_norm(ctx: FusionContext, node: Node, found) -> None:
    """GroupNormalization (and the affine after it) as one wpk GroupNorm node."""
    x, groups, epsilon, scale, bias, taken = found
    _become_group_norm(ctx, node, x, groups, epsilon, scale, bias)
    if taken:
        ctx.absorb(node, taken[-1], remove=taken[:-1])
    else:
        ctx.reindex(node)


def is_group_norm_node(node: Node) -> bool:
    """Whether `node` is wpk's GroupNorm."""
    return node.op == GROUP_NORM_OP and node.domain == GROUP_NORM_DOMAIN

