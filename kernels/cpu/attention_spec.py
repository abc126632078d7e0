"""wpk's fused attention op: what it computes, its float64 formula and its ONNX form.

    Attention(Q, K, V[, mask]) (domain 'wpk', attributes scale, k_transposed)
      = Softmax(Q @ K^T * scale [+ mask], axis=-1) @ V

Q is [..., Sq, D] and V [..., Sk, Dv] with the same leading (batch, head)
dims (rank 3 to 6: the kernels see a rank-5 or rank-6 operand as rank 4, its leading
dims before the heads folded into one, as MaxViT's [B, windows, H, S, D]); K is
[..., Sk, D] (`k_transposed` 0: the exporter wrote MatMul(Q, Transpose(K))) or K^T
itself, [..., D, Sk] (`k_transposed` 1). The
optional mask broadcasts against the scores [..., Sq, Sk]. The graph pass
`wpk.passes.attention` writes the node; `attention_onnx_nodes` expands it
back into the standard nodes it replaced (for onnxruntime and `to_onnx`).

Attribute `bshd` (four ints, for Q, K, V and the output; rank 4 only, CPU only): an
operand flagged 1 is stored [B, S, H, D], as exporters have it before their head split
Transpose (0, 2, 1, 3), which the CPU pass `attention_heads` then absorbs. Every size,
the reference and the ONNX form see the [B, H, S, D] view (`logical_shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.deferred import helper, numpy_helper
from wpk.core.workload import Workload

ATTENTION_OP = "Attention"
ATTENTION_DOMAIN = "wpk"
_RANKS = (3, 4, 5, 6)


def is_attention(workload: Workload) -> bool:
    """Whether the workload is wpk's fused attention."""
    return workload.op == ATTENTION_OP and workload.domain == ATTENTION_DOMAIN


@dataclass(frozen=True)
class AttentionShape:
    """The sizes of one attention workload: `batch` folds every leading dim."""

    batch: int
    sq: int
    sk: int
    d: int
    dv: int
    k_transposed: bool
    scale: float
    mask_shape: tuple[int, ...] | None


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether `shape` broadcasts against `target` without changing it."""
    shape, target = tuple(shape), tuple(target)
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], target[::-1]))


HEADS_PERM = (0, 2, 1, 3)   # [B, S, H, D] <-> [B, H, S, D]


def layout_flags(values) -> tuple[bool, bool, bool, bool]:
    """The attribute `bshd` (absent: None or empty) as four flags for Q, K, V, output."""
    return (tuple(bool(int(f)) for f in values or ()) + (False,) * 4)[:4]


def bshd_flags(workload: Workload) -> tuple[bool, bool, bool, bool]:
    """Which of Q, K, V and the output are stored [B, S, H, D] (attribute `bshd`)."""
    return layout_flags(workload.attr("bshd"))


def logical_shapes(workload: Workload) -> tuple[tuple[int, ...], ...]:
    """The [B, H, S, D] (or rank-3) shapes of Q, K, V and the output, as the op sees them."""
    shapes = [tuple(s.shape) for s in workload.inputs[:3]] + [tuple(workload.outputs[0].shape)]
    return tuple(tuple(shape[i] for i in HEADS_PERM) if flag and len(shape) == 4 else shape
                 for shape, flag in zip(shapes, bshd_flags(workload)))


def attention_reason(workload: Workload) -> str | None:
    """None when the workload is a well-formed fused attention, else what is wrong."""
    if not is_attention(workload):
        return "not wpk's Attention op"
    specs = workload.inputs
    if len(specs) not in (3, 4) or any(s is None for s in specs[:3]):
        return "Attention takes Q, K, V and an optional mask"
    if len(workload.outputs) != 1:
        return "Attention has one output"
    if any(s.dtype != "float32" for s in [*(s for s in specs if s is not None),
                                          *workload.outputs]):
        return "Attention computes float32 only"
    flags = bshd_flags(workload)
    if any(flags) and (len(specs[0].shape) != 4 or len(workload.attr("bshd")) != 4):
        return "Attention's bshd layouts need rank 4 and four flags"
    if flags[1] and workload.attr("k_transposed", 0):
        return "Attention's K is either transposed or [B, S, H, D], not both"
    q, k, v, out = logical_shapes(workload)
    if len(q) not in _RANKS or not len(q) == len(k) == len(v):
        return "Attention's Q, K and V must be rank 3 to 6, all the same rank"
    if not q[:-2] == k[:-2] == v[:-2]:
        return "Attention's Q, K and V must have the same leading (batch, head) dims"
    d, sk = (k[-1], k[-2]) if not workload.attr("k_transposed", 0) else (k[-2], k[-1])
    if d != q[-1] or sk != v[-2]:
        return "Attention's Q, K and V sizes do not agree"
    if out != q[:-1] + (v[-1],):
        return "Attention's output shape is not [..., Sq, Dv]"
    if len(specs) == 4 and specs[3] is not None:
        scores = q[:-1] + (sk,)
        mask = tuple(specs[3].shape)
        if not broadcasts_to(mask, scores):
            return f"mask {list(mask)} does not broadcast against the scores {list(scores)}"
        if folded_mask_shape(mask, scores) is None:
            return (f"mask {list(mask)} broadcasts along some of the scores' leading dims "
                    f"{list(scores[:-3])} and not others: they cannot be folded into one")
    return None


def kernel_rank(rank: int) -> int:
    """The rank the kernels see: 3, or 4 with the leading dims before the heads folded."""
    return min(rank, 4)


def folded_mask_shape(mask: Sequence[int], scores: Sequence[int]) -> tuple[int, ...] | None:
    """The mask's shape against the scores' rank-4 view (`kernel_rank`: the dims before
    the heads folded into one), or None where it broadcasts along some of those dims and
    not others (no single stride walks it); at rank 3 and 4 the mask's own shape."""
    mask, scores = tuple(int(d) for d in mask), tuple(int(d) for d in scores)
    if len(scores) <= 4:
        return mask
    full = (1,) * (len(scores) - len(mask)) + mask
    lead, mask_lead = scores[:-3], full[:-3]
    if all(d == 1 for d in mask_lead):
        folded = 1
    elif all(m == s for m, s in zip(mask_lead, lead)):
        folded = int(np.prod(lead))
    else:
        return None
    return (folded, *full[-3:])


def attention_shape(workload: Workload) -> AttentionShape:
    """The sizes of a well-formed attention workload (check `attention_reason` first)."""
    q, k, v, _ = logical_shapes(workload)
    mask = workload.inputs[3] if len(workload.inputs) > 3 else None
    return AttentionShape(batch=int(np.prod(q[:-2], dtype=np.int64)), sq=q[-2], sk=v[-2],
                          d=q[-1], dv=v[-1], k_transposed=bool(workload.attr("k_transposed", 0)),
                          scale=float(workload.attr("scale", 1.0)),
                          mask_shape=None if mask is None else folded_mask_shape(
                              mask.shape, q[:-1] + (v[-2],)))


def mask_strides(shape: AttentionShape, rank: int) -> tuple[int, int, int, int]:
    """Element strides of the mask along (batch dim 0, batch dim 1, query, key) of the
    rank-4 view of the scores (0 where it broadcasts); rank-3 workloads have no dim 1.
    `rank` is the kernels' (`kernel_rank`), the shape's mask already folded to it."""
    mask = shape.mask_shape or ()
    full = (1,) * (4 - len(mask)) + tuple(mask)
    strides, step = [0, 0, 0, 0], 1
    for axis in range(3, -1, -1):
        if full[axis] != 1:
            strides[axis] = step
        step *= full[axis]
    if rank == 3:  # a rank-3 mask's dims are (batch, query, key): no head dim
        strides = [strides[1], 0, strides[2], strides[3]]
    return tuple(strides)


def attention_formula(workload: Workload, inputs: Sequence[np.ndarray | None]) \
        -> list[np.ndarray]:
    """The float64 reference: softmax(Q K^T scale + mask) V, the softmax shifted by its max."""
    flags = bshd_flags(workload)
    q, k, v = (np.asarray(x, np.float64).transpose(HEADS_PERM) if flag else
               np.asarray(x, np.float64) for x, flag in zip(inputs[:3], flags))
    kt = k if workload.attr("k_transposed", 0) else np.swapaxes(k, -1, -2)
    scores = np.matmul(q, kt) * float(workload.attr("scale", 1.0))
    if len(inputs) > 3 and inputs[3] is not None:
        scores = scores + np.asarray(inputs[3], np.float64)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs, v)
    return [np.ascontiguousarray(out.transpose(HEADS_PERM)) if flags[3] else out]


def attention_onnx_nodes(inputs: Sequence[str], output: str, prefix: str, scale: float,
                         k_transposed: bool, rank: int, opset: int,
                         bshd: Sequence = ()):
    """The standard ONNX nodes of the fused op: [Transpose], MatMul, Mul by the scale (a
    Constant node), [Add mask], Softmax over the last axis, MatMul, and the head-split
    Transposes of the operands stored [B, S, H, D] (`bshd`); names and intermediate
    tensors start with `prefix`."""
    q, k, v = inputs[:3]
    mask = inputs[3] if len(inputs) > 3 and inputs[3] else None
    nodes = []
    heads = []
    bshd = layout_flags(bshd)
    for name, flag, tag in zip((q, k, v), bshd, "qkv"):
        if flag:
            nodes.append(helper.make_node("Transpose", [name], [f"{prefix}{tag}_heads"],
                                          f"{prefix}{tag}_split", perm=list(HEADS_PERM)))
        heads.append(f"{prefix}{tag}_heads" if flag else name)
    q, k, v = heads
    context = f"{prefix}out_heads" if bshd[3] else output
    if not k_transposed:
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        nodes.append(helper.make_node("Transpose", [k], [f"{prefix}kt"], f"{prefix}transpose",
                                      perm=perm))
        k = f"{prefix}kt"
    scale_value = numpy_helper.from_array(np.array(scale, np.float32), f"{prefix}scale")
    nodes.append(helper.make_node("Constant", [], [f"{prefix}scale"], f"{prefix}constant",
                                  value=scale_value))
    nodes.append(helper.make_node("MatMul", [q, k], [f"{prefix}scores"], f"{prefix}qk"))
    nodes.append(helper.make_node("Mul", [f"{prefix}scores", f"{prefix}scale"],
                                  [f"{prefix}scaled"], f"{prefix}scale_mul"))
    logits = f"{prefix}scaled"
    if mask is not None:
        nodes.append(helper.make_node("Add", [logits, mask], [f"{prefix}masked"], f"{prefix}mask"))
        logits = f"{prefix}masked"
    axis = -1 if opset >= 13 else rank - 1  # before 13: the 2-D coercion at the last axis
    nodes.append(helper.make_node("Softmax", [logits], [f"{prefix}probs"], f"{prefix}softmax",
                                  axis=axis))
    nodes.append(helper.make_node("MatMul", [f"{prefix}probs", v], [context], f"{prefix}pv"))
    if bshd[3]:
        nodes.append(helper.make_node("Transpose", [context], [output], f"{prefix}merge",
                                      perm=list(HEADS_PERM)))
    return nodes
