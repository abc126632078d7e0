"""wpk's fused inverted-residual block: what it computes, its parts and its float64 formula.

    InvertedResidual(X, W1, B1, W2, B2, W3, B3) (domain 'wpk')
      H1 = act1(conv1x1(X, W1) + B1)                     expand
      H2 = act2(depthwise KxK stride S (H1, W2) + B2)    depthwise
      Y  = conv1x1(H2, W3) + B3 [+ X]                    project [+ residual]

Every tensor is in the NCHWc blocked layout of `wpk.passes.nchwc_layout`
(X and Y (N, Cb, H, W, b)); the filters and biases are the logical ones of
the three `wpk.nchwc` Conv nodes the block replaced (biases may be absent).
Attributes: `block`, `channels` (Y's logical channels), `expanded` (H1's),
`kernel` K, `stride` S, `pads` (top, left, bottom, right of the depthwise),
`act1`/`act2` (an epilogue step name or '' for none) with `act1_attrs`/
`act2_attrs` (its (name, value) pairs) and `residual` (1: Y adds X).

`part_workloads` gives the three `wpk.nchwc` Conv workloads of the block, so
the float64 reference, onnxruntime's candidate and the inverse rewrite
(`part_nodes`, for `to_onnx`) are the separate steps' own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from wpk.core.graph import Node
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN

IR_OP = "InvertedResidual"
IR_DOMAIN = "wpk"
# The activations the fused block carries after the expand and the depthwise conv (the
# MLAS activations of a wpk.nchwc Conv whose value at 0 the kernel need not know)
IR_ACTIVATIONS = frozenset({"relu", "clip", "leaky_relu", "hard_sigmoid"})
PART_NAMES = ("expand", "depthwise", "project")


def is_inverted_residual(workload: Workload) -> bool:
    """Whether the workload is wpk's fused inverted-residual block."""
    return workload.op == IR_OP and workload.domain == IR_DOMAIN


def activation_step(name: str, attrs) -> tuple[EpilogueStep, ...]:
    """The epilogue of a part whose activation is `name` ('' for none) with `attrs`."""
    if not name:
        return ()
    return (EpilogueStep(str(name), tuple((str(k), float(v)) for k, v in attrs)),)


def blocked(n: int, channels: int, h: int, w: int, b: int) -> TensorSpec:
    """The spec of a blocked float32 tensor of `channels` logical channels."""
    return TensorSpec((n, -(-channels // b), h, w, b), "float32")


def _spec(specs: Sequence[TensorSpec | None], index: int) -> TensorSpec | None:
    return specs[index] if index < len(specs) else None


def part_specs(attrs: Mapping, x: TensorSpec) -> tuple[TensorSpec, TensorSpec]:
    """The specs of the expanded tensor H1 and the depthwise output H2."""
    b, e = int(attrs["block"]), int(attrs["expanded"])
    n, _, h, w, _ = x.shape
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    pt, pl, pb, pr = (int(p) for p in attrs["pads"])
    oh, ow = (h + pt + pb - k) // s + 1, (w + pl + pr - k) // s + 1
    return blocked(n, e, h, w, b), blocked(n, e, oh, ow, b)


def _conv_attrs(k: int, s: int, pads, group: int, b: int, channels: int) -> tuple:
    return (("block", b), ("channels", channels), ("dilations", (1, 1)), ("group", group),
            ("kernel_shape", (k, k)), ("pads", tuple(int(p) for p in pads)), ("strides", (s, s)))


def part_workloads(workload: Workload) -> list[Workload]:
    """The expand, depthwise and project `wpk.nchwc` Conv workloads of the block, inputs
    (X, W, B[, R]) with the filter and bias constant; the project's residual R is X."""
    attrs = dict(workload.attrs)
    b, e, c = int(attrs["block"]), int(attrs["expanded"]), int(attrs["channels"])
    specs = workload.inputs
    x, y = specs[0], workload.outputs[0]
    h1, h2 = part_specs(attrs, x)
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    common = dict(domain=NCHWC_DOMAIN, opset=workload.opset)
    expand = Workload("Conv", (x, specs[1], _spec(specs, 2)), (h1,),
                      _conv_attrs(1, 1, (0, 0, 0, 0), 1, b, e),
                      activation_step(attrs["act1"], attrs.get("act1_attrs", ())),
                      const_inputs=_consts(specs, 1), **common)
    depthwise = Workload("Conv", (h1, specs[3], _spec(specs, 4)), (h2,),
                         _conv_attrs(k, s, attrs["pads"], e, b, e),
                         activation_step(attrs["act2"], attrs.get("act2_attrs", ())),
                         const_inputs=_consts(specs, 3), **common)
    residual = bool(attrs.get("residual", 0))
    project = Workload("Conv", (h2, specs[5], _spec(specs, 6), *((x,) if residual else ())),
                       (y,), _conv_attrs(1, 1, (0, 0, 0, 0), 1, b, c),
                       (EpilogueStep("add", (), 3),) if residual else (),
                       const_inputs=_consts(specs, 5), **common)
    return [expand, depthwise, project]


def _consts(specs: Sequence[TensorSpec | None], first: int) -> tuple[int, ...]:
    """The constant inputs (filter, bias when present) of the part whose filter is `first`."""
    return (1, 2) if _spec(specs, first + 1) is not None else (1,)


def part_inputs(workload: Workload, inputs: Sequence, part: int, previous=None) -> list:
    """The inputs of part `part` (0 expand, 1 depthwise, 2 project) from the block's inputs
    and the previous part's output."""
    first = 1 + 2 * part
    own = [inputs[0] if part == 0 else previous, inputs[first],
           inputs[first + 1] if first + 1 < len(inputs) else None]
    if part == 2 and workload.attr("residual", 0):
        own.append(inputs[0])
    return own


def run_parts(workload: Workload, inputs: Sequence, step: Callable) -> list:
    """The block's output by `step(part_workload, part_inputs) -> output`, part by part."""
    value = None
    for index, part in enumerate(part_workloads(workload)):
        value = step(part, part_inputs(workload, inputs, index, value))
    return [value]


def inverted_residual_formula(workload: Workload, inputs: Sequence) -> list[np.ndarray]:
    """The float64 reference: the three blocked convs' own references, one after the other."""
    from wpk.kernels.nchwc_reference import nchwc_reference  # the reference imports this module
    return run_parts(workload, inputs, lambda part, values: nchwc_reference(part, values)[0])


def inverted_residual_reason(workload: Workload) -> str | None:
    """None when the workload is a well-formed fused block, else what is wrong."""
    if not is_inverted_residual(workload):
        return "not wpk's InvertedResidual op"
    specs = workload.inputs
    if len(specs) != 7 or any(specs[i] is None for i in (0, 1, 3, 5)):
        return "InvertedResidual takes X, W1, B1, W2, B2, W3, B3 (biases may be absent)"
    if any(i not in workload.const_inputs for i in range(1, 7) if specs[i] is not None):
        return "the block's filters and biases must be constants"
    if any(s.dtype != "float32" for s in (*(s for s in specs if s is not None),
                                          *workload.outputs)):
        return "the fused block computes float32 only"
    attrs = dict(workload.attrs)
    missing = [k for k in ("block", "channels", "expanded", "kernel", "stride", "pads",
                           "act1", "act2") if k not in attrs]
    if missing:
        return f"InvertedResidual lacks attributes {missing}"
    for name in ("act1", "act2"):
        if attrs[name] and attrs[name] not in IR_ACTIVATIONS:
            return f"activation {attrs[name]!r} is not one the fused block computes"
    x, y = specs[0], workload.outputs[0]
    if len(x.shape) != 5 or x.shape[4] != int(attrs["block"]):
        return "the block's input must be a blocked (N, Cb, H, W, b) tensor"
    _, h2 = part_specs(attrs, x)
    if y.shape != blocked(x.shape[0], int(attrs["channels"]), *h2.shape[2:4],
                          int(attrs["block"])).shape:
        return "the block's output shape does not follow from its input and attributes"
    if attrs.get("residual", 0) and x.shape != y.shape:
        return "a residual block's input and output must have one shape"
    from wpk.kernels.support import unsupported_reason  # support imports this module
    for name, part in zip(PART_NAMES, part_workloads(workload)):
        reason = unsupported_reason(part)
        if reason:
            return f"{name} conv: {reason}"
    return None


def part_nodes(node: Node, fresh: Callable[[str], str]) -> list[Node]:
    """The three `wpk.nchwc` Conv nodes the fused node stands for (intermediate tensors
    named by `fresh(base)`; the caller records their specs when it needs them)."""
    attrs = node.attrs
    b, e, c = int(attrs["block"]), int(attrs["expanded"]), int(attrs["channels"])
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    x, w1, b1, w2, b2, w3, b3 = node.inputs
    out = node.outputs[0]
    h1, h2 = fresh(out + "_expanded"), fresh(out + "_depthwise")
    residual = bool(attrs.get("residual", 0))
    conv = dict(domain=NCHWC_DOMAIN)
    return [
        Node("Conv", [x, w1, b1], [h1], node.name,   # the first keeps the fused node's name
             dict(_conv_attrs(1, 1, (0, 0, 0, 0), 1, b, e)),
             epilogue=activation_step(attrs["act1"], attrs.get("act1_attrs", ())), **conv),
        Node("Conv", [h1, w2, b2], [h2], f"{node.name}/depthwise",
             dict(_conv_attrs(k, s, attrs["pads"], e, b, e)),
             epilogue=activation_step(attrs["act2"], attrs.get("act2_attrs", ())), **conv),
        Node("Conv", [h2, w3, b3, *([x] if residual else [])], [out], f"{node.name}/project",
             dict(_conv_attrs(1, 1, (0, 0, 0, 0), 1, b, c)),
             epilogue=(EpilogueStep("add", (), 3),) if residual else (), **conv),
    ]


def block_workload(n: int, cin: int, expanded: int, cout: int, h: int, w: int, k: int = 3,
                   stride: int = 1, act: tuple = ("clip", (("max", 6.0), ("min", 0.0))),
                   residual: bool = False, block: int = 16, biases: bool = True,
                   opset: int = 17) -> Workload:
    """A fused block workload of the given sizes (benchmarks and tests; the graph pass makes
    them from a model): pads K // 2, the same activation after the expand and the depthwise."""
    p = k // 2
    attrs = {"block": block, "channels": cout, "expanded": expanded, "kernel": k,
             "stride": stride, "pads": (p, p, p, p), "act1": act[0], "act1_attrs": act[1],
             "act2": act[0], "act2_attrs": act[1], "residual": int(residual)}
    x = blocked(n, cin, h, w, block)
    _, h2 = part_specs(attrs, x)
    y = blocked(n, cout, h2.shape[2], h2.shape[3], block)
    shapes = [(expanded, cin, 1, 1), (expanded,), (expanded, 1, k, k), (expanded,),
              (cout, expanded, 1, 1), (cout,)]
    inputs = (x, *(TensorSpec(s) if biases or len(s) > 1 else None for s in shapes))
    return Workload(IR_OP, inputs, (y,), tuple(sorted(attrs.items())), domain=IR_DOMAIN,
                    const_inputs=tuple(i for i in range(1, 7) if inputs[i] is not None),
                    opset=opset)
