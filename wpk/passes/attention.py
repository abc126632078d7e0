"""Match and rewrite of scaled dot-product attention into wpk's fused `Attention` op (rule
`attention`, run by the `attention_fusion` pass on both targets).

    scores = MatMul(Q, Transpose(K, last two dims swapped))  or  MatMul(Q, K^T)
    (a K^T made by another Transpose that moves the innermost dim, the exporters' head split
    of K, is made K by the flipped Transpose instead: a copy of rows, not of elements; a
    swap of the last two dims between Reshapes of the leading dims is absorbed with them)
    logits = scores * scale  or  scores / scale   (a constant scalar; optional)
    (Q, K or K^T may come scaled by constant scalars, as torch's and paddle's exports write
    it: q * s @ k^T, q * sqrt(s) @ k^T * sqrt(s); the factors join the scale)
    logits = logits + mask                        (optional, either operand order; also
                                                  torch's masked_fill, a Where, made such
                                                  an Add first: rule `masked_fill_as_mask`)
    Y = MatMul(Softmax(logits, last axis), V)
                        ->  Attention(Q, K or K^T, V[, mask]; scale, k_transposed)

Q, K, V are the [B, H, S, D] (or [B*H, S, D]; or [B, windows, H, S, D] as MaxViT's
einsum writes them) tensors exporters make by their Reshape/Transpose head split; the
mask broadcasts against the scores ([B,1,1,S], [1,1,S,S], ...). Fires only when every
intermediate (scores, scaled, masked, probabilities, a swapped K) has the next node as its
only reader and is no graph output, the softmax is over the last axis, every
shape is known and every tensor is float32. The op is defined, with its
float64 formula and its ONNX form, in `wpk.kernels.cpu.attention_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Node
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cpu.attention_spec import (
    ATTENTION_DOMAIN,
    ATTENTION_OP,
    HEADS_PERM,
    attention_reason,
    broadcasts_to,
)
from wpk.passes.base import add_constant
from wpk.passes.fusion import FusionContext, FusionRule


@dataclass(frozen=True)
class AttentionMatch:
    """What the rule found: the nodes it replaces and the fused node's inputs and attributes."""

    scores: Node          # MatMul(Q, K^T): becomes the fused node
    context: Node         # MatMul(P, V): its outputs and place go to the fused node
    others: tuple[Node, ...]
    inputs: tuple[str, ...]
    scale: float
    k_transposed: bool
    # a Transpose that made K^T and will make K, or a Reshape that will (`_key_of`)
    flip: Node | KeyReshape | None = None


def _known(ctx: FusionContext, name: str) -> bool:
    info = ctx.graph.tensors.get(name) if name else None
    return info is not None and all(isinstance(d, (int, np.integer)) and d > 0
                                    for d in info.shape)


def _feeds_only(ctx: FusionContext, node: Node | None, user: Node, op: str | tuple) -> bool:
    ops = (op,) if isinstance(op, str) else op
    return node is not None and node.op in ops and node.domain in ("", "ai.onnx") \
        and not node.epilogue and ctx.single_consumer(node) is user


def softmax_is_last_axis(ctx: FusionContext, softmax: Node, rank: int) -> bool:
    default = -1 if ctx.graph.opset >= 13 else 1   # before 13: 2-D coercion at `axis`
    return int(softmax.attr("axis", default)) % rank == rank - 1


def _scale_of(ctx: FusionContext, node: Node) -> tuple[str, float] | None:
    """(the scores operand, the factor) of a Mul or Div by a constant scalar, else None."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    for tensor, const in ((a, b), (b, a)) if node.op == "Mul" else ((a, b),):
        value = ctx.const(const)
        if value is not None and value.size == 1 and value.dtype.kind == "f" \
                and ctx.const(tensor) is None:
            factor = float(value.reshape(-1)[0])
            if node.op == "Div":
                return (tensor, 1.0 / factor) if factor != 0.0 else None
            return tensor, factor
    return None


def _mask_split(ctx: FusionContext, add: Node, logits_shape: tuple[int, ...]):
    """(the scores operand, the mask) of the mask Add, or None."""
    if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    for scores, mask in (add.inputs, add.inputs[::-1]):
        producer = ctx.producers.get(scores)
        if not _feeds_only(ctx, producer, add, ("Mul", "Div", "MatMul")) or not _known(ctx, mask):
            continue
        if broadcasts_to(ctx.graph.tensors[mask].shape, logits_shape):
            return scores, mask
    return None


def _scaled_input(ctx: FusionContext, name: str, user: Node) -> tuple[str, float, list[Node]]:
    """(tensor, factor, [node]) when `name` is a Mul/Div of a tensor by a constant scalar read
    only by `user` (torch and paddle scale Q, or Q and K^T, before the MatMul), else
    (name, 1.0, [])."""
    node = ctx.producers.get(name)
    if _feeds_only(ctx, node, user, ("Mul", "Div")):
        found = _scale_of(ctx, node)
        if found is not None:
            return found[0], found[1], [node]
    return name, 1.0, []


def _swapped_last(perm) -> list[int]:
    return [*perm[:-2], perm[-1], perm[-2]]


def _lead_reshapes(ctx: FusionContext, name: str, user: Node) -> tuple[str, list[Node]]:
    """The tensor a chain of Reshapes that keep the last two dims (each read only by the
    next, the last by `user`) starts from, and those Reshapes ((name, []) for none)."""
    nodes = []
    node = ctx.producers.get(name)
    while _feeds_only(ctx, node, user, "Reshape") and _known(ctx, node.inputs[0]) and \
            _known(ctx, name) and \
            ctx.graph.tensors[node.inputs[0]].shape[-2:] == ctx.graph.tensors[name].shape[-2:]:
        nodes.append(node)
        user, name = node, node.inputs[0]
        node = ctx.producers.get(name)
    return name, nodes


@dataclass(frozen=True)
class KeyReshape:
    """A Reshape of the leading dims that is to read `source` and make K of `shape`."""

    node: Node
    source: str
    shape: tuple[int, ...]


def _key_through_reshapes(ctx: FusionContext, kt: str, user: Node
                          ) -> tuple[str, list[Node], KeyReshape | None] | None:
    """(K, the nodes absorbed (the first reads K), a Reshape to retarget) where K^T is K's
    last two dims swapped between Reshapes of the leading dims (torch's dynamo export:
    [1, 1, H, S, D] -> [H, S, D] -> Transpose -> [H, D, S] -> [1, H, D, S]), else None. K
    is the swap's source where it has the fused op's shape; else the Reshape that made the
    swap's input makes it, from the chain's source (a view: no copy)."""
    inner, outer = _lead_reshapes(ctx, kt, user)
    if not outer:
        return None
    swap = ctx.producers.get(inner)
    if not _feeds_only(ctx, swap, outer[-1], "Transpose"):
        return None
    rank = len(ctx.graph.tensors[inner].shape)
    if [int(p) for p in swap.attr("perm", ())] != _swapped_last(list(range(rank))):
        return None
    key, before = _lead_reshapes(ctx, swap.inputs[0], swap)
    shape = tuple(_swapped_last(ctx.graph.tensors[kt].shape))
    if not _known(ctx, key):
        return None
    absorbed = outer + [swap] + before
    if tuple(ctx.graph.tensors[key].shape) == shape:
        return key, [absorbed[-1]] + absorbed[:-1], None   # first: the node that reads K
    if not before:
        return None
    kept = before[0]   # made the swap's input: now makes K from the chain's source
    return kept.outputs[0], [n for n in absorbed if n is not kept], KeyReshape(kept, key, shape)


def _key_of(ctx: FusionContext, kt: str, user: Node, rank: int
            ) -> tuple[str, bool, list[Node], Node | None]:
    """K, whether the fused op reads it as K^T, the nodes absorbed, and a Transpose to flip:
    a Transpose swapping the last two dims, read only by `user` (the scores MatMul or a
    scale on its way), is absorbed. Any other Transpose making K^T that moves the innermost
    dim (the exporters' head split of K: [B, S, H, D] by (0, 2, 3, 1), a strided copy of
    every element) is flipped to make K instead (by (0, 2, 1, 3): a copy of whole rows,
    as Q's and V's), when that keeps the innermost dim in place."""
    through = _key_through_reshapes(ctx, kt, user)
    if through is not None:
        return through[0], False, through[1], through[2]
    node = ctx.producers.get(kt)
    if not _feeds_only(ctx, node, user, "Transpose"):
        return kt, True, [], None
    perm = [int(p) for p in node.attr("perm", ())]
    if perm == _swapped_last(list(range(rank))):
        return node.inputs[0], False, [node], None
    if len(perm) == rank and perm[-1] != rank - 1 and _swapped_last(perm)[-1] == rank - 1:
        return kt, False, [], node
    return kt, True, [], None


def _operands(ctx: FusionContext, scores: Node, rank: int):
    """Q, K, whether K is K^T, the product of the scalar factors on their way to the scores
    MatMul, the nodes those took, and K's Transpose to flip (`_key_of`)."""
    q, q_factor, nodes = _scaled_input(ctx, scores.inputs[0], scores)
    kt, k_factor, k_nodes = _scaled_input(ctx, scores.inputs[1], scores)
    key, k_transposed, swap, flip = _key_of(ctx, kt, k_nodes[0] if k_nodes else scores, rank)
    factor = q_factor * k_factor
    if swap:
        key, swap_factor, swap_nodes = _scaled_input(ctx, key, swap[0])
        factor *= swap_factor
        swap += swap_nodes
    return q, key, k_transposed, factor, nodes + k_nodes + swap, flip


def match_attention(ctx: FusionContext, softmax: Node) -> AttentionMatch | None:
    """The attention pattern around `softmax`, or None (see the module docstring)."""
    graph = ctx.graph
    if softmax.domain not in ("", "ai.onnx") or len(softmax.inputs) != 1 \
            or not _known(ctx, softmax.inputs[0]):
        return None
    logits_shape = tuple(graph.tensors[softmax.inputs[0]].shape)
    rank = len(logits_shape)
    if rank not in (3, 4, 5, 6) or not softmax_is_last_axis(ctx, softmax, rank):
        return None
    context = ctx.single_consumer(softmax)
    if context is None or context.op != "MatMul" or context.domain not in ("", "ai.onnx") \
            or context.epilogue or context.inputs[0] != softmax.outputs[0] \
            or context.inputs[1] == softmax.outputs[0]:
        return None
    others, value, mask, scale = [softmax], softmax.inputs[0], None, 1.0
    node = ctx.producers.get(value)
    if _feeds_only(ctx, node, softmax, "Add"):
        split = _mask_split(ctx, node, logits_shape)
        if split is None:
            return None
        others.append(node)
        value, mask = split
        user, node = node, ctx.producers.get(split[0])
    else:
        user = softmax
    if _feeds_only(ctx, node, user, ("Mul", "Div")):
        found = _scale_of(ctx, node)
        if found is None:
            return None
        others.append(node)
        value, scale = found
        user, node = node, ctx.producers.get(found[0])
    if not _feeds_only(ctx, node, user, "MatMul") or len(node.inputs) != 2:
        return None
    q, key, k_transposed, factor, operand_nodes, flip = _operands(ctx, node, rank)
    scale *= factor
    inputs = (q, key, context.inputs[1]) + ((mask,) if mask else ())
    if not all(_known(ctx, name) for name in (*inputs, context.outputs[0])):
        return None
    specs = [graph.tensors[n].spec for n in inputs]
    if isinstance(flip, KeyReshape):   # K as the retargeted Reshape will make it
        specs[1] = TensorSpec(flip.shape, specs[1].dtype)
    elif flip is not None:   # K as the flipped Transpose will make it
        specs[1] = TensorSpec(tuple(_swapped_last(specs[1].shape)), specs[1].dtype)
    workload = Workload(ATTENTION_OP, tuple(specs), (graph.tensors[context.outputs[0]].spec,),
                        (("k_transposed", int(k_transposed)), ("scale", scale)),
                        domain=ATTENTION_DOMAIN)
    if attention_reason(workload) is not None:
        return None
    return AttentionMatch(node, context, tuple(others + operand_nodes), inputs, scale,
                          k_transposed, flip)


def rewrite_attention(ctx: FusionContext, softmax: Node, found: AttentionMatch) -> None:
    """The scores MatMul becomes the fused node, in the context MatMul's place; the rest go."""
    if isinstance(found.flip, KeyReshape):   # the Reshape makes K from the chain's source
        reshape = found.flip
        shape = add_constant(ctx.graph, f"{reshape.node.name}_key",
                             np.array(reshape.shape, np.int64))
        reshape.node.inputs = [reshape.source, shape]
        ctx.graph.tensors[reshape.node.outputs[0]].shape = reshape.shape
    elif found.flip is not None:   # K^T's Transpose makes K (its only reader was the scores)
        flip = found.flip
        flip.attrs["perm"] = tuple(_swapped_last([int(p) for p in flip.attr("perm", ())]))
        info = ctx.graph.tensors[flip.outputs[0]]
        info.shape = tuple(_swapped_last(info.shape))
    node = found.scores
    node.op, node.domain, node.inputs = ATTENTION_OP, ATTENTION_DOMAIN, list(found.inputs)
    node.attrs = {"scale": found.scale, "k_transposed": int(found.k_transposed)}
    node.epilogue = ()
    ctx.absorb(node, found.context, remove=list(found.others))


ATTENTION_RULES = [
    FusionRule("attention", frozenset({"Softmax"}), match_attention, rewrite_attention,
               "Softmax(MatMul(Q, K^T) * scale [+ mask]) @ V -> wpk Attention (one fused "
               "kernel, no [seq, seq] tensor)"),
]


# A masked_fill's fill must swamp any score: -inf, or a float32 value so far below that
# score + fill rounds to fill (HF's finfo(float32).min)
WHERE_FILL_LIMIT = -1e30


def match_masked_fill(ctx: FusionContext, where: Node) -> tuple[str, np.ndarray] | None:
    """(the scores, the additive mask) of torch's masked_fill before a softmax over the
    last axis, or None: Where(keep, scores, fill) or Where(drop, fill, scores) with a
    constant boolean condition that broadcasts to the scores, a scalar float32 fill of
    -inf or at most `WHERE_FILL_LIMIT`, and every row of the scores keeping a key (a row
    filled whole is uniform after the Where, not after an added mask). For finite scores
    scores + mask is the Where's output (score + fill rounds to fill)."""
    if where.domain not in ("", "ai.onnx") or len(where.inputs) != 3 or where.epilogue:
        return None
    softmax = ctx.single_consumer(where)
    shape = ctx.graph.tensors[where.outputs[0]].shape
    if softmax is None or softmax.op != "Softmax" or softmax.domain not in ("", "ai.onnx") \
            or not _known(ctx, where.outputs[0]) \
            or not softmax_is_last_axis(ctx, softmax, len(shape)):
        return None
    condition, then, other = where.inputs
    keep = ctx.const(condition)
    if keep is None or keep.dtype != np.bool_ or not broadcasts_to(tuple(keep.shape), shape):
        return None
    for scores, fill, kept in ((then, other, keep), (other, then, ~keep)):
        value = ctx.const(fill)
        if value is None or value.size != 1 or value.dtype != np.float32 \
                or not float(value.reshape(-1)[0]) <= WHERE_FILL_LIMIT \
                or ctx.const(scores) is not None \
                or tuple(ctx.graph.tensors[scores].shape) != tuple(shape):
            continue
        if not np.broadcast_to(kept, shape).any(axis=-1).all():
            return None
        return scores, np.where(kept, np.float32(0.0), value.reshape(())).astype(np.float32)
    return None


def rewrite_masked_fill(ctx: FusionContext, where: Node, found) -> None:
    """The Where becomes Add(scores, its additive mask as a constant)."""
    scores, mask = found
    where.op, where.attrs = "Add", {}
    where.inputs = [scores, add_constant(ctx.graph, f"{where.name}_mask", mask)]
    ctx.reindex(where)


# Both targets: the CUDA kernel's online softmax takes exponents relative to 0 while a
# thread has seen no key that is not -inf (emulator-tested on masked_fill's causal masks)
MASKED_FILL_RULES = [
    FusionRule("masked_fill_as_mask", frozenset({"Where"}), match_masked_fill,
               rewrite_masked_fill,
               "Where(constant mask, scores, -inf) before a Softmax (torch's masked_fill) -> "
               "Add(scores, constant 0 / -inf mask), the form the attention rule fuses"),
]


@dataclass(frozen=True)
class HeadsMatch:
    """The head-split Transposes (0, 2, 1, 3) the fused node absorbs: per operand (Q, K, V)
    the one that made it, or None, and the one its output goes through."""

    splits: tuple[Node | None, Node | None, Node | None]
    merge: Node


def _is_heads_transpose(node: Node | None) -> bool:
    return node is not None and node.op == "Transpose" and node.domain in ("", "ai.onnx") \
        and not node.epilogue and tuple(int(p) for p in node.attr("perm", ())) == HEADS_PERM


def match_heads(ctx: FusionContext, node: Node) -> HeadsMatch | None:
    """A rank-4 fused attention whose output goes through the heads' merge Transpose
    (0, 2, 1, 3) alone, with the split Transposes of its operands read by it alone."""
    if node.domain != ATTENTION_DOMAIN or any(node.attr("bshd", ()) or ()) \
            or len(node.inputs) < 3 or not _known(ctx, node.inputs[0]) \
            or len(ctx.graph.tensors[node.inputs[0]].shape) != 4:
        return None
    merge = ctx.single_consumer(node)
    if not _is_heads_transpose(merge) or merge.inputs[0] != node.outputs[0]:
        return None
    splits = []
    for index, name in enumerate(node.inputs[:3]):
        split = ctx.producers.get(name)
        usable = _is_heads_transpose(split) and ctx.single_consumer(split) is node \
            and _known(ctx, split.inputs[0]) \
            and not (index == 1 and node.attr("k_transposed", 0))
        splits.append(split if usable else None)
    return HeadsMatch(tuple(splits), merge)


def rewrite_heads(ctx: FusionContext, node: Node, found: HeadsMatch) -> None:
    """The fused node reads the split Transposes' inputs and writes the merge's output,
    flagged [B, S, H, D] (attribute `bshd`); the Transposes go."""
    flags = [split is not None for split in found.splits] + [True]
    node.inputs = [split.inputs[0] if split is not None else name
                   for split, name in zip(found.splits, node.inputs[:3])] + node.inputs[3:]
    node.attrs = {**node.attrs, "bshd": tuple(int(f) for f in flags)}
    splits = list({id(s): s for s in found.splits if s is not None}.values())
    ctx.absorb(node, found.merge, remove=splits)


ATTENTION_HEADS_RULES = [
    FusionRule("attention_heads", frozenset({ATTENTION_OP}), match_heads, rewrite_heads,
               "Transpose (0, 2, 1, 3) of Q, K, V and of the output around wpk Attention -> "
               "read and written where they lie ([B, S, H, D], attribute bshd; CPU)"),
]
