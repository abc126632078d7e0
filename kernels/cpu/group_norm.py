"""The library and onnxruntime candidates of wpk's GroupNorm (`group_norm_spec`).

`numpy.group_norm` computes the op with numpy in float32 (`group_norm_formula`, statistics
in float64), the epilogue after it; the blocked form reaches it through `numpy.nchwc`.
`ort.group_norm` runs the exporters' written-out form (`group_norm_onnx_nodes`) and the
epilogue's nodes in one onnxruntime session, as onnxruntime would run the exporter's nodes,
and joins onnxruntime's regions like any onnxruntime step. `groupnorm.c`
(`group_norm_native`) is the generated kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.group_norm_spec import (
    GROUP_NORM_DOMAIN,
    GROUP_NORM_OP,
    group_norm_formula,
    group_norm_onnx_nodes,
    group_norm_reason,
)
from wpk.kernels.cpu.library import NumpyImplementation
from wpk.kernels.cpu.node_model import OnnxPart, expanded_model, input_name, output_name
from wpk.kernels.cpu.ort_node import create_session, session_kernel
from wpk.kernels.epilogue import apply_epilogue_into, epilogue_onnx_nodes
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register


def _plain_reason(workload: Workload) -> str | None:
    if workload.op != GROUP_NORM_OP or workload.domain != GROUP_NORM_DOMAIN:
        return "computes wpk's plain GroupNorm only"
    return group_norm_reason(workload)


class NumpyGroupNorm(NumpyImplementation):
    """GroupNorm with numpy, then its epilogue."""

    name = "numpy.group_norm"
    ops = (GROUP_NORM_OP,)

    def extra_reason(self, workload: Workload) -> str | None:
        return _plain_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "numpy, statistics in float64"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        steps = workload.epilogue

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            arrays = [np.asarray(a, np.float32) for a in inputs[:3]]
            apply_epilogue_into(outputs[0], group_norm_formula(workload, arrays)[0], steps,
                                inputs)

        return kernel


def group_norm_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The written-out nodes and the epilogue's as an ONNX model (inputs `in{i}`, output
    `out0`; constants as initializers) and the workload input indices it is fed."""
    shape = workload.inputs[0].shape

    def nodes(names: list[str]) -> list:
        normed = "gn_value" if workload.epilogue else output_name(0)
        result = group_norm_onnx_nodes(names, normed, "gn_", shape,
                                       int(workload.attr("groups")),
                                       float(workload.attr("epsilon", 1e-5)))
        if workload.epilogue:
            result += epilogue_onnx_nodes(workload.epilogue, normed, names, output_name(0),
                                          "gn_epilogue_", opset=workload.opset,
                                          onnxruntime=True)
        return result

    return expanded_model(workload, consts, nodes, "wpk_group_norm")


class OrtGroupNorm(Implementation):
    """onnxruntime running the nodes the GroupNorm fusion replaced (one session)."""

    name = "ort.group_norm"
    kind = VENDOR
    onnxruntime = True
    uses_blas = False
    joins_regions = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        return _plain_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "unfused (Reshape, InstanceNormalization, Reshape, Mul, Add)"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        model, feeds = group_norm_model(workload, consts)
        session = create_session(model.SerializeToString(), workload.label,
                                 config.get("threads"))
        return session_kernel(session, workload, [(i, input_name(i)) for i in feeds])

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        model, feeds = group_norm_model(workload, consts)
        return OnnxPart(model, tuple((input_name(i), i) for i in feeds), (output_name(0),))


NUMPY_GROUP_NORM = register(NumpyGroupNorm())
ORT_GROUP_NORM = register(OrtGroupNorm())
