"""`Loop` for `onnx.reference.ReferenceEvaluator(..., new_ops=[Loop])`: the reference's own
Loop, with its scan outputs stacked as the ONNX spec says.

    evaluator = ReferenceEvaluator(model, new_ops=[Loop])

ONNX's spec: a scan output of a Loop that ran M iterations has shape [M, *s], where s is the
shape of the value one iteration produced. onnx.reference stacks them with `np.vstack`, which
gives a scalar scan output the shape [M, 1] and merges the first two axes of one of rank
2 or more ([M*a, b] instead of [M, a, b]); wpk infers shapes with that evaluator and uses it
as a last-resort kernel, so a plan would have carried the wrong shape.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop


class Loop(_ReferenceLoop):
    """onnx.reference's Loop whose scan outputs are [M, *one iteration's shape]."""

    op_domain = ""

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        body = self._run_body  # set per instance by OpRun from the `body` attribute
        self._scan_shapes: list[tuple[int, ...]] | None = None

        def recorded(*args, **kwargs):
            outputs = body(*args, **kwargs)
            scans = outputs[len(outputs) - self.K:] if self.K else []
            self._scan_shapes = [np.shape(value) for value in scans]
            return outputs

        self._run_body = recorded

    def _run(self, *args, **kwargs):
        self._scan_shapes = None
        results = list(super()._run(*args, **kwargs))
        for index, shape in enumerate(self._scan_shapes or ()):
            stacked = np.asarray(results[self.N + index])
            results[self.N + index] = stacked.reshape(-1, *shape)
        return tuple(results)
