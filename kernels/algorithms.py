"""Names of the algorithms kernels compute convolutions and products with, as reports
show them (`Implementation.algorithm`).

    conv_algorithm(workload)   # 'depthwise', '1x1' or 'direct'

Several implementations pick their code path from the Conv's shape the same
way (onnxruntime's MLAS NCHWc kernels, wpk's generated loop nests): one
channel per group is depthwise, a 1x1 window without padding is a pointwise
(1x1) product, anything else is computed directly over the window.
"""

from __future__ import annotations

from wpk.core.workload import Workload
from wpk.kernels.nchwc_logical import is_depthwise

DIRECT = "direct"
POINTWISE = "1x1"
DEPTHWISE = "depthwise"
GEMM = "gemm"


def is_pointwise(workload: Workload) -> bool:
    """A Conv with a 1x1 window and no padding (any stride); workloads carry explicit pads
    (`wpk.workloads` resolves auto_pad)."""
    kernel = workload.inputs[1].shape[2:]
    return all(k == 1 for k in kernel) and not any(int(p) for p in workload.attr("pads", ()))


def conv_algorithm(workload: Workload) -> str:
    """'depthwise', '1x1' or 'direct' for a Conv workload (standard or `wpk.nchwc`)."""
    if is_depthwise(workload):
        return DEPTHWISE
    return POINTWISE if is_pointwise(workload) else DIRECT
