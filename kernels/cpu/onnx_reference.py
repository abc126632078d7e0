"""`onnx.reference` as a kernel: the last resort for nodes onnxruntime cannot run.

    kernel = ONNX_REFERENCE.prepare(workload, consts, {})
    kernel(inputs, outputs)        # ReferenceEvaluator on the node's single-node model

ONNX's own Python evaluator implements nearly every op of the standard, in
every dtype numpy and `ml_dtypes` know (bfloat16, float8, int4, ...), where
onnxruntime's CPU provider lacks kernels (float8 casts, new opsets, training
and preview ops) or computes some wrongly. It is slow (numpy, one op at a
time), so it is a *last resort* (`Implementation.last_resort`): the planner
measures it only for a workload no other candidate computes correctly, and
reports it under its own name (kind `fallback`).

It is verified like every kernel, against `wpk.kernels.reference.reference`
on random inputs. Where that reference is wpk's own numpy formula, or
onnx.reference run in float64, the check is independent; for ops the
evaluator runs only in their own dtypes, the reference is the same evaluator
and the check covers the plumbing (output shapes and dtypes, every element
written), not the arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.deferred import onnx_reference
from wpk.core.errors import UnsupportedError
from wpk.core.workload import Workload
from wpk.kernels.cpu.library import finish_epilogue
from wpk.kernels.cpu.node_model import (
    MS_DOMAIN,
    build_node_model,
    check_buildable,
    core_input_count,
    input_name,
    output_name,
)
from wpk.kernels.epilogue import validate_epilogue
from wpk.kernels.registry import FALLBACK, Implementation, Kernel, register


def evaluator_for(workload: Workload, consts: Mapping[int, np.ndarray]):
    """(ReferenceEvaluator of the workload's node without its epilogue, fed input indices)."""
    from wpk.core.onnx_quantize import REFERENCE_OPS  # loads onnx: only where it runs

    node_model = build_node_model(workload, consts, with_epilogue=False)
    try:
        evaluator = onnx_reference.ReferenceEvaluator(node_model.model,
                                                      new_ops=list(REFERENCE_OPS))
    except Exception as exc:  # the evaluator raises whatever its op's constructor raises
        text = str(exc).strip().splitlines()
        raise UnsupportedError(f"{workload.label}: onnx.reference cannot load the node: "
                               f"{text[0] if text else type(exc).__name__}",
                               hint="the op or its attributes are not implemented by "
                                    "onnx.reference") from exc
    return evaluator, node_model.feeds


def store(outputs: Sequence[np.ndarray], results: Sequence, label: str) -> None:
    """Copy the evaluator's results into the preallocated outputs; shapes must match
    exactly (no broadcasting: a value-dependent shape is an error, not a stretched copy)."""
    for index, (out, value) in enumerate(zip(outputs, results)):
        value = np.asarray(value)
        if value.shape != out.shape:
            raise UnsupportedError(f"{label}: onnx.reference gave output {index} the shape "
                                   f"{value.shape}, the plan holds {out.shape}",
                                   hint="the output's shape depends on the input values")
        np.copyto(out, value, casting="unsafe")


class OnnxReferenceKernel(Implementation):
    """The node run by `onnx.reference.ReferenceEvaluator` (see the module docstring)."""

    name = "onnx.reference"
    kind = FALLBACK
    uses_blas = True  # numpy inside the evaluator may call BLAS (MatMul, Gemm, Conv)
    last_resort = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.domain == MS_DOMAIN:
            return "onnx.reference has no onnxruntime contrib ops"
        return check_buildable(workload) or validate_epilogue(workload.epilogue,
                                                              len(workload.inputs))

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        core = core_input_count(workload)
        evaluator, feeds = evaluator_for(workload, {i: v for i, v in consts.items()
                                                    if i < core})
        names = [output_name(j) for j in range(len(workload.outputs))]
        fed = [(i, input_name(i)) for i in feeds]
        steps, label = workload.epilogue, workload.label

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            results = evaluator.run(names, {name: inputs[i] for i, name in fed})
            store(outputs, results, label)
            finish_epilogue(outputs[0], steps, inputs)

        return kernel


ONNX_REFERENCE = register(OnnxReferenceKernel())
