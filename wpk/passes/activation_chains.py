"""Written-out activations inside `Elementwise` chains -> their one-step forms.

Exporters that have no HardSwish or HardSigmoid op write them out:
paddle2onnx's HardSwish is `x * Clip(x + 3, 0, 6) / 6`, tf2onnx and older
torch exports write `Clip(x / 6 + 0.5, 0, 1)` for HardSigmoid. After
`elementwise_fusion` each such spelling is a run of steps in one `Elementwise`
node; this pass replaces the run with one step:

    add 3, clip [0, 6], (div 6 | mul 1/6)        -> hard_sigmoid(1/6, 3/6)
    add c, clip [0, 6], (div 6 | mul 1/6)        -> hard_sigmoid(1/6, c/6)
    mul a, add b, clip [0, 1]                    -> hard_sigmoid(a, b)
    hard_sigmoid(1/6, 1/2), mul x                -> hard_swish   (x: the chain's input)
    add 3, clip [0, 6], mul x, (div 6 | mul 1/6) -> hard_swish

One step reads its input once and runs as one kernel where a library has it
(onnxruntime's HardSigmoid/HardSwish; MLAS fuses HardSigmoid into a blocked
convolution), instead of four passes over memory. `x * hard_sigmoid(x)`
needs the multiplication by the chain's own input, so hard_swish is only
formed at the start of a chain; hard_sigmoid anywhere. Constants that no
step reads any more are dropped from the node's inputs.
"""

from __future__ import annotations

import math

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.core.workload import EpilogueStep
from wpk.passes.base import GraphPass
from wpk.passes.to_onnx import ELEMENTWISE_OP, WPK_DOMAIN

HARD_SWISH_ALPHA, HARD_SWISH_BETA = 1 / 6, 0.5
_REL_TOL = 1e-5


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=_REL_TOL, abs_tol=1e-7)


class _Steps:
    """The steps of one Elementwise node with the constant scalar each one reads."""

    def __init__(self, graph: Graph, node: Node):
        self.node = node
        self.steps = list(node.epilogue)
        self.scalars = [self._scalar(graph, s) for s in self.steps]

    def _scalar(self, graph: Graph, step: EpilogueStep) -> float | None:
        if step.operand is None or step.operand == 0:
            return None
        value = graph.constants.get(self.node.inputs[step.operand])
        return None if value is None or value.size != 1 else float(np.asarray(value).ravel()[0])

    def is_op(self, i: int, op: str, scalar: float | None = None) -> bool:
        """Step i is `op` (unswapped), reading the constant `scalar` when one is given."""
        if i >= len(self.steps) or self.steps[i].op != op or self.steps[i].swap:
            return False
        return scalar is None or _close(self.scalars[i], scalar)

    def constant(self, i: int, op: str) -> float | None:
        """The constant step i reads when it is an unswapped `op` of a scalar, else None."""
        return self.scalars[i] if self.is_op(i, op) else None

    def is_clip(self, i: int, low: float, high: float) -> bool:
        if i >= len(self.steps) or self.steps[i].op != "clip":
            return False
        step = self.steps[i]
        return _close(step.attr("min"), low) and _close(step.attr("max"), high)

    def scale(self, i: int) -> float | None:
        """1/c for `div c`, c for `mul c`: the factor step i multiplies by, or None."""
        divisor = self.constant(i, "div")
        if divisor:
            return 1.0 / divisor
        return self.constant(i, "mul")

    def reads_input(self, i: int) -> bool:
        """Step i multiplies the running value by the chain's input."""
        return (i < len(self.steps) and self.steps[i].op == "mul"
                and self.steps[i].operand == 0)


def _hard_sigmoid_at(s: _Steps, i: int) -> tuple[int, float, float] | None:
    """(steps used, alpha, beta) of a written-out hard sigmoid starting at step i."""
    shift = s.constant(i, "add")
    if shift is not None and s.is_clip(i + 1, 0.0, 6.0):
        scale = s.scale(i + 2)
        if scale is not None and _close(scale, 1 / 6):
            return 3, 1 / 6, shift / 6
    alpha, beta = s.scale(i), s.constant(i + 1, "add")
    if alpha is not None and beta is not None and s.is_clip(i + 2, 0.0, 1.0):
        return 3, alpha, beta
    return None


def _hard_swish_prefix(s: _Steps) -> int | None:
    """How many leading steps compute hard_swish of the chain's input, or None."""
    if s.is_op(0, "add", 3.0) and s.is_clip(1, 0.0, 6.0) and s.reads_input(2):
        scale = s.scale(3)
        if scale is not None and _close(scale, 1 / 6):
            return 4
    found = _hard_sigmoid_at(s, 0)
    if found is not None:
        used, alpha, beta = found
    elif s.steps and s.steps[0].op == "hard_sigmoid":
        used, alpha, beta = 1, s.steps[0].attr("alpha", 0.2), s.steps[0].attr("beta", 0.5)
    else:
        return None
    if _close(alpha, HARD_SWISH_ALPHA) and _close(beta, HARD_SWISH_BETA) \
            and s.reads_input(used):
        return used + 1
    return None


def canonical_steps(graph: Graph, node: Node) -> tuple[list[EpilogueStep], list[str]]:
    """The node's steps with written-out activations replaced, and the names of the
    activations formed (empty when nothing matched)."""
    s = _Steps(graph, node)
    out: list[EpilogueStep] = []
    formed: list[str] = []
    i = 0
    prefix = _hard_swish_prefix(s)
    if prefix is not None:
        out.append(EpilogueStep("hard_swish"))
        formed.append("hard_swish")
        i = prefix
    while i < len(s.steps):
        found = _hard_sigmoid_at(s, i)
        if found is None:
            out.append(s.steps[i])
            i += 1
            continue
        used, alpha, beta = found
        out.append(EpilogueStep("hard_sigmoid", (("alpha", alpha), ("beta", beta))))
        formed.append("hard_sigmoid")
        i += used
    return out, formed


def _drop_unread_inputs(node: Node) -> None:
    """Remove inputs after the first that no step reads, renumbering the operands."""
    read = sorted({s.operand for s in node.epilogue if s.operand})
    keep = [0, *read]
    index = {old: new for new, old in enumerate(keep)}
    node.inputs = [node.inputs[k] for k in keep]
    node.epilogue = tuple(EpilogueStep(s.op, s.attrs, None if s.operand is None
                                       else index[s.operand], s.swap) for s in node.epilogue)


class ActivationChains(GraphPass):
    """Replace written-out HardSigmoid/HardSwish runs of Elementwise steps (module doc)."""

    name = "activation_chains"

    def run(self, graph: Graph) -> Graph:
        for node in graph.nodes:
            if node.op != ELEMENTWISE_OP or node.domain != WPK_DOMAIN:
                continue
            steps, formed = canonical_steps(graph, node)
            if not formed:
                continue
            node.epilogue = tuple(steps)
            _drop_unread_inputs(node)
            for name in formed:
                self.hit(name)
        return graph
