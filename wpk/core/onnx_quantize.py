"""`DequantizeLinear` for `onnx.reference.ReferenceEvaluator` at every opset.

    evaluator = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS))

onnx.reference implements DequantizeLinear from opset 19 on only, so a model of an older
opset (onnxruntime's own quantization tool writes opset 10-17 QDQ models: QuantizeLinear,
DequantizeLinear around every Conv and MatMul) could not be evaluated: its shapes not
completed, its constant weights not folded, its nodes not verified. The op's meaning has
not changed since opset 10, only grown (opset 13 a per-axis scale, `axis`; later ones more
types, blocks and `output_dtype`), so the newest implementation, with its attributes'
defaults, computes the older versions too. `REFERENCE_OPS` is every op wpk gives
onnx.reference: this one, `wpk.core.onnx_loop.Loop`, `wpk.core.onnx_pool`'s MaxPool,
AveragePool and LpPool, and `wpk.core.onnx_gather.GatherElements`.
"""

from __future__ import annotations

from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_25

from wpk.core.onnx_gather import GatherElements
from wpk.core.onnx_loop import Loop
from wpk.core.onnx_pool import AveragePool, LpPool, MaxPool


class DequantizeLinear(DequantizeLinear_25):
    """onnx.reference's newest DequantizeLinear, for every opset from 10 on."""

    op_domain = ""


REFERENCE_OPS = (Loop, DequantizeLinear, MaxPool, AveragePool, LpPool, GatherElements)
