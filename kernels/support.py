"""Which workloads wpk computes itself (own float64 reference and a library kernel).

Everything else still runs, through onnxruntime (`ort.fallback`), and is
marked as a fallback in reports.
"""

from __future__ import annotations

from wpk.core.errors import WpkError
from wpk.core.op_checks import op_problem
from wpk.core.workload import BINARY_EPILOGUE_OPS, UNARY_EPILOGUE_OPS, Workload
from wpk.kernels.cpu.attention_spec import ATTENTION_OP, attention_reason
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_OP, group_norm_reason
from wpk.kernels.cpu.inverted_residual_spec import IR_OP, inverted_residual_reason
from wpk.kernels.cpu.resize import ASPECT_POLICIES, COORDINATE_MODES, MODES
from wpk.kernels.cpu.rms_norm_spec import RMS_NORM_OP, rms_norm_reason
from wpk.kernels.cpu.window import conv_transpose_begin_pads
from wpk.kernels.nchwc_logical import logical_workload  # the blocked ops' own module

ELEMENTWISE_UNARY_OPS = frozenset({
    "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Erf",
    "Softplus", "LeakyRelu", "HardSigmoid", "HardSwish", "Clip",
})
ELEMENTWISE_BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum",
                                    "Mean"})
DATA_MOVEMENT_OPS = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Transpose", "Concat",
    "Gather", "Slice", "Pad", "Resize", "Split", "DepthToSpace", "SpaceToDepth",
})
# Ops wpk computes for any dtype numpy holds (bool, integers, floats): the moves, and the
# ops of the masks and ids exporters write around attention (an HF model's int64
# attention_mask unsqueezed and cast, torch's bool padding mask compared and selected).
ANY_DTYPE_MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                             "Transpose", "Concat", "Gather", "Slice", "Split", "Expand",
                             "Tile"})
MASK_OPS = frozenset({"Cast", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
                      "Not", "And", "Or", "Where"})
# The index of each slice's largest or smallest value (a classifier's or segmenter's
# class, a detector's best class): int64 out of any numpy dtype.
INDEX_OPS = frozenset({"ArgMax", "ArgMin"})
ANY_DTYPE_OPS = ANY_DTYPE_MOVES | MASK_OPS | INDEX_OPS
NUMPY_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                          "uint32", "uint64", "float16", "float32", "float64"})
# Reductions over any axes (keepdims, noop_with_empty_axes; axes an attribute or, from
# opset 13/18, a static input); the norms are F.normalize's and Swin V2's
REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1",
                        "ReduceL2", "ReduceSumSquare"})
NN_OPS = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "LRN",
    "InstanceNormalization",
})
# wpk's blocked-layout ops (domain wpk.nchwc), written by the NCHWc layout pass.
NCHWC_DOMAIN = "wpk.nchwc"
NCHWC_REORDERS = frozenset({"ReorderInput", "ReorderOutput"})
NCHWC_OPS = NCHWC_REORDERS | {"DepthToSpace", "ChannelGather", "ChannelSlice", "Upsample",
                              "Conv", "MaxPool", "AveragePool", "GlobalMaxPool",
                              "GlobalAveragePool", GROUP_NORM_OP}
SUPPORTED_OPS = frozenset({"Elementwise"} | ELEMENTWISE_UNARY_OPS | ELEMENTWISE_BINARY_OPS
                          | DATA_MOVEMENT_OPS | ANY_DTYPE_OPS | REDUCE_OPS | NN_OPS)
# Inputs that must be constants with fixed values (static inputs); Clip bounds may vary.
_STATIC_OPERANDS = {"Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Split": (1,),
                    "Expand": (1,), "Tile": (1,), **{op: (1,) for op in REDUCE_OPS}}
# Ops with several outputs that wpk computes (the others: one output)
_MULTI_OUTPUT_OPS = frozenset({"LayerNormalization", "Split"})
_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})


def unsupported_reason(workload: Workload) -> str | None:
    """None when wpk's own reference and library kernels cover the workload, else why not."""
    op = workload.op
    if workload.domain == NCHWC_DOMAIN:
        return _nchwc_reason(workload)
    if workload.domain not in ("", "ai.onnx", "wpk"):
        return f"domain {workload.domain!r} is not implemented by wpk"
    if workload.domain == "wpk" and op == ATTENTION_OP:
        return attention_reason(workload)
    if workload.domain == "wpk" and op == IR_OP:
        return inverted_residual_reason(workload)
    if workload.domain == "wpk" and op == RMS_NORM_OP:
        return rms_norm_reason(workload)
    if workload.domain == "wpk" and op == GROUP_NORM_OP:
        return group_norm_reason(workload)
    if op not in SUPPORTED_OPS or (workload.domain == "wpk") != (op == "Elementwise"):
        return f"op {op!r} is not implemented by wpk"
    reason = _dtype_reason(workload)
    if reason:
        return reason
    if len(workload.outputs) != 1 and op not in _MULTI_OUTPUT_OPS:
        return f"{op} with {len(workload.outputs)} outputs is not implemented"
    for step in workload.epilogue:
        if step.op not in UNARY_EPILOGUE_OPS and step.op not in BINARY_EPILOGUE_OPS:
            return f"unknown epilogue op {step.op!r}"
        if step.op in BINARY_EPILOGUE_OPS and (
                step.operand is None or not 0 <= step.operand < len(workload.inputs)
                or workload.inputs[step.operand] is None):
            return f"epilogue step {step.op!r} has no valid operand"
    static = {i for i, _ in workload.static_inputs}
    for i in _STATIC_OPERANDS.get(op, ()) if op != "Clip" else ():
        if i < len(workload.inputs) and workload.inputs[i] is not None and i not in static:
            return f"{op} input {i} must be a static input"
    if op == "Pad":
        mode = workload.text_attr("mode", "constant")
        if mode not in ("constant", "reflect", "edge"):
            return f"Pad mode {mode!r} is not implemented"
    if op == "Dropout" and (workload.attr("is_test", 1) == 0 or _truthy(workload, 2)):
        return "Dropout in training mode is not implemented"
    if op == "InstanceNormalization" and len(workload.inputs[0].shape) < 3:
        return "InstanceNormalization needs an input of rank 3 or more (N, C, D1, ...)"
    if op == "BatchNormalization" and int(workload.attr("training_mode", 0)):
        return "BatchNormalization in training mode (batch statistics) goes through onnxruntime"
    if op == "Resize":
        reason = _resize_reason(workload)
        if reason:
            return reason
    if op in ("MaxPool", "AveragePool") and workload.attr("storage_order", 0):
        return "MaxPool storage_order=1 is not implemented"
    if op == "ConvTranspose":
        reason = _conv_transpose_reason(workload)
        if reason:
            return reason
    if op in REDUCE_OPS and 0 in workload.inputs[0].shape:
        return "a reduction of an empty tensor goes through onnxruntime"
    if op == "Conv" and len(workload.inputs[0].shape) < 3:
        return "Conv needs at least one spatial dimension"
    return None


def _dtype_reason(workload: Workload) -> str | None:
    """Float outputs everywhere; any numpy dtype for the moves and mask ops (no epilogue on
    a non-float output)."""
    floats = all(spec.dtype in _FLOAT_DTYPES for spec in workload.outputs)
    if workload.op not in ANY_DTYPE_OPS:
        return None if floats else "only float outputs are implemented"
    specs = [s for s in (*workload.inputs, *workload.outputs) if s is not None]
    odd = sorted({s.dtype for s in specs} - NUMPY_DTYPES)
    if odd:
        return f"{workload.op} of {', '.join(odd)} is not implemented (numpy's dtypes are)"
    if workload.epilogue and not floats:
        return "an epilogue on a non-float output is not implemented"
    return None


def _conv_transpose_reason(workload: Workload) -> str | None:
    """ConvTranspose with a filter of the input's rank, whose pads (given, or from
    auto_pad SAME or output_shape) do not start before the full result."""
    if len(workload.inputs[0].shape) < 3 or workload.inputs[1] is None \
            or len(workload.inputs[1].shape) != len(workload.inputs[0].shape):
        return "ConvTranspose needs a spatial input and a filter of its rank"
    if any(p < 0 for p in conv_transpose_begin_pads(workload)):
        return "ConvTranspose whose output_shape is larger than its full result goes " \
               "through onnxruntime"
    return None


def _nchwc_reason(workload: Workload) -> str | None:
    """Blocked-layout ops (see wpk.passes.nchwc_layout) are supported as their logical op is."""
    if workload.op in NCHWC_REORDERS:
        return None
    if workload.op == "DepthToSpace":
        return _blocked_depth_to_space_reason(workload)
    if workload.op == "ChannelGather":
        problem = op_problem(workload)
        return None if problem is None else f"a blocked ChannelGather: {problem}"

    try:
        logical = logical_workload(workload)
    except WpkError as exc:
        return exc.message
    return unsupported_reason(logical)


def _blocked_depth_to_space_reason(workload: Workload) -> str | None:
    """A blocked DepthToSpace: mode DCR or CRD, and the shapes its blocksize gives
    (`op_checks`: r^2 * channels input channels, an NCHW output r times the input's size)."""
    if workload.text_attr("mode", "DCR") not in ("DCR", "CRD"):
        return "DepthToSpace mode must be DCR or CRD"
    problem = op_problem(workload)
    return None if problem is None else \
        f"a blocked DepthToSpace needs r^2 * channels input channels and an NCHW output r " \
        f"times the input's size: {problem}"


def _resize_reason(workload: Workload) -> str | None:
    """Resize from opset 11 on, every mode and coordinate transformation of the spec
    (`wpk.kernels.cpu.resize`)."""
    if workload.opset < 11:
        return "Resize before opset 11 goes through onnxruntime"
    for name, default, allowed in (("mode", "nearest", MODES),
                                   ("coordinate_transformation_mode", "half_pixel",
                                    COORDINATE_MODES),
                                   ("keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES)):
        value = workload.text_attr(name, default)
        if value not in allowed:
            return f"Resize {name} {value!r} is not in the spec"
    return None


def _truthy(workload: Workload, index: int) -> bool:
    """Whether input `index` is present and not a static false (e.g. Dropout training_mode)."""
    if index >= len(workload.inputs) or workload.inputs[index] is None:
        return False
    value = workload.static_value(index)
    return value is None or bool(value)


def is_supported(workload: Workload | str, domain: str = "") -> bool:
    """Whether wpk implements the workload itself (ops in SUPPORTED_OPS, with valid attributes).

    Given an op type (and domain) instead of a workload, whether wpk claims the op at all.
    """
    if isinstance(workload, str):
        if workload in ("Elementwise", ATTENTION_OP, IR_OP, RMS_NORM_OP, GROUP_NORM_OP):
            return domain == "wpk"
        if domain == NCHWC_DOMAIN:
            return workload in NCHWC_OPS
        return domain in ("", "ai.onnx") and workload in SUPPORTED_OPS
    return unsupported_reason(workload) is None
