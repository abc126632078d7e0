"""wpk's fused inverted-residual block: what it computes, its parts and its float64 formula.

    InvertedResidual(X, W1, B1, W2, B2, W3, B3[, WR, BR, WE, BE]) (domain 'wpk')
      H1 = act1(conv1x1(X, W1) + B1)                     expand (absent: H1 = X, expansion 1)
      H2 = act2(depthwise KxK stride S (H1, W2) + B2)    depthwise
      G  = se2(conv1x1(se1(conv1x1(mean_hw(H2), WR) + BR), WE) + BE)   squeeze-excite gate
      H2 = H2 * G                                        (only with the gate)
      Y  = conv1x1(H2, W3) + B3 [+ X]                    project [+ residual]

Every tensor is in the NCHWc blocked layout of `wpk.passes.nchwc_layout`
(X and Y (N, Cb, H, W, b)); the filters and biases are the logical ones of
the `wpk.nchwc` Conv nodes the block replaced (biases may be absent; W1 and B1
are absent in an expansion-1 block, whose depthwise reads X). Attributes:
`block`, `channels` (Y's logical channels), `expanded` (H1's), `kernel` K,
`stride` S, `pads` (top, left, bottom, right of the depthwise), `act1`/`act2`
(an epilogue step name or '' for none) with `act1_attrs`/`act2_attrs` (its
(name, value) pairs), `residual` (1: Y adds X) and, for a gated block, `se` 1
with `se_act1`/`se_act2` and their `_attrs`.

`block_parts` gives the separate steps the fused node stands for, as the NCHWc
graph wrote them (an activation MLAS fuses into its Conv, another one a
blocked `Elementwise`; the gate a GlobalAveragePool, two 1x1 Convs and a
blocked multiply), so the float64 reference, onnxruntime's candidate and the
inverse rewrite (`part_nodes`, for `to_onnx`) are the separate steps' own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Node
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN

IR_OP = "InvertedResidual"
IR_DOMAIN = "wpk"
ELEMENTWISE = "Elementwise"
# The activations the fused block carries after the expand and the depthwise conv and in
# the gate (the kernel computes them in registers; no conv reads a padding lane, so an
# activation with act(0) != 0 leaves Y's padding lanes zero)
IR_ACTIVATIONS = frozenset({"relu", "clip", "leaky_relu", "hard_sigmoid", "sigmoid",
                            "hard_swish", "silu"})
# The ones MLAS fuses into its NCHWc Conv (the others are a separate Elementwise step)
CONV_FUSED = frozenset({"relu", "clip", "leaky_relu", "hard_sigmoid", "sigmoid"})
# Block inputs: X, then (filter, bias) of the expand, depthwise, project, gate reduce and
# gate expand convs
EXPAND, DEPTHWISE, PROJECT, SE_REDUCE, SE_EXPAND = 1, 3, 5, 7, 9


@dataclass(frozen=True)
class Part:
    """One separate step of a block: its workload, what feeds its inputs (a block input
    index, an earlier part's output label, or None) and its output's label."""

    name: str
    workload: Workload
    inputs: tuple[int | str | None, ...]
    output: str


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


def has_expand(workload: Workload) -> bool:
    """Whether the block has its 1x1 expand conv (False: expansion 1)."""
    return _spec(workload.inputs, EXPAND) is not None


def has_gate(workload: Workload) -> bool:
    """Whether the block has a squeeze-excitation gate."""
    return bool(workload.attr("se", 0))


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


class _Parts:
    """Collects a block's parts in order (see `block_parts`)."""

    def __init__(self, workload: Workload):
        self.workload, self.parts = workload, []
        self.specs = workload.inputs

    def add(self, name, op, inputs, output_spec, label, attrs=(), epilogue=(), consts=(),
            domain=NCHWC_DOMAIN) -> str:
        specs = tuple(self.specs[i] if isinstance(i, int) else self.spec_of(i) if i else None
                      for i in inputs)
        workload = Workload(op, specs, (output_spec,), attrs, tuple(epilogue), domain=domain,
                            const_inputs=tuple(k for k in consts if specs[k] is not None),
                            opset=self.workload.opset)
        self.parts.append(Part(name, workload, tuple(inputs), label))
        return label

    def spec_of(self, label: str) -> TensorSpec:
        return next(p.workload.outputs[0] for p in self.parts if p.output == label)

    def conv(self, name, source, first, spec, attrs, act, label, extra=(), epilogue=()) -> str:
        """A conv part and its activation: fused when MLAS fuses it, else an Elementwise."""
        steps = activation_step(*act)
        fused = not steps or steps[0].op in CONV_FUSED
        bias = first + 1 if _spec(self.specs, first + 1) is not None else None
        out = self.add(name, "Conv", (source, first, bias, *extra), spec,
                       label if fused else label + "_linear", attrs,
                       (*epilogue, *(steps if fused else ())), (1, 2))
        if fused:
            return out
        return self.add(f"{name}_activation", ELEMENTWISE, (out,), spec, label,
                        epilogue=steps, domain=IR_DOMAIN)


def block_parts(workload: Workload) -> list[Part]:
    """The separate steps of the block, in order (see the module docstring); labels 'h1',
    'h2', 'pooled', 'squeezed', 'gate', 'scaled' and 'y' name their outputs."""
    attrs = dict(workload.attrs)
    b, e, c = int(attrs["block"]), int(attrs["expanded"]), int(attrs["channels"])
    x = workload.inputs[0]
    h1, h2 = part_specs(attrs, x)
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    act = {name: (attrs.get(name, ""), attrs.get(f"{name}_attrs", ()))
           for name in ("act1", "act2", "se_act1", "se_act2")}
    parts = _Parts(workload)
    source = 0
    if has_expand(workload):
        source = parts.conv("expand", 0, EXPAND, h1, _conv_attrs(1, 1, (0,) * 4, 1, b, e),
                            act["act1"], "h1")
    source = parts.conv("depthwise", source, DEPTHWISE, h2,
                        _conv_attrs(k, s, attrs["pads"], e, b, e), act["act2"], "h2")
    if has_gate(workload):
        n = x.shape[0]
        squeezed = workload.inputs[SE_REDUCE].shape[0]
        pooled = parts.add("se_pool", "GlobalAveragePool", (source,), blocked(n, e, 1, 1, b),
                           "pooled", (("block", b), ("channels", e)))
        mid = parts.conv("se_reduce", pooled, SE_REDUCE, blocked(n, squeezed, 1, 1, b),
                         _conv_attrs(1, 1, (0,) * 4, 1, b, squeezed), act["se_act1"],
                         "squeezed")
        gate = parts.conv("se_expand", mid, SE_EXPAND, blocked(n, e, 1, 1, b),
                          _conv_attrs(1, 1, (0,) * 4, 1, b, e), act["se_act2"], "gate")
        source = parts.add("se_scale", ELEMENTWISE, (source, gate), h2, "scaled",
                           epilogue=(EpilogueStep("mul", (), 1),), domain=IR_DOMAIN)
    residual = bool(attrs.get("residual", 0))
    parts.conv("project", source, PROJECT, workload.outputs[0],
               _conv_attrs(1, 1, (0,) * 4, 1, b, c), ("", ()), "y", (0,) if residual else (),
               (EpilogueStep("add", (), 3),) if residual else ())
    return parts.parts


def part_workloads(workload: Workload) -> list[Workload]:
    """The workloads of the block's separate steps (`block_parts`), in order."""
    return [part.workload for part in block_parts(workload)]


def run_parts(workload: Workload, inputs: Sequence, step: Callable) -> list:
    """The block's output by `step(part_workload, part_inputs) -> output`, part by part."""
    values: dict[str, object] = {}
    for part in block_parts(workload):
        args = [inputs[i] if isinstance(i, int) and i < len(inputs) else values.get(i)
                if isinstance(i, str) else None for i in part.inputs]
        values[part.output] = step(part.workload, args)
    return [values["y"]]


def inverted_residual_formula(workload: Workload, inputs: Sequence) -> list[np.ndarray]:
    """The float64 reference: the separate steps' own references, one after the other."""
    from wpk.kernels.reference import reference  # the reference imports this module
    return run_parts(workload, inputs, lambda part, values: np.asarray(
        reference(part, values)[0], np.float64))


def _inputs_reason(workload: Workload) -> str | None:
    specs = workload.inputs
    gate = has_gate(workload)
    if len(specs) != (11 if gate else 7) or any(
            specs[i] is None for i in (0, DEPTHWISE, PROJECT, *((SE_REDUCE, SE_EXPAND)
                                                                  if gate else ()))):
        return ("InvertedResidual takes X, W1, B1, W2, B2, W3, B3 and with a gate WR, BR, "
                "WE, BE (biases and, at expansion 1, W1 may be absent)")
    if specs[EXPAND] is None and specs[EXPAND + 1] is not None:
        return "a block without an expand conv has no expand bias"
    if any(i not in workload.const_inputs for i in range(1, len(specs)) if specs[i] is not None):
        return "the block's filters and biases must be constants"
    if any(s.dtype != "float32" for s in (*(s for s in specs if s is not None),
                                          *workload.outputs)):
        return "the fused block computes float32 only"
    return None


def inverted_residual_reason(workload: Workload) -> str | None:
    """None when the workload is a well-formed fused block, else what is wrong."""
    if not is_inverted_residual(workload):
        return "not wpk's InvertedResidual op"
    reason = _inputs_reason(workload)
    if reason:
        return reason
    specs = workload.inputs
    attrs = dict(workload.attrs)
    gate = ("squeezed", "se_act1", "se_act2") if has_gate(workload) else ()
    missing = [k for k in ("block", "channels", "expanded", "kernel", "stride", "pads",
                           "act1", "act2", *gate) if k not in attrs]
    if missing:
        return f"InvertedResidual lacks attributes {missing}"
    for name in ("act1", "act2", "se_act1", "se_act2"):
        if attrs.get(name) and attrs[name] not in IR_ACTIVATIONS:
            return f"activation {attrs[name]!r} is not one the fused block computes"
    if has_gate(workload) and specs[SE_REDUCE].shape[0] != int(attrs["squeezed"]):
        return "the gate's `squeezed` attribute is not its reduce conv's channel count"
    x, y = specs[0], workload.outputs[0]
    if len(x.shape) != 5 or x.shape[4] != int(attrs["block"]):
        return "the block's input must be a blocked (N, Cb, H, W, b) tensor"
    if not has_expand(workload) and specs[DEPTHWISE].shape[0] != int(attrs["expanded"]):
        return "a block without an expand conv has the depthwise conv's channels"
    _, h2 = part_specs(attrs, x)
    if y.shape != blocked(x.shape[0], int(attrs["channels"]), *h2.shape[2:4],
                          int(attrs["block"])).shape:
        return "the block's output shape does not follow from its input and attributes"
    if attrs.get("residual", 0) and x.shape != y.shape:
        return "a residual block's input and output must have one shape"
    from wpk.kernels.support import unsupported_reason  # support imports this module
    for part in block_parts(workload):
        reason = unsupported_reason(part.workload)
        if reason:
            return f"{part.name}: {reason}"
    return None


def part_nodes(node: Node, fresh: Callable[[str], str]) -> list[Node]:
    """The separate nodes the fused node stands for (`block_parts`; intermediate tensors
    named by `fresh(base)`; the caller records their specs when it needs them). The first
    keeps the fused node's name."""
    out = node.outputs[0]
    names: dict[str, str] = {"y": out}
    nodes = []
    for k, part in enumerate(block_parts(_node_workload(node))):
        if part.output not in names:
            names[part.output] = fresh(f"{out}_{part.output}")
        inputs = [node.inputs[i] if isinstance(i, int) else names[i] if i else ""
                  for i in part.inputs]
        nodes.append(Node(part.workload.op, inputs, [names[part.output]],
                          node.name if k == 0 else f"{node.name}/{part.name}",
                          dict(part.workload.attrs), part.workload.domain,
                          part.workload.epilogue))
    return nodes


def _node_workload(node: Node) -> Workload:
    """A stand-in workload of a fused node: its attributes and which inputs exist (the
    shapes are dummies: the nodes take only ops, attributes and epilogues from it)."""
    attrs = node.attrs
    n_in = len(node.inputs)
    size = int(attrs["kernel"]) * int(attrs["stride"])
    x = TensorSpec((1, 1, size, size, int(attrs["block"])))
    specs = [x, *(TensorSpec((1, 1, 1, 1)) if node.inputs[i] else None
                  for i in range(1, n_in))]
    if has_gate_attrs(attrs):
        specs[SE_REDUCE] = TensorSpec((int(attrs["squeezed"]), int(attrs["expanded"]), 1, 1))
    return Workload(IR_OP, tuple(specs), (x,), tuple(sorted(attrs.items())), domain=IR_DOMAIN)


def has_gate_attrs(attrs: Mapping) -> bool:
    """Whether a fused node's attributes say it has a squeeze-excitation gate."""
    return bool(attrs.get("se", 0))


def block_workload(n: int, cin: int, expanded: int, cout: int, h: int, w: int, k: int = 3,
                   stride: int = 1, act: tuple = ("clip", (("max", 6.0), ("min", 0.0))),
                   residual: bool = False, block: int = 16, biases: bool = True,
                   opset: int = 17, squeezed: int = 0,
                   gate_acts: tuple = (("relu", ()), ("hard_sigmoid", ())),
                   expand: bool = True) -> Workload:
    """A fused block workload of the given sizes (benchmarks and tests; the graph pass makes
    them from a model): pads K // 2, the same activation after the expand and the depthwise,
    a squeeze-excitation gate of `squeezed` channels when > 0 (activations `gate_acts`), no
    expand conv when `expand` is False (then `expanded` must be `cin`)."""
    p = k // 2
    attrs = {"block": block, "channels": cout, "expanded": expanded, "kernel": k,
             "stride": stride, "pads": (p, p, p, p), "act1": act[0] if expand else "",
             "act1_attrs": act[1] if expand else (), "act2": act[0], "act2_attrs": act[1],
             "residual": int(residual)}
    if squeezed:
        attrs.update(se=1, squeezed=squeezed, se_act1=gate_acts[0][0],
                     se_act1_attrs=gate_acts[0][1], se_act2=gate_acts[1][0],
                     se_act2_attrs=gate_acts[1][1])
    x = blocked(n, cin, h, w, block)
    _, h2 = part_specs(attrs, x)
    y = blocked(n, cout, h2.shape[2], h2.shape[3], block)
    shapes = [(expanded, cin, 1, 1), (expanded,), (expanded, 1, k, k), (expanded,),
              (cout, expanded, 1, 1), (cout,)]
    if squeezed:
        shapes += [(squeezed, expanded, 1, 1), (squeezed,), (expanded, squeezed, 1, 1),
                   (expanded,)]
    inputs = [x, *(TensorSpec(s) if biases or len(s) > 1 else None for s in shapes)]
    if not expand:
        inputs[EXPAND] = inputs[EXPAND + 1] = None
    return Workload(IR_OP, tuple(inputs), (y,), tuple(sorted(attrs.items())), domain=IR_DOMAIN,
                    const_inputs=tuple(i for i in range(1, len(inputs)) if inputs[i] is not None),
                    opset=opset)
