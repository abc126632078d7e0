"""A workload as a self-contained single-node ONNX model.

Used by the onnxruntime kernels (node plus epilogue, constants baked in as
initializers) and by the `onnx.reference` fallback of the float64 references
(node alone). Input `i` of the workload is the graph input or initializer
named `in{i}`; output `j` is `out{j}`. With `external_min_bytes`, constants at least
that big stay numpy arrays (`NodeModel.external`) that the session is handed as
external initializers, so a big weight is not copied into the model, serialized
and parsed again (VGG-19's 411 MB FC weight three times per onnxruntime candidate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from wpk.core.deferred import defs, helper, numpy_helper, onnx
from wpk.core.epilogue import ONNXRUNTIME_DOMAIN
from wpk.core.workload import Workload
from wpk.kernels.epilogue import epilogue_onnx_nodes

ELEMENTWISE_OP = "Elementwise"
WPK_DOMAIN = "wpk"
MS_DOMAIN = ONNXRUNTIME_DOMAIN
# Attributes that hold a graph (stored in a workload as serialized GraphProto bytes).
SUBGRAPH_ATTRS = frozenset({"then_branch", "else_branch", "body"})
# A region part's constants of this many bytes and more stay numpy arrays beside its model
# (`OnnxPart.external`): copied into protobuf, merged and serialized, ResNet-50's 98 MB of
# weights cost a third of its plan's load. At most 8 bytes a value, so each has 4096
# values or more: the ones `ort_region`'s version conversion takes out of a part anyway.
PART_EXTERNAL_MIN_BYTES = 32768


def is_elementwise(workload: Workload) -> bool:
    """Whether the workload is wpk's `Elementwise` (identity main op plus epilogue)."""
    return workload.op == ELEMENTWISE_OP and workload.domain in (WPK_DOMAIN, "")


def input_name(i: int) -> str:
    return f"in{i}"


def output_name(j: int) -> str:
    return f"out{j}"


def schema_for(workload: Workload) -> defs.OpSchema | None:
    """The ONNX schema of the main op at the workload's opset, or None if unknown."""
    domain = "" if workload.domain in ("", "ai.onnx") else workload.domain
    try:
        if domain:  # a workload keeps the default domain's opset only: the newest schema
            return defs.get_schema(workload.op, domain)
        return defs.get_schema(workload.op, workload.opset, domain)
    except Exception:  # onnx raises SchemaError, a private type
        return None


def core_input_count(workload: Workload) -> int:
    """How many leading inputs belong to the main op; the rest are epilogue operands.

    Epilogue operands are appended after the op's own inputs, so the trailing
    inputs that are only referenced by epilogue steps are not the op's.
    """
    if is_elementwise(workload):
        return 1
    operands = {s.operand for s in workload.epilogue if s.operand is not None}
    count = len(workload.inputs)
    if not operands:  # every input is the op's (no schema read: onnx loads on first use)
        return count
    while count > 0 and count - 1 in operands:
        count -= 1
    schema = schema_for(workload)
    if schema is not None:  # an operand may also be one of the op's own required inputs
        count = min(max(count, schema.min_input), schema.max_input, len(workload.inputs))
    return count


def onnx_attribute(name: str, value) -> onnx.AttributeProto:
    """An ONNX attribute from a workload attribute value (arrays become tensors)."""
    if isinstance(value, onnx.GraphProto):
        return helper.make_attribute(name, value)
    if isinstance(value, bytes) and name in SUBGRAPH_ATTRS:
        graph = onnx.GraphProto()
        graph.ParseFromString(value)
        return helper.make_attribute(name, graph)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value, name))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, tuple):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
        if not value:  # an empty list needs its type; ints are by far the most common
            return helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
    return helper.make_attribute(name, value)


def tensor_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@dataclass(frozen=True)
class NodeModel:
    """A single-node model and how the workload's inputs map onto its graph inputs."""

    model: onnx.ModelProto
    feeds: tuple[int, ...]        # workload input indices fed at run time, in graph order
    # initializers kept out of the model: name -> value, for `add_external_initializers`
    external: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class OnnxPart:
    """A step's ONNX form, for merging into a region model: the model, which graph input
    each workload input index feeds (`feeds`: (graph input name, input index)), the
    graph outputs of the workload's outputs, in order, and the values of its external
    initializers by name (`external`: weights of `PART_EXTERNAL_MIN_BYTES` and more, kept
    out of the model's protobuf; `wpk.kernels.cpu.ort_region` hands them to the session)."""

    model: onnx.ModelProto
    feeds: tuple[tuple[str, int], ...]
    outputs: tuple[str, ...]
    external: Mapping[str, np.ndarray] = field(default_factory=dict)


def expanded_model(workload: Workload, consts: Mapping[int, np.ndarray],
                   make_nodes: Callable[[list[str]], list[onnx.NodeProto]],
                   name: str) -> tuple[onnx.ModelProto, list[int]]:
    """A wpk op's standard-node form as a model -- inputs `in{i}` ('' for an absent one;
    constants as initializers), output `out0`, `make_nodes(input names)` the nodes -- and
    the workload input indices it is fed, in graph order."""
    names, graph_inputs, initializers, feeds = [], [], [], []
    for i, spec in enumerate(workload.inputs):
        if spec is None:
            names.append("")
            continue
        names.append(input_name(i))
        if i in consts:
            initializers.append(numpy_helper.from_array(
                np.asarray(consts[i]).astype(spec.dtype, copy=False), input_name(i)))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                input_name(i), tensor_type(spec.dtype), list(spec.shape)))
            feeds.append(i)
    out = workload.outputs[0]
    graph = helper.make_graph(make_nodes(names), name, graph_inputs, [
        helper.make_tensor_value_info(output_name(0), tensor_type(out.dtype), list(out.shape))],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", workload.opset)],
                              producer_name="wpk")
    model.ir_version = ir_version_for(workload.opset)
    return model, feeds


def node_part(workload: Workload, consts: Mapping[int, np.ndarray] | None = None) -> OnnxPart:
    """The `OnnxPart` of the workload's node and epilogue (constants as initializers)."""
    node = build_node_model(workload, consts, external_min_bytes=PART_EXTERNAL_MIN_BYTES)
    return OnnxPart(node.model, tuple((input_name(i), i) for i in node.feeds),
                    tuple(output_name(j) for j in range(len(workload.outputs))), node.external)


def opset_imports(workload: Workload) -> list[onnx.OperatorSetIdProto]:
    imports = [helper.make_opsetid("", workload.opset)]
    if workload.domain == MS_DOMAIN:
        imports.append(helper.make_opsetid(MS_DOMAIN, 1))
    elif workload.domain not in ("", "ai.onnx") and schema_for(workload) is not None:
        # ai.onnx.ml, ai.onnx.preview.training...: the op's newest version in onnx
        imports.append(helper.make_opsetid(workload.domain, _newest_version(workload)))
    return imports


def _newest_version(workload: Workload) -> int:
    """The newest version of a non-default-domain op's schema known to onnx."""
    return defs.get_schema(workload.op, workload.domain).since_version


def ir_version_for(opset: int) -> int:
    """The smallest IR version that carries the default-domain opset (ORT supports <= 10 here)."""
    try:
        return max(helper.find_min_ir_version_for([helper.make_opsetid("", opset)]), 7)
    except Exception:  # an opset newer than this onnx knows: the newest IR ORT reads
        return 10


def build_node_model(workload: Workload, consts: Mapping[int, np.ndarray] | None = None, *,
                     with_epilogue: bool = True, dtype_map: Mapping[str, str] | None = None,
                     external_min_bytes: int | None = None) -> NodeModel:
    """Build the workload's node (and, by default, its epilogue) as an ONNX model.

    Inputs listed in `consts` become initializers; absent inputs (None specs)
    are left empty in the node. `dtype_map` renames dtypes (e.g. float32 to
    float64 for a float64 reference run). Constants of `external_min_bytes` or more
    become external initializers (`NodeModel.external`).
    """
    consts = consts or {}
    dtype_map = dtype_map or {}

    def dtype_of(spec) -> str:
        return dtype_map.get(spec.dtype, spec.dtype)

    graph_inputs, initializers, feeds = [], [], []
    external: dict[str, np.ndarray] = {}
    used = len(workload.inputs) if with_epilogue else core_input_count(workload)
    for i, spec in enumerate(workload.inputs):
        if spec is None or i >= used:
            continue
        if i in consts:
            value = np.asarray(consts[i]).astype(dtype_of(spec), copy=False)
            initializers.append(initializer(value, input_name(i), external,
                                            external_min_bytes))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                input_name(i), tensor_type(dtype_of(spec)), list(spec.shape)))
            feeds.append(i)

    n_out = len(workload.outputs)
    has_epilogue = with_epilogue and bool(workload.epilogue)
    nodes = []
    if is_elementwise(workload):
        if with_epilogue:
            nodes += epilogue_onnx_nodes(workload.epilogue, input_name(0), _operand_names(workload),
                                         output_name(0), "epi_",
                                         dtype=dtype_of(workload.outputs[0]),
                                         opset=workload.opset, onnxruntime=True)
        else:
            nodes.append(helper.make_node("Identity", [input_name(0)], [output_name(0)]))
    else:
        core = core_input_count(workload)
        node_inputs = ["" if workload.inputs[i] is None else input_name(i) for i in range(core)]
        while node_inputs and node_inputs[-1] == "":
            node_inputs.pop()
        node_outputs = [output_name(j) for j in range(n_out)]
        if has_epilogue:
            node_outputs[0] = "main_out0"
        attrs = [onnx_attribute(k, v) for k, v in workload.attrs]
        node = helper.make_node(workload.op, node_inputs, node_outputs, name="main",
                                domain=workload.domain or None)
        node.attribute.extend(attrs)
        nodes.append(node)
        if has_epilogue:
            nodes += epilogue_onnx_nodes(workload.epilogue, "main_out0", _operand_names(workload),
                                         output_name(0), "epi_",
                                         dtype=dtype_of(workload.outputs[0]),
                                         opset=workload.opset, onnxruntime=True)

    outputs = [helper.make_tensor_value_info(output_name(j), tensor_type(dtype_of(spec)),
                                             list(spec.shape))
               for j, spec in enumerate(workload.outputs)]
    graph = helper.make_graph(nodes, f"wpk_{workload.op}", graph_inputs, outputs,
                              initializer=initializers)
    imports = opset_imports(workload)
    if MS_DOMAIN not in {i.domain for i in imports} and any(n.domain == MS_DOMAIN
                                                            for n in nodes):
        imports.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=imports, producer_name="wpk")
    model.ir_version = ir_version_for(workload.opset)
    return NodeModel(model, tuple(feeds), external)


def initializer(value: np.ndarray, name: str, external: dict[str, np.ndarray] | None,
                min_bytes: int | None) -> onnx.TensorProto:
    """`value` as initializer `name`: inside the model, or, with `external` and `min_bytes`
    and a numeric value of `min_bytes` or more, an external initializer whose value goes
    into `external` by name."""
    if external is None or min_bytes is None or value.nbytes < min_bytes \
            or value.dtype.kind not in "biuf":
        return numpy_helper.from_array(value, name)
    external[name] = np.ascontiguousarray(value)
    return external_initializer(name, value)


def external_initializer(name: str, value: np.ndarray) -> onnx.TensorProto:
    """An initializer that names `value`'s dtype and shape and holds no data: its data is
    handed to onnxruntime with `SessionOptions.add_external_initializers`."""
    tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                              dims=value.shape, data_location=onnx.TensorProto.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", f"wpk-external-{name}"
    return tensor


def _operand_names(workload: Workload) -> dict[int, str]:
    return {i: input_name(i) for i, spec in enumerate(workload.inputs) if spec is not None}


def check_buildable(workload: Workload) -> str | None:
    """None when the workload's op is a known ONNX op, else why a node model can't be built."""
    if is_elementwise(workload):
        return None
    if workload.domain == WPK_DOMAIN:
        return f"wpk op {workload.op!r} has no ONNX form"
    if workload.domain == MS_DOMAIN:  # onnxruntime's contrib ops: onnx has no schemas for them
        return None
    if schema_for(workload) is None:
        domain = workload.domain or "ai.onnx"
        return f"{domain} op {workload.op!r} is unknown at opset {workload.opset}"
    return None
