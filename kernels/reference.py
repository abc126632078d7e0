"""Float64 references: what a workload computes, epilogue included.

Every candidate implementation is verified against `reference`. The hot ops
(Conv, Gemm, MatMul, pooling, normalizations, elementwise and data movement)
have numpy formulations evaluated in float64; any other op runs through
`onnx.reference.ReferenceEvaluator` on a single-node model (in float64 when
the op accepts it, else in the original dtypes), followed by the epilogue in
numpy.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from wpk.core.deferred import onnx_reference
from wpk.core.errors import UnsupportedError
from wpk.core.numerics import ROUNDING_OPS, is_ml_dtype
from wpk.core.workload import Workload
from wpk.kernels.cpu.attention_spec import attention_formula, is_attention
from wpk.kernels.cpu.group_norm_spec import group_norm_formula, is_group_norm
from wpk.kernels.cpu.inverted_residual_spec import inverted_residual_formula, is_inverted_residual
from wpk.kernels.cpu.nn_formulas import NN_FORMULAS
from wpk.kernels.cpu.node_model import (
    MS_DOMAIN,
    build_node_model,
    check_buildable,
    core_input_count,
    input_name,
    is_elementwise,
    output_name,
)
from wpk.kernels.cpu.rms_norm_spec import is_rms_norm, rms_norm_formula
from wpk.kernels.cpu.tensor_formulas import TENSOR_FORMULAS
from wpk.kernels.cpu.window import pad_spatial, window_geometry, windows
from wpk.kernels.cuda.irb_spec import irb_formula, is_irb_nchw
from wpk.kernels.epilogue import apply_epilogue, validate_epilogue
from wpk.kernels.support import unsupported_reason

if TYPE_CHECKING:
    from onnx.reference import ReferenceEvaluator

_FLOAT_KINDS = "f"


def _conv(workload: Workload, inputs) -> list[np.ndarray]:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    group = int(workload.attr("group", 1))
    rank = x.ndim - 2
    geom = window_geometry(workload, tuple(w.shape[2:]))
    view = windows(pad_spatial(x, geom, 0.0), geom)          # [N, C, *out, *k]
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    view = view.reshape((n, group, cg) + view.shape[2:])
    wg = w.reshape((group, mg, cg) + w.shape[2:])
    if group == 1:
        k_axes = list(range(3 + rank, 3 + 2 * rank))
        y = np.tensordot(view[:, 0], wg[0], axes=([1] + [a - 1 for a in k_axes],
                                                  [1] + list(range(2, 2 + rank))))
        y = np.moveaxis(y, -1, 1)                             # [N, M, *out]
    else:
        letters = string.ascii_letters
        out_l, k_l = letters[:rank], letters[rank:2 * rank]
        spec = f"NGC{out_l}{k_l},GMC{k_l}->NGM{out_l}"
        y = np.einsum(spec, view, wg, optimize=True).reshape((n, m) + geom.out_size)
    if bias is not None:
        y = y + bias.reshape((1, m) + (1,) * rank)
    return [y]


def _gemm(workload: Workload, inputs) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    a = a.T if workload.attr("transA", 0) else a
    b = b.T if workload.attr("transB", 0) else b
    y = workload.attr("alpha", 1.0) * (a @ b)
    if c is not None:
        y = y + workload.attr("beta", 1.0) * c
    return [y]


def _matmul(workload: Workload, inputs) -> list[np.ndarray]:
    return [np.matmul(inputs[0], inputs[1])]


REFERENCE_FORMULAS = {"Conv": _conv, "Gemm": _gemm, "MatMul": _matmul,
                      **TENSOR_FORMULAS, **NN_FORMULAS}


def to_float64(x: np.ndarray | None) -> np.ndarray | None:
    """Float arrays as float64; anything else unchanged."""
    if x is None:
        return None
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind in _FLOAT_KINDS else x


def has_formula(workload: Workload) -> bool:
    """Whether the reference uses wpk's own numpy formulation (not onnx.reference): only
    where it covers the workload's whole ONNX definition (`kernels.support`), so e.g. a
    linear Resize is judged by onnx.reference, not by the nearest-only formula."""
    if is_elementwise(workload) or is_attention(workload) or is_inverted_residual(workload) \
            or is_irb_nchw(workload) or is_rms_norm(workload) or is_group_norm(workload):
        return True
    return (workload.domain in ("", "ai.onnx") and workload.op in REFERENCE_FORMULAS
            and unsupported_reason(workload) is None)


def reference(workload: Workload, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """The workload's outputs in float64 (float outputs), epilogue applied to output 0."""
    if workload.domain == "wpk.nchwc":  # blocked layout: unblock, reference, re-block
        # imported here: nchwc_reference builds on this module (a cycle at module level)
        from wpk.kernels.nchwc_reference import nchwc_reference
        return nchwc_reference(workload, inputs)
    if is_inverted_residual(workload):  # its three blocked convs, one after the other
        return [np.asarray(y, np.float64) for y in inverted_residual_formula(workload, inputs)]
    if is_irb_nchw(workload):  # its three NCHW convs, one after the other
        return irb_formula(workload, inputs)
    if len(inputs) != len(workload.inputs):
        raise UnsupportedError(f"{workload.label}: {len(inputs)} inputs given, "
                               f"{len(workload.inputs)} expected",
                               hint="pass one array (or None) per workload input")
    reason = validate_epilogue(workload.epilogue, len(inputs))
    if reason:
        raise UnsupportedError(f"{workload.label}: {reason}",
                               hint="see EPILOGUE_TABLE in wpk.core.epilogue for the steps")
    if all(0 in spec.shape for spec in workload.outputs):
        return _empty_outputs(workload)
    wide = [to_float64(x) for x in inputs]
    if is_elementwise(workload):
        outputs = [np.array(np.broadcast_to(wide[0], workload.outputs[0].shape))]
    else:
        core = wide[:core_input_count(workload)]
        if is_attention(workload):
            outputs = attention_formula(workload, core)
        elif is_rms_norm(workload):
            outputs = rms_norm_formula(workload, core)
        elif is_group_norm(workload):
            outputs = group_norm_formula(workload, core)
        elif has_formula(workload):
            outputs = REFERENCE_FORMULAS[workload.op](workload, core)
        else:
            outputs = _onnx_reference(workload, core)
    outputs = [np.array(y, copy=True) for y in outputs]
    if workload.epilogue:
        outputs[0] = apply_epilogue(outputs[0], workload.epilogue, wide)
    return [np.array(y.reshape(spec.shape), order="C") for y, spec in
            zip(outputs, workload.outputs)]


def _empty_outputs(workload: Workload) -> list[np.ndarray]:
    """The outputs of a workload whose outputs all hold no element (a Softmax over the
    empty rows a Slice past the end leaves): nothing to compute, and the formulas' own
    reductions (max, sum) have no identity on an empty axis. Float outputs float64."""
    return [np.empty(spec.shape, np.float64 if np.dtype(spec.dtype).kind in _FLOAT_KINDS
                     else spec.dtype) for spec in workload.outputs]


_EVALUATORS: dict[tuple[str, bool], ReferenceEvaluator] = {}


def _evaluator(workload: Workload, wide: bool) -> ReferenceEvaluator:
    # imported here: onnx.reference's ops load onnx, which a plan's load need not
    from wpk.core.onnx_quantize import REFERENCE_OPS

    key = (workload.key, wide)
    if key not in _EVALUATORS:
        dtype_map = {"float32": "float64", "float16": "float64"} if wide else {}
        model = build_node_model(workload, {}, with_epilogue=False, dtype_map=dtype_map)
        if len(_EVALUATORS) > 256:
            _EVALUATORS.clear()
        _EVALUATORS[key] = onnx_reference.ReferenceEvaluator(model.model,
                                                             new_ops=list(REFERENCE_OPS))
    return _EVALUATORS[key]


def _contrib_session(workload: Workload, wide: bool):
    """onnxruntime's own contrib op (com.microsoft has no onnx.reference), float64 if it can."""
    dtype_map = {"float32": "float64", "float16": "float64"} if wide else {}
    model = build_node_model(workload, {}, with_epilogue=False, dtype_map=dtype_map)
    return ort.InferenceSession(model.model.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def _onnx_reference(workload: Workload, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run the node alone with onnx.reference: float64 first, then the original dtypes
    (only those when an output has an ml_dtypes type).

    Contrib ops (com.microsoft) have no onnx.reference implementation; they run
    through onnxruntime instead, the only independent implementation there is.
    """
    reason = check_buildable(workload)
    if reason:
        raise UnsupportedError(f"{workload.label}: no reference: {reason}",
                               hint="wpk can only verify ops that onnx defines")
    names = [output_name(j) for j in range(len(workload.outputs))]
    errors = []
    # An output in an ml_dtypes type (bfloat16, float8, int4...) rounds what it is given,
    # as a quantizing op does (`ROUNDING_OPS`): widening the inputs would round float64
    # values, not the node's own.
    narrow = any(is_ml_dtype(spec.dtype) for spec in workload.outputs) \
        or workload.op in ROUNDING_OPS
    for wide in (False,) if narrow else (True, False):
        feeds = {}
        for i, x in enumerate(inputs):
            if x is None or workload.inputs[i] is None:
                continue
            feeds[input_name(i)] = x if wide else x.astype(workload.inputs[i].dtype, copy=False)
        try:
            if workload.domain == MS_DOMAIN:
                results = _contrib_session(workload, wide).run(names, feeds)
            else:
                results = _evaluator(workload, wide).run(names, feeds)
        except Exception as exc:  # the evaluator raises whatever its op raises
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        return [to_float64(np.asarray(y)) for y in results]
    raise UnsupportedError(f"{workload.label}: onnx.reference cannot run it ({errors[-1]})",
                           hint="this op has no reference in wpk or onnx.reference")
