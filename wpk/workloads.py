"""Workload extraction: one `Workload` per graph node, grouped by identity.

    pairs = extract_workloads(graph)          # [NodeWorkload(node, workload), ...]
    groups = distinct(pairs)                  # key -> the nodes sharing that workload

Attributes are normalised so that equal computations get equal keys: the
ONNX defaults of Conv, ConvTranspose, pooling and Gemm are written out
(strides, dilations, explicit pads instead of `auto_pad`, group, kernel
shape, alpha/beta/trans flags), lists become tuples, subgraphs their
serialized bytes. Constant inputs are listed in `const_inputs`; integer
constants and float constants of at most `STATIC_FLOAT_LIMIT` elements are
`static_inputs` (part of the identity, see `wpk.core.workload.Workload`),
except the weights of the ops in `WEIGHT_INPUTS` (a 64-channel Conv bias is
data, not identity, so equal convolutions share one workload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.core.workload import Workload

STATIC_FLOAT_LIMIT = 64
CONV_OPS = frozenset({"Conv", "ConvTranspose"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
# Inputs (by index) that are weights, never static, whatever their size.
WEIGHT_INPUTS = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "MatMul": {0, 1},
    "BatchNormalization": {1, 2, 3, 4}, "InstanceNormalization": {1, 2},
    "LayerNormalization": {1, 2}, "PRelu": {1},
}
# The same for ops of other domains, keyed by (domain, op).
DOMAIN_WEIGHT_INPUTS = {("wpk.nchwc", "Conv"): {1, 2},
                        ("wpk", "GroupNorm"): {1, 2}, ("wpk.nchwc", "GroupNorm"): {1, 2},
                        ("wpk", "InvertedResidual"): {1, 2, 3, 4, 5, 6}}
# Pooling attributes that ONNX added in opset 10; older models must not carry them,
# or onnxruntime rejects the node.
POOL_ATTRS_SINCE_10 = ("ceil_mode", "dilations")


@dataclass(frozen=True)
class NodeWorkload:
    """A graph node and the workload it computes."""

    node: Node
    workload: Workload


def _explicit_pads(node: Node, in_shape: tuple[int, ...], kernel: tuple[int, ...],
                   strides: tuple[int, ...], dilations: tuple[int, ...]) -> tuple[int, ...]:
    spatial = len(kernel)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and node.op != "ConvTranspose":
        begins, ends = [], []
        for size, k, s, d in zip(in_shape[2:], kernel, strides, dilations):
            out = math.ceil(size / s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        return tuple(begins + ends)
    if auto_pad == "VALID":
        return (0,) * (2 * spatial)
    return tuple(int(p) for p in node.attr("pads", (0,) * (2 * spatial)))


def _window_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    attrs = _window_attrs_all(graph, node)
    if node.op in POOL_OPS and graph.opset < 10:
        for name in POOL_ATTRS_SINCE_10:
            if name not in node.attrs:
                attrs.pop(name, None)
    return attrs


def _window_attrs_all(graph: Graph, node: Node) -> dict[str, Any]:
    attrs = dict(node.attrs)
    in_shape = graph.tensors[node.inputs[0]].shape
    if node.op in CONV_OPS:
        kernel = tuple(node.attr("kernel_shape", graph.tensors[node.inputs[1]].shape[2:]))
        attrs["group"] = int(node.attr("group", 1))
    else:
        kernel = tuple(node.attr("kernel_shape", ()))
    spatial = len(kernel)
    strides = tuple(node.attr("strides", (1,) * spatial))
    dilations = tuple(node.attr("dilations", (1,) * spatial))
    attrs["kernel_shape"] = kernel
    attrs["strides"] = strides
    if node.op != "AveragePool" and node.op != "LpPool":
        attrs["dilations"] = dilations
    if node.op in POOL_OPS:
        attrs["ceil_mode"] = int(node.attr("ceil_mode", 0))
    if node.op == "ConvTranspose":
        return attrs  # its auto_pad depends on output_shape; kept as given
    attrs["pads"] = _explicit_pads(node, in_shape, kernel, strides, dilations)
    attrs.pop("auto_pad", None)
    return attrs


def normalized_attrs(graph: Graph, node: Node) -> tuple[tuple[str, Any], ...]:
    """The node's attributes with ONNX defaults made explicit, as a sorted tuple."""
    attrs = dict(node.attrs)
    if node.domain in ("", "ai.onnx"):
        if node.op in CONV_OPS or (node.op in POOL_OPS and "kernel_shape" in attrs):
            attrs = _window_attrs(graph, node)
        elif node.op == "Gemm":
            attrs = {"alpha": float(attrs.get("alpha", 1.0)), "beta": float(attrs.get("beta", 1.0)),
                     "transA": int(attrs.get("transA", 0)), "transB": int(attrs.get("transB", 0))}
    return tuple(sorted((key, _canonical(value)) for key, value in attrs.items()))


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return np.asarray(value, order="C")
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "SerializeToString"):  # a subgraph (If/Loop/Scan body)
        return value.SerializeToString(deterministic=True)
    return value


def _is_static(value: np.ndarray) -> bool:
    if value.dtype.kind in "iub":
        return True
    return value.dtype.kind == "f" and value.size <= STATIC_FLOAT_LIMIT


def workload_of(graph: Graph, node: Node) -> Workload:
    """The workload one node computes."""
    inputs = tuple(graph.tensors[name].spec if name else None for name in node.inputs)
    outputs = tuple(graph.tensors[name].spec for name in node.outputs if name)
    const_inputs = tuple(k for k, name in enumerate(node.inputs) if name in graph.constants)
    static_inputs = []
    if node.domain in ("", "ai.onnx"):
        weights = WEIGHT_INPUTS.get(node.op, set())
    else:
        weights = DOMAIN_WEIGHT_INPUTS.get((node.domain, node.op), set())
    for k in const_inputs:
        value = np.asarray(graph.constants[node.inputs[k]])
        if k not in weights and _is_static(value):
            static_inputs.append((k, np.asarray(value, order="C")))
    return Workload(op=node.op, inputs=inputs, outputs=outputs,
                    attrs=normalized_attrs(graph, node), epilogue=tuple(node.epilogue),
                    domain=node.domain, const_inputs=const_inputs,
                    static_inputs=tuple(static_inputs), opset=graph.opset)


def extract_workloads(graph: Graph) -> list[NodeWorkload]:
    """One `NodeWorkload` per node, in graph order."""
    return [NodeWorkload(node, workload_of(graph, node)) for node in graph.nodes]


def distinct(workloads: list[NodeWorkload]) -> dict[str, list[NodeWorkload]]:
    """Group node workloads by workload key (first appearance order)."""
    groups: dict[str, list[NodeWorkload]] = {}
    for item in workloads:
        groups.setdefault(item.workload.key, []).append(item)
    return groups
