"""A blocked per-channel gate multiply as MLAS's depthwise 1x1 NCHWc convolution.

The NCHWc layout pass writes a squeeze-excitation scale, x * gate with x a
blocked (1, Cb, H, W, b) tensor and gate a blocked (1, Cb, 1, 1, b) one, as a
one-step wpk `Elementwise` (mul by input 1). onnxruntime's standard Mul
broadcasts it in runs of b floats, slower than numpy; but the gate's memory
is exactly a depthwise 1x1 filter in MLAS's OIHWBo packing (Cb*b, 1, 1, 1),
so `com.microsoft.nchwc` Conv(x, gate, group = Cb*b) computes the product with
MLAS's vectorised, multi-threaded depthwise kernel. The filter is an
ordinary input of that kernel (nothing is pre-packed), so a gate computed at
run time works; padding lanes stay zero (x's are zero). Batch 1 only: one
filter serves every image of a batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wpk.core.deferred import helper, numpy_helper
from wpk.core.workload import Workload

ORT_NCHWC_DOMAIN = "com.microsoft.nchwc"
OUTPUT = "y"


def is_gate_multiply(workload: Workload) -> bool:
    """Whether a blocked Elementwise is x * gate: one `mul` of input 0 by input 1, x of the
    output's (1, Cb, H, W, b) shape and gate (1, Cb, 1, 1, b), float32."""
    if len(workload.inputs) != 2 or len(workload.outputs) != 1 or len(workload.epilogue) != 1:
        return False
    step = workload.epilogue[0]
    x, gate, out = workload.inputs[0], workload.inputs[1], workload.outputs[0]
    if step.op != "mul" or step.operand != 1 or x is None or gate is None:
        return False
    if any(s.dtype != "float32" for s in (x, gate, out)) or len(out.shape) != 5:
        return False
    n, cb, _, _, b = out.shape
    return n == 1 and x.shape == out.shape and gate.shape == (1, cb, 1, 1, b)


def build_gate_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The fragment Conv(x, gate as filter) with output 'y', and its feeds (graph input,
    workload input index). x and y are declared on the 4-d view (1, Cb*b, H, W), the gate
    as the filter (Cb*b, 1, 1, 1): the same memory in every case."""
    _, cb, h, w, b = workload.outputs[0].shape
    channels = cb * b
    view = [1, channels, h, w]
    node = helper.make_node("Conv", ["x", "gate"], [OUTPUT], domain=ORT_NCHWC_DOMAIN,
                            kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0],
                            dilations=[1, 1], group=channels)
    inputs, initializers, feeds = [helper.make_tensor_value_info("x", 1, view)], [], [("x", 0)]
    filter_shape = [channels, 1, 1, 1]
    if 1 in consts:
        initializers.append(numpy_helper.from_array(
            np.asarray(consts[1], np.float32).reshape(filter_shape), "gate"))
    else:
        inputs.append(helper.make_tensor_value_info("gate", 1, filter_shape))
        feeds.append(("gate", 1))
    graph = helper.make_graph([node], "nchwc_gate", inputs,
                              [helper.make_tensor_value_info(OUTPUT, 1, view)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ORT_NCHWC_DOMAIN, 1)])
    model.ir_version = 8
    return model, tuple(feeds)
