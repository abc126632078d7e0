"""numpy kernels of the ops exporters write around masks and ids (`numpy.mask`).

Cast, the comparisons (Equal, Greater, Less, GreaterOrEqual, LessOrEqual), the boolean
ops (Not, And, Or), Where, and ArgMax/ArgMin, for any dtype numpy holds
(`kernels.support`): an HF transformers model's int64 `attention_mask` cast to float,
torch's padding mask compared and selected, a detector's or segmenter's best class. Each
writes into its output buffer (`out=`, `np.copyto`), with numpy's broadcasting; a float
output carries its epilogue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.library import NumpyImplementation, finish_epilogue
from wpk.kernels.registry import Kernel, register
from wpk.kernels.support import INDEX_OPS, MASK_OPS, NUMPY_DTYPES

_BINARY = {"Equal": np.equal, "Greater": np.greater, "Less": np.less,
           "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal,
           "And": np.logical_and, "Or": np.logical_or}


def _arg_extreme(workload: Workload):
    """ArgMax/ArgMin along `axis` (first index of a tie, or last with select_last_index),
    written as the int64 output (kept dims or not: the output's shape says)."""
    find = np.argmax if workload.op == "ArgMax" else np.argmin
    axis = int(workload.attr("axis", 0)) % len(workload.inputs[0].shape)
    last = bool(workload.attr("select_last_index", 0))
    size = workload.inputs[0].shape[axis]

    def compute(inputs, out):
        x = inputs[0]
        if last:   # the first extreme of the reversed axis is the last of the axis
            index = size - 1 - find(np.flip(x, axis), axis=axis, keepdims=True)
        else:
            index = find(x, axis=axis, keepdims=True)
        np.copyto(out, index.reshape(out.shape))

    return compute


def _where(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
    condition, x, y = inputs[:3]
    np.copyto(out, y)
    np.copyto(out, x, where=condition)   # where= broadcasts like the sources


class NumpyMask(NumpyImplementation):
    """Cast, comparisons, boolean ops, Where, ArgMax and ArgMin in numpy (see the module
    docstring)."""

    name = "numpy.mask"
    uses_blas = False
    ops = tuple(sorted(MASK_OPS | INDEX_OPS))
    dtypes = NUMPY_DTYPES

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        op, steps = workload.op, workload.epilogue
        if op == "Cast":
            def compute(inputs, out):
                np.copyto(out, inputs[0], casting="unsafe")
        elif op == "Not":
            def compute(inputs, out):
                np.logical_not(inputs[0], out=out)
        elif op == "Where":
            compute = _where
        elif op in INDEX_OPS:
            compute = _arg_extreme(workload)
        else:
            ufunc = _BINARY[op]

            def compute(inputs, out):
                ufunc(inputs[0], inputs[1], out=out)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            compute(inputs, outputs[0])
            finish_epilogue(outputs[0], steps, inputs)

        return kernel


NUMPY_MASK = register(NumpyMask())
