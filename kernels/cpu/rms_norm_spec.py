"""wpk's RMS normalization op: what it computes, its float64 formula and its ONNX form.

    RMSNorm(X, Scale) (domain 'wpk', attributes axis, epsilon)
      = X / sqrt(mean(X^2 over the axes from `axis` on) + epsilon) * Scale

Scale has the normalized axes' shape. LLaMA-, T5- and Gemma-style transformers normalize
this way; torch's exporters write it out (Pow or Mul, ReduceMean, Add, Sqrt, then Div, or
Reciprocal and Mul, or Div(1, .) and Mul, then Mul by the weight), and ONNX defines it
as an op only from opset 23. The CPU pass `rms_norm` (`wpk.passes.norm_rules`) writes
the node; `rms_norm_onnx_nodes` expands it back into standard nodes (for onnxruntime's
candidate and `to_onnx`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wpk.core.deferred import helper, numpy_helper
from wpk.core.workload import Workload

RMS_NORM_OP = "RMSNorm"
RMS_NORM_DOMAIN = "wpk"


def is_rms_norm(workload: Workload) -> bool:
    """Whether the workload is wpk's RMS normalization."""
    return workload.op == RMS_NORM_OP and workload.domain == RMS_NORM_DOMAIN


def normalized_axis(workload: Workload) -> int:
    """The first normalized axis, non-negative."""
    return int(workload.attr("axis", -1)) % len(workload.inputs[0].shape)


def rms_norm_reason(workload: Workload) -> str | None:
    """None when the workload is a valid RMSNorm wpk computes, else why not."""
    inputs = workload.inputs
    if len(inputs) != 2 or any(s is None for s in inputs) or not inputs[0].shape:
        return "RMSNorm takes X (rank >= 1) and Scale"
    if len(workload.outputs) != 1 or workload.epilogue:
        return "RMSNorm writes Y only (no fused epilogue)"
    if any(s.dtype not in ("float32", "float64") for s in (*inputs, *workload.outputs)):
        return "RMSNorm computes float tensors only"
    x = inputs[0].shape
    axis = int(workload.attr("axis", -1))
    if not -len(x) <= axis < len(x):
        return f"axis {axis} is out of range for rank {len(x)}"
    if tuple(inputs[1].shape) != tuple(x[axis % len(x):]):
        return "Scale must have the normalized axes' shape"
    if tuple(workload.outputs[0].shape) != tuple(x):
        return "Y has X's shape"
    return None


def rms_norm_formula(workload: Workload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """[Y] in float64."""
    x, scale = (np.asarray(a, np.float64) for a in inputs[:2])
    axes = tuple(range(normalized_axis(workload), x.ndim))
    eps = float(workload.attr("epsilon", 1e-5))
    return [x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps) * scale]


def rms_norm_onnx_nodes(inputs: Sequence[str], output: str, prefix: str, axis: int,
                        rank: int, epsilon: float, opset: int, dtype: str = "float32"):
    """The standard ONNX nodes of the op: Mul (square), ReduceMean over the axes from `axis`
    on (kept), Add epsilon (a Constant node), Sqrt, Div, Mul by Scale; names and
    intermediate tensors start with `prefix`."""
    x, scale = inputs[:2]
    axes = list(range(axis % rank, rank))
    eps = numpy_helper.from_array(np.array(epsilon, dtype), f"{prefix}eps")
    nodes = [helper.make_node("Constant", [], [f"{prefix}eps"], f"{prefix}eps_constant",
                              value=eps),
             helper.make_node("Mul", [x, x], [f"{prefix}square"], f"{prefix}square")]
    if opset >= 18:   # ReduceMean's axes became an input
        values = numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}axes")
        nodes.append(helper.make_node("Constant", [], [f"{prefix}axes"],
                                      f"{prefix}axes_constant", value=values))
        nodes.append(helper.make_node("ReduceMean", [f"{prefix}square", f"{prefix}axes"],
                                      [f"{prefix}mean"], f"{prefix}mean", keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", [f"{prefix}square"], [f"{prefix}mean"],
                                      f"{prefix}mean", axes=axes, keepdims=1))
    nodes += [helper.make_node("Add", [f"{prefix}mean", f"{prefix}eps"], [f"{prefix}var"],
                               f"{prefix}add_eps"),
              helper.make_node("Sqrt", [f"{prefix}var"], [f"{prefix}rms"], f"{prefix}sqrt"),
              helper.make_node("Div", [x, f"{prefix}rms"], [f"{prefix}normed"],
                               f"{prefix}div"),
              helper.make_node("Mul", [f"{prefix}normed", scale], [output], f"{prefix}scale")]
    return nodes
