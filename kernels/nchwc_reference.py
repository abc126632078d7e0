"""Float64 references of the `wpk.nchwc` ops (semantics in `wpk.passes.nchwc_layout`).

ReorderInput and ReorderOutput are exact layout changes. Every other op is
unblocked, computed as its logical NCHW op (`wpk.kernels.nchwc_logical`) by
the standard float64 reference `wpk.kernels.reference.reference`, and
re-blocked with the padding lanes the logical op gives them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.nchwc_logical import logical_inputs, logical_workload
from wpk.kernels.reference import reference, to_float64


def nchwc_reference(workload: Workload, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Float64 outputs of a `wpk.nchwc` workload."""
    b = int(workload.attr("block"))
    channels_last = fmt.channels_last(workload)
    if workload.op == "ReorderInput":
        x = np.asarray(inputs[0], dtype=np.float64)
        return [fmt.block(x.transpose(0, 3, 1, 2) if channels_last else x, b)]
    if workload.op == "ReorderOutput":
        y = fmt.unblock(np.asarray(inputs[0], dtype=np.float64), int(workload.attr("channels")))
        return [np.ascontiguousarray(y.transpose(0, 2, 3, 1)) if channels_last else y]
    logical = logical_workload(workload)
    values = [to_float64(x) for x in logical_inputs(workload, inputs)]
    outputs = reference(logical, values)
    return [fmt.block(np.asarray(y, dtype=np.float64), b) for y in outputs]
