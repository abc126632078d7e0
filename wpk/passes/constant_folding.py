"""Constant folding: evaluate nodes whose inputs are all constants at build time.

Nodes are evaluated with `onnx.reference` (numpy fast paths for the common
shape ops). `Shape`/`Size` of a tensor with a static shape fold too. A result
larger than `MAX_FOLDED_BYTES` is only kept when it is no larger than the
inputs it replaces, so folding never blows up the weights; `ConstantOfShape`
is the exception: it folds to a broadcast view that takes no memory.
Random ops and nodes with subgraphs are never folded.
"""

from __future__ import annotations

import numpy as np
from onnx.reference import ReferenceEvaluator

from wpk.core.errors import ModelError
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.onnx_quantize import REFERENCE_OPS
from wpk.frontend import constant_of_shape
from wpk.passes.base import GraphPass
from wpk.passes.to_onnx import node_to_proto

MAX_FOLDED_BYTES = 16 * 1024 * 1024
NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def _static_shape_value(graph: Graph, node: Node) -> np.ndarray | None:
    """`Shape` / `Size` of a statically shaped tensor, without evaluating anything."""
    shape = graph.tensors[node.inputs[0]].shape
    if node.op == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    rank = len(shape)
    start = node.attr("start", 0)
    end = node.attr("end", rank)
    start, end = (max(0, min(rank, v + rank if v < 0 else v)) for v in (start, end))
    return np.array(shape[start:end], dtype=np.int64)


def _fast_eval(node: Node, values: list[np.ndarray | None]) -> list[np.ndarray] | None:
    op = node.op
    if op == "ConstantOfShape":
        return [constant_of_shape(values[0], node.attr("value"))]
    if op == "Identity":
        return [values[0]]
    if op in ("Unsqueeze", "Squeeze"):  # onnx.reference fails on the opset<13 attribute form
        axes = node.attr("axes") if len(values) < 2 else values[1]
        if axes is None:
            return [np.squeeze(values[0])] if op == "Squeeze" else None
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        if op == "Squeeze":
            return [np.squeeze(values[0], tuple(a % values[0].ndim for a in axes))]
        rank = values[0].ndim + len(axes)
        return [np.expand_dims(values[0], tuple(sorted(a % rank for a in axes)))]
    return None


def evaluate_node(graph: Graph, node: Node, values: list[np.ndarray | None]) -> list[np.ndarray]:
    """Outputs of one node on the given input values (None for absent inputs)."""
    fast = _fast_eval(node, values)
    if fast is not None:
        return fast
    feeds = {name: value for name, value in zip(node.inputs, values) if name}
    evaluator = ReferenceEvaluator(node_to_proto(node), opsets=dict(graph.opsets),
                                   new_ops=list(REFERENCE_OPS))
    return [np.asarray(v) for v in evaluator.run(None, feeds)]


def _folded(graph: Graph, node: Node, values: list[np.ndarray | None]) -> list[np.ndarray]:
    """`evaluate_node`, a failure being the model's: every input is a constant of it."""
    where = f"{node.op} node '{node.name}'"
    if node.op == "Range" and len(values) == 3 and values[2] is not None \
            and not np.any(values[2]):
        raise ModelError(f"{where} has step (delta) 0: the range never ends",
                         hint="fix the model: give the Range a non-zero delta")
    try:
        return evaluate_node(graph, node, values)
    except (ArithmeticError, ValueError, TypeError, IndexError, KeyError) as exc:
        reason = (str(exc).splitlines() or [""])[0]
        raise ModelError(f"{where} cannot be computed from its constant inputs "
                         f"({type(exc).__name__}: {reason})",
                         hint=f"check the node's inputs and attributes against the ONNX "
                              f"spec of {node.op}") from exc


def _nbytes(info: TensorInfo) -> int:
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


class ConstantFolding(GraphPass):
    """Replace nodes computable at build time by constants."""

    name = "constant_folding"

    def _foldable(self, graph: Graph, node: Node) -> bool:
        if node.op in NEVER_FOLD or node.domain not in ("", "ai.onnx"):
            return False
        if any(hasattr(v, "node") for v in node.attrs.values()):
            return False
        if not node.inputs or not all(i == "" or i in graph.constants for i in node.inputs):
            return False
        if node.op == "ConstantOfShape":
            return True
        out_bytes = sum(_nbytes(graph.tensors[o]) for o in node.outputs if o)
        in_bytes = sum(graph.constants[i].nbytes for i in node.inputs if i)
        return out_bytes <= MAX_FOLDED_BYTES or out_bytes <= in_bytes

    def run(self, graph: Graph) -> Graph:
        kept: list[Node] = []
        for node in graph.nodes:
            if node.op in ("Shape", "Size") and node.inputs[0] not in graph.constants:
                graph.constants[node.outputs[0]] = _static_shape_value(graph, node)
                self.hit()
                continue
            if not self._foldable(graph, node):
                kept.append(node)
                continue
            values = [graph.constants[i] if i else None for i in node.inputs]
            results = _folded(graph, node, values)
            for name, value in zip(node.outputs, results):
                if name:
                    graph.constants[name] = value
                    graph.tensors[name] = TensorInfo(tuple(value.shape), value.dtype.name)
            self.hit()
        graph.nodes = kept
        return graph
