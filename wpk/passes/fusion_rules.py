"""The fusion rule tables: one declarative rule per fusion.

`LINEAR_RULES` fold what is linear into Conv/Gemm weights (BatchNormalization,
per-channel bias and scale, MatMul + bias -> Gemm). `PATTERN_RULES` recognise
what exporters spell with several ops (x*sigmoid(x), both forms of GELU,
x*hard_sigmoid(x), layer normalization). `CHAIN_RULES` merge chains of
elementwise ops into one `Elementwise` node. `EPILOGUE_RULES` fuse what follows a
Conv/Gemm/MatMul (activation, one residual Add, constant-operand steps) into
its epilogue. See `wpk.passes.fusion.FusionRule` for the rule shape.
"""

from __future__ import annotations

import math

import numpy as np

from wpk.core.graph import Node, TensorInfo
from wpk.core.workload import EpilogueStep
from wpk.kernels.nchwc_format import CONV_ACTIVATIONS
from wpk.passes.base import FLOAT_DTYPES, add_constant
from wpk.passes.elementwise import (
    Chain,
    attach,
    chain_of,
    chain_start,
    is_closed,
    make_elementwise,
    operand_names,
)
from wpk.passes.fusion import FusionContext, FusionRule
from wpk.passes.gelu_rules import (
    match_gelu_erf,
    match_gelu_tanh,
    match_quick_gelu,
    rewrite_activation,
)
from wpk.passes.group_norm_rules import (
    is_group_norm_node,
    match_group_norm,
    match_onnx_group_norm,
    rewrite_group_norm,
    rewrite_onnx_group_norm,
)
from wpk.passes.norm_rules import (
    match_channel_layer_norm,
    match_channel_layer_norm_reciprocal,
    match_layer_norm,
    match_layer_norm_reciprocal,
    match_rms_norm,
    rewrite_channel_layer_norm,
    rewrite_layer_norm,
    rewrite_rms_norm,
)
from wpk.passes.to_onnx import ELEMENTWISE_OP, WPK_DOMAIN

LINEAR_OPS = frozenset({"Conv", "Gemm", "MatMul"})


# ---------------------------------------------------------------- helpers

def _plain(node: Node) -> bool:
    return node.domain in ("", "ai.onnx") and not node.epilogue


def _other_input(node: Node, name: str) -> str | None:
    if len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _per_channel(value: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """`value` as a vector along `axis` of `out_shape` if it broadcasts only along it."""
    if value.ndim > len(out_shape):
        return None
    shape = (1,) * (len(out_shape) - value.ndim) + tuple(value.shape)
    if any(d != 1 for k, d in enumerate(shape) if k != axis):
        return None
    if shape[axis] not in (1, out_shape[axis]):
        return None
    return np.broadcast_to(value.reshape(-1), (out_shape[axis],)).astype(np.float64)


def _new_const(ctx: FusionContext, node: Node, tag: str, value: np.ndarray, dtype) -> str:
    return add_constant(ctx.graph, f"{node.name}_{tag}", np.asarray(value.astype(dtype), order="C"))


def _consumer(ctx: FusionContext, node: Node, ops: frozenset[str]) -> Node | None:
    consumer = ctx.single_consumer(node)
    if consumer is None or consumer.op not in ops or consumer.domain not in ("", "ai.onnx"):
        return None
    return consumer


# ---------------------------------------------------------------- BatchNormalization

def _bn_params(ctx: FusionContext, bn: Node, channels: int):
    if bn.attr("training_mode", 0) or bn.attr("spatial", 1) != 1:
        return None
    if any(ctx.users.get(o) or o in ctx.pinned for o in bn.outputs[1:] if o):
        return None
    values = [ctx.const(name) for name in bn.inputs[1:5]]
    if len(values) != 4 or any(v is None or v.shape != (channels,) for v in values):
        return None
    scale, bias, mean, var = (v.astype(np.float64) for v in values)
    factor = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return factor, bias - mean * factor


def _bn_after(ctx: FusionContext, node: Node):
    """(the BatchNormalization reading `node` alone, `node`'s constant weight) when its
    weight and bias are constants, else None."""
    bn = _consumer(ctx, node, frozenset({"BatchNormalization"}))
    weight = ctx.const(node.inputs[1])
    if bn is None or not _plain(node) or weight is None or bn.inputs[0] != node.outputs[0]:
        return None
    if len(node.inputs) > 2 and node.inputs[2] and ctx.const(node.inputs[2]) is None:
        return None
    return bn, weight


def _fold_bn(ctx: FusionContext, node: Node, bn: Node, weight: np.ndarray,
             new_w: np.ndarray, factor: np.ndarray, shift: np.ndarray) -> None:
    """`node` takes the scaled weight `new_w` and its bias times `factor` plus `shift`,
    and the BatchNormalization's output."""
    bias = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else 0.0
    new_b = np.asarray(bias, np.float64) * factor + shift
    node.inputs = [node.inputs[0], _new_const(ctx, node, "W", new_w, weight.dtype),
                   _new_const(ctx, node, "B", new_b, weight.dtype)]
    ctx.absorb(node, bn)


def _match_bn_conv(ctx: FusionContext, conv: Node):
    found = _bn_after(ctx, conv)
    if found is None:
        return None
    bn, weight = found
    params = _bn_params(ctx, bn, weight.shape[0])
    return None if params is None else (bn, weight, params)


def _rewrite_bn_conv(ctx: FusionContext, conv: Node, found) -> None:
    bn, weight, (factor, shift) = found
    new_w = weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    _fold_bn(ctx, conv, bn, weight, new_w, factor, shift)


def _match_bn_conv_transpose(ctx: FusionContext, node: Node):
    found = _bn_after(ctx, node)
    if found is None:
        return None
    bn, weight = found
    groups = int(node.attr("group", 1))
    if weight.ndim < 3 or weight.shape[0] % groups:
        return None
    params = _bn_params(ctx, bn, weight.shape[1] * groups)
    return None if params is None else (bn, weight, groups, params)


def _rewrite_bn_conv_transpose(ctx: FusionContext, node: Node, found) -> None:
    """W [C_in, C_out / group, k...]: input channel ci of group g feeds output channels
    g * C_out/group + c, each scaled by its factor."""
    bn, weight, groups, (factor, shift) = found
    per_row = np.repeat(factor.reshape(groups, -1), weight.shape[0] // groups, axis=0)
    new_w = weight.astype(np.float64) * per_row.reshape(per_row.shape + (1,) * (weight.ndim - 2))
    _fold_bn(ctx, node, bn, weight, new_w, factor, shift)


def _gemm_parts(ctx: FusionContext, node: Node):
    """(B as a (K, N) matrix, C or None, alpha, beta) of a foldable Gemm or 2-D MatMul.

    Callers check the rest of their pattern first: nothing here copies the weight."""
    if not _plain(node) or node.op not in ("Gemm", "MatMul"):
        return None
    weight = ctx.const(node.inputs[1])
    if weight is None or weight.ndim != 2 or len(ctx.graph.tensors[node.inputs[0]].shape) != 2:
        return None
    if ctx.graph.tensors[node.outputs[0]].dtype not in FLOAT_DTYPES:
        return None
    if node.op == "MatMul":
        return weight, None, 1.0, 1.0
    c_name = node.inputs[2] if len(node.inputs) > 2 else ""
    c = ctx.const(c_name)
    if c_name and c is None:
        return None
    matrix = weight.T if node.attr("transB", 0) else weight
    return matrix, c, float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))


def _set_gemm(ctx: FusionContext, node: Node, matrix: np.ndarray, c: np.ndarray,
              alpha: float) -> None:
    """Make `node` a Gemm `alpha * A @ matrix + c` (transA kept, B not transposed)."""
    dtype = ctx.graph.tensors[node.outputs[0]].dtype
    trans_a = node.attr("transA", 0) if node.op == "Gemm" else 0
    node.op = "Gemm"
    node.attrs = {"alpha": float(alpha), "beta": 1.0, "transA": int(trans_a), "transB": 0}
    node.inputs = [node.inputs[0], _new_const(ctx, node, "B", matrix, dtype),
                   _new_const(ctx, node, "C", c, dtype)]


def _match_bn_gemm(ctx: FusionContext, node: Node):
    bn = _consumer(ctx, node, frozenset({"BatchNormalization"}))
    parts = _gemm_parts(ctx, node) if bn is not None else None
    if parts is None or bn.inputs[0] != node.outputs[0]:
        return None
    params = _bn_params(ctx, bn, parts[0].shape[1])
    return None if params is None else (bn, parts, params)


def _rewrite_bn_gemm(ctx: FusionContext, node: Node, found) -> None:
    bn, (matrix, c, alpha, beta), (factor, shift) = found
    c_scaled = (0.0 if c is None else beta * c.astype(np.float64)) * factor + shift
    _set_gemm(ctx, node, matrix.astype(np.float64) * factor[None, :], np.asarray(c_scaled),
              alpha)
    ctx.absorb(node, bn)


def _match_bn_affine(ctx: FusionContext, bn: Node):
    """BatchNormalization -> Mul/Div/Add/Sub by a per-channel constant (pre-activation BN)."""
    if not _plain(bn) or len(bn.inputs) < 5:
        return None
    shape = ctx.graph.tensors[bn.outputs[0]].shape
    if len(shape) < 2 or _bn_params(ctx, bn, shape[1]) is None:
        return None
    found = _match_const_operand(ctx, bn, frozenset({"Mul", "Div", "Add", "Sub"}))
    if found is None:
        return None
    vector = _per_channel(found[1], shape, 1)
    return None if vector is None else (found[0], vector)


def _rewrite_bn_affine(ctx: FusionContext, bn: Node, found) -> None:
    consumer, vector = found
    scale, bias = (ctx.const(name).astype(np.float64) for name in bn.inputs[1:3])
    if consumer.op in ("Mul", "Div"):
        factor = vector if consumer.op == "Mul" else 1.0 / vector
        scale, bias = scale * factor, bias * factor
    else:
        bias = bias + (vector if consumer.op == "Add" else -vector)
    dtype = ctx.const(bn.inputs[1]).dtype
    bn.inputs = [bn.inputs[0], _new_const(ctx, bn, "scale", scale, dtype),
                 _new_const(ctx, bn, "bias", bias, dtype), *bn.inputs[3:5]]
    ctx.absorb(bn, consumer)


# ---------------------------------------------------------------- bias and scale

def _match_const_operand(ctx: FusionContext, node: Node, ops: frozenset[str]):
    consumer = _consumer(ctx, node, ops)
    if consumer is None:
        return None
    other = _other_input(consumer, node.outputs[0])
    value = ctx.const(other) if other else None
    out = ctx.graph.tensors[node.outputs[0]]
    if value is None or ctx.graph.tensors[consumer.outputs[0]].shape != out.shape:
        return None
    if consumer.op in ("Sub", "Div") and consumer.inputs[0] != node.outputs[0]:
        return None
    return consumer, value


def _match_conv_affine(ops: frozenset[str]):
    def match(ctx: FusionContext, conv: Node):
        if not _plain(conv) or ctx.const(conv.inputs[1]) is None:
            return None
        if len(conv.inputs) > 2 and conv.inputs[2] and ctx.const(conv.inputs[2]) is None:
            return None
        found = _match_const_operand(ctx, conv, ops)
        if found is None:
            return None
        vector = _per_channel(found[1], ctx.graph.tensors[conv.outputs[0]].shape, 1)
        return None if vector is None else (found[0], vector)
    return match


def _rewrite_conv_affine(ctx: FusionContext, conv: Node, found) -> None:
    consumer, vector = found
    weight = ctx.const(conv.inputs[1])
    bias = ctx.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
    new_w = weight
    if consumer.op in ("Mul", "Div"):
        scale = vector if consumer.op == "Mul" else 1.0 / vector
        new_w = weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
        bias = bias * scale
    else:
        bias = bias + (vector if consumer.op == "Add" else -vector)
    w_name = conv.inputs[1] if new_w is weight else _new_const(ctx, conv, "W", new_w,
                                                                 weight.dtype)
    conv.inputs = [conv.inputs[0], w_name, _new_const(ctx, conv, "B", bias, weight.dtype)]
    ctx.absorb(conv, consumer)


def _match_gemm_bias(ctx: FusionContext, node: Node):
    found = _match_const_operand(ctx, node, frozenset({"Add"}))
    if found is None or found[1].ndim > 2:
        return None
    parts = _gemm_parts(ctx, node)
    return None if parts is None else (found, parts)


def _rewrite_gemm_bias(ctx: FusionContext, node: Node, found) -> None:
    (consumer, value), (_, c, _, beta) = found
    c_new = value.astype(np.float64) + (0.0 if c is None else beta * c.astype(np.float64))
    dtype = ctx.graph.tensors[node.outputs[0]].dtype
    if node.op == "MatMul":  # the weight stays as it is: B of a Gemm without transposes
        node.op, node.attrs = "Gemm", {"alpha": 1.0, "transA": 0, "transB": 0}
    node.attrs["beta"] = 1.0
    node.inputs = [*node.inputs[:2], _new_const(ctx, node, "C", c_new, dtype)]
    ctx.absorb(node, consumer)


def _match_bias_before_split(ctx: FusionContext, reshape: Node):
    """A Reshape that splits the last axis of a MatMul's or Gemm's product into heads
    (or of an Add or Mul on it), read only by an Add or Mul of a constant over the split
    dims (Keras' EinsumDense bias, [heads, head_dim], after its einsum became MatMul +
    Reshape; the query's scalar scale after it): (that node, the constant as one vector
    over the unsplit axis), or None."""
    if not _plain(reshape) or len(reshape.inputs) < 2:
        return None
    source = ctx.producers.get(reshape.inputs[0])
    if source is None or source.op not in ("MatMul", "Gemm", "Add", "Mul") or \
            ctx.single_consumer(source) is not reshape:
        return None
    found = _match_const_operand(ctx, reshape, frozenset({"Add", "Mul"}))
    if found is None:
        return None
    add, value = found
    before = tuple(ctx.graph.tensors[reshape.inputs[0]].shape)
    after = tuple(ctx.graph.tensors[reshape.outputs[0]].shape)
    lead, tail = after[:len(before) - 1], after[len(before) - 1:]
    if not before or lead != before[:-1] or int(np.prod(tail)) != before[-1] \
            or value.ndim > len(tail) or tuple(ctx.graph.tensors[add.outputs[0]].shape) != after:
        return None
    try:
        vector = np.broadcast_to(value, tail).reshape(-1)
    except ValueError:
        return None
    return add, vector


def _rewrite_bias_before_split(ctx: FusionContext, reshape: Node, found) -> None:
    """The Add or Mul first, on the unsplit product (where the epilogue fusion takes it),
    then the Reshape: the two nodes swap places."""
    add, vector = found
    op = add.op
    source, shape = reshape.inputs[0], reshape.inputs[1]
    dtype = ctx.graph.tensors[source].dtype
    biased = ctx.graph.unique_name(f"{source}_biased")
    ctx.graph.tensors[biased] = TensorInfo(tuple(ctx.graph.tensors[source].shape), dtype)
    split, out, attrs = reshape.outputs[0], add.outputs[0], reshape.attrs
    reshape.op, reshape.inputs, reshape.outputs, reshape.attrs = (
        op, [source, _new_const(ctx, reshape, op.lower(), vector, dtype)], [biased], {})
    add.op, add.inputs, add.outputs, add.attrs = "Reshape", [biased, shape], [out], attrs
    ctx.graph.tensors.pop(split, None)
    ctx.producers.pop(split, None)
    for node in (reshape, add):
        ctx.reindex(node)


# ---------------------------------------------------------------- activation patterns

def _gate_pattern(step: str, check=lambda node: True):
    """x * gate(x) where the gate is a unary op on x: silu, hard_swish."""
    def match(ctx: FusionContext, gate: Node):
        x = gate.inputs[0]
        mul = _consumer(ctx, gate, frozenset({"Mul"}))
        if mul is None or not check(gate) or _other_input(mul, gate.outputs[0]) != x:
            return None
        if ctx.graph.tensors[x].dtype not in FLOAT_DTYPES:
            return None
        return mul
    def rewrite(ctx: FusionContext, gate: Node, mul: Node) -> None:
        new = make_elementwise(gate.name, gate.inputs[0], [(EpilogueStep(step), None)], [])
        gate.op, gate.domain, gate.inputs, gate.attrs = new.op, new.domain, new.inputs, {}
        gate.epilogue = new.epilogue
        ctx.absorb(gate, mul)
    return match, rewrite


def _match_mish(ctx: FusionContext, softplus: Node):
    """x * Tanh(Softplus(x)), the TorchScript exporter's Mish below opset 18: (the step, x,
    the Tanh and the Mul) for `rewrite_activation`."""
    x = softplus.inputs[0]
    tanh = _consumer(ctx, softplus, frozenset({"Tanh"}))
    if tanh is None or ctx.graph.tensors[x].dtype not in FLOAT_DTYPES:
        return None
    mul = _consumer(ctx, tanh, frozenset({"Mul"}))
    if mul is None or _other_input(mul, tanh.outputs[0]) != x:
        return None
    return EpilogueStep("mish"), x, [tanh, mul]


def _hard_swish_gate(node: Node) -> bool:
    return (math.isclose(node.attr("alpha", 0.2), 1 / 6, rel_tol=1e-3)
            and math.isclose(node.attr("beta", 0.5), 0.5, rel_tol=1e-3))


# ---------------------------------------------------------------- elementwise chains

def _match_chain(ctx: FusionContext, node: Node):
    start = chain_start(ctx.graph, node)
    consumer = ctx.single_consumer(node) if start and not is_closed(start[1]) else None
    if consumer is None:
        return None
    chain = chain_of(ctx.graph, consumer, node.outputs[0])
    return None if not chain else (start, consumer, chain)


def _rewrite_chain(ctx: FusionContext, node: Node, found) -> None:
    (value, first), consumer, chain = found
    merged = make_elementwise(node.name, value, first + chain, [])
    node.op, node.domain, node.attrs = ELEMENTWISE_OP, WPK_DOMAIN, {}
    node.inputs, node.epilogue = merged.inputs, merged.epilogue
    ctx.absorb(node, consumer)


# ---------------------------------------------------------------- epilogues

def _non_const(ctx: FusionContext, chain: Chain) -> list[tuple[EpilogueStep, str]]:
    return [(s, n) for s, n in chain if n is not None and ctx.const(n) is None]


def _match_epilogue(kind: str):
    def match(ctx: FusionContext, node: Node):
        if node.domain not in ("", "ai.onnx") or is_closed(node.epilogue):
            return None
        if ctx.graph.tensors[node.outputs[0]].dtype not in FLOAT_DTYPES:
            return None
        consumer = ctx.single_consumer(node)
        chain = chain_of(ctx.graph, consumer, node.outputs[0]) if consumer else None
        if not chain:
            return None
        dynamic = _non_const(ctx, chain)
        has_residual = any(ctx.const(n) is None for n in operand_names(node))
        if kind == "activation":
            ok = all(n is None for _, n in chain)
        elif kind == "residual_add":
            ok = (len(dynamic) == 1 and dynamic[0][0].op == "add" and not has_residual)
        else:
            ok = not dynamic and any(n is not None for _, n in chain)
        return (consumer, chain) if ok else None
    return match


_match_activation = _match_epilogue("activation")


def _rewrite_epilogue(ctx: FusionContext, node: Node, found) -> None:
    consumer, chain = found
    attach(node, chain)
    ctx.absorb(node, consumer)


def _rule(name, ops, match, rewrite, doc) -> FusionRule:
    return FusionRule(name, None if ops is None else frozenset(ops), match, rewrite, doc)


LINEAR_RULES = (
    _rule("batchnorm_into_conv", {"Conv"}, _match_bn_conv, _rewrite_bn_conv,
          "Conv -> BatchNormalization: scale W, shift B"),
    _rule("batchnorm_into_conv_transpose", {"ConvTranspose"}, _match_bn_conv_transpose,
          _rewrite_bn_conv_transpose,
          "ConvTranspose -> BatchNormalization: scale W per output channel, shift B"),
    _rule("batchnorm_into_gemm", {"Gemm", "MatMul"}, _match_bn_gemm, _rewrite_bn_gemm,
          "Gemm/2-D MatMul -> BatchNormalization: scale B columns, shift C"),
    _rule("affine_into_batchnorm", {"BatchNormalization"}, _match_bn_affine,
          _rewrite_bn_affine,
          "BatchNormalization -> Mul/Div/Add/Sub of a per-channel constant: into scale, bias"),
    _rule("bias_into_conv", {"Conv"}, _match_conv_affine(frozenset({"Add", "Sub"})),
          _rewrite_conv_affine, "Conv -> Add/Sub of a per-channel constant: into B"),
    _rule("scale_into_conv", {"Conv"}, _match_conv_affine(frozenset({"Mul", "Div"})),
          _rewrite_conv_affine, "Conv -> Mul/Div by a per-channel constant: into W and B"),
    _rule("bias_into_gemm", {"Gemm"}, _match_gemm_bias, _rewrite_gemm_bias,
          "Gemm (constant B, C) -> Add of a constant: into C"),
    _rule("matmul_add_to_gemm", {"MatMul"}, _match_gemm_bias, _rewrite_gemm_bias,
          "2-D MatMul with a constant 2-D weight -> Add of a constant: Gemm with C"),
    _rule("bias_before_head_split", {"Reshape"}, _match_bias_before_split,
          _rewrite_bias_before_split,
          "MatMul/Gemm -> Reshape splitting the last axis -> Add/Mul of a constant over "
          "the split dims: the Add/Mul first, where the epilogue fusion takes it"),
)

_silu = _gate_pattern("silu")
_hard_swish = _gate_pattern("hard_swish", _hard_swish_gate)
PATTERN_RULES = (
    _rule("silu", {"Sigmoid"}, *_silu, "x * Sigmoid(x) -> Elementwise[silu]"),
    _rule("hard_swish", {"HardSigmoid"}, *_hard_swish,
          "x * HardSigmoid(x; 1/6, 1/2) -> Elementwise[hard_swish]"),
    _rule("quick_gelu", {"Sigmoid"}, match_quick_gelu, rewrite_activation,
          "x * Sigmoid(alpha * x), alpha a scalar -> Elementwise[quick_gelu]"),
    _rule("mish", {"Softplus"}, _match_mish, rewrite_activation,
          "x * Tanh(Softplus(x)) -> Elementwise[mish]"),
    _rule("gelu_erf", {"Erf"}, match_gelu_erf, rewrite_activation,
          "0.5 * x * (1 + Erf(x / sqrt(2))) -> Elementwise[gelu]"),
    _rule("gelu_tanh", {"Tanh"}, match_gelu_tanh, rewrite_activation,
          "0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))), or with the argument "
          "factored as (x sqrt(2/pi)) (1 + 0.044715 x x) -> Elementwise[gelu_tanh]"),
    _rule("layer_norm", {"Div"}, match_layer_norm, rewrite_layer_norm,
          "(x - mean) / sqrt(var + eps) [* gamma] [+ beta] -> LayerNormalization"),
    _rule("layer_norm_reciprocal", {"Reciprocal"}, match_layer_norm_reciprocal,
          rewrite_layer_norm,
          "x * inv + (beta - mean * inv), inv = gamma / sqrt(var + eps) (Keras) -> "
          "LayerNormalization"),
)

# CPU only: the Transposes become NHWC reorders next to blocked convolutions there; a
# CUDA plan of the same graph has not been measured against the written-out form
CHANNEL_NORM_RULES = (
    _rule("channel_layer_norm", {"Div"}, match_channel_layer_norm, rewrite_channel_layer_norm,
          "(x - mean) / sqrt(var + eps) [* gamma] [+ beta] over one axis not the last "
          "(channels-first) -> Transpose, LayerNormalization over the last axis, Transpose"),
    _rule("channel_layer_norm_reciprocal", {"Reciprocal"}, match_channel_layer_norm_reciprocal,
          rewrite_channel_layer_norm,
          "x * inv + (beta - mean * inv) (Keras) over one axis not the last -> Transpose, "
          "LayerNormalization over the last axis, Transpose"),
)

# CPU only: wpk's RMSNorm op has C and onnxruntime kernels on the CPU, none on CUDA yet
RMS_NORM_RULES = (
    _rule("rms_norm", {"Sqrt"}, match_rms_norm, rewrite_rms_norm,
          "x / sqrt(mean(x^2) + eps) [* gamma] (or x * Reciprocal(...), x * (1 / ...)) -> "
          "wpk RMSNorm"),
)

CHAIN_RULES = (
    _rule("elementwise_chain", None, _match_chain, _rewrite_chain,
          "two chained elementwise ops (one consumer between) -> one Elementwise node"),
)

EPILOGUE_RULES = (
    _rule("epilogue_activation", LINEAR_OPS, _match_activation, _rewrite_epilogue,
          "Conv/Gemm/MatMul -> unary activation(s): into the epilogue"),
    _rule("epilogue_residual_add", LINEAR_OPS, _match_epilogue("residual_add"),
          _rewrite_epilogue, "Conv/Gemm/MatMul -> Add of another tensor (one per node)"),
    _rule("epilogue_const", LINEAR_OPS, _match_epilogue("const"), _rewrite_epilogue,
          "Conv/Gemm/MatMul -> steps with constant operands (N-D MatMul bias)"),
)



def _match_transpose_activation(ctx: FusionContext, node: Node):
    """ConvTranspose -> one activation the C kernels apply in their stores (a BN folded
    into it first: DBNet's head, a DCGAN's layers)."""
    found = _match_activation(ctx, node)
    return found if not node.epilogue and _one_activation(found) else None


def _one_activation(found) -> bool:
    """Whether an activation match (consumer, chain) is one unary activation of the ones the
    conv, ConvTranspose and GroupNorm kernels apply in their stores (`CONV_ACTIVATIONS`)."""
    if found is None:
        return False
    _, chain = found
    return len(chain) == 1 and chain[0][1] is None and chain[0][0].op in CONV_ACTIVATIONS


def _match_group_norm_activation(ctx: FusionContext, node: Node):
    """wpk's GroupNorm -> one activation its kernels apply (a diffusion UNet's SiLU)."""
    if not is_group_norm_node(node) or node.epilogue:
        return None
    consumer = ctx.single_consumer(node)
    chain = chain_of(ctx.graph, consumer, node.outputs[0]) if consumer else None
    found = (consumer, chain) if chain else None
    return found if _one_activation(found) else None


# CPU only: wpk's GroupNorm, written by the CPU rules below, has CPU kernels only
GROUP_NORM_RULES = (
    _rule("group_norm", {"InstanceNormalization"}, match_group_norm, rewrite_group_norm,
          "Reshape, InstanceNormalization, Reshape [, Mul, Add per channel] -> GroupNorm"),
    _rule("onnx_group_norm", {"GroupNormalization"}, match_onnx_group_norm,
          rewrite_onnx_group_norm, "GroupNormalization [, Mul, Add per channel] -> GroupNorm"),
)
GROUP_NORM_EPILOGUE_RULES = (
    _rule("epilogue_activation_group_norm", {"GroupNorm"}, _match_group_norm_activation,
          _rewrite_epilogue, "GroupNorm -> one activation: into the epilogue"),
)


# CPU only: the CPU's ConvTranspose kernels (convtranspose.c, onnxruntime's node and its
# activation in one session, the DSL's) apply it; the CUDA ones have not been given it
CONV_TRANSPOSE_EPILOGUE_RULES = (
    _rule("epilogue_activation_conv_transpose", {"ConvTranspose"}, _match_transpose_activation,
          _rewrite_epilogue, "ConvTranspose -> one activation: into the epilogue"),
)

__all__ = ["CHAIN_RULES", "CONV_TRANSPOSE_EPILOGUE_RULES", "EPILOGUE_RULES",
           "GROUP_NORM_EPILOGUE_RULES", "GROUP_NORM_RULES", "LINEAR_RULES",
           "PATTERN_RULES", "RMS_NORM_RULES"]
