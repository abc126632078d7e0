"""Consecutive onnxruntime steps of a plan executed as one onnxruntime session.

Every step of a plan is chosen, verified and timed on its own; running dozens
of one-node sessions back to back then costs a session call per node (input
and output binding, execution frame, thread-pool hand-off). When consecutive
steps were all given to implementations that run in onnxruntime (those with
an ONNX form, `Implementation.onnx_part`: `ort`, `ort.fallback`, `ort.nchwc`),
the runtime may execute them as one session holding exactly those nodes, with
the same packed weights and attributes, so onnxruntime runs the same kernels:
graph optimizations stay at the level that leaves the nodes as they are. The
weights reach the session as external initializers, beside its model rather than
serialized into it (`region_model`'s `detached`). The
outputs that later steps or the graph read are bound to their arena buffers;
the others stay inside the session. On request (`Session(spin_threads=True)`)
the session's threads spin between its nodes during a run, as onnxruntime's
own default does (no worker wake-up per node), and stop spinning when the run
returns (`session_options(spin_during_run=True)`), so they leave no core busy
for what follows. Off by default: with another busy process on the cores,
spinning workers wait on each other (up to 2x slower). Nothing is chosen
differently: it is an execution strategy of already verified kernels, checked
against step-by-step execution by the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from wpk.core.deferred import helper, numpy_helper, onnx, version_converter
from wpk.core.workload import Workload
from wpk.kernels.cpu.nchwc import _CPU, ORT_NCHWC_DOMAIN
from wpk.kernels.cpu.node_model import MS_DOMAIN, OnnxPart, external_initializer
from wpk.kernels.cpu.ort_node import session_options
from wpk.kernels.registry import Implementation, Kernel

# Initializers of this many values and more reach ONNX's version converter as typed inputs
# (`_weights_as_inputs`).
CONVERTED_WEIGHT_LIMIT = 4096
# A region session gets weights of this many bytes and more as external initializers
# (`region_model`'s `detached`), not inside its serialized model
DETACHED_MIN_BYTES = 4096


@dataclass(frozen=True)
class RegionMember:
    """One plan step of a region: its implementation, workload, constants and tensors."""

    implementation: Implementation
    workload: Workload
    consts: Mapping[int, np.ndarray]
    inputs: Sequence[str]
    outputs: Sequence[str]

    def part(self) -> OnnxPart:
        return self.implementation.onnx_part(self.workload, self.consts)


def region_model(members: Sequence[RegionMember], exported: set[str] | None = None,
                 detached: dict[str, np.ndarray] | None = None):
    """The merged model, its external input names (in order), its output names and every
    bound tensor's (ONNX element type, shape): the members' outputs in `exported` (all of
    them when None); the others stay inside the session, in onnxruntime's own memory. A
    tensor that a member declares with another shape than the one it was produced or
    bound with (the 4-d view of a blocked tensor read 5-d, or back) is read through a
    Reshape. With `detached` (a dict), the weights of `DETACHED_MIN_BYTES` and more move
    into it, by name, and the model holds only their names, types and shapes (external
    initializers for `SessionOptions.add_external_initializers`)."""
    merged = _Merged()
    opset = max(m.implementation.onnx_opset(m.workload) for m in members)
    for index, member in enumerate(members):
        part = member.part()
        model = upgraded(part.model, member.implementation.onnx_opset(member.workload), opset)
        declared = declared_types(model)
        rename = dict(zip(part.outputs, member.outputs))
        for local, input_index in part.feeds:
            rename[local] = merged.read(member.inputs[input_index], declared[local])
        prefix = f"s{index}/"
        for tensor in model.graph.initializer:
            local = tensor.name
            rename[local] = prefix + local
            if local in part.external:   # its values beside the part's model
                merged.initializers.append(_outside(part.external[local], rename[local],
                                                    detached))
                continue
            tensor.name = rename[local]
            merged.initializers.append(_detach(tensor, detached))
        for node in model.graph.node:
            node.input[:] = [rename.get(name, prefix + name) if name else ""
                             for name in node.input]
            node.output[:] = [rename.get(name, prefix + name) for name in node.output]
            node.name = prefix + (node.name or node.op_type)
            merged.nodes.append(node)
        for local, name in zip(part.outputs, member.outputs):
            merged.types[name] = declared[local]
    outputs = [name for m in members for name in m.outputs
               if exported is None or name in exported]
    types = merged.types
    graph = helper.make_graph(
        merged.nodes, "ort_region",
        [helper.make_tensor_value_info(n, *types[n]) for n in merged.external],
        [helper.make_tensor_value_info(n, *types[n]) for n in outputs], merged.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(ORT_NCHWC_DOMAIN, 1),
                                                    helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    return model, merged.external, outputs, types


def _outside(value: np.ndarray, name: str, detached: dict[str, np.ndarray] | None
             ) -> onnx.TensorProto:
    """A part's external weight `value` as initializer `name` of the region: external too,
    its value in `detached`, or without `detached` inside the model."""
    if detached is None:
        return numpy_helper.from_array(value, name)
    detached[name] = value
    return external_initializer(name, value)


def _detach(tensor: onnx.TensorProto, detached: dict[str, np.ndarray] | None
            ) -> onnx.TensorProto:
    """`tensor`, or with `detached` and `DETACHED_MIN_BYTES` of raw data or more, an
    external initializer of its name, type and shape, its values moved into `detached`
    (DenseNet-121's region of 217 parts: serializing its 31 MB of weights into the model,
    and onnxruntime parsing them back, took about a fifth of the plan's load)."""
    if detached is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return tensor
    raw = tensor.raw_data
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if len(raw) < DETACHED_MIN_BYTES or dtype.kind not in "biuf":   # numpy's own types only
        return tensor
    return _outside(np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims)), tensor.name,
                    detached)


def upgraded(model: onnx.ModelProto, opset: int, target: int) -> onnx.ModelProto:
    """`model` (default-domain opset `opset`) as it reads at opset `target`: unchanged when
    none of its standard ops was redefined in between, else through ONNX's version
    converter (Clip's bounds, Split's sizes, ReduceMean's axes become inputs, ...). A
    default-domain op that ONNX does not define at `opset` is onnxruntime's own
    registration (LayerNormalization before 17), the same op at any opset."""
    if opset >= target or not any(_redefined(node, opset, target) for node in model.graph.node):
        return model
    light, weights = _weights_as_inputs(model)
    converted = version_converter.convert_version(light, target)
    declared = {v.name: v for v in (*model.graph.input, *model.graph.output)}
    inputs = [v for v in converted.graph.input if v.name in declared]
    del converted.graph.input[:]
    converted.graph.input.extend(inputs)
    for value in (*converted.graph.input, *converted.graph.output):
        value.CopyFrom(declared[value.name])
    converted.graph.initializer.extend(weights.values())
    return converted


def _weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """A copy of `model` without its large initializers (`CONVERTED_WEIGHT_LIMIT` values
    and more), which are graph inputs of their type and shape there, and those
    initializers by name.

    ONNX's converter serializes the whole model into C++ and back; with a VGG-sized
    weight (100M values) that took 1.7 s a part, 8.5 s of one build's 105 s. No adapter
    reads a weight's values (they turn attributes into inputs, rename ops), so the
    converter gets the weights' types only; the small constants stay, which an adapter
    may read (Upsample's scales)."""
    light = onnx.ModelProto()
    for field_name in ("ir_version", "producer_name", "producer_version", "domain",
                       "model_version"):
        setattr(light, field_name, getattr(model, field_name))
    light.opset_import.extend(model.opset_import)
    source, graph = model.graph, light.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    weights = {}
    listed = {value.name for value in source.input}  # IR 3 lists initializers as inputs
    for tensor in source.initializer:
        if int(np.prod(tensor.dims)) < CONVERTED_WEIGHT_LIMIT:
            graph.initializer.append(tensor)
            continue
        weights[tensor.name] = tensor
        if tensor.name not in listed:
            graph.input.append(helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)))
    return light, weights


# Ops whose every definition from this opset on only widens what the op accepts (more
# element types, negative axes, an attribute whose default keeps the old meaning): a node
# valid at such an opset means the same at any later one, so a part made of them needs no
# conversion. DenseNet-121's 30 opset-9 Concats went through ONNX's version converter at
# every load (0.15 s of it), unchanged by it.
WIDENING_SINCE = {
    "Concat": 4, "Add": 7, "Sub": 7, "Mul": 7, "Div": 7, "Relu": 6, "Sigmoid": 6, "Tanh": 6,
    "Exp": 6, "Log": 6, "Sqrt": 6, "Abs": 6, "Neg": 6, "Floor": 6, "Ceil": 6, "Reciprocal": 6,
    "Erf": 9, "LeakyRelu": 6, "Transpose": 1, "MatMul": 1, "Identity": 1, "Flatten": 9,
    "Reshape": 5, "Gemm": 7, "Where": 9, "GlobalAveragePool": 1,
}


def _redefined(node: onnx.NodeProto, opset: int, target: int) -> bool:
    """Whether ONNX defines the node's op at `opset` and redefined its meaning by `target`
    (not only widened it: `WIDENING_SINCE`)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if opset >= WIDENING_SINCE.get(node.op_type, target + 1):
        return False
    try:
        onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return False
    return onnx.defs.get_schema(node.op_type, target).since_version > opset


def declared_types(model: onnx.ModelProto) -> dict[str, tuple[int, list[int]]]:
    """(element type, shape) a fragment declares for its graph inputs and outputs."""
    return {value.name: (value.type.tensor_type.elem_type,
                         [d.dim_value for d in value.type.tensor_type.shape.dim])
            for value in (*model.graph.input, *model.graph.output)}


@dataclass
class _Merged:
    """The region model being assembled: nodes, initializers, tensor types, inputs."""

    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    types: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    external: list[str] = field(default_factory=list)
    reshaped: dict[tuple[str, tuple[int, ...]], str] = field(default_factory=dict)

    def read(self, name: str, declared: tuple[int, list[int]]) -> str:
        """The tensor to read `name` as the `declared` shape: itself, or one shared Reshape
        of it (a first read of a region input binds it as declared)."""
        if name not in self.types:
            self.external.append(name)
            self.types[name] = (declared[0], list(declared[1]))
        shape = list(declared[1])
        if self.types[name][1] == shape:
            return name
        key = (name, tuple(shape))
        if key not in self.reshaped:
            target = f"{name}@{'x'.join(map(str, shape))}"
            self.initializers.append(numpy_helper.from_array(
                np.asarray(shape, dtype=np.int64), f"{target}/shape"))
            self.nodes.append(helper.make_node("Reshape", [name, f"{target}/shape"], [target],
                                               name=f"reshape/{target}"))
            self.reshaped[key] = target
        return self.reshaped[key]


def region_kernel(members: Sequence[RegionMember], exported: set[str] | None = None,
                  spin: bool = False) -> tuple[Kernel, list[str], list[str]]:
    """A kernel(inputs, outputs) running the merged session, and the tensor names of its
    inputs and outputs (in the order the kernel takes the arrays); with `spin`, its threads
    spin during a run (see the module docstring)."""
    weights: dict[str, np.ndarray] = {}
    model, external, outputs, types = region_model(members, exported, weights)
    options = session_options(optimization="disabled", spin_during_run=spin)
    if weights:   # onnxruntime copies them into its graph: they may go once it holds them
        options.add_external_initializers(
            list(weights), [ort.OrtValue.ortvalue_from_numpy(v) for v in weights.values()])
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()._iobinding
    run = session._sess.run_with_iobinding
    run_options = ort.RunOptions()
    shapes = {name: types[name][1] for name in [*external, *outputs]}
    bound: list[int] = []

    def kernel(inputs, outs) -> None:
        arrays = [*inputs, *outs]
        addresses = [a.ctypes.data for a in arrays]
        if addresses != bound:
            if not all(a.flags.c_contiguous for a in arrays):
                raise ValueError("an onnxruntime region needs C-contiguous buffers")
            for name, array in zip(external, arrays):
                binding.bind_input(name, _CPU, array.dtype, shapes[name], array.ctypes.data)
            for name, array in zip(outputs, arrays[len(external):]):
                binding.bind_output(name, _CPU, array.dtype, shapes[name], array.ctypes.data)
            bound[:] = addresses
        run(binding, run_options)

    return kernel, external, outputs
