"""Standard ONNX ops on blocked tensors, run by onnxruntime next to its NCHWc kernels.

The NCHWc layout pass leaves two kinds of nodes on blocked (N, Cb, H, W, b)
tensors that are not `wpk.nchwc` ops: a default-domain Concat on axis 1
(every input a whole number of blocks) and wpk `Elementwise` chains (a
BatchNormalization's leftovers, SiLU, a squeeze-excitation gate). Both are
plain ONNX on the 5-d buffers, so onnxruntime's standard kernels compute them
exactly; written in the `ort.nchwc` fragment form (`build_standard_model`),
they can join the MLAS NCHWc nodes around them in one onnxruntime session
(`wpk.kernels.cpu.ort_region`) instead of ending it. Fragments run with
graph optimization off; their steps take onnxruntime's one-pass contrib ops
where the epilogue table has one (SiLU as QuickGelu with alpha 1).

Declared shapes: a Concat, and an Elementwise whose every operand has the
output's shape, are declared on the 4-d view (N, Cb*b, H, W) that the MLAS
nodes use (same memory, same element order), so they chain without a
Reshape; an Elementwise that broadcasts (per-channel constants, a gate of
shape (N, Cb, 1, 1, b)) keeps its 5-d shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from wpk.core.deferred import helper, numpy_helper, onnx
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.node_model import (
    build_node_model,
    input_name,
    is_elementwise,
    output_name,
)
from wpk.kernels.epilogue import validate_epilogue

OUTPUT = "y"
FRAGMENT_OPSET = 17


def is_standard_blocked(workload: Workload) -> bool:
    """Whether the workload is a Concat or Elementwise that would run on blocked tensors."""
    concat = workload.op == "Concat" and workload.domain in ("", "ai.onnx")
    return (concat or is_elementwise(workload)) and len(workload.outputs) == 1 \
        and len(workload.outputs[0].shape) == 5


def _blocked(spec: TensorSpec | None, block: int) -> bool:
    return spec is not None and spec.dtype == "float32" and len(spec.shape) == 5 \
        and spec.shape[4] == block


def standard_reason(workload: Workload) -> str | None:
    """Why onnxruntime cannot run this blocked Concat/Elementwise in an NCHWc region."""
    block = fmt.host_block_size()
    out = workload.outputs[0]
    if not all(_blocked(s, block) for s in (*workload.inputs, out)):
        return f"not every tensor is float32 blocked with MLAS's block {block}"
    if workload.op == "Concat":
        if int(workload.attr("axis", 1)) not in (1, -4):
            return "a blocked Concat must join along the channel blocks (axis 1)"
        if any(s.shape[:1] + s.shape[2:] != out.shape[:1] + out.shape[2:]
               for s in workload.inputs):
            return "Concat inputs differ outside the channel blocks"
        return None
    return validate_epilogue(workload.epilogue, len(workload.inputs))


def _flat(workload: Workload) -> bool:
    """Whether every operand has the output's shape (no broadcasting): the 4-d view works."""
    if workload.op == "Concat":
        return True
    return all(s.shape == workload.outputs[0].shape for s in workload.inputs)


def build_channel_slice_model(workload: Workload):
    """A blocked ChannelSlice as a standard Slice of the 4-d view (N, Cb*b, H, W): whole
    blocks are contiguous runs of that view, so the slice is exact, padding lanes included."""
    x, out = workload.inputs[0], workload.outputs[0]
    start = int(workload.attr("start"))
    view_in, view_out = _view(x.shape), _view(out.shape)
    bounds = [numpy_helper.from_array(np.array(v, np.int64), name) for v, name in
              (([start], "starts"), ([start + view_out[1]], "ends"), ([1], "axes"))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], [OUTPUT])], "channel_slice",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, view_in)],
        [helper.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT, view_out)], bounds)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FRAGMENT_OPSET)])
    model.ir_version = 8
    return model, (("x", 0),)


def build_channel_gather_model(workload: Workload):
    """A blocked ChannelGather as standard ONNX on the 5-d tensors (the 4-d view of MLAS
    keeps the lanes inside their blocks, so a channel Gather cannot run on it): each input
    unblocked to its padded NCHW lanes, those and one zero channel concatenated, the
    output's lanes gathered (its padding lanes read the zero channel) and blocked again."""
    out = workload.outputs[0]
    n, out_blocks, h, w, b = out.shape
    names = [f"x{i}" for i in range(len(workload.inputs))]
    lanes = sum(spec.shape[1] * b for spec in workload.inputs)
    indices = list(workload.attr("indices"))
    indices += [lanes] * (out_blocks * b - len(indices))
    constants = [numpy_helper.from_array(np.zeros((n, 1, h, w), np.float32), "zero"),
                 numpy_helper.from_array(np.array(indices, np.int64), "indices"),
                 numpy_helper.from_array(np.array([n, -1, h, w], np.int64), "nchw"),
                 numpy_helper.from_array(np.array([n, out_blocks, b, h, w], np.int64),
                                         "split")]
    nodes = []
    for name in names:
        nodes += [helper.make_node("Transpose", [name], [f"{name}_t"], perm=[0, 1, 4, 2, 3]),
                  helper.make_node("Reshape", [f"{name}_t", "nchw"], [f"{name}_lanes"])]
    nodes += [helper.make_node("Concat", [f"{n}_lanes" for n in names] + ["zero"], ["lanes"],
                               axis=1),
              helper.make_node("Gather", ["lanes", "indices"], ["picked"], axis=1),
              helper.make_node("Reshape", ["picked", "split"], ["blocks"]),
              helper.make_node("Transpose", ["blocks"], [OUTPUT], perm=[0, 1, 3, 4, 2])]
    graph = helper.make_graph(
        nodes, "channel_gather",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(spec.shape))
         for name, spec in zip(names, workload.inputs)],
        [helper.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT, list(out.shape))],
        constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FRAGMENT_OPSET)])
    model.ir_version = 8
    return model, tuple((name, i) for i, name in enumerate(names))


def _view(shape: tuple[int, ...]) -> list[int]:
    n, cb, h, w, b = shape
    return [n, cb * b, h, w]


def _set_shape(value: onnx.ValueInfoProto, shape: list[int]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for d in shape:
        dims.add().dim_value = int(d)


def build_standard_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The fragment (model with output 'y', feeds as (graph input, workload input index))."""
    # opset 17, the NCHWc fragments' one, so that both kinds can share one region model
    workload = replace(workload, opset=max(workload.opset, FRAGMENT_OPSET), _key="")
    model = build_node_model(workload, consts).model
    graph = model.graph
    for node in graph.node:
        node.output[:] = [OUTPUT if name == output_name(0) else name for name in node.output]
    graph.output[0].name = OUTPUT
    flat = _flat(workload)
    if flat:
        for value in (*graph.input, graph.output[0]):
            _set_shape(value, fmt_view(value))
    index = {input_name(i): i for i in range(len(workload.inputs))}
    feeds = tuple((value.name, index[value.name]) for value in graph.input)
    return model, feeds


def fmt_view(value: onnx.ValueInfoProto) -> list[int]:
    """The 4-d view (N, Cb*b, H, W) of a declared 5-d blocked shape."""
    n, cb, h, w, b = (d.dim_value for d in value.type.tensor_type.shape.dim)
    return [n, cb * b, h, w]


def declared_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The shapes a fragment declares for its graph inputs and outputs, by name."""
    return {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in (*model.graph.input, *model.graph.output)}
