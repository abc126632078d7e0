"""Match and rewrite of the decomposed layer normalization (rules `layer_norm` and
`layer_norm_reciprocal` in `wpk.passes.fusion_rules`).

    mean = ReduceMean(x); d = x - mean; var = ReduceMean(d^2 or d*d)
    y = d / Sqrt(var + eps) [* gamma] [+ beta]     ->  LayerNormalization(x, gamma, beta)

Keras (tf2onnx) writes it with a reciprocal and the shift folded apart:

    inv = Reciprocal(Sqrt(var + eps)) [* gamma]
    y = x * inv + (beta - mean * inv)              ->  LayerNormalization(x, gamma, beta)

Both reductions must cover the same trailing axes (keepdims=1). Rules
`channel_layer_norm` and `channel_layer_norm_reciprocal` (CPU) take the same patterns
over one axis that is not the last (ConvNeXt's channels-first LayerNorm of NCHW, or a
Keras channels-last one whose Transposes were moved past it, gamma and beta of shape
[C, 1, 1]):

    y = LN(x) over axis 1                  ->  Transpose(0,2,3,1), LayerNormalization
                                               (axis -1), Transpose(0,3,1,2)
 At any opset:
LayerNormalization is a standard op from opset 17 on, and onnxruntime
registers the same op in the default domain for older opsets (paddle2onnx and
tf2onnx write opset 11-13), so its kernel runs the node either way.

Rule `rms_norm` (CPU) takes the RMS normalization LLaMA-, T5- and Gemma-style models
write out (`match_rms_norm`) into wpk's RMSNorm op (`kernels/cpu/rms_norm_spec.py`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wpk.core.graph import Node
from wpk.kernels.cpu.rms_norm_spec import RMS_NORM_DOMAIN, RMS_NORM_OP
from wpk.passes.base import FLOAT_DTYPES, add_constant
from wpk.passes.fusion import FusionContext


def _reduced_axes(ctx: FusionContext, node: Node | None, rank: int,
                  trailing: bool = True) -> tuple[int, ...] | None:
    """The axes a keepdims ReduceMean `node` reduces: trailing ones only, unless not
    `trailing`; None for another node."""
    if node is None or node.op != "ReduceMean" or not node.attr("keepdims", 1):
        return None
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = ctx.const(node.inputs[1])
        if axes is None:
            return None
    else:
        axes = node.attr("axes")
    if axes is None:
        return None
    axes = tuple(sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)))
    return axes if not trailing or axes == tuple(range(axes[0], rank)) else None


def _only_feeds(ctx: FusionContext, node: Node | None, user: Node) -> bool:
    return node is not None and ctx.single_consumer(node) is user


def _scalar(ctx: FusionContext, name: str) -> float | None:
    value = ctx.const(name)
    return None if value is None or value.size != 1 else float(value.reshape(-1)[0])


def _const_operand(ctx: FusionContext, node: Node | None, op: str, value: str):
    if node is None or node.op != op or len(node.inputs) != 2 or node.inputs.count(value) != 1:
        return None
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    return ctx.const(other)


def match_layer_norm(ctx: FusionContext, div: Node):
    """The pattern above `div` over trailing axes: (x, first axis, eps, {"Mul": gamma,
    "Add": beta}, its nodes in order), or None."""
    return _match_division_form(ctx, div, channel=False)


def match_channel_layer_norm(ctx: FusionContext, div: Node):
    """The same pattern over one axis that is not the last (ConvNeXt's channels-first
    LayerNorm of NCHW: mean over axis 1, gamma and beta of shape [C, 1, 1]), or None."""
    return _match_division_form(ctx, div, channel=True)


def _match_division_form(ctx: FusionContext, div: Node, channel: bool):
    """The pattern ending in `div` (d / std), or None."""
    graph = ctx.graph
    if len(div.inputs) != 2:
        return None
    d_name, std_name = div.inputs
    prod = ctx.producers
    sub, std = prod.get(d_name), prod.get(std_name)
    if sub is None or sub.op != "Sub" or std is None or std.op != "Sqrt":
        return None
    x, mean_name = sub.inputs
    if graph.tensors[x].dtype not in FLOAT_DTYPES:
        return None
    rank = len(graph.tensors[x].shape)
    mean = prod.get(mean_name)
    axes = _reduced_axes(ctx, mean, rank, trailing=not channel)
    if axes is None or mean.inputs[0] != x or not _only_feeds(ctx, mean, sub):
        return None
    if channel and (len(axes) != 1 or axes[0] == rank - 1):
        return None
    add_eps = prod.get(std.inputs[0])
    if add_eps is None or add_eps.op != "Add" or not _only_feeds(ctx, std, div):
        return None
    var = next((prod.get(i) for i in add_eps.inputs if i in prod), None)
    eps = _const_operand(ctx, add_eps, "Add", var.outputs[0]) if var is not None else None
    if eps is None or eps.size != 1 or _reduced_axes(ctx, var, rank, not channel) != axes:
        return None
    square = prod.get(var.inputs[0])
    if square is None or not _only_feeds(ctx, square, var) or not _only_feeds(ctx, add_eps, std):
        return None
    if not _only_feeds(ctx, var, add_eps):
        return None
    if square.op == "Pow":
        if square.inputs[0] != d_name or _scalar(ctx, square.inputs[1]) != 2.0:
            return None
    elif square.op != "Mul" or square.inputs != [d_name, d_name]:
        return None
    if _readers(ctx, d_name) != {id(square), id(div)}:
        return None
    shape = graph.tensors[x].shape
    nodes, params = [mean, sub, square, var, add_eps, std, div], {}
    for op in ("Mul", "Add"):
        nxt = ctx.single_consumer(nodes[-1])
        value = _const_operand(ctx, nxt, op, nodes[-1].outputs[0]) if nxt is not None else None
        param = None if value is None else \
            _channel_param(value, shape, axes[0]) if channel else \
            _norm_param(value, shape[axes[0]:])
        if param is None or graph.tensors[nxt.outputs[0]].shape != graph.tensors[x].shape:
            break
        nodes.append(nxt)
        params[op] = param
    return x, axes[0], float(eps.reshape(-1)[0]), params, nodes


def _norm_param(value: np.ndarray, norm_shape: tuple[int, ...]) -> np.ndarray | None:
    """A scale/shift as an array of the normalized shape, if it only varies along it."""
    extra = value.ndim - len(norm_shape)
    if extra > 0:
        if any(d != 1 for d in value.shape[:extra]):
            return None
        value = value.reshape(value.shape[extra:])
    try:
        return np.broadcast_to(value, norm_shape)
    except ValueError:
        return None


def _channel_param(value: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """A scale/shift as an array of shape [shape[axis]], if it only varies along `axis` of
    a tensor of `shape` (and broadcasts to it)."""
    if value.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(full) if k != axis) or full[axis] not in (1, shape[axis]):
        return None
    return np.broadcast_to(value.reshape(-1), (shape[axis],))


def rewrite_channel_layer_norm(ctx: FusionContext, div: Node, found) -> None:
    """Transpose `axis` last, LayerNormalization over it, transpose back, on the pattern's
    own nodes: the mean becomes the first Transpose, the Sub the LayerNormalization, the
    square the Transpose back (taking the last node's outputs); the rest goes. On the CPU
    the Transposes next to blocked convolutions become NHWC reorders (`nchwc_layout`), and
    the normalization one `layernorm.c` call over rows of contiguous channels."""
    x, axis, eps, params, nodes = found
    mean, sub, square = nodes[:3]
    graph = ctx.graph
    info = graph.tensors[x]
    rank = len(info.shape)
    perm = [k for k in range(rank) if k != axis] + [axis]
    back = [perm.index(k) for k in range(rank)]
    moved = tuple(info.shape[k] for k in perm)
    dtype = np.dtype(info.dtype)
    channels = info.shape[axis]
    scale = np.array(params.get("Mul", np.ones(channels, dtype)), dtype)
    inputs = [mean.outputs[0], add_constant(graph, f"{div.name}_scale", scale)]
    if "Add" in params:
        inputs.append(add_constant(graph, f"{div.name}_bias", np.array(params["Add"], dtype)))
    mean.op, mean.domain, mean.inputs, mean.attrs = "Transpose", "", [x], {"perm": perm}
    sub.op, sub.domain, sub.inputs = "LayerNormalization", "", inputs
    sub.attrs = {"axis": rank - 1, "epsilon": eps}
    for node in (mean, sub):
        graph.tensors[node.outputs[0]] = dataclasses.replace(info, shape=moved)
        node.epilogue = ()
        ctx.reindex(node)
    square.op, square.domain, square.inputs = "Transpose", "", [sub.outputs[0]]
    square.attrs, square.epilogue = {"perm": back}, ()
    ctx.absorb(square, nodes[-1], remove=nodes[3:-1])


def rewrite_layer_norm(ctx: FusionContext, div: Node, found) -> None:
    """Replace the pattern with one LayerNormalization node (constants materialized)."""
    x, axis, eps, params, nodes = found
    info = ctx.graph.tensors[x]
    dtype = np.dtype(info.dtype)
    scale = params.get("Mul", np.ones(info.shape[axis:], dtype))
    inputs = [x, add_constant(ctx.graph, f"{div.name}_scale", np.array(scale, dtype))]
    if "Add" in params:
        inputs.append(add_constant(ctx.graph, f"{div.name}_bias", np.array(params["Add"], dtype)))
    anchor, last = nodes[0], nodes[-1]
    anchor.op, anchor.domain, anchor.inputs = "LayerNormalization", "", inputs
    anchor.attrs = {"axis": int(axis), "epsilon": eps}
    anchor.epilogue = ()
    ctx.absorb(anchor, last, remove=nodes[1:-1])


def _variance_of(ctx: FusionContext, d_name: str, var: Node | None, rank: int,
                 axes: tuple[int, ...]) -> Node | None:
    """The square node when `var` is ReduceMean(d*d or d^2) over `axes`, used only there."""
    if _reduced_axes(ctx, var, rank, trailing=False) != axes:
        return None
    square = ctx.producers.get(var.inputs[0])
    if square is None or not _only_feeds(ctx, square, var):
        return None
    if square.op == "Pow" and square.inputs[0] == d_name \
            and _scalar(ctx, square.inputs[1]) == 2.0:
        return square
    return square if square.op == "Mul" and square.inputs == [d_name, d_name] else None


def _mean_plus_eps(ctx: FusionContext, sqrt: Node):
    """(the Add, the node it adds a scalar constant to, eps) under `sqrt`, each read only by
    the next; None otherwise."""
    prod = ctx.producers
    add_eps = prod.get(sqrt.inputs[0])
    if add_eps is None or add_eps.op != "Add" or not _only_feeds(ctx, add_eps, sqrt):
        return None
    var = next((prod.get(i) for i in add_eps.inputs if i in prod), None)
    eps = _const_operand(ctx, add_eps, "Add", var.outputs[0]) if var is not None else None
    if eps is None or eps.size != 1 or not _only_feeds(ctx, var, add_eps):
        return None
    return add_eps, var, eps


def _users(ctx: FusionContext, name: str) -> list[Node] | None:
    """The nodes that read `name`; None when it is pinned (a graph output), so a rule that
    takes its readers over cannot remove it."""
    return None if name in ctx.pinned else list(ctx.users.get(name, []))


def _readers(ctx: FusionContext, name: str) -> set[int] | None:
    """The ids of the nodes that read `name` (None when it is pinned), to compare with the
    pattern's own nodes."""
    users = _users(ctx, name)
    return None if users is None else {id(u) for u in users}


def match_layer_norm_reciprocal(ctx: FusionContext, recip: Node):
    """The Keras pattern around `recip` (Reciprocal(Sqrt(var + eps))) over trailing axes,
    or None."""
    return _match_reciprocal_form(ctx, recip, channel=False)


def match_channel_layer_norm_reciprocal(ctx: FusionContext, recip: Node):
    """The Keras pattern over one axis that is not the last (a channels-last LayerNorm
    whose Transposes `transpose_sinking` moved past it, now over NCHW's channels), or
    None."""
    return _match_reciprocal_form(ctx, recip, channel=True)


def _match_reciprocal_form(ctx: FusionContext, recip: Node, channel: bool):
    """The Keras pattern around `recip`, over trailing axes or (`channel`) one other."""
    graph, prod = ctx.graph, ctx.producers
    std = prod.get(recip.inputs[0])
    if std is None or std.op != "Sqrt" or not _only_feeds(ctx, std, recip):
        return None
    found = _mean_plus_eps(ctx, std)
    if found is None:
        return None
    add_eps, var, eps = found
    square = prod.get(var.inputs[0])
    sub = prod.get(square.inputs[0]) if square is not None else None
    if sub is None or sub.op != "Sub":
        return None
    x, mean_name = sub.inputs
    if graph.tensors[x].dtype not in FLOAT_DTYPES:
        return None
    shape = graph.tensors[x].shape
    rank = len(shape)
    mean = prod.get(mean_name)
    axes = _reduced_axes(ctx, mean, rank, trailing=not channel)
    if axes is None or mean.inputs[0] != x or _variance_of(ctx, sub.outputs[0], var, rank,
                                                          axes) is None:
        return None
    if channel and (len(axes) != 1 or axes[0] == rank - 1):
        return None
    if _readers(ctx, sub.outputs[0]) != {id(square)}:
        return None

    def param(value):
        return _channel_param(value, shape, axes[0]) if channel else \
            _norm_param(value, shape[axes[0]:])

    nodes, inv, gamma = [mean, sub, square, var, add_eps, std, recip], recip, None
    scaled = ctx.single_consumer(recip)
    value = _const_operand(ctx, scaled, "Mul", recip.outputs[0]) if scaled else None
    if value is not None:
        gamma = param(value)
        if gamma is None:
            return None
        nodes.append(scaled)
        inv = scaled
    found = _keras_tail(ctx, x, mean, sub, inv, param)
    if found is None:
        return None
    tail, beta = found
    params = {"Mul": gamma} if gamma is not None else {}
    if beta is not None:
        params["Add"] = beta
    return x, axes[0], float(eps.reshape(-1)[0]), params, nodes + tail


def _keras_tail(ctx: FusionContext, x: str, mean: Node, sub: Node, inv: Node, param):
    """The nodes of x * inv + (beta - mean * inv) after `inv`, and beta (or None); `param`
    gives a constant as the normalization's shift, or None where it is no such one."""
    users = _users(ctx, inv.outputs[0])
    if users is None or len(users) != 2 or any(u.op != "Mul" or len(u.inputs) != 2 for u in users):
        return None
    by_other = {(u.inputs[1] if u.inputs[0] == inv.outputs[0] else u.inputs[0]): u
                for u in users}
    scale_x, scale_mean = by_other.get(x), by_other.get(mean.outputs[0])
    if scale_x is None or scale_mean is None:
        return None
    if _readers(ctx, mean.outputs[0]) != {id(sub), id(scale_mean)}:
        return None
    shift = ctx.single_consumer(scale_mean)
    if shift is None or shift.op not in ("Sub", "Neg"):
        return None
    beta = None
    if shift.op == "Sub":
        if shift.inputs[1] != scale_mean.outputs[0]:
            return None
        beta_value = ctx.const(shift.inputs[0])
        beta = None if beta_value is None else param(beta_value)
        if beta is None:
            return None
    add = ctx.single_consumer(shift)
    if add is None or add.op != "Add" or ctx.single_consumer(scale_x) is not add \
            or sorted(add.inputs) != sorted([scale_x.outputs[0], shift.outputs[0]]):
        return None
    if ctx.graph.tensors[add.outputs[0]].shape != ctx.graph.tensors[x].shape:
        return None
    return [scale_x, scale_mean, shift, add], beta


def match_rms_norm(ctx: FusionContext, sqrt: Node):
    """The written-out RMS normalization around `sqrt` (rule `rms_norm`):

        ms = ReduceMean(x^2 or x*x) over trailing axes; r = Sqrt(ms + eps)
        y = x / r, or x * Reciprocal(r), or x * (1 / r)    [* gamma]

    as (x, first axis, eps, gamma or None, its nodes in order), or None."""
    graph, prod = ctx.graph, ctx.producers
    found = _mean_plus_eps(ctx, sqrt)
    if found is None:
        return None
    add_eps, var, eps = found
    square = prod.get(var.inputs[0])
    x = _squared(ctx, square)
    if x is None or not _only_feeds(ctx, square, var):
        return None
    info = graph.tensors.get(x)
    if info is None or info.dtype not in FLOAT_DTYPES or not info.shape:
        return None
    axes = _reduced_axes(ctx, var, len(info.shape))
    norm = _rms_division(ctx, sqrt, x)
    if axes is None or norm is None or graph.tensors[norm[-1].outputs[0]].shape != info.shape:
        return None
    nodes = [square, var, add_eps, sqrt, *norm]
    scale = ctx.single_consumer(nodes[-1])
    value = _const_operand(ctx, scale, "Mul", nodes[-1].outputs[0]) if scale else None
    gamma = None if value is None else _norm_param(value, info.shape[axes[0]:])
    if gamma is not None and graph.tensors[scale.outputs[0]].shape == info.shape:
        nodes.append(scale)
    else:
        gamma = None
    return x, axes[0], float(eps.reshape(-1)[0]), gamma, nodes


def _squared(ctx: FusionContext, square: Node | None) -> str | None:
    """x when `square` is Pow(x, 2) or Mul(x, x), else None."""
    if square is None or len(square.inputs) != 2:
        return None
    if square.op == "Pow" and _scalar(ctx, square.inputs[1]) == 2.0:
        return square.inputs[0]
    return square.inputs[0] if square.op == "Mul" and square.inputs[0] == square.inputs[1] \
        else None


def _rms_division(ctx: FusionContext, sqrt: Node, x: str) -> list[Node] | None:
    """The nodes dividing x by `sqrt`'s output: [Div(x, r)], or [Reciprocal(r) or
    Div(1, r), Mul(x, .)]; None for anything else."""
    root = sqrt.outputs[0]
    nxt = ctx.single_consumer(sqrt)
    if nxt is None:
        return None
    if nxt.op == "Div" and nxt.inputs == [x, root]:
        return [nxt]
    inverse = nxt.op == "Reciprocal" or (
        nxt.op == "Div" and len(nxt.inputs) == 2 and nxt.inputs[1] == root
        and _scalar(ctx, nxt.inputs[0]) == 1.0)
    mul = ctx.single_consumer(nxt) if inverse else None
    if mul is None or mul.op != "Mul" or sorted(mul.inputs) != sorted([x, nxt.outputs[0]]):
        return None
    return [nxt, mul]


def rewrite_rms_norm(ctx: FusionContext, sqrt: Node, found) -> None:
    """Replace the pattern with one wpk RMSNorm node (Scale materialized: ones without
    gamma)."""
    x, axis, eps, gamma, nodes = found
    info = ctx.graph.tensors[x]
    dtype = np.dtype(info.dtype)
    scale = np.ones(info.shape[axis:], dtype) if gamma is None else np.array(gamma, dtype)
    anchor, last = nodes[0], nodes[-1]
    anchor.op, anchor.domain = RMS_NORM_OP, RMS_NORM_DOMAIN
    anchor.inputs = [x, add_constant(ctx.graph, f"{sqrt.name}_scale", scale)]
    anchor.attrs = {"axis": int(axis), "epsilon": eps}
    anchor.epilogue = ()
    ctx.absorb(anchor, last, remove=nodes[1:-1])
