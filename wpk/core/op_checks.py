"""A workload's own invariants from the ONNX spec of its op, checked before any kernel is
tried, so that a model error is reported as one (with what to fix), not as every kernel
failing to compute it.

    problem = op_problem(workload)    # None, or why the node violates its op's spec

The ONNX checker and shape inference let some of these through (a Conv with
`group=0`, or with channel counts that do not divide by its groups, passes both
when the model declares its output shapes).
"""

from __future__ import annotations

from collections.abc import Callable

from wpk.core.workload import Workload

_CONV_OPS = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
_WINDOW_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger",
               "QLinearConv")


def _positive_ints(workload: Workload) -> str | None:
    for name in ("strides", "dilations", "kernel_shape"):
        values = workload.attr(name)
        if values is not None and any(int(v) < 1 for v in values):
            return f"attribute {name}={list(values)} has a value below 1"
    return None


def _conv_channels(workload: Workload) -> str | None:
    group = int(workload.attr("group", 1))
    if group < 1:
        return f"attribute group={group}; it must be at least 1"
    weight_index = 3 if workload.op == "QLinearConv" else 1
    if len(workload.inputs) <= weight_index or not workload.inputs[0] \
            or not workload.inputs[weight_index]:
        return None
    x, w = workload.inputs[0].shape, workload.inputs[weight_index].shape
    if len(x) < 2 or len(w) < 2:
        return None
    if workload.op == "ConvTranspose":
        if x[1] != w[0]:
            return (f"input X has {x[1]} channels but the weight W (shape {list(w)}) expects "
                    f"{w[0]}")
        return None
    if x[1] % group:
        return f"input X has {x[1]} channels, which group={group} does not divide"
    if w[0] % group:
        return f"the weight W has {w[0]} output channels, which group={group} does not divide"
    if x[1] != w[1] * group:
        return (f"input X has {x[1]} channels but the weight W (shape {list(w)}) with "
                f"group={group} expects {w[1] * group} (W's dim 1 times group)")
    return None


_CHECKS: dict[str, tuple[Callable[[Workload], str | None], ...]] = {}
for _op in _WINDOW_OPS:
    _CHECKS[_op] = (_positive_ints,)
for _op in _CONV_OPS:
    _CHECKS[_op] = (*_CHECKS.get(_op, ()), _conv_channels)


def op_problem(workload: Workload) -> str | None:
    """Why `workload` violates the ONNX spec of its op (one sentence), or None."""
    if workload.domain not in ("", "ai.onnx"):
        return None
    for check in _CHECKS.get(workload.op, ()):
        problem = check(workload)
        if problem:
            return problem
    return None
