"""Match and rewrite of MobileNet's and EfficientNet's inverted-residual blocks into wpk's
fused `InvertedResidual` op (rule `inverted_residual`, run on the CPU after the NCHWc layout
pass).

    H1 = Conv1x1(X)  + act1           (wpk.nchwc, group 1, stride 1, no pads; absent in an
                                       expansion-1 block, whose depthwise reads X)
    H2 = ConvKxK(H1) + act2           (wpk.nchwc depthwise: group = channels, K 3 or 5,
                                       stride 1 or 2)
    [G = act4(Conv1x1(act3(Conv1x1(GlobalAveragePool(H2)))));  H2 = H2 * G]   (the gate)
    Y  = Conv1x1(H2) [+ X]            (wpk.nchwc, no activation; the residual only at
                                       stride 1, and only when the operand is X itself)
                        ->  InvertedResidual(X, W1, B1, W2, B2, W3, B3[, WR, BR, WE, BE])

An activation is either the Conv's fused epilogue (the ones MLAS fuses) or the
blocked one-step `Elementwise` node the layout pass leaves after it (HardSwish,
SiLU); both are folded into the block. Fires only when every intermediate
tensor has the block's next step as its only reader (H2 with a gate: the pool
and the multiply) and is no graph output, every filter and bias is a constant,
X is a blocked tensor and the fused workload is well formed
(`inverted_residual_reason`: the parts are steps onnxruntime's NCHWc kernels
compute, the activations are ones the fused kernel carries). The op, its
float64 formula and its parts are defined in
`wpk.kernels.cpu.inverted_residual_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.graph import Node
from wpk.core.workload import Workload
from wpk.kernels.cpu.inverted_residual_spec import (
    ELEMENTWISE,
    IR_ACTIVATIONS,
    IR_DOMAIN,
    IR_OP,
    inverted_residual_reason,
)
from wpk.kernels.nchwc_format import SPARSE_GROUPS
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN
from wpk.passes.fusion import FusionContext, FusionRule


@dataclass(frozen=True)
class BlockMatch:
    """The block's nodes (the anchor's first, the project conv last) and the fused node's
    inputs and attributes."""

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    attrs: dict


@dataclass(frozen=True)
class Stage:
    """A conv and its activation: in its epilogue, or the Elementwise node after it."""

    nodes: tuple[Node, ...]
    act: tuple[str, tuple]
    output: str


def _activation(node: Node) -> tuple[str, tuple] | None:
    """('', ()) for no epilogue, (step name, attrs) for one carried activation, else None."""
    if not node.epilogue:
        return "", ()
    step = node.epilogue[0]
    if len(node.epilogue) != 1 or step.op not in IR_ACTIVATIONS or step.operand is not None:
        return None
    return step.op, tuple(step.attrs)


def _elementwise_activation(node: Node | None, source: str) -> tuple[str, tuple] | None:
    """The activation of a blocked one-step Elementwise node reading only `source`."""
    if node is None or node.op != ELEMENTWISE or node.domain != IR_DOMAIN \
            or list(node.inputs) != [source] or len(node.epilogue) != 1:
        return None
    act = _activation(node)
    return act if act and act[0] else None


def _stage(ctx: FusionContext, conv: Node) -> Stage | None:
    act = _activation(conv)
    if act is None:
        return None
    if not act[0]:
        after = ctx.single_consumer(conv)
        folded = _elementwise_activation(after, conv.outputs[0])
        if folded is not None:
            return Stage((conv, after), folded, after.outputs[0])
    return Stage((conv,), act, conv.outputs[0])


def _conv(node: Node | None, kernel: int | tuple[int, ...], group_ok) -> bool:
    """A wpk.nchwc Conv, unit dilations, square kernel in `kernel`, whose group passes."""
    if node is None or node.op != "Conv" or node.domain != NCHWC_DOMAIN:
        return False
    kernels = (kernel,) if isinstance(kernel, int) else kernel
    shape = tuple(node.attr("kernel_shape", ()))
    return len(shape) == 2 and shape[0] == shape[1] and shape[0] in kernels \
        and tuple(node.attr("dilations", (1, 1))) == (1, 1) and group_ok(node)


def _pointwise(node: Node | None, source: str | None = None) -> bool:
    """A plain 1x1 conv (reading `source` first, when given) with at most filter and bias."""
    # (not a dense conv of sparse groups: the block's kernel would multiply their zeros)
    return _conv(node, 1, lambda n: int(n.attr("group", 1)) == 1
                 and not n.attr(SPARSE_GROUPS, 0)) \
        and tuple(node.attr("strides", (1, 1))) == (1, 1) \
        and tuple(node.attr("pads", (0, 0, 0, 0))) == (0, 0, 0, 0) \
        and (source is None or node.inputs[0] == source)


def _constants(ctx: FusionContext, node: Node) -> tuple[str, str] | None:
    """(filter, bias or '') of a conv whose filter and bias are constants, else None."""
    weight = node.inputs[1] if len(node.inputs) > 1 else ""
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if ctx.const(weight) is None or (bias and ctx.const(bias) is None):
        return None
    return weight, bias


def _depthwise(node: Node | None, source: str) -> bool:
    """A 3x3 or 5x5 depthwise conv of `source` (group = channels), stride 1 or 2."""
    if node is None or not node.inputs or node.inputs[0] != source or len(node.inputs) > 3:
        return False
    channels = int(node.attr("channels", 0))
    if not _conv(node, (3, 5), lambda n: int(n.attr("group", 1)) == channels):
        return False
    strides = tuple(node.attr("strides", (1, 1)))
    return strides[0] == strides[1] and strides[0] in (1, 2)


def _gate_multiply(node: Node, source: str) -> bool:
    """The blocked `source * gate` Elementwise of a squeeze-excitation."""
    return node.op == ELEMENTWISE and node.domain == IR_DOMAIN and len(node.inputs) == 2 \
        and node.inputs[0] == source and len(node.epilogue) == 1 \
        and node.epilogue[0].op == "mul" and node.epilogue[0].operand == 1 \
        and not node.epilogue[0].swap


def _gate(ctx: FusionContext, h2: str) -> tuple[list[Stage], Node, Node] | None:
    """The gate on `h2` (pool, reduce and expand stages) and its multiply, or None."""
    users = ctx.users.get(h2, [])
    if h2 in ctx.pinned or len(users) != 2:
        return None
    pool = next((u for u in users if u.op == "GlobalAveragePool"
                 and u.domain == NCHWC_DOMAIN and not u.epilogue), None)
    multiply = next((u for u in users if _gate_multiply(u, h2)), None)
    if pool is None or multiply is None:
        return None
    stages, source = [], pool.outputs[0]
    for _ in range(2):
        conv = ctx.single_user(source)
        stage = _stage(ctx, conv) if _pointwise(conv, source) and len(conv.inputs) <= 3 \
            else None
        if stage is None:
            return None
        stages.append(stage)
        source = stage.output
    if source != multiply.inputs[1] or ctx.single_user(source) is not multiply:
        return None
    return stages, pool, multiply


def _residual(project: Node, x: str, stride: int) -> int | None:
    """1 when the project conv adds X (stride 1 only), 0 without an epilogue, else None."""
    if not project.epilogue:
        return 0 if len(project.inputs) <= 3 else None
    step = project.epilogue[0]
    if len(project.epilogue) != 1 or step.op != "add" or step.operand != 3 \
            or len(project.inputs) != 4 or project.inputs[3] != x or stride != 1:
        return None
    return 1


def _front(ctx: FusionContext, anchor: Node) -> tuple[str, Stage | None, Stage] | None:
    """(X, the expand stage or None, the depthwise stage) of a block starting at `anchor`."""
    if _pointwise(anchor) and len(anchor.inputs) <= 3:
        expand = _stage(ctx, anchor)
        if expand is None:
            return None
        depthwise = ctx.single_user(expand.output)
        if not _depthwise(depthwise, expand.output) \
                or int(depthwise.attr("channels")) != int(anchor.attr("channels")):
            return None
    elif _depthwise(anchor, anchor.inputs[0] if anchor.inputs else ""):
        expand, depthwise = None, anchor
    else:
        return None
    stage = _stage(ctx, depthwise)
    return (anchor.inputs[0], expand, stage) if stage is not None else None


def match_block(ctx: FusionContext, anchor: Node) -> BlockMatch | None:
    """The inverted-residual block starting at `anchor` (its expand conv, or at expansion 1
    its depthwise conv), or None (see the module docstring)."""
    front = _front(ctx, anchor)
    if front is None:
        return None
    x, expand, depthwise = front
    info = ctx.graph.tensors.get(x)
    if info is None or len(info.shape) != 5:
        return None
    gate = _gate(ctx, depthwise.output)
    if gate is not None:
        stages, pool, multiply = gate
        source, extra = multiply.outputs[0], [pool, *(n for s in stages for n in s.nodes),
                                              multiply]
    else:
        stages, source, extra = [], depthwise.output, []
    project = ctx.single_user(source)
    if not _pointwise(project, source):
        return None
    dw = depthwise.nodes[0]
    stride = int(dw.attr("strides")[0])
    residual = _residual(project, x, stride)
    convs = [expand.nodes[0]] if expand else []
    convs += [dw, project, *(s.nodes[0] for s in stages)]
    parts = [_constants(ctx, n) for n in convs]
    if residual is None or any(p is None for p in parts):
        return None
    if not expand:
        parts.insert(0, ("", ""))
    act1 = expand.act if expand else ("", ())
    attrs = {"block": int(dw.attr("block")), "channels": int(project.attr("channels")),
             "expanded": int(dw.attr("channels")), "kernel": int(dw.attr("kernel_shape")[0]),
             "stride": stride, "pads": tuple(int(p) for p in dw.attr("pads")),
             "act1": act1[0], "act1_attrs": act1[1], "act2": depthwise.act[0],
             "act2_attrs": depthwise.act[1], "residual": residual}
    if stages:
        attrs.update(se=1, squeezed=int(stages[0].nodes[0].attr("channels")),
                     se_act1=stages[0].act[0], se_act1_attrs=stages[0].act[1],
                     se_act2=stages[1].act[0], se_act2_attrs=stages[1].act[1])
    inputs = (x, *(name for part in parts for name in part))
    if inverted_residual_reason(_workload(ctx, inputs, project, attrs)) is not None:
        return None
    nodes = (*(expand.nodes if expand else ()), *depthwise.nodes, *extra, project)
    return BlockMatch(nodes, inputs, attrs)


def _workload(ctx: FusionContext, inputs: tuple[str, ...], project: Node, attrs: dict):
    tensors = ctx.graph.tensors
    return Workload(IR_OP, tuple(tensors[n].spec if n else None for n in inputs),
                    (tensors[project.outputs[0]].spec,), tuple(sorted(attrs.items())),
                    domain=IR_DOMAIN,
                    const_inputs=tuple(k for k, n in enumerate(inputs) if ctx.const(n) is not None),
                    opset=ctx.graph.opset)


def rewrite_block(ctx: FusionContext, anchor: Node, found: BlockMatch) -> None:
    """The anchor becomes the fused node, in the project conv's place; the rest go."""
    anchor.op, anchor.domain, anchor.inputs = IR_OP, IR_DOMAIN, list(found.inputs)
    anchor.attrs = dict(found.attrs)
    anchor.epilogue = ()
    ctx.absorb(anchor, found.nodes[-1], remove=list(found.nodes[1:-1]))


INVERTED_RESIDUAL_RULES = [
    FusionRule("inverted_residual", frozenset({"Conv"}), match_block, rewrite_block,
               "blocked [Conv1x1+act ->] depthwise KxK+act [-> squeeze-excite gate] -> "
               "Conv1x1 [+ X] -> wpk InvertedResidual (one fused kernel, the expanded "
               "tensor only in cache)"),
]
