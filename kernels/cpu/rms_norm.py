"""onnxruntime's candidate for wpk's RMSNorm: the standard nodes the fusion replaced.

`layernorm.c` (`kernels/cpu/layernorm_native.py`) computes the op in one pass a row;
`ort.rms_norm` runs its written-out form (`rms_norm_spec.rms_norm_onnx_nodes`) in one
onnxruntime session, as onnxruntime would run the exporter's nodes, and joins
onnxruntime's regions like any onnxruntime step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.node_model import OnnxPart, expanded_model, input_name, output_name
from wpk.kernels.cpu.ort_node import create_session, session_kernel
from wpk.kernels.cpu.rms_norm_spec import (
    is_rms_norm,
    normalized_axis,
    rms_norm_onnx_nodes,
    rms_norm_reason,
)
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register


def rms_norm_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The written-out nodes as an ONNX model (inputs `in{i}`, output `out0`; constants as
    initializers) and the workload input indices it is fed."""
    rank = len(workload.inputs[0].shape)
    return expanded_model(
        workload, consts,
        lambda names: rms_norm_onnx_nodes(names, output_name(0), "rms_",
                                          normalized_axis(workload), rank,
                                          float(workload.attr("epsilon", 1e-5)),
                                          workload.opset, workload.inputs[0].dtype),
        "wpk_rms_norm")


class OrtRmsNorm(Implementation):
    """onnxruntime running the nodes the RMSNorm fusion replaced (one session)."""

    name = "ort.rms_norm"
    kind = VENDOR
    onnxruntime = True
    uses_blas = False
    joins_regions = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        if not is_rms_norm(workload):
            return "ort.rms_norm computes wpk's RMSNorm only"
        return rms_norm_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "unfused (Mul, ReduceMean, Add, Sqrt, Div, Mul)"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        model, feeds = rms_norm_model(workload, consts)
        session = create_session(model.SerializeToString(), workload.label,
                                 config.get("threads"))
        return session_kernel(session, workload, [(i, input_name(i)) for i in feeds])

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        model, feeds = rms_norm_model(workload, consts)
        return OnnxPart(model, tuple((input_name(i), i) for i in feeds), (output_name(0),))


ORT_RMS_NORM = register(OrtRmsNorm())
