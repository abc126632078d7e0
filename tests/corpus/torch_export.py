"""Export the corpus networks with torch's two ONNX exporters, as users run them.

- `export_torchscript`: `torch.onnx.export(..., dynamo=False)`, opset 17, batch
  axis dynamic (`dynamic_axes`, the usual tutorial recipe), constant folding on.
  The graph keeps the tracer's Shape -> Gather -> Unsqueeze -> Concat chains
  for every reshape that reads `x.shape`.
- `export_dynamo`: `torch.onnx.export(..., dynamo=True)`, opset 18, static
  shapes, with the exporter's default onnxscript optimizer. Needs `onnxscript`.

Both return an `onnx.ModelProto` with one input "x"; exporting the same module
twice gives the same bytes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import torch

TORCHSCRIPT_OPSET = 17
DYNAMO_OPSET = 18
INPUT_NAME = "x"


@contextlib.contextmanager
def _quiet_exporter():
    """Silence the exporters' deprecation warnings and their log lines about torchvision,
    and turn off torch's fused attention fast path while exporting (its
    `_transformer_encoder_layer_fwd` has no ONNX form: torch's own advice for export)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch._dynamo",
                                                    "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    fastpath = torch.backends.mha.get_fastpath_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            yield
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def export_torchscript(module: torch.nn.Module, input_shape: tuple[int, ...],
                       opset: int = TORCHSCRIPT_OPSET) -> onnx.ModelProto:
    """The TorchScript (tracing) exporter's model of `module`, batch axis named "batch"."""
    example = torch.zeros(input_shape)
    buffer = io.BytesIO()
    with _quiet_exporter(), torch.no_grad():
        torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=["y"],
                          dynamic_axes={INPUT_NAME: {0: "batch"}, "y": {0: "batch"}},
                          do_constant_folding=True)
    return onnx.load_from_string(buffer.getvalue())


def export_dynamo(module: torch.nn.Module, input_shape: tuple[int, ...],
                  opset: int = DYNAMO_OPSET) -> onnx.ModelProto:
    """The dynamo (torch.export) exporter's model of `module`, static shapes.

    Raises `ImportError` when onnxscript, which that exporter needs, is missing.
    """
    import onnxscript  # noqa: F401 - the exporter's dependency; fail early and clearly

    example = torch.zeros(input_shape)
    with _quiet_exporter(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(module, (example,), dynamo=True, opset_version=opset,
                                    input_names=[INPUT_NAME], output_names=["y"],
                                    verbose=False)
    return program.model_proto
