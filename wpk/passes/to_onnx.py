"""Turn a (possibly optimized) `Graph` back into a standard ONNX model.

    model = to_onnx(graph)                                  # runnable, checkable
    model = to_onnx(graph, notes={"conv_3": "chosen: ort.nchwc, 177 us"}, doc="...")

Fused epilogues, `Elementwise` and `Attention` nodes (domain 'wpk') are expanded into
standard ONNX ops of the graph's opset, so onnxruntime or
`onnx.reference` can run the result: useful to debug passes, to compare an
optimized graph with the original, and for `wpk inspect --export` and
`wpk report --graph`, whose files Netron shows. The nodes a fused node
expands into are named after it (`conv_3`, then `conv_3/Relu`, ...) and
each one's doc_string names the fused node and what it fused; `notes` adds a
text to the doc_string of every node a graph node became (the chosen
implementation and its time, for a plan); `doc` is the graph's doc_string.
Ops of wpk's own domains (the blocked NCHWc layout) are kept as they are: the
file passes `onnx.checker`, but only wpk runs those nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from wpk.core.graph import Graph, Node
from wpk.kernels.cpu.attention_spec import ATTENTION_DOMAIN, ATTENTION_OP, attention_onnx_nodes
from wpk.kernels.cpu.group_norm_spec import (
    GROUP_NORM_DOMAIN,
    GROUP_NORM_OP,
    group_norm_onnx_nodes,
)
from wpk.kernels.cpu.inverted_residual_spec import IR_DOMAIN, IR_OP, part_nodes
from wpk.kernels.cpu.rms_norm_spec import RMS_NORM_DOMAIN, RMS_NORM_OP, rms_norm_onnx_nodes
from wpk.kernels.cuda.irb_spec import IRB_OP
from wpk.kernels.cuda.irb_spec import part_nodes as irb_part_nodes
from wpk.kernels.epilogue import epilogue_onnx_nodes

ELEMENTWISE_OP = "Elementwise"
WPK_DOMAIN = "wpk"
# Inputs a fused node keeps before its epilogue operands (absent optional ones are '').
BASE_ARITY = {"Conv": 3, "Gemm": 3, "MatMul": 2, ELEMENTWISE_OP: 1}


def attr_to_proto(name: str, value: Any) -> onnx.AttributeProto | None:
    """An attribute value of a `Node` as an AttributeProto (None for an empty list)."""
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (tuple, list)):
        if not value:
            return None
        items = [numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for v in value]
        return helper.make_attribute(name, items)
    if isinstance(value, np.generic):
        value = value.item()
    return helper.make_attribute(name, value)


def node_to_proto(node: Node, inputs: list[str] | None = None,
                  outputs: list[str] | None = None) -> onnx.NodeProto:
    """A `Node` (without its epilogue) as a NodeProto."""
    proto = helper.make_node(node.op, list(node.inputs if inputs is None else inputs),
                             list(node.outputs if outputs is None else outputs),
                             name=node.name, domain=node.domain or None)
    for key, value in sorted(node.attrs.items()):
        attr = attr_to_proto(key, value)
        if attr is not None:
            proto.attribute.append(attr)
    return proto


def fused_text(node: Node) -> str:
    """What a node computes, fusions included: 'Conv +relu +add'."""
    return node.op + "".join(f" +{step.op}" for step in node.epilogue)


class _Emitter:
    """Collects the nodes of the exported model, named and annotated."""

    def __init__(self, graph: Graph, notes: Mapping[str, str] | None = None):
        self.graph = graph
        self.opset = graph.opset
        self.notes = dict(notes or {})
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0
        self.dtypes: dict[str, str] = {}   # tensors of expanded fused nodes, not in the graph

    def fresh(self, base: str) -> str:
        """A tensor name not used yet, from `base`."""
        self.count += 1
        return f"{base}__x{self.count}"

    def node(self, node: Node) -> None:
        """Emit the ONNX nodes of one graph node, named and annotated."""
        start = len(self.nodes)
        self._emit(node)
        self._annotate(node, self.nodes[start:])

    def _emit(self, node: Node) -> None:
        if node.op == ATTENTION_OP and node.domain == ATTENTION_DOMAIN:
            self._attention(node)
            return
        if node.op == RMS_NORM_OP and node.domain == RMS_NORM_DOMAIN:
            self._rms_norm(node)
            return
        if node.op == GROUP_NORM_OP and node.domain == GROUP_NORM_DOMAIN:
            self._group_norm(node)
            return
        if node.domain == IR_DOMAIN and node.op in (IR_OP, IRB_OP):  # its three convs
            parts = part_nodes if node.op == IR_OP else irb_part_nodes
            for part in parts(node, self.fresh):
                self.dtypes[part.outputs[0]] = self.graph.tensors[node.inputs[0]].dtype
                self._emit(part)
            return
        if not node.epilogue and node.op != ELEMENTWISE_OP:
            self.nodes.append(node_to_proto(node))
            return
        out = node.outputs[0]
        dtype = self.dtypes.get(out) or self.graph.tensors[out].dtype
        if node.op == ELEMENTWISE_OP:
            value = node.inputs[0]
        else:
            base = node.inputs[:BASE_ARITY.get(node.op, len(node.inputs))]
            while base and not base[-1]:
                base.pop()
            value = self.fresh(out)
            self.nodes.append(node_to_proto(node, inputs=base, outputs=[value]))
        self.nodes += epilogue_onnx_nodes(node.epilogue, value, node.inputs, out,
                                          self.fresh(out) + "_", dtype=dtype, opset=self.opset)

    def _attention(self, node: Node) -> None:
        """wpk's fused attention as the standard nodes it replaced."""
        out = node.outputs[0]
        rank = len(self.graph.tensors[node.inputs[0]].shape)
        self.nodes += attention_onnx_nodes(node.inputs, out, self.fresh(out) + "_",
                                           float(node.attr("scale", 1.0)),
                                           bool(node.attr("k_transposed", 0)), rank, self.opset,
                                           node.attr("bshd"))

    def _rms_norm(self, node: Node) -> None:
        """wpk's RMSNorm as standard nodes (Mul, ReduceMean, Add, Sqrt, Div, Mul)."""
        out = node.outputs[0]
        info = self.graph.tensors[node.inputs[0]]
        self.nodes += rms_norm_onnx_nodes(node.inputs, out, self.fresh(out) + "_",
                                          int(node.attr("axis", -1)), len(info.shape),
                                          float(node.attr("epsilon", 1e-5)), self.opset,
                                          info.dtype)

    def _group_norm(self, node: Node) -> None:
        """wpk's GroupNorm as the exporters' nodes (Reshape, InstanceNormalization, Reshape,
        Mul, Add), then its epilogue's."""
        out = node.outputs[0]
        info = self.graph.tensors[node.inputs[0]]
        prefix = self.fresh(out) + "_"
        value = prefix + "value" if node.epilogue else out
        self.nodes += group_norm_onnx_nodes(node.inputs, value, prefix, info.shape,
                                            int(node.attr("groups")),
                                            float(node.attr("epsilon", 1e-5)), info.dtype)
        if node.epilogue:
            self.nodes += epilogue_onnx_nodes(node.epilogue, value, node.inputs, out,
                                              prefix + "epilogue_", dtype=info.dtype,
                                              opset=self.opset)

    def _annotate(self, node: Node, protos: list[onnx.NodeProto]) -> None:
        """Name the nodes a graph node became after it and say so in their doc_string."""
        texts = []
        if len(protos) > 1:
            texts.append(f"part of wpk fused node '{node.name}' ({fused_text(node)}), "
                         f"one of {len(protos)} ONNX nodes it expands into")
        if node.name in self.notes:
            texts.append(self.notes[node.name])
        for index, proto in enumerate(protos):
            if index or not proto.name:
                proto.name = f"{node.name}/{proto.op_type}_{index}"
            own = ([f"op of wpk's domain '{proto.domain}', which only wpk runs"]
                   if proto.domain not in ("", "ai.onnx") else [])
            if texts or own:
                proto.doc_string = "; ".join(own + texts)


def _value_info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    info = graph.tensors[name]
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), list(info.shape))


def to_onnx(graph: Graph, notes: Mapping[str, str] | None = None,
            doc: str = "") -> onnx.ModelProto:
    """The graph as a standard ONNX model (epilogues and `Elementwise` nodes expanded, named
    and annotated; see the module docstring)."""
    emit = _Emitter(graph, notes)
    for node in graph.nodes:
        emit.node(node)
    initializers = [numpy_helper.from_array(np.asarray(v, order="C"), name)
                    for name, v in graph.constants.items()]
    produced = {o for n in graph.nodes for o in n.outputs}
    value_info = [_value_info(graph, name) for name in produced
                  if name in graph.tensors and name not in graph.outputs]
    proto = helper.make_graph(emit.nodes, graph.name,
                              [_value_info(graph, i) for i in graph.inputs],
                              [_value_info(graph, o) for o in graph.outputs],
                              initializer=initializers, value_info=value_info,
                              doc_string=doc or None)
    versions = {d: v for d, v in graph.opsets.items() if d != WPK_DOMAIN}
    for node in emit.nodes:  # custom domains of later passes (e.g. wpk.nchwc), version 1
        versions.setdefault(node.domain, 1)
    opsets = [helper.make_opsetid(d, v) for d, v in versions.items()]
    model = helper.make_model(proto, opset_imports=opsets, producer_name="wpk")
    model.ir_version = min(model.ir_version, 10)
    return model
