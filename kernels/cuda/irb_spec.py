"""wpk's inverted-residual block on plain NCHW tensors (the CUDA target's layout).

    InvertedResidualNCHW(X, W1, B1, W2, B2, W3, B3) (domain 'wpk')
      H1 = act1(conv1x1(X, W1) + B1)                     expand
      H2 = act2(depthwise KxK stride S (H1, W2) + B2)    depthwise
      Y  = conv1x1(H2, W3) + B3 [+ X]                    project [+ residual]

The CPU's `InvertedResidual` (`wpk.kernels.cpu.inverted_residual_spec`) is
the same block on the blocked NCHWc layout of its convs; this one reads the
standard ONNX Conv nodes of any target without that layout pass. X, Y are
(N, C, H, W); filters and biases are the convs' own (biases may be absent).
Attributes: `channels` (Y's), `expanded` (H1's), `kernel` K, `stride` S,
`pads` (the depthwise's: top, left, bottom, right), `act1`/`act2` (an
epilogue step name or '' for none) with `act1_attrs`/`act2_attrs`, and
`residual` (1: Y adds X). `part_workloads` gives the three standard Conv
workloads, so the float64 reference and the unfused peer are the separate
steps' own, and `part_nodes` the nodes `to_onnx` expands the block into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from wpk.core.epilogue import EPILOGUE_TABLE
from wpk.core.graph import Node
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.cpu.inverted_residual_spec import activation_step

IRB_OP = "InvertedResidualNCHW"
IRB_DOMAIN = "wpk"
KERNELS = (3, 5)
STRIDES = (1, 2)


def is_irb_nchw(workload: Workload) -> bool:
    """Whether the workload is wpk's NCHW inverted-residual block."""
    return workload.op == IRB_OP and workload.domain == IRB_DOMAIN


def depthwise_size(attrs, h: int, w: int) -> tuple[int, int]:
    """(OH, OW) of the depthwise conv."""
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    pt, pl, pb, pr = (int(p) for p in attrs["pads"])
    return (h + pt + pb - k) // s + 1, (w + pl + pr - k) // s + 1


def _conv_attrs(k: int, s: int, pads, group: int) -> tuple:
    return (("dilations", (1, 1)), ("group", group), ("kernel_shape", (k, k)),
            ("pads", tuple(int(p) for p in pads)), ("strides", (s, s)))


def _spec(specs: Sequence, index: int):
    return specs[index] if index < len(specs) else None


def part_workloads(workload: Workload) -> list[Workload]:
    """The expand, depthwise and project Conv workloads; the project's residual is X."""
    attrs = dict(workload.attrs)
    e, k, s = int(attrs["expanded"]), int(attrs["kernel"]), int(attrs["stride"])
    specs = workload.inputs
    x, y = specs[0], workload.outputs[0]
    n, _, h, w = x.shape
    h1 = TensorSpec((n, e, h, w))
    h2 = TensorSpec((n, e, *depthwise_size(attrs, h, w)))

    def consts(first):
        return (1, 2) if _spec(specs, first + 1) is not None else (1,)

    expand = Workload("Conv", (x, specs[1], _spec(specs, 2)), (h1,),
                      _conv_attrs(1, 1, (0, 0, 0, 0), 1),
                      activation_step(attrs["act1"], attrs.get("act1_attrs", ())),
                      const_inputs=consts(1), opset=workload.opset)
    depthwise = Workload("Conv", (h1, specs[3], _spec(specs, 4)), (h2,),
                         _conv_attrs(k, s, attrs["pads"], e),
                         activation_step(attrs["act2"], attrs.get("act2_attrs", ())),
                         const_inputs=consts(3), opset=workload.opset)
    residual = bool(attrs.get("residual", 0))
    project = Workload("Conv", (h2, specs[5], _spec(specs, 6), *((x,) if residual else ())),
                       (y,), _conv_attrs(1, 1, (0, 0, 0, 0), 1),
                       (EpilogueStep("add", (), 3),) if residual else (),
                       const_inputs=consts(5), opset=workload.opset)
    return [expand, depthwise, project]


def part_inputs(workload: Workload, inputs: Sequence, part: int, previous=None) -> list:
    """The inputs of part `part` (0 expand, 1 depthwise, 2 project)."""
    first = 1 + 2 * part
    own = [inputs[0] if part == 0 else previous, inputs[first],
           inputs[first + 1] if first + 1 < len(inputs) else None]
    if part == 2 and workload.attr("residual", 0):
        own.append(inputs[0])
    return own


def irb_formula(workload: Workload, inputs: Sequence) -> list[np.ndarray]:
    """The float64 reference: the three convs' own references, one after the other."""
    from wpk.kernels.reference import reference  # the reference imports this module

    value = None
    for index, part in enumerate(part_workloads(workload)):
        value = reference(part, part_inputs(workload, inputs, index, value))[0]
    return [value]


def irb_reason(workload: Workload) -> str | None:
    """None when the workload is a well-formed NCHW block, else what is wrong."""
    if not is_irb_nchw(workload):
        return "not wpk's InvertedResidualNCHW op"
    specs = workload.inputs
    if len(specs) != 7 or any(specs[i] is None for i in (0, 1, 3, 5)):
        return "the block takes X, W1, B1, W2, B2, W3, B3 (biases may be absent)"
    if any(s.dtype != "float32" for s in (*(s for s in specs if s is not None),
                                          *workload.outputs)):
        return "the fused block computes float32 only"
    attrs = dict(workload.attrs)
    missing = [k for k in ("channels", "expanded", "kernel", "stride", "pads", "act1",
                           "act2") if k not in attrs]
    if missing:
        return f"the block lacks attributes {missing}"
    for name in ("act1", "act2"):
        op = attrs[name]
        if op and (op not in EPILOGUE_TABLE or EPILOGUE_TABLE[op].arity != 1):
            return f"activation {op!r} is not a one-operand epilogue step"
    if int(attrs["kernel"]) not in KERNELS or int(attrs["stride"]) not in STRIDES:
        return "the depthwise conv must be 3x3 or 5x5, stride 1 or 2"
    x, y = specs[0], workload.outputs[0]
    e, c = int(attrs["expanded"]), int(attrs["channels"])
    if len(x.shape) != 4:
        return "the block's input must be an NCHW tensor"
    n, cin, h, w = x.shape
    want = {1: (e, cin, 1, 1), 2: (e,), 3: (e, 1, attrs["kernel"], attrs["kernel"]),
            4: (e,), 5: (c, e, 1, 1), 6: (c,)}
    for index, shape in want.items():
        if specs[index] is not None and tuple(specs[index].shape) != tuple(shape):
            return f"input {index} has shape {list(specs[index].shape)}, not {list(shape)}"
    if tuple(y.shape) != (n, c, *depthwise_size(attrs, h, w)):
        return "the block's output shape does not follow from its input and attributes"
    if attrs.get("residual", 0) and tuple(x.shape) != tuple(y.shape):
        return "a residual block's input and output must have one shape"
    return None


def part_nodes(node: Node, fresh: Callable[[str], str]) -> list[Node]:
    """The three standard Conv nodes the fused node stands for."""
    attrs = node.attrs
    k, s, e = int(attrs["kernel"]), int(attrs["stride"]), int(attrs["expanded"])
    x, w1, b1, w2, b2, w3, b3 = node.inputs
    out = node.outputs[0]
    h1, h2 = fresh(out + "_expanded"), fresh(out + "_depthwise")
    residual = bool(attrs.get("residual", 0))
    return [
        Node("Conv", [x, w1, b1], [h1], node.name, dict(_conv_attrs(1, 1, (0,) * 4, 1)),
             epilogue=activation_step(attrs["act1"], attrs.get("act1_attrs", ()))),
        Node("Conv", [h1, w2, b2], [h2], f"{node.name}/depthwise",
             dict(_conv_attrs(k, s, attrs["pads"], e)),
             epilogue=activation_step(attrs["act2"], attrs.get("act2_attrs", ()))),
        Node("Conv", [h2, w3, b3, *([x] if residual else [])], [out], f"{node.name}/project",
             dict(_conv_attrs(1, 1, (0,) * 4, 1)),
             epilogue=(EpilogueStep("add", (), 3),) if residual else ()),
    ]


def irb_workload(n: int, cin: int, expanded: int, cout: int, h: int, w: int, k: int = 3,
                 stride: int = 1, act: tuple = ("clip", (("max", 6.0), ("min", 0.0))),
                 residual: bool = False, biases: bool = True) -> Workload:
    """A block workload of the given sizes (tests, benchmarks): pads K // 2, the same
    activation after the expand and the depthwise."""
    p = k // 2
    attrs = {"channels": cout, "expanded": expanded, "kernel": k, "stride": stride,
             "pads": (p, p, p, p), "act1": act[0], "act1_attrs": act[1], "act2": act[0],
             "act2_attrs": act[1], "residual": int(residual)}
    x = TensorSpec((n, cin, h, w))
    y = TensorSpec((n, cout, *depthwise_size(attrs, h, w)))
    shapes = [(expanded, cin, 1, 1), (expanded,), (expanded, 1, k, k), (expanded,),
              (cout, expanded, 1, 1), (cout,)]
    inputs = (x, *(TensorSpec(s) if biases or len(s) > 1 else None for s in shapes))
    return Workload(IRB_OP, inputs, (y,), tuple(sorted(attrs.items())), domain=IRB_DOMAIN,
                    const_inputs=tuple(i for i in range(1, 7) if inputs[i] is not None))
