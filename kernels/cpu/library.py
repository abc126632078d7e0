"""Common ground of the numpy/BLAS library implementations (kind `library`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.cpu.node_model import core_input_count
from wpk.kernels.epilogue import apply_epilogue
from wpk.kernels.registry import LIBRARY, Implementation
from wpk.kernels.support import unsupported_reason

_LIBRARY_DTYPES = frozenset({"float32", "float64"})


def finish_epilogue(out: np.ndarray, steps: Sequence[EpilogueStep],
                    inputs: Sequence[np.ndarray | None]) -> None:
    """Apply the epilogue to `out` in place (copying back if an operand broadcast it)."""
    if steps:
        result = apply_epilogue(out, steps, inputs)
        if result is not out:
            np.copyto(out, result.reshape(out.shape))


class NumpyImplementation(Implementation):
    """A numpy kernel for the ops in `ops`, for workloads wpk supports whose first input and
    outputs are of `dtypes` (float32 and float64 unless a kernel says more)."""

    kind = LIBRARY
    ops: tuple[str, ...] = ()
    dtypes: frozenset[str] = _LIBRARY_DTYPES

    @property
    def one_pool(self) -> bool:
        """numpy computes on the calling thread, except where it calls BLAS."""
        return not self.uses_blas

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.op not in self.ops:
            return f"{self.name} implements {', '.join(self.ops)}, not {workload.op}"
        if workload.domain not in ("", "ai.onnx", "wpk"):  # e.g. blocked wpk.nchwc ops
            return f"{self.name} implements default-domain ops, not {workload.domain}"
        reason = unsupported_reason(workload)
        if reason:
            return reason
        specs = [s for s in workload.inputs[:1] if s is not None] + list(workload.outputs)
        if any(s.dtype not in self.dtypes for s in specs):
            return f"{self.name} computes {', '.join(sorted(self.dtypes))} only"
        return self.extra_reason(workload)

    def extra_reason(self, workload: Workload) -> str | None:
        """Further limits of one implementation (None: none)."""
        return None

    @staticmethod
    def core_inputs(workload: Workload) -> int:
        """How many leading inputs the main op takes (the rest are epilogue operands)."""
        return core_input_count(workload)
