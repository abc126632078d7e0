"""`MaxPool` for `onnx.reference.ReferenceEvaluator`, its ceil_mode at unit strides mended.

onnx.reference (1.23) computes a MaxPool whose strides are all 1 with `ceil_mode=1` as if
its pads counted twice: a 5x5 pool with pads 2 over a 2x2 image gives 6x6, where the ONNX
spec and onnxruntime give 2x2. At unit strides the output size
`(in + pads - dilation * (kernel - 1) - 1) / 1 + 1` is a whole number, so rounding it up
or down is the same: `ceil_mode` changes nothing there, and this MaxPool evaluates such a
node without it. Found by the passes' fuzzer (`tests/fuzzing/mutations.py`): a YOLO whose
SPPF MaxPool had `ceil_mode` set could not have its shapes evaluated ("cannot determine
the shapes ...") while onnxruntime ran it.
"""

from __future__ import annotations

from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool


class MaxPool(ReferenceMaxPool):
    """onnx.reference's MaxPool, `ceil_mode` dropped where every stride is 1."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None,
             pads=None, storage_order=None, strides=None):
        if ceil_mode and (strides is None or all(s == 1 for s in strides)):
            ceil_mode = 0
        return super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                            kernel_shape=kernel_shape, pads=pads,
                            storage_order=storage_order, strides=strides)
