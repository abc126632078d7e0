"""Match and rewrite of MobileNet's inverted-residual block into wpk's fused
`InvertedResidual` op (rule `inverted_residual`, run on the CPU after the NCHWc layout pass).

    H1 = Conv1x1(X)  + act1           (wpk.nchwc, group 1, stride 1, no pads)
    H2 = ConvKxK(H1) + act2           (wpk.nchwc depthwise: group = channels, K 3 or 5,
                                       stride 1 or 2)
    Y  = Conv1x1(H2) [+ X]            (wpk.nchwc, no activation; the residual only at
                                       stride 1, and only when the operand is X itself)
                        ->  InvertedResidual(X, W1, B1, W2, B2, W3, B3)

Fires only when H1 and H2 each have the next conv as their only reader and are
no graph outputs, every filter and bias is a constant, X is a blocked tensor
and the fused workload is well formed (`inverted_residual_reason`: the parts
are convs onnxruntime's NCHWc kernels compute, the activations are ones the
fused kernel carries). The op, its float64 formula and its parts are defined
in `wpk.kernels.cpu.inverted_residual_spec`; expansion-1 blocks (no expand conv)
and squeeze-excitation gates between the depthwise and the project conv are not
matched.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.graph import Node
from wpk.core.workload import Workload
from wpk.kernels.cpu.inverted_residual_spec import (
    IR_ACTIVATIONS,
    IR_DOMAIN,
    IR_OP,
    inverted_residual_reason,
)
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN
from wpk.passes.fusion import FusionContext, FusionRule


@dataclass(frozen=True)
class BlockMatch:
    """The three convs of a block and the fused node's inputs and attributes."""

    depthwise: Node
    project: Node
    inputs: tuple[str, ...]
    attrs: dict


def _activation(node: Node) -> tuple[str, tuple] | None:
    """('', ()) for no epilogue, (step name, attrs) for one carried activation, else None."""
    if not node.epilogue:
        return "", ()
    step = node.epilogue[0]
    if len(node.epilogue) != 1 or step.op not in IR_ACTIVATIONS or step.operand is not None:
        return None
    return step.op, tuple(step.attrs)


def _conv(node: Node | None, kernel: int | tuple[int, ...], group_ok) -> bool:
    """A wpk.nchwc Conv, unit dilations, square kernel in `kernel`, whose group passes."""
    if node is None or node.op != "Conv" or node.domain != NCHWC_DOMAIN:
        return False
    kernels = (kernel,) if isinstance(kernel, int) else kernel
    shape = tuple(node.attr("kernel_shape", ()))
    return len(shape) == 2 and shape[0] == shape[1] and shape[0] in kernels \
        and tuple(node.attr("dilations", (1, 1))) == (1, 1) and group_ok(node)


def _pointwise(node: Node | None) -> bool:
    return _conv(node, 1, lambda n: int(n.attr("group", 1)) == 1) \
        and tuple(node.attr("strides", (1, 1))) == (1, 1) \
        and tuple(node.attr("pads", (0, 0, 0, 0))) == (0, 0, 0, 0)


def _constants(ctx: FusionContext, node: Node) -> tuple[str, str] | None:
    """(filter, bias or '') of a conv whose filter and bias are constants, else None."""
    weight = node.inputs[1] if len(node.inputs) > 1 else ""
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if ctx.const(weight) is None or (bias and ctx.const(bias) is None):
        return None
    return weight, bias


def _depthwise_of(ctx: FusionContext, expand: Node) -> Node | None:
    node = ctx.single_consumer(expand)
    channels = int(expand.attr("channels", 0))
    ok = _conv(node, (3, 5), lambda n: int(n.attr("group", 1)) == channels
               and int(n.attr("channels", 0)) == channels)
    if not ok or node.inputs[0] != expand.outputs[0]:
        return None
    strides = tuple(node.attr("strides", (1, 1)))
    return node if strides[0] == strides[1] and strides[0] in (1, 2) else None


def _residual(project: Node, x: str, stride: int) -> int | None:
    """1 when the project conv adds X (stride 1 only), 0 without an epilogue, else None."""
    if not project.epilogue:
        return 0 if len(project.inputs) <= 3 else None
    step = project.epilogue[0]
    if len(project.epilogue) != 1 or step.op != "add" or step.operand != 3 \
            or len(project.inputs) != 4 or project.inputs[3] != x or stride != 1:
        return None
    return 1


def match_block(ctx: FusionContext, expand: Node) -> BlockMatch | None:
    """The inverted-residual block starting at `expand`, or None (see the module docstring)."""
    if not _pointwise(expand) or len(expand.inputs) > 3:
        return None
    x = expand.inputs[0]
    info = ctx.graph.tensors.get(x)
    act1 = _activation(expand)
    depthwise = _depthwise_of(ctx, expand)
    if info is None or len(info.shape) != 5 or act1 is None or depthwise is None \
            or len(depthwise.inputs) > 3:
        return None
    act2 = _activation(depthwise)
    project = ctx.single_consumer(depthwise)
    if act2 is None or not _pointwise(project) or project.inputs[0] != depthwise.outputs[0]:
        return None
    stride = int(depthwise.attr("strides")[0])
    residual = _residual(project, x, stride)
    parts = [_constants(ctx, n) for n in (expand, depthwise, project)]
    if residual is None or any(p is None for p in parts):
        return None
    attrs = {"block": int(expand.attr("block")), "channels": int(project.attr("channels")),
             "expanded": int(expand.attr("channels")),
             "kernel": int(depthwise.attr("kernel_shape")[0]), "stride": stride,
             "pads": tuple(int(p) for p in depthwise.attr("pads")), "act1": act1[0],
             "act1_attrs": act1[1], "act2": act2[0], "act2_attrs": act2[1],
             "residual": residual}
    inputs = (x, *(name for part in parts for name in part))
    if inverted_residual_reason(_workload(ctx, inputs, project, attrs)) is not None:
        return None
    return BlockMatch(depthwise, project, inputs, attrs)


def _workload(ctx: FusionContext, inputs: tuple[str, ...], project: Node, attrs: dict):
    tensors = ctx.graph.tensors
    return Workload(IR_OP, tuple(tensors[n].spec if n else None for n in inputs),
                    (tensors[project.outputs[0]].spec,), tuple(sorted(attrs.items())),
                    domain=IR_DOMAIN,
                    const_inputs=tuple(k for k, n in enumerate(inputs) if ctx.const(n) is not None),
                    opset=ctx.graph.opset)


def rewrite_block(ctx: FusionContext, expand: Node, found: BlockMatch) -> None:
    """The expand conv becomes the fused node, in the project conv's place; the rest go."""
    expand.op, expand.domain, expand.inputs = IR_OP, IR_DOMAIN, list(found.inputs)
    expand.attrs = dict(found.attrs)
    expand.epilogue = ()
    ctx.absorb(expand, found.project, remove=[found.depthwise])


INVERTED_RESIDUAL_RULES = [
    FusionRule("inverted_residual", frozenset({"Conv"}), match_block, rewrite_block,
               "blocked Conv1x1+act -> depthwise KxK+act -> Conv1x1 [+ X] -> wpk "
               "InvertedResidual (one fused kernel, the expanded tensor only in cache)"),
]
