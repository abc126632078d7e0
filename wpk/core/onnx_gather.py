"""`GatherElements` for `onnx.reference.ReferenceEvaluator`, computed here.

onnx.reference's GatherElements (onnx 1.23) gathers with `np.choose`, which takes at most
64 choices; past that, for 2-d tensors, it falls back to a loop that reads only the first
index of each row and fails to reshape the result. A Hugging Face BERT exported by
`torch.onnx.export` gathers its 128 token type ids from a 512-long buffer along axis 1,
so wpk could neither fold that constant chain nor evaluate the model for its shapes, and
refused the model ("cannot determine the shapes of /embeddings/Expand_output_0 ...").

Here it is `np.take_along_axis`: negative indices count from the axis' end, and the data
is first cut to the indices' sizes along the other axes (the spec lets them be smaller,
as torch.gather does).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


class GatherElements(OpRun):
    """The spec's GatherElements (every opset from 11 on)."""

    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = int(axis or 0) % data.ndim
        indices = np.asarray(indices, np.int64)
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        window = tuple(slice(None) if dim == axis else slice(0, size)
                       for dim, size in enumerate(indices.shape))
        return (np.take_along_axis(data[window], indices, axis=axis),)
