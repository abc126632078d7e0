"""Checks of an ONNX model that `onnx.checker` does not make, each failing as a user error
that names the node or tensor (never as a crash deep in the build):

- names that are not UTF-8 text (protobuf hands them over as bytes),
- tensors of a type wpk cannot compute with (STRING, and any type numpy lacks),
- float attributes that are NaN or infinite (no operator wpk runs takes one, and a
  plan stores its attributes as JSON, which has no such numbers).

    check_model_values(proto, "model.onnx")     # ModelError / UnsupportedError

Conv's own invariants (group, channel counts) are checked on workloads, where the
shapes are known (`wpk.core.op_checks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx

from wpk.core.errors import ModelError, UnsupportedError

FIX_HINT = "fix the model where it was exported (or edit it with onnx.helper)"


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph of its nodes (If, Loop, Scan bodies), depth first."""
    pending = [graph]
    while pending:
        current = pending.pop()
        yield current
        for node in current.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    pending.append(attr.g)
                pending.extend(attr.graphs)


def _node_label(node: onnx.NodeProto, index: int) -> str:
    name = node.name if isinstance(node.name, str) and node.name else f"{node.op_type}_{index}"
    return f"{node.op_type} node '{name}'"


def _check_names(graph: onnx.GraphProto, source: str) -> None:
    for index, node in enumerate(graph.node):
        names = [node.name, *node.input, *node.output]
        if any(isinstance(name, bytes) for name in names):
            raise ModelError(f"{_node_label(node, index)} (#{index}) of '{source}' has a name "
                             "or an input/output name that is not UTF-8 text",
                             hint=f"{FIX_HINT}: ONNX names are UTF-8 strings")
    for kind, values in (("input", graph.input), ("output", graph.output),
                         ("value_info", graph.value_info), ("initializer", graph.initializer)):
        for index, value in enumerate(values):
            if isinstance(value.name, bytes):
                raise ModelError(f"graph {kind} #{index} of '{source}' has a name that is not "
                                 "UTF-8 text", hint=f"{FIX_HINT}: ONNX names are UTF-8 strings")


def _check_types(graph: onnx.GraphProto, source: str) -> None:
    typed = [(value.name, value.type.tensor_type.elem_type)
             for value in [*graph.input, *graph.output, *graph.value_info]
             if value.type.HasField("tensor_type")]
    typed += [(tensor.name, tensor.data_type) for tensor in graph.initializer]
    for name, elem_type in typed:
        if elem_type == onnx.TensorProto.STRING:
            raise UnsupportedError(f"tensor '{name}' of '{source}' holds strings (STRING); "
                                   "wpk computes with numeric tensors only",
                                   hint="run the string processing outside the model and "
                                        "feed wpk the numeric tensors")


def _check_attributes(graph: onnx.GraphProto, source: str) -> None:
    for index, node in enumerate(graph.node):
        for attr in node.attribute:
            values = ([attr.f] if attr.type == onnx.AttributeProto.FLOAT
                      else list(attr.floats) if attr.type == onnx.AttributeProto.FLOATS else [])
            bad = [v for v in values if not math.isfinite(v)]
            if bad:
                raise ModelError(f"attribute '{attr.name}' of {_node_label(node, index)} in "
                                 f"'{source}' is {bad[0]}; it must be a finite number",
                                 hint=f"{FIX_HINT}: give '{attr.name}' a finite value")


def check_model_values(proto: onnx.ModelProto, source: str) -> None:
    """Raise ModelError (names that are not UTF-8, NaN or infinite float attributes) or
    UnsupportedError (STRING tensors) for the first such problem in `proto`'s graphs."""
    for graph in _graphs(proto.graph):
        _check_names(graph, source)
        _check_types(graph, source)
        _check_attributes(graph, source)
