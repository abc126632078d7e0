"""QuantizeLinear -> DequantizeLinear pairs of activations -> one float step, `fake_quant`.

A QDQ model (what onnxruntime's quantization tool writes by default, and PyTorch's and
TensorRT's quantization flows) marks every quantized activation with a QuantizeLinear
whose consumers are DequantizeLinear nodes of the same scale and zero point; the weights'
DequantizeLinear nodes read constants, and constant folding has already turned them into
float weights. What such a pair computes, as ONNX defines it, is a float function of x:

    (clip(round(x / scale) + zero_point, low, high) - zero_point) * scale

(`low`, `high`: the quantized type's range, e.g. 0 and 255 for uint8; round: half to
even), the epilogue step `fake_quant` of `wpk.core.epilogue`. Each pair becomes a one-step
`Elementwise[fake_quant]` node, so the elementwise and epilogue fusions that follow treat it
like any activation: into the producing Conv's or MatMul's epilogue, into a chain with its
neighbours; no integer tensor is left between the two.

The pass fires only where that is the pair's exact meaning: the QuantizeLinear's scale and
zero point are constant scalars (per-tensor quantization; a per-axis one stays as it is)
of an integer type up to 16 bits, x is float32, every reader of the quantized tensor is a
DequantizeLinear with the same scale and zero point, and the quantized tensor is not a
graph output. ONNX has no Round before opset 11, which the step's ONNX form needs, so a
model of an older opset keeps its pairs.
"""

from __future__ import annotations

import numpy as np

from wpk.core.epilogue import FAKE_QUANT
from wpk.core.graph import Graph, Node
from wpk.core.workload import EpilogueStep
from wpk.passes.base import GraphPass, constant_input, pinned_names, readers_of, remove_node
from wpk.passes.to_onnx import ELEMENTWISE_OP, WPK_DOMAIN

# Round, which the step's ONNX form uses, exists from this opset on
MIN_OPSET = 11
QUANTIZED_DTYPES = frozenset({"int8", "uint8", "int16", "uint16"})
# Ops that make a model quantized: onnxruntime's graph optimizations turn them (and the
# nodes between them) into integer kernels that round elsewhere than the nodes do.
QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                            "QLinearMatMul", "MatMulInteger", "ConvInteger", "QLinearAdd",
                            "QLinearMul", "QGemm", "QLinearSigmoid", "QLinearLeakyRelu",
                            "QLinearGlobalAveragePool", "QLinearAveragePool",
                            "QLinearConcat", "QLinearSoftmax", "DynamicQuantizeMatMul",
                            "MatMulIntegerToFloat"})


def quantizes(graph: Graph) -> bool:
    """Whether the model holds quantizing ops (`QUANTIZING_OPS`)."""
    return any(node.op in QUANTIZING_OPS for node in graph.nodes)


def _parameters(graph: Graph, node: Node) -> tuple[float, int, str] | None:
    """(scale, zero point, quantized dtype) of a per-tensor QuantizeLinear or
    DequantizeLinear whose parameters are constants, else None."""
    scale = constant_input(graph, node, 1)
    zero_point = constant_input(graph, node, 2, absent=np.zeros((), np.uint8))
    if scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1:
        return None
    if zero_point.dtype.name not in QUANTIZED_DTYPES or scale.dtype != np.float32:
        return None
    value = float(scale.ravel()[0])
    if not np.isfinite(value) or value <= 0:
        return None
    return value, int(zero_point.ravel()[0]), zero_point.dtype.name


def _is_plain(node: Node, op: str) -> bool:
    return node.op == op and node.domain in ("", "ai.onnx")


def fake_quant_step(scale: float, zero_point: int, dtype: str) -> EpilogueStep:
    """The `fake_quant` step of a QuantizeLinear/DequantizeLinear pair."""
    info = np.iinfo(dtype)
    return EpilogueStep(FAKE_QUANT, (("scale", scale), ("zero_point", float(zero_point)),
                                     ("low", float(info.min)), ("high", float(info.max))))


class QuantizeDequantize(GraphPass):
    """Replace activation QuantizeLinear -> DequantizeLinear pairs (see the module doc)."""

    name = "quantize_dequantize"

    def run(self, graph: Graph) -> Graph:
        if graph.opset < MIN_OPSET:
            return graph
        pinned = pinned_names(graph)
        readers = readers_of(graph)
        for node in list(graph.nodes):
            if _is_plain(node, "QuantizeLinear"):
                self._replace(graph, node, readers.get(node.outputs[0], []), pinned)
        return graph

    def _replace(self, graph: Graph, quantize: Node, readers: list[Node],
                 pinned: set[str]) -> None:
        params = _parameters(graph, quantize)
        x = quantize.inputs[0]
        if params is None or quantize.outputs[0] in pinned or not readers \
                or graph.tensors[x].dtype != "float32":
            return
        if not all(_is_plain(r, "DequantizeLinear") and r.inputs[0] == quantize.outputs[0]
                   and _parameters(graph, r) == params for r in readers):
            return
        kept, *others = readers
        for other in others:   # every pair computes the same value: one node is enough
            remove_node(graph, other)
            self._read_instead(graph, other.outputs[0], kept.outputs[0], pinned)
        kept.op, kept.domain, kept.attrs = ELEMENTWISE_OP, WPK_DOMAIN, {}
        kept.inputs, kept.epilogue = [x], (fake_quant_step(*params),)
        remove_node(graph, quantize)
        graph.tensors.pop(quantize.outputs[0], None)
        self.hit(FAKE_QUANT)

    @staticmethod
    def _read_instead(graph: Graph, old: str, new: str, pinned: set[str]) -> None:
        """Readers of `old` read `new`; a graph output keeps its name through an Identity."""
        for node in graph.nodes:
            if old in node.inputs:
                node.inputs = [new if i == old else i for i in node.inputs]
        if old in pinned:
            graph.nodes.append(Node("Identity", [new], [old], graph.unique_name(old)))
        else:
            graph.tensors.pop(old, None)
