"""Match and rewrite of MobileNet's inverted-residual block on standard NCHW convs into
wpk's `InvertedResidualNCHW` (rule `inverted_residual_nchw`, run on the CUDA target).

    H1 = Conv1x1(X)  + act1           (group 1, stride 1, no pads)
    H2 = ConvKxK(H1) + act2           (depthwise: group = H1's channels, K 3 or 5,
                                       stride 1 or 2, unit dilations)
    Y  = Conv1x1(H2) [+ X]            (no activation; the residual only at stride 1,
                                       and only when the operand is X itself)
                        ->  InvertedResidualNCHW(X, W1, B1, W2, B2, W3, B3)

The CPU's rule (`wpk.passes.inverted_residual`) matches the same block on the
blocked convs of its NCHWc layout; this one matches the standard ONNX Conv
nodes the CUDA target keeps. Fires only when H1 and H2 each have the next conv
as their only reader and are no graph outputs, every filter and bias is a
constant, each activation is one one-operand epilogue step, and the fused
workload is well formed (`irb_reason`). The op is defined in
`wpk.kernels.cuda.irb_spec`; expansion-1 blocks and squeeze-excitation gates
are not matched.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.epilogue import EPILOGUE_TABLE
from wpk.core.graph import Node
from wpk.core.workload import Workload
from wpk.kernels.cuda.irb_spec import IRB_DOMAIN, IRB_OP, irb_reason
from wpk.passes.fusion import FusionContext, FusionRule
from wpk.passes.inverted_residual import _constants, _residual


@dataclass(frozen=True)
class NchwBlock:
    """The three convs of a block and the fused node's inputs and attributes."""

    depthwise: Node
    project: Node
    inputs: tuple[str, ...]
    attrs: dict


def _activation(node: Node) -> tuple[str, tuple] | None:
    """('', ()) without an epilogue, (step, attrs) for one one-operand step, else None."""
    if not node.epilogue:
        return "", ()
    step = node.epilogue[0]
    row = EPILOGUE_TABLE.get(step.op)
    if len(node.epilogue) != 1 or row is None or row.arity != 1 or step.operand is not None:
        return None
    return step.op, tuple(step.attrs)


def _kernel(ctx: FusionContext, node: Node) -> tuple[int, ...]:
    """The conv's kernel shape: its attribute, else its filter's spatial dims."""
    shape = node.attr("kernel_shape")
    if shape is None and len(node.inputs) > 1:
        info = ctx.graph.tensors.get(node.inputs[1])
        shape = info.shape[2:] if info is not None else ()
    return tuple(int(d) for d in shape or ())


def _conv(ctx: FusionContext, node: Node | None, kernels: tuple[int, ...]) -> bool:
    if node is None or node.op != "Conv" or node.domain not in ("", "ai.onnx"):
        return False
    shape = _kernel(ctx, node)
    return len(shape) == 2 and shape[0] == shape[1] and shape[0] in kernels \
        and tuple(node.attr("dilations", (1, 1))) == (1, 1)


def _pointwise(ctx: FusionContext, node: Node | None) -> bool:
    return _conv(ctx, node, (1,)) and int(node.attr("group", 1)) == 1 \
        and tuple(node.attr("strides", (1, 1))) == (1, 1) \
        and tuple(node.attr("pads", (0, 0, 0, 0))) == (0, 0, 0, 0)


def _channels(ctx: FusionContext, name: str) -> int | None:
    info = ctx.graph.tensors.get(name)
    return int(info.shape[1]) if info is not None and len(info.shape) == 4 else None


def _depthwise_of(ctx: FusionContext, expand: Node) -> Node | None:
    node = ctx.single_consumer(expand)
    channels = _channels(ctx, expand.outputs[0])
    if not _conv(ctx, node, (3, 5)) or node.inputs[0] != expand.outputs[0] \
            or channels is None or int(node.attr("group", 1)) != channels:
        return None
    strides = tuple(node.attr("strides", (1, 1)))
    return node if strides[0] == strides[1] and strides[0] in (1, 2) else None


def match_nchw_block(ctx: FusionContext, expand: Node) -> NchwBlock | None:
    """The NCHW inverted-residual block starting at `expand`, or None."""
    if not _pointwise(ctx, expand) or len(expand.inputs) > 3:
        return None
    x = expand.inputs[0]
    act1, depthwise = _activation(expand), _depthwise_of(ctx, expand)
    if _channels(ctx, x) is None or act1 is None or depthwise is None \
            or len(depthwise.inputs) > 3:
        return None
    act2 = _activation(depthwise)
    project = ctx.single_consumer(depthwise)
    if act2 is None or not _pointwise(ctx, project) or project.inputs[0] != depthwise.outputs[0]:
        return None
    stride = int(depthwise.attr("strides", (1, 1))[0])
    residual = _residual(project, x, stride)
    parts = [_constants(ctx, n) for n in (expand, depthwise, project)]
    if residual is None or any(p is None for p in parts):
        return None
    attrs = {"channels": _channels(ctx, project.outputs[0]),
             "expanded": _channels(ctx, expand.outputs[0]),
             "kernel": _kernel(ctx, depthwise)[0], "stride": stride,
             "pads": tuple(int(p) for p in depthwise.attr("pads", (0, 0, 0, 0))),
             "act1": act1[0], "act1_attrs": act1[1], "act2": act2[0], "act2_attrs": act2[1],
             "residual": residual}
    inputs = (x, *(name for part in parts for name in part))
    tensors = ctx.graph.tensors
    workload = Workload(IRB_OP, tuple(tensors[n].spec if n else None for n in inputs),
                        (tensors[project.outputs[0]].spec,), tuple(sorted(attrs.items())),
                        domain=IRB_DOMAIN, opset=ctx.graph.opset)
    if irb_reason(workload) is not None:
        return None
    return NchwBlock(depthwise, project, inputs, attrs)


def rewrite_nchw_block(ctx: FusionContext, expand: Node, found: NchwBlock) -> None:
    """The expand conv becomes the fused node, in the project conv's place; the rest go."""
    expand.op, expand.domain, expand.inputs = IRB_OP, IRB_DOMAIN, list(found.inputs)
    expand.attrs = dict(found.attrs)
    expand.epilogue = ()
    ctx.absorb(expand, found.project, remove=[found.depthwise])


INVERTED_RESIDUAL_NCHW_RULES = [
    FusionRule("inverted_residual_nchw", frozenset({"Conv"}), match_nchw_block,
               rewrite_nchw_block,
               "Conv1x1+act -> depthwise KxK+act -> Conv1x1 [+ X] (NCHW) -> wpk "
               "InvertedResidualNCHW (one fused CUDA kernel, the expanded tensor on chip)"),
]
