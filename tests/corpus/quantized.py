"""Post-training quantized corpus models, as onnxruntime's quantization tool writes them.

Users who deploy on CPUs quantize their exported models, most often with onnxruntime's own
`quantize_static`: the torchscript export with its input shape fixed, onnxruntime's
pre-processing (`quant_pre_process`: shape inference, graph optimization), then static
quantization calibrated on a few seeded inputs, activations uint8 and weights int8, in one
of its two formats:

- `qdq` (its default): QuantizeLinear/DequantizeLinear pairs around float ops, weights
  per channel;
- `qop` (QOperator): QLinearConv, QLinearMatMul and onnxruntime's contrib QLinearAdd,
  QLinearMul, QGemm, ... on uint8 tensors, weights per tensor.

    model = quantized("mobilenetv3", "qdq", "ci")
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

CALIBRATION_INPUTS = 4


def quantized(architecture: str, quant_format: str, size: str) -> onnx.ModelProto:
    """The torchscript export of `architecture` at `size`, quantized in `quant_format`."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    from tests.corpus import torch_export
    from tests.corpus.torch_nets import make_network

    network, shape = make_network(architecture, size, 0)
    model = torch_export.export_torchscript(network, shape)
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, shape):
        dim.Clear()
        dim.dim_value = value

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.left = [{"x": np.random.default_rng(seed).standard_normal(shape)
                          .astype(np.float32)} for seed in range(CALIBRATION_INPUTS)]

        def get_next(self):
            return self.left.pop(0) if self.left else None

    with tempfile.TemporaryDirectory() as folder:
        source, ready, target = (Path(folder) / n for n in ("f.onnx", "p.onnx", "q.onnx"))
        onnx.save(model, source)
        quant_pre_process(str(source), str(ready))
        quantize_static(str(ready), str(target), Calibration(),
                        quant_format=QuantFormat.QDQ if quant_format == "qdq"
                        else QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=quant_format == "qdq")
        return onnx.load(target)
