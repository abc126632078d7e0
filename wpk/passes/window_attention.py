"""Swin's window attention in the forms the attention rule fuses (rules
`window_mask_unreshaped`, `score_constants_summed` and `head_scale_on_queries`, run by the
`window_attention` pass on both targets, before `attention_fusion`: the mask is finite,
-100 across regions, which both targets' fused kernels take like any additive mask).

Swin implementations (torchvision's, timm's, Hugging Face's) add the shifted windows' mask
to the scores viewed per image, then view them back per window:

    scores = MatMul(Q, K^T) + relative_bias                      [B*W, H, N, N]
    masked = Reshape(Add(Reshape(scores, [B, W, H, N, N]), mask), [B*W, H, N, N])
    Y = MatMul(Softmax(masked), V)

with a constant mask ([1, W, 1, N, N]: 0 within a window's region, -100 across regions).
`window_mask_unreshaped` makes the sandwich one Add of the scores and the mask viewed as
the scores are ([W, 1, N, N] here: the mask broadcast to the per-image view, reshaped, and
every axis along which it does not change kept at 1); `score_constants_summed` then adds
the relative bias and that mask into one constant, (scores + bias) + mask -> scores +
(bias + mask), which rounds differently only by the rounding of bias + mask. The
attention rule then sees its one mask Add.

Swin V2's cosine attention scales the scores by a learned factor per head,
MatMul(Q, K^T) * exp(clamp(logit_scale)) with a constant [H, 1, 1]: no scalar the fused
op takes as its scale. `head_scale_on_queries` moves it onto the queries,
MatMul(Q * scale, K^T), the same products up to rounding, so the scores come straight
from the MatMul and the attention rule fuses them (scale 1).

Each fires only before a Softmax over the last axis (through at most two Adds and the
sandwich), with every intermediate read by the next node alone and no graph output,
every shape known and the tensors float32; the first only when the outer Reshape
restores the scores' shape, and while the mask it writes stays within `MAX_MASK_VALUES`
values; the third only when the factor varies along the scores' leading dims alone and
does not widen the queries.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from wpk.core.graph import Node
from wpk.kernels.cpu.attention_spec import broadcasts_to
from wpk.passes.attention import softmax_is_last_axis
from wpk.passes.base import add_constant
from wpk.passes.fusion import FusionContext, FusionRule

# the most values a rewritten mask may take (Swin-B's first stage at 384 x 384: 144
# windows of 144 tokens, 3 million values, 12 MB)
MAX_MASK_VALUES = 1 << 24


def _plain(node: Node | None, op: str) -> bool:
    return node is not None and node.op == op and node.domain in ("", "ai.onnx") \
        and not node.epilogue


def _shape(ctx: FusionContext, name: str) -> tuple[int, ...] | None:
    """The known static shape of float32 tensor `name`, else None."""
    info = ctx.graph.tensors.get(name) if name else None
    if info is None or info.dtype != "float32" \
            or not all(isinstance(d, (int, np.integer)) and d > 0 for d in info.shape):
        return None
    return tuple(int(d) for d in info.shape)


def _softmax_last(ctx: FusionContext, node: Node | None) -> bool:
    """Whether `node` is a Softmax over its input's last axis."""
    if not _plain(node, "Softmax"):
        return False
    shape = _shape(ctx, node.inputs[0])
    return shape is not None and softmax_is_last_axis(ctx, node, len(shape))


def _const_operand(ctx: FusionContext, node: Node) -> tuple[str, np.ndarray] | None:
    """(the other operand, the float32 constant) of a binary node (Add, Mul) of a tensor
    and a constant."""
    if len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
        return None
    for tensor, const in (node.inputs, node.inputs[::-1]):
        value = ctx.const(const)
        if value is not None and value.dtype == np.float32 and ctx.const(tensor) is None:
            return tensor, value
    return None


def _const_operand_over(ctx: FusionContext, node: Node, op: str
                        ) -> tuple[Node, np.ndarray] | None:
    """(the node making the other operand, the constant) of a binary node of a tensor and
    a float32 constant whose tensor a plain `op` makes for it alone, else None."""
    split = _const_operand(ctx, node)
    if split is None:
        return None
    producer = ctx.producers.get(split[0])
    if not _plain(producer, op) or ctx.single_consumer(producer) is not node:
        return None
    return producer, split[1]


def compact(value: np.ndarray) -> np.ndarray:
    """`value` with every axis along which it does not change cut to length 1: the smallest
    array that broadcasts back to it."""
    for axis in range(value.ndim):
        first = value.take([0], axis=axis)
        if value.shape[axis] > 1 and np.array_equal(value, np.broadcast_to(first, value.shape)):
            value = first
    return np.ascontiguousarray(value)


def match_unreshaped(ctx: FusionContext, outer: Node):
    """(the Add, the inner Reshape, the scores, the mask as the scores see it) of
    Reshape(Add(Reshape(scores), constant mask)) back to the scores' shape before a
    Softmax over the last axis, else None."""
    if not _plain(outer, "Reshape") or not _softmax_last(ctx, ctx.single_consumer(outer)):
        return None
    add = ctx.producers.get(outer.inputs[0])
    if not _plain(add, "Add") or ctx.single_consumer(add) is not outer:
        return None
    found = _const_operand_over(ctx, add, "Reshape")
    if found is None:
        return None
    inner, mask = found
    scores = inner.inputs[0]
    view, shape = _shape(ctx, inner.outputs[0]), _shape(ctx, scores)
    if view is None or shape is None or _shape(ctx, outer.outputs[0]) != shape \
            or not broadcasts_to(mask.shape, view) or int(np.prod(shape)) > MAX_MASK_VALUES:
        return None
    return add, inner, scores, compact(np.broadcast_to(mask, view).reshape(shape))


def rewrite_unreshaped(ctx: FusionContext, outer: Node, found) -> None:
    """The Add reads the scores and the mask as they see it and writes the outer Reshape's
    output; both Reshapes go."""
    add, inner, scores, mask = found
    add.inputs = [scores, add_constant(ctx.graph, f"{add.name}_mask", mask)]
    ctx.absorb(add, outer, remove=[inner])


def match_summed(ctx: FusionContext, outer: Node):
    """(the scores, bias + mask) of Add(Add(scores, constant bias), constant mask) read by
    a Softmax over the last axis, when neither constant widens the scores, else None."""
    if not _plain(outer, "Add") or not _softmax_last(ctx, ctx.single_consumer(outer)):
        return None
    found = _const_operand_over(ctx, outer, "Add")
    if found is None:
        return None
    inner, mask = found
    split = _const_operand(ctx, inner)
    if split is None:
        return None
    scores, bias = split
    shape = _shape(ctx, scores)
    if shape is None or _shape(ctx, outer.outputs[0]) != shape \
            or not broadcasts_to(bias.shape, shape) or not broadcasts_to(mask.shape, shape):
        return None
    return inner, scores, (bias + mask).astype(np.float32)


def rewrite_summed(ctx: FusionContext, outer: Node, found) -> None:
    """The inner Add adds the summed constant and writes the outer Add's output."""
    inner, scores, summed = found
    inner.inputs = [scores, add_constant(ctx.graph, f"{inner.name}_summed", summed)]
    ctx.absorb(inner, outer)


def _reaches_softmax(ctx: FusionContext, node: Node) -> bool:
    """Whether `node`'s output reaches a Softmax over the last axis through at most two
    Adds and the mask sandwich `match_unreshaped` undoes (its two Reshapes), each read
    alone."""
    for _ in range(5):
        node = ctx.single_consumer(node)
        if _softmax_last(ctx, node):
            return True
        if not (_plain(node, "Add") or _plain(node, "Reshape")):
            return False
    return False


def match_head_scale(ctx: FusionContext, mul: Node):
    """(the scores MatMul, the queries, the factor) of MatMul(Q, K^T) * constant whose
    last two dims are 1 (a factor per head, or per leading index), bound for a Softmax
    over the last axis, else None. A scalar factor is the attention rule's own scale."""
    if not _plain(mul, "Mul") or not _reaches_softmax(ctx, mul):
        return None
    found = _const_operand_over(ctx, mul, "MatMul")
    if found is None:
        return None
    matmul, factor = found
    if factor.size == 1 or factor.ndim < 2 or factor.shape[-2:] != (1, 1):
        return None
    queries = matmul.inputs[0]
    shape, query_shape = _shape(ctx, matmul.outputs[0]), _shape(ctx, queries)
    if shape is None or query_shape is None or len(query_shape) != len(shape) \
            or _shape(ctx, mul.outputs[0]) != shape \
            or not broadcasts_to(factor.shape, query_shape) or ctx.const(queries) is not None:
        return None
    return matmul, queries, factor


def rewrite_head_scale(ctx: FusionContext, mul: Node, found) -> None:
    """The two nodes trade places: the first scales the queries (a new tensor), the second
    multiplies them by K^T into the Mul's output."""
    matmul, queries, factor = found
    graph = ctx.graph
    scaled = f"{mul.name}_queries"
    while scaled in graph.tensors:
        scaled += "_"
    keys, product, result = matmul.inputs[1], matmul.outputs[0], mul.outputs[0]
    with ctx.editing(matmul, mul):
        matmul.op, matmul.attrs = "Mul", {}
        matmul.inputs = [queries, add_constant(graph, f"{mul.name}_factor", factor)]
        matmul.outputs = [scaled]
        mul.op, mul.attrs = "MatMul", {}
        mul.inputs, mul.outputs = [scaled, keys], [result]
    graph.tensors[scaled] = replace(graph.tensors[queries])   # its own (passes edit shapes)
    graph.tensors.pop(product, None)


WINDOW_ATTENTION_RULES = [
    FusionRule("window_mask_unreshaped", frozenset({"Reshape"}), match_unreshaped,
               rewrite_unreshaped,
               "Reshape(Add(Reshape(scores), constant mask)) back to the scores' shape before "
               "a Softmax (Swin's shifted windows) -> Add(scores, the mask as they see it)"),
    FusionRule("score_constants_summed", frozenset({"Add"}), match_summed, rewrite_summed,
               "Add(Add(scores, constant), constant) before a Softmax -> "
               "Add(scores, their sum): the one mask Add the attention rule fuses"),
    FusionRule("head_scale_on_queries", frozenset({"Mul"}), match_head_scale,
               rewrite_head_scale,
               "MatMul(Q, K^T) * constant per head before a Softmax (Swin V2's logit scale) "
               "-> MatMul(Q * constant, K^T): scores the attention rule fuses"),
]
