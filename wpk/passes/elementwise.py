"""Elementwise ops as epilogue steps: which ONNX ops are elementwise and how they chain.

A *chain* is a list of `(EpilogueStep, operand_name)` applied in order to one
value (`operand_name` is None for unary steps; the step's `operand` index is
filled in when the chain is attached to a node). Only float tensors chain, and
a binary step never changes the value's shape (its operand broadcasts into it).
"""

from __future__ import annotations

import numpy as np

from wpk.core.epilogue import (
    COMMUTATIVE_STEPS,
    FAKE_QUANT,
    ONNX_BINARY_STEPS,
    is_unary_onnx_op,
    step_from_onnx,
)
from wpk.core.graph import Graph, Node
from wpk.core.workload import EpilogueStep
from wpk.passes.base import FLOAT_DTYPES
from wpk.passes.to_onnx import BASE_ARITY, ELEMENTWISE_OP, WPK_DOMAIN

Chain = list[tuple[EpilogueStep, str | None]]


def is_closed(steps) -> bool:
    """Whether `steps` (EpilogueSteps, or a chain's pairs) hold a step that takes no more
    after it: `fake_quant`, whose rounding flips verification tells from errors only where
    it is the last step (`wpk.search.measure.output_quanta`)."""
    return any((s[0] if isinstance(s, tuple) else s).op == FAKE_QUANT for s in steps)


def _scalar(graph: Graph, name: str) -> float | None:
    value = graph.constants.get(name)
    if value is None or value.size != 1:
        return None
    return float(np.asarray(value).reshape(-1)[0])


def unary_step(graph: Graph, node: Node) -> EpilogueStep | None:
    """The epilogue step computing a unary ONNX activation node, or None.

    The epilogue table says which ops and attributes make which step; inputs
    after the first (Clip's bounds) must be constant scalars.
    """
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 \
            or not is_unary_onnx_op(node.op):
        return None
    scalars: list[float | None] = [None]
    for name in node.inputs[1:]:
        scalars.append(_scalar(graph, name) if name else None)
        if name and scalars[-1] is None:
            return None
    found = step_from_onnx(node.op, node.attrs, scalars)
    return None if found is None else EpilogueStep(*found)


def _is_float(graph: Graph, name: str) -> bool:
    return graph.tensors[name].dtype in FLOAT_DTYPES


def chain_of(graph: Graph, node: Node, value: str) -> Chain | None:
    """`node` as a chain of steps applied to its input `value`, or None if it is not one."""
    if not node.outputs or not _is_float(graph, node.outputs[0]):
        return None
    out = graph.tensors[node.outputs[0]]
    if graph.tensors[value].shape != out.shape or graph.tensors[value].dtype != out.dtype:
        return None
    if node.op == ELEMENTWISE_OP and node.domain == WPK_DOMAIN:
        return _elementwise_chain(node, value)
    step = unary_step(graph, node)
    if step is not None:
        return [(step, None)] if node.inputs[0] == value else None
    if node.op not in ONNX_BINARY_STEPS or node.domain not in ("", "ai.onnx") \
            or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if (a == value) == (b == value):
        return None
    name = ONNX_BINARY_STEPS[node.op]
    operand = b if a == value else a
    if graph.tensors[operand].dtype != out.dtype:
        return None
    swap = a != value and name not in COMMUTATIVE_STEPS
    return [(EpilogueStep(name, swap=swap), operand)]


def _elementwise_chain(node: Node, value: str) -> Chain | None:
    names = [node.inputs[s.operand] if s.operand is not None else None for s in node.epilogue]
    if node.inputs[0] != value:
        first = node.epilogue[0] if node.epilogue else None
        if (first is None or first.op not in COMMUTATIVE_STEPS or names[0] != value
                or value in names[1:]):
            return None
        names[0] = node.inputs[0]
    if value in names:
        return None
    return [(EpilogueStep(s.op, s.attrs, None, s.swap), n) for s, n in zip(node.epilogue, names)]


def chain_start(graph: Graph, node: Node) -> tuple[str, Chain] | None:
    """The value a chain-able node starts from and its chain, or None."""
    if node.op == ELEMENTWISE_OP and node.domain == WPK_DOMAIN:
        if not _is_float(graph, node.outputs[0]):
            return None
        return node.inputs[0], [  # operands may name input 0: it stays an outside tensor
            (EpilogueStep(s.op, s.attrs, None, s.swap),
             None if s.operand is None else node.inputs[s.operand]) for s in node.epilogue]
    if not node.inputs or not node.inputs[0]:
        return None
    if unary_step(graph, node) is not None:
        chain = chain_of(graph, node, node.inputs[0])
        return (node.inputs[0], chain) if chain else None
    if node.op in ONNX_BINARY_STEPS and len(node.inputs) == 2:
        for value in node.inputs:
            chain = chain_of(graph, node, value)
            if chain:
                return value, chain
    return None


def attach(node: Node, chain: Chain) -> None:
    """Append `chain` to `node.epilogue`, adding its operands as node inputs (deduplicated)."""
    base = BASE_ARITY.get(node.op, len(node.inputs))
    inputs = list(node.inputs) + [""] * (base - len(node.inputs))
    reusable_from = 0 if node.op == ELEMENTWISE_OP else base
    steps = list(node.epilogue)
    for step, operand in chain:
        index = None
        if operand is not None:
            if operand in inputs[reusable_from:]:
                index = inputs.index(operand, reusable_from)
            else:
                inputs.append(operand)
                index = len(inputs) - 1
        steps.append(EpilogueStep(step.op, step.attrs, index, step.swap))
    node.inputs = inputs
    node.epilogue = tuple(steps)


def operand_names(node: Node) -> list[str]:
    """Names of the tensors the epilogue steps of `node` read."""
    return [node.inputs[s.operand] for s in node.epilogue if s.operand is not None]


def make_elementwise(name: str, value: str, chain: Chain, outputs: list[str]) -> Node:
    """A new `Elementwise` node applying `chain` to `value`."""
    node = Node(ELEMENTWISE_OP, [value], list(outputs), name, domain=WPK_DOMAIN)
    attach(node, chain)
    return node
