"""onnxruntime's MLAS NCHWc kernels as implementations of the `wpk.nchwc` ops.

Each workload becomes a one-node ONNX model in onnxruntime's contrib domain
`com.microsoft.nchwc` (Conv with fused activation and Sum input, MaxPool,
AveragePool, GlobalMaxPool, GlobalAveragePool, Upsample, ReorderInput,
ReorderOutput; a ChannelSlice is a standard Slice of the 4-d view, a ChannelGather its
inputs unblocked, concatenated, gathered and blocked again, `nchwc_standard`),
with the filter packed the way onnxruntime's NchwcTransformer packs it
(`wpk.kernels.nchwc_format`) and the bias padded to the block. A blocked
(N, Cb, H, W, b) buffer is bound to the session as the 4-d NCHWc tensor
(N, Cb*b, H, W) that MLAS expects: same memory, no copy. Sessions run with
every graph optimization off (the node is already what we want), intra-op
threads = cores, spinning off, and IOBinding straight into the caller's
output arrays. The op semantics are documented in `wpk.passes.nchwc_layout`.
The blocked Concat and Elementwise nodes around them are run with onnxruntime's
standard kernels (`wpk.kernels.cpu.nchwc_standard`), so they can share a region;
a squeeze-excitation gate multiply runs as a depthwise 1x1 Conv whose filter is
the gate (`wpk.kernels.cpu.nchwc_gate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as ort_capi

from wpk.core.deferred import helper, numpy_helper
from wpk.core.epilogue import EPILOGUE_TABLE, FAKE_QUANT, ONNXRUNTIME_DOMAIN
from wpk.core.workload import Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.algorithms import conv_algorithm
from wpk.kernels.cpu.nchwc_gate import build_gate_model, is_gate_multiply
from wpk.kernels.cpu.nchwc_standard import (
    FRAGMENT_OPSET,
    build_channel_gather_model,
    build_channel_slice_model,
    build_standard_model,
    declared_shapes,
    is_standard_blocked,
    standard_reason,
)
from wpk.kernels.cpu.node_model import PART_EXTERNAL_MIN_BYTES, OnnxPart, initializer
from wpk.kernels.cpu.ort_node import session_options
from wpk.kernels.epilogue import epilogue_onnx_nodes
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register

NCHWC_DOMAIN = "wpk.nchwc"
_CPU = ort_capi.OrtDevice(ort_capi.OrtDevice.cpu(), ort_capi.OrtDevice.default_memory(), 0)
ORT_NCHWC_DOMAIN = "com.microsoft.nchwc"
POOL_OPS = ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
NCHWC_OPS = ("Conv", "ReorderInput", "ReorderOutput", "Upsample", "ChannelSlice",
             "ChannelGather", *POOL_OPS)
# What onnxruntime's blocked Upsample computes (its kernel refuses the rest at load)
_UPSAMPLE_MODES = {"nearest": ("asymmetric",),
                   "linear": ("asymmetric", "half_pixel", "align_corners")}

# A blocked Conv's activation (`fmt.CONV_ACTIVATIONS`): MLAS fuses those of
# `fmt.MLAS_CONV_ACTIVATIONS`, naming each as its ONNX op with the op's attributes (Clip's as
# in opsets 6-10) as activation_params; onnxruntime's candidate runs the others as the step's
# nodes after its conv, in the same session (`epilogue_onnx_nodes` at this opset: SiLU and
# QuickGELU as onnxruntime's QuickGelu, GELU as its Gelu, HardSwish as one node, Mish as its
# formula; fake_quant as the QuantizeLinear and DequantizeLinear it stands for:
# `fake_quant_nodes`)
_NODE_ACTIVATION_OPSET = 17
_ATTRIBUTES_OPSET = 10  # the last opset where Clip's bounds are attributes


def fake_quant_nodes(step, source: str, target: str) -> tuple[list, list]:
    """(nodes, initializers): the QuantizeLinear and DequantizeLinear a `fake_quant` step
    stands for, from `source` to `target` (the quantized type from its range)."""
    low, high = int(step.attr("low")), int(step.attr("high"))
    dtype = next(t for t in (np.uint8, np.int8, np.uint16, np.int16)
                 if (np.iinfo(t).min, np.iinfo(t).max) == (low, high))
    constants = [numpy_helper.from_array(np.array(step.attr("scale"), np.float32), "fq_scale"),
                 numpy_helper.from_array(np.array(step.attr("zero_point"), dtype), "fq_zero")]
    nodes = [helper.make_node("QuantizeLinear", [source, "fq_scale", "fq_zero"], ["fq_q"]),
             helper.make_node("DequantizeLinear", ["fq_q", "fq_scale", "fq_zero"], [target])]
    return nodes, constants


def activation_attrs(step) -> dict:
    """The MLAS Conv attributes of activation `step` (from the epilogue table's ONNX form)."""
    row = EPILOGUE_TABLE[step.op]
    _, params = row.onnx.to_onnx(row.attr_values(dict(step.attrs)), _ATTRIBUTES_OPSET)
    attrs = {"activation": row.onnx.op}
    if params:
        attrs["activation_params"] = [float(v) for v in params.values()]
    return attrs


def conv_epilogue_form(workload: Workload) -> tuple[int | None, object | None] | str:
    """Split a Conv epilogue into (Sum operand index, activation step), or say why it can't.

    MLAS computes act(conv + bias + sum): an optional `add` of a blocked
    operand first, then at most one activation, one MLAS fuses or SiLU/HardSwish/GELU/
    QuickGELU/Mish (which onnxruntime's candidate runs as their nodes after the conv).
    """
    steps = list(workload.epilogue)
    sum_index = None
    if steps and steps[0].op == "add":
        sum_index = steps.pop(0).operand
        spec = workload.inputs[sum_index] if sum_index is not None else None
        if spec is None or spec.shape != workload.outputs[0].shape:
            return "the residual add operand is not a blocked tensor of the output's shape"
    if len(steps) > 1 or (steps and steps[0].op not in fmt.CONV_ACTIVATIONS):
        return (f"epilogue {[s.op for s in workload.epilogue]} is not [add] + one activation "
                "a blocked Conv carries")
    return sum_index, (steps[0] if steps else None)


def conv_filter_format(workload: Workload) -> str:
    """'OIHWBo' (depthwise, or NCHW input) or 'OIHWBiBo' (everything else)."""
    weight = workload.inputs[1].shape
    group = int(workload.attr("group", 1))
    if len(workload.inputs[0].shape) == 4:
        return "OIHWBo"
    if group > 1 and weight[1] == 1 and weight[0] == group:
        return "OIHWBo"
    return "OIHWBiBo"


def _unsupported_conv(workload: Workload, b: int) -> str | None:
    x, w = workload.inputs[0], workload.inputs[1]
    if w is None or 1 not in workload.const_inputs:
        return "the filter is not a constant"
    if len(workload.inputs) > 2 and workload.inputs[2] is not None \
            and 2 not in workload.const_inputs:
        return "the bias is not a constant"
    o, i_per_group, _, _ = w.shape
    group = int(workload.attr("group", 1))
    if len(x.shape) == 4:
        if group != 1 or x.shape[1] >= b:
            return "an NCHW input is only read directly by a group-1 conv with < block channels"
    elif group > 1 and not (i_per_group == 1 and o == group):
        if i_per_group % b or (o // group) % b:
            return "grouped conv channels per group are not multiples of the block"
    elif group == 1 and i_per_group % 4 and x.shape[1] * b < 4:
        # a blocked input is zero padded to whole blocks and the packed filter's input
        # channels with it (OIHWBiBo), so only a real count below 4 stays out
        return "input channels are not a multiple of 4"
    form = conv_epilogue_form(workload)
    return form if isinstance(form, str) else None


def unsupported_reason(workload: Workload) -> str | None:
    """Why onnxruntime's NCHWc kernels cannot compute the workload (None if they can)."""
    if is_standard_blocked(workload):
        return standard_reason(workload)
    if workload.domain != NCHWC_DOMAIN or workload.op not in NCHWC_OPS:
        return "not a wpk.nchwc op"
    if any(s is not None and s.dtype != "float32" for s in (*workload.inputs, *workload.outputs)):
        return "MLAS NCHWc kernels are float32 only"
    b = int(workload.attr("block", 0))
    if b != fmt.host_block_size():
        return f"block {b} is not MLAS's block {fmt.host_block_size()} on this host"
    if str(workload.attr("auto_pad", "NOTSET")) not in ("NOTSET", ""):
        return "auto_pad must be resolved to explicit pads"
    if workload.op == "Conv":
        return _unsupported_conv(workload, b)
    if workload.epilogue:
        return "fused epilogues are only supported on Conv"
    channel_axis = 3 if fmt.channels_last(workload) else 1
    if workload.op == "ReorderInput" and workload.inputs[0].shape[channel_axis] % 4:
        return "onnxruntime's ReorderInput needs a channel count that is a multiple of 4"
    if workload.op == "Upsample":
        mode = workload.attr("mode")
        if workload.attr("coordinate_transformation_mode") not in _UPSAMPLE_MODES.get(mode, ()):
            return (f"onnxruntime's blocked Upsample has no {mode} mode with the "
                    f"{workload.attr('coordinate_transformation_mode')} transformation")
    if workload.op == "ChannelSlice" and int(workload.attr("start")) % b:
        return "a channel slice must start on a block boundary"
    return None


def _ort_shape(shape: tuple[int, ...]) -> list[int]:
    """The 4-d shape onnxruntime sees for a blocked (5-d) or NCHW (4-d) buffer."""
    if len(shape) == 5:
        n, cb, h, w, b = shape
        return [n, cb * b, h, w]
    return list(shape)


def _onnx_attrs(workload: Workload, names: Sequence[str]) -> dict:
    attrs = {}
    for name in names:
        value = workload.attr(name)
        if value is not None:
            attrs[name] = list(value) if isinstance(value, tuple) else value
    return attrs


def build_ort_model(workload: Workload, consts: Mapping[int, np.ndarray],
                    external: dict[str, np.ndarray] | None = None):
    """The one-node `com.microsoft.nchwc` model and the workload inputs it is fed, in order
    (a blocked Concat or Elementwise: its standard ONNX form, `nchwc_standard`, except
    a gate multiply: a depthwise 1x1 Conv with the gate as filter, `nchwc_gate`). With
    `external` (a dict), a packed filter of `PART_EXTERNAL_MIN_BYTES` or more goes into it
    by name and the model holds an external initializer (`OnnxPart.external`)."""
    if is_gate_multiply(workload):
        return build_gate_model(workload, consts)
    if is_standard_blocked(workload):
        return build_standard_model(workload, consts)
    if workload.op == "ChannelSlice":
        return build_channel_slice_model(workload)
    if workload.op == "ChannelGather":
        return build_channel_gather_model(workload)
    b = int(workload.attr("block"))
    initializers, feeds, node_inputs = [], [], ["x"]
    op, attrs, act = workload.op, {}, None
    if op == "Conv":
        weight = np.asarray(consts[1], dtype=np.float32)
        out_channels = weight.shape[0]
        if conv_filter_format(workload) == "OIHWBo":
            packed = fmt.pack_filter_oihwbo(weight, b)
        else:
            packed = fmt.pack_filter_oihwbibo(weight, b)
        initializers.append(initializer(packed, "w", external, PART_EXTERNAL_MIN_BYTES))
        node_inputs.append("w")
        has_bias = len(workload.inputs) > 2 and workload.inputs[2] is not None
        if has_bias:
            bias = fmt.pad_channels(np.asarray(consts[2], dtype=np.float32), b)
            initializers.append(numpy_helper.from_array(bias, "b"))
        node_inputs.append("b" if has_bias else "")
        sum_index, act = conv_epilogue_form(workload)
        if sum_index is not None:
            node_inputs.append("sum")
            feeds.append(("sum", sum_index))
        attrs = _onnx_attrs(workload, ("kernel_shape", "strides", "pads", "dilations"))
        group = int(workload.attr("group", 1))
        if conv_filter_format(workload) == "OIHWBo" and group > 1:
            group = fmt.round_up(out_channels, b)
        attrs["group"] = group
        if act is not None and act.op in fmt.MLAS_CONV_ACTIVATIONS:
            attrs.update(activation_attrs(act))
    elif op in ("MaxPool", "AveragePool"):
        names = ("kernel_shape", "strides", "pads", "dilations", "ceil_mode")
        if op == "AveragePool":
            names = (*names, "count_include_pad")
        attrs = _onnx_attrs(workload, names)
    elif op == "ReorderOutput":
        attrs = {"channels": int(workload.attr("channels")),
                 "channels_last": int(fmt.channels_last(workload))}
    elif op == "ReorderInput":
        attrs = {"channels_last": int(fmt.channels_last(workload))}
    elif op == "Upsample":
        attrs = {"scales": [1, 1, *(int(v) for v in workload.attr("scales"))],
                 "mode": workload.attr("mode"),
                 "coordinate_transformation_mode": workload.attr("coordinate_transformation_mode")}
    while node_inputs[-1] == "":
        node_inputs.pop()
    quantized = act is not None and act.op == FAKE_QUANT
    after = act is not None and not quantized and act.op not in fmt.MLAS_CONV_ACTIVATIONS
    nodes = [helper.make_node(op, node_inputs, ["c" if after or quantized else "y"],
                              domain=ORT_NCHWC_DOMAIN, **attrs)]
    opsets = [helper.make_opsetid("", _NODE_ACTIVATION_OPSET),
              helper.make_opsetid(ORT_NCHWC_DOMAIN, 1)]
    if quantized:
        pair, constants = fake_quant_nodes(act, "c", "y")
        nodes += pair
        initializers += constants
    if after:
        nodes += epilogue_onnx_nodes([act], "c", [], "y", "act_", opset=_NODE_ACTIVATION_OPSET,
                                     onnxruntime=True)
        if any(node.domain == ONNXRUNTIME_DOMAIN for node in nodes):
            opsets.append(helper.make_opsetid(ONNXRUNTIME_DOMAIN, 1))
    graph_inputs = [helper.make_tensor_value_info("x", 1, _ort_shape(workload.inputs[0].shape))]
    feeds.insert(0, ("x", 0))
    for name, index in feeds[1:]:
        graph_inputs.append(helper.make_tensor_value_info(
            name, 1, _ort_shape(workload.inputs[index].shape)))
    output = helper.make_tensor_value_info("y", 1, _ort_shape(workload.outputs[0].shape))
    graph = helper.make_graph(nodes, f"nchwc_{op}", graph_inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model, tuple(feeds)


def make_kernel(model, feeds: tuple[tuple[str, int], ...], workload: Workload,
                threads: int | None = None) -> Kernel:
    """A kernel(inputs, outputs) running the session with IOBinding on the caller's buffers.

    Buffers are bound by address; a call whose arrays sit where the previous
    call's did (the runtime's arena) skips the rebinding and only runs.
    """
    options = session_options(threads, optimization="disabled")  # the node is already final
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()._iobinding
    bind_input, bind_output = binding.bind_input, binding.bind_output
    run = session._sess.run_with_iobinding
    run_options = ort.RunOptions()
    float32 = np.dtype(np.float32)
    shapes = declared_shapes(model)
    inputs_to_bind = [(name, index, shapes[name]) for name, index in feeds]
    out_shape = shapes["y"]
    bound: list[int] = []

    def kernel(inputs, outputs) -> None:
        arrays = [inputs[index] for _, index, _ in inputs_to_bind]
        arrays.append(outputs[0])
        copied = not all(a.dtype == float32 and a.flags.c_contiguous for a in arrays)
        if copied:  # temporaries: bind them for this call only
            arrays = [np.ascontiguousarray(a, dtype=float32) for a in arrays]
        addresses = [a.ctypes.data for a in arrays]
        if addresses != bound:
            for (name, _, shape), address in zip(inputs_to_bind, addresses):
                bind_input(name, _CPU, float32, shape, address)
            bind_output("y", _CPU, float32, out_shape, addresses[-1])
            bound[:] = [] if copied else addresses
        run(binding, run_options)
        if copied and arrays[-1] is not outputs[0]:
            np.copyto(outputs[0], arrays[-1])

    return kernel


class OrtNchwc(Implementation):
    """onnxruntime's MLAS NCHWc kernels (contrib domain com.microsoft.nchwc)."""

    name = "ort.nchwc"
    onnxruntime = True
    uses_blas = False
    kind = VENDOR
    target = "cpu"
    joins_regions = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        return unsupported_reason(workload)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        model, feeds = build_ort_model(workload, consts)
        return make_kernel(model, feeds, workload, config.get("threads"))

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """MLAS's convolution routine for the shape (MlasConvNchwc: an input with fewer
        channels than a block is read as NCHW, then depthwise, pointwise or direct)."""
        if workload.op != "Conv":
            return self.name
        if len(workload.inputs[0].shape) == 4:
            return "direct (NCHW input)"
        return conv_algorithm(workload)

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        external: dict[str, np.ndarray] = {}
        model, feeds = build_ort_model(workload, consts, external)
        return OnnxPart(model, tuple(feeds), ("y",), external)

    def onnx_opset(self, workload: Workload) -> int:
        return max(workload.opset, FRAGMENT_OPSET)


ORT_NCHWC = register(OrtNchwc())
