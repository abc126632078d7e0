"""Library implementation of the `wpk.nchwc` ops: unblock, run the logical op, block.

The logical NCHW op (`wpk.kernels.nchwc_logical`) is computed by the first
registered library (numpy/BLAS) implementation that supports it, so every
blocked workload has a second candidate besides onnxruntime's MLAS kernels,
with any block size. The reorders, DepthToSpace and ChannelGather are numpy copies.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.numpy_ops import pixel_shuffle_views
from wpk.kernels.nchwc_logical import (
    NCHWC_DOMAIN,
    logical_consts,
    logical_inputs,
    logical_workload,
)
from wpk.kernels.nchwc_reference import gather_reference, plain_depth_to_space, unblocked_input
from wpk.kernels.registry import LIBRARY, Candidate, Implementation, Kernel, candidates, register

_REORDERS = ("ReorderInput", "ReorderOutput", "DepthToSpace", "ChannelGather")


def _library_candidate(logical: Workload) -> Candidate | None:
    for candidate in candidates(logical, "cpu"):
        impl = candidate.implementation
        if impl.kind == LIBRARY and impl.name != NumpyNchwc.name:
            return candidate
    return None


class NumpyNchwc(Implementation):
    """Blocked ops through wpk's library kernels of the logical NCHW op."""

    name = "numpy.nchwc"
    kind = LIBRARY
    target = "cpu"

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.domain != NCHWC_DOMAIN:
            return "not a wpk.nchwc op"
        if workload.op in _REORDERS:
            return None
        try:
            logical = logical_workload(workload)
        except Exception as exc:  # an op without a logical form
            return str(exc)
        if _library_candidate(logical) is None:
            return f"no library implementation of the logical {logical.label}"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        b = int(workload.attr("block"))
        channels = int(workload.attr("channels"))
        channels_last = fmt.channels_last(workload)
        if workload.op == "ReorderInput":
            def reorder_input(inputs, outputs) -> None:
                x = inputs[0].transpose(0, 3, 1, 2) if channels_last else inputs[0]
                fmt.block(x, b, out=outputs[0])
            return reorder_input
        if workload.op == "ReorderOutput":
            def reorder_output(inputs, outputs) -> None:
                n, cb, h, w, _ = inputs[0].shape
                full = inputs[0].transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
                out = outputs[0].transpose(0, 3, 1, 2) if channels_last else outputs[0]
                np.copyto(out, full[:, :channels])
            return reorder_output
        if workload.op == "DepthToSpace":
            views = pixel_shuffle_views(plain_depth_to_space(workload))

            def depth_to_space(inputs, outputs) -> None:
                for src, dst in views([unblocked_input(workload, inputs[0])], outputs):
                    np.copyto(dst, src)
            return depth_to_space
        if workload.op == "ChannelGather":
            def channel_gather(inputs, outputs) -> None:
                np.copyto(outputs[0], gather_reference(workload, inputs, np.float32))
            return channel_gather

        logical = logical_workload(workload)
        candidate = _library_candidate(logical)
        padded_consts = logical_consts(workload, dict(consts))
        inner = candidate.implementation.prepare(logical, padded_consts, candidate.config)
        scratch = [np.empty(s.shape, dtype=s.dtype) for s in logical.outputs]

        def kernel(inputs, outputs) -> None:
            unblocked = logical_inputs(workload, [None if i in padded_consts else x
                                                  for i, x in enumerate(inputs)])
            for i, value in padded_consts.items():
                unblocked[i] = value
            inner(unblocked, scratch)
            for y, out in zip(scratch, outputs):
                fmt.block(y, b, out=out)

        return kernel


NUMPY_NCHWC = register(NumpyNchwc())
