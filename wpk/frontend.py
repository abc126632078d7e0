"""ONNX frontend: read a model, fix its input shapes, validate it and build a `Graph`.

    graph = load_model("model.onnx", input_shapes={"data": (1, 3, 224, 224)})

Steps: parse (path, bytes or ModelProto) -> fix symbolic input dims from
`input_shapes` (a declared `dim_value` of -1 or 0, paddle2onnx's and some
tf2onnx versions' "dynamic", counts as symbolic) -> `onnx.checker.check_model(full_check=True)` ->
`onnx.shape_inference.infer_shapes(strict_mode=True, data_prop=True)` ->
`Graph`. Checker and inference see a skeleton of the model without the data
of big initializers (so a 500 MB model is not serialized twice). Initializers
(also those declared as graph inputs, as old opsets do), `Constant` nodes and
`ConstantOfShape` of a constant shape become `graph.constants`; every tensor
gets a static shape and dtype (`wpk.frontend_shapes` completes what inference
leaves open, or says why it cannot). Unnamed nodes are named `<op>_<index>`.

Limits (`wpk.core.limits`, `--max-memory`): the given input shapes, every
declared constant, `ConstantOfShape` and `Loop` trip count are checked before
anything is allocated or evaluated, and the model's estimated memory (the sum
of its tensors' sizes) before and after the shapes are completed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from wpk.core.errors import ModelError, ShapeError, UnsupportedError
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.limits import Limits
from wpk.frontend_pools import stand_in_ceil_mode_pools
from wpk.frontend_shapes import SHAPE_HINT, complete_shapes
from wpk.model_checks import check_model_values

MIN_OPSET = 7
SKELETON_KEEP_ELEMENTS = 4096  # initializers up to this size stay in the checked model


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto,
               input_shapes: Mapping[str, tuple[int, ...]] | None = None,
               max_memory: int | str | Limits | None = None,
               source: str | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a validated `Graph` with static shapes.

    `input_shapes` maps graph input names to full shapes; it is required for
    inputs with symbolic or unknown dims and must agree with fixed dims.
    `max_memory` (bytes, or e.g. "4G"; default half the RAM) bounds every tensor
    and their sum. Raises `ModelError` (unreadable, invalid), `ShapeError`
    (shapes; `ValueShapeError` where a shape depends on input values) or `LimitError`
    (over the limits). `source` names the model in messages (default: its path, or
    `<ModelProto>`/`<bytes>`), e.g. the file a ModelProto part was cut from.
    """
    limits = Limits.of(max_memory)
    proto, read_from = read_model(model)
    source = source or read_from
    _check_opset(proto, source)
    _check_declared_constants(proto.graph, source, limits)
    constants = _initializer_names(proto.graph)
    skeleton = _skeleton(proto, source)
    _fix_input_shapes(skeleton, source, dict(input_shapes or {}), constants, limits)
    stand_in_ceil_mode_pools(skeleton)   # ONNX's inference misses the spec's last-window rule
    _check(skeleton, source)
    _stand_ins_for_inference(skeleton)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types here
        raise ModelError(f"shape inference failed for '{source}': {_first_line(exc)}",
                         hint="check the model with onnx.checker and the input shapes") from exc
    return _build_graph(proto, inferred, source, limits)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_model(model: Any) -> tuple[onnx.ModelProto, str]:
    """(ModelProto, the name messages give it) of a path (external data loaded), bytes or
    ModelProto; `ModelError` when it cannot be read."""
    if isinstance(model, onnx.ModelProto):
        return model, "<ModelProto>"
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_model_from_string(bytes(model)), "<bytes>"
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise ModelError(f"cannot parse '<bytes>' as an ONNX model: {_first_line(exc)}",
                             hint="pass the bytes of a complete .onnx file") from exc
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(f"cannot read a model from a {type(model).__name__}",
                         hint="pass a path, the bytes of an .onnx file or an onnx.ModelProto")
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise ModelError(f"model file '{path}' not found",
                         hint="check the path (and that it is a file, not a folder)")
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise ModelError(f"cannot parse '{path}' as an ONNX model: {_first_line(exc)}",
                         hint="the file is truncated or not an ONNX model; export it again"
                         ) from exc
    _load_external(proto, path)
    return proto, path


def _load_external(proto: onnx.ModelProto, path: str) -> None:
    base = os.path.dirname(os.path.abspath(path))
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        if not os.path.isfile(os.path.join(base, location)):
            raise ModelError(
                f"external data '{location}' of tensor '{tensor.name}' in '{path}' not found",
                hint=f"put '{location}' next to the model file ({base})")
    try:
        onnx.load_external_data_for_model(proto, base)
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"cannot load external data of '{path}': {_first_line(exc)}",
                         hint="check the external data files next to the model") from exc


def _check_opset(proto: onnx.ModelProto, source: str) -> None:
    newest = onnx.defs.onnx_opset_version()
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx") and not MIN_OPSET <= entry.version <= newest:
            raise UnsupportedError(
                f"'{source}' uses ONNX opset {entry.version}; wpk supports {MIN_OPSET}..{newest}",
                hint="convert it with onnx.version_converter.convert_version(model, 17)")


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def _check_declared_constants(graph: onnx.GraphProto, source: str, limits: Limits) -> None:
    """Every initializer's and `Constant`'s declared shape within the limits, before
    any is turned into an array (a sparse one would be made dense)."""
    for tensor in graph.initializer:
        limits.check_tensor(tensor.dims, _np_dtype(tensor.data_type),
                            f"initializer '{tensor.name}' of '{source}'")
    for sparse in graph.sparse_initializer:
        limits.check_tensor(sparse.dims, _np_dtype(sparse.values.data_type),
                            f"sparse initializer '{sparse.values.name}' of '{source}'")
    for index, node in enumerate(graph.node):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        what = f"Constant node '{node.name or f'Constant_{index}'}' of '{source}'"
        for attr in node.attribute:
            if attr.name == "value":
                limits.check_tensor(attr.t.dims, _np_dtype(attr.t.data_type), what)
            elif attr.name == "sparse_value":
                limits.check_tensor(attr.sparse_tensor.dims,
                                    _np_dtype(attr.sparse_tensor.values.data_type), what)
            elif attr.name in ("value_floats", "value_ints", "value_strings"):
                limits.check_tensor((len(getattr(attr, attr.name[6:])),), "int64", what)


def _np_dtype(elem_type: int):
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, ValueError, TypeError):
        return "float64"  # unknown types are refused later, by the checker


def _fix_input_shapes(proto: onnx.ModelProto, source: str,
                      input_shapes: dict[str, tuple[int, ...]], constants: set[str],
                      limits: Limits) -> None:
    """Check `input_shapes` against the inputs of `proto` and write them into it."""
    real_inputs = [i for i in proto.graph.input if i.name not in constants]
    names = [i.name for i in real_inputs]
    for name in input_shapes:
        if name not in names:
            raise ShapeError(f"--input-shape names '{name}', which is not an input of '{source}'",
                             hint=f"the inputs are: {', '.join(names) or '(none)'}")
    updates: dict[str, tuple[int, ...]] = {}
    for value in proto.graph.input:
        if value.name not in names:
            continue
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise UnsupportedError(f"input '{value.name}' of '{source}' is not a tensor",
                                   hint="wpk supports tensor inputs only")
        if ttype.elem_type == onnx.TensorProto.UNDEFINED:
            raise UnsupportedError(f"input '{value.name}' of '{source}' has no element type "
                                   "(UNDEFINED)",
                                   hint="declare the input's element type in the model's "
                                        "graph inputs, e.g. FLOAT")
        dims = ([_declared_dim(d) for d in ttype.shape.dim]
                if ttype.HasField("shape") else None)
        given = input_shapes.get(value.name)
        shown = "unknown rank" if dims is None else "[" + ", ".join(map(str, dims)) + "]"
        if given is None:
            if dims is None or any(not isinstance(d, int) for d in dims):
                raise ShapeError(f"input '{value.name}' of '{source}' has dims {shown}, "
                                 "which are not all fixed",
                                 hint=f"give the input shape, e.g. --input-shape "
                                      f"{value.name}=1x3x224x224")
            continue
        given = tuple(int(d) for d in given)
        if any(d < 0 for d in given):
            raise ShapeError(f"--input-shape {value.name}={'x'.join(map(str, given))} "
                             "has a negative dim", hint=SHAPE_HINT)
        limits.check_tensor(given, _np_dtype(ttype.elem_type),
                            f"input '{value.name}' of '{source}' (--input-shape)")
        if dims is not None:
            if len(dims) != len(given):
                raise ShapeError(f"input '{value.name}' of '{source}' has rank {len(dims)} "
                                 f"({shown}) but the given shape {given} has rank {len(given)}",
                                 hint=f"give {len(dims)} dims for '{value.name}'")
            for axis, (have, want) in enumerate(zip(dims, given)):
                if isinstance(have, int) and have != want:
                    raise ShapeError(f"input '{value.name}' of '{source}' has dim {have} at "
                                     f"axis {axis} ({shown}) but the given shape says {want}",
                                     hint="fixed dims of the model cannot be changed")
        if dims is None or list(dims) != list(given):
            updates[value.name] = given
    for value in proto.graph.input:
        if value.name in updates:
            ttype = value.type.tensor_type
            ttype.ClearField("shape")
            ttype.shape.SetInParent()  # a scalar still has a (rank 0) shape
            for d in updates[value.name]:
                ttype.shape.dim.add().dim_value = d
    _forget_placeholder_dims([*proto.graph.output, *proto.graph.value_info])


def _declared_dim(dim: onnx.TensorShapeProto.Dimension) -> int | str:
    """A declared dim: its value when fixed, else its name, the placeholder ("-1", "0")
    or "?". paddle2onnx and tf2onnx declare a dynamic dim as `dim_value: -1` (some
    exporters 0): unknown, like a symbolic one, so `--input-shape` can fix it."""
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value > 0 else str(dim.dim_value)
    return dim.dim_param or "?"


def _forget_placeholder_dims(values) -> None:
    """Make `dim_value` -1 or 0 (an exporter's "dynamic") unknown in declared value
    infos, so shape inference fills them instead of disagreeing with them."""
    for value in values:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
            continue
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.ClearField("dim_value")


def _copy_field(message, field, value, source: str) -> None:
    try:
        _set_field(message, field, value)
    except (UnicodeDecodeError, TypeError) as exc:
        raise ModelError(f"field '{field.name}' of '{source}' is not valid UTF-8 text: "
                         f"{_first_line(exc)}", hint="export the model again") from exc


def _set_field(message, field, value) -> None:
    repeated = getattr(field, "is_repeated", None)
    if repeated is None:  # older protobuf
        repeated = field.label == field.LABEL_REPEATED
    if repeated:
        getattr(message, field.name).extend(value)
    elif field.message_type is not None:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _skeleton(proto: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """A copy of the model without the data of big initializers, for checker and inference.

    A big initializer becomes a graph input of its type and shape (unless it is
    declared as one already), so serializing the model for the checker and for
    shape inference costs nothing like the weights; small ones (shapes, axes)
    stay, for data propagation. The caller's model is never modified.
    """
    skeleton = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(skeleton, field, value, source)
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(skeleton.graph, field, value, source)
    declared = {value.name for value in proto.graph.input}
    for tensor in proto.graph.initializer:
        if math.prod(tensor.dims) <= SKELETON_KEEP_ELEMENTS:
            skeleton.graph.initializer.append(tensor)
        elif tensor.name not in declared:
            skeleton.graph.input.append(helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)))
    return skeleton


# Ops whose output has their first input's type and shape but that ONNX shape inference
# leaves untyped (GroupNormalization: a function op whose body onnx does not infer through).
SHAPE_KEEPING_OPS = frozenset({"GroupNormalization"})


def _stand_ins_for_inference(skeleton: onnx.ModelProto) -> None:
    """Give shape inference an Identity of the first input in place of each node of
    `SHAPE_KEEPING_OPS` (in the skeleton only: the graph keeps the model's nodes)."""
    for node in skeleton.graph.node:
        if node.op_type in SHAPE_KEEPING_OPS and node.domain in ("", "ai.onnx") and node.input:
            first = node.input[0]
            node.op_type = "Identity"
            del node.input[:]
            node.input.append(first)
            del node.attribute[:]


def _check(proto: onnx.ModelProto, source: str) -> None:
    check_model_values(proto, source)  # what onnx.checker lets through (wpk.model_checks)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
            ValueError) as exc:
        text = str(exc)
        node = _node_in_message(proto, text)
        where = f" at node '{node}'" if node else ""
        raise ModelError(f"'{source}' fails the ONNX checker{where}: {_first_line(exc)}",
                         hint="fix the model (onnx.checker.check_model tells the details)"
                         ) from exc


def _node_in_message(proto: onnx.ModelProto, text: str) -> str | None:
    for index, node in enumerate(proto.graph.node):
        label = node.name or f"{node.op_type}_{index}"
        if node.name and (f"'{node.name}'" in text or f"node {node.name}" in text
                          or f"name: {node.name}" in text):
            return label
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    for index, node in enumerate(proto.graph.node):
        if node.op_type in words:
            return node.name or f"{node.op_type}_{index}"
    return None


def _dtype_name(elem_type: int, value: str, source: str) -> str:
    """The numpy name of a declared element type; UnsupportedError naming the value for a
    type number this onnx does not know (a newer ONNX's type, or damaged bytes)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, ValueError, TypeError):
        raise UnsupportedError(f"value '{value}' of '{source}' has element type {elem_type}, "
                               f"which onnx {onnx.__version__} does not know",
                               hint="export the model with a standard ONNX element type "
                                    "(FLOAT, FLOAT16, INT64, ...)") from None


def _value_infos(proto: onnx.ModelProto, source: str) -> dict[str, TensorInfo | None]:
    infos: dict[str, TensorInfo | None] = {}
    graph = proto.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        ttype = value.type.tensor_type
        kind = value.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise UnsupportedError(
                f"value '{value.name}' of '{source}' is a "
                f"{kind.replace('_type', '')}, not a tensor",
                hint="wpk runs tensor graphs only (no sequences, maps or optionals)")
        if not value.type.HasField("tensor_type") or ttype.elem_type == 0:
            continue
        dtype = _dtype_name(ttype.elem_type, value.name, source)
        if not ttype.HasField("shape"):
            infos.setdefault(value.name, None)
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
        if any(d < 0 for d in dims):
            infos.setdefault(value.name, None)
        else:
            infos[value.name] = TensorInfo(tuple(dims), dtype)
    return infos


def attribute_value(attr: onnx.AttributeProto) -> Any:
    """An ONNX attribute as a Python value: ints, floats, str, tuples, numpy arrays, graphs."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        items = [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto)
                 else v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
                 for v in value]
        return tuple(items)
    return value


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    attr = node.attribute[0]
    if attr.name == "sparse_value":
        sparse = attr.sparse_tensor
        dense = np.zeros(tuple(sparse.dims), dtype=helper.tensor_dtype_to_np_dtype(
            sparse.values.data_type))
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices)
        flat = dense.reshape(-1)
        if indices.ndim == 2:
            indices = np.ravel_multi_index(tuple(indices.T), dense.shape)
        flat[indices] = values
        return dense
    value = attribute_value(attr)
    if attr.name == "value_string":
        return np.array(value, dtype=object)
    if attr.name == "value_strings":
        return np.array(list(value), dtype=object)
    if attr.name in ("value_float", "value_floats"):
        return np.array(value, dtype=np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.array(value, dtype=np.int64)
    return np.asarray(value)


def constant_of_shape(shape: np.ndarray, value: np.ndarray | None) -> np.ndarray:
    """`ConstantOfShape` as a read-only broadcast view (no memory for the repeated value)."""
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]
    return np.broadcast_to(fill.reshape(()), tuple(int(d) for d in shape))


def node_names(proto: onnx.ModelProto) -> list[str]:
    """The name of every node as wpk reports it: its own, or `{op}_{index}` where it has
    none (or repeats an earlier one's), made unique."""
    taken = {n.name for n in proto.graph.node if n.name}
    names, used = [], set()
    for index, node in enumerate(proto.graph.node):
        name = node.name
        if not name or name in used:
            base = node.name or f"{node.op_type}_{index}"
            name, k = base, 0
            while name in used or (name in taken and name != node.name):
                k += 1
                name = f"{base}_{k}"
        used.add(name)
        names.append(name)
    return names


def _constant_shape(value: np.ndarray, node: onnx.NodeProto, name: str, source: str,
                    limits: Limits) -> tuple[int, ...]:
    """The shape a `ConstantOfShape` makes, checked: 1-D, integers >= 0, within the limits."""
    what = f"the output of ConstantOfShape node '{name}' in '{source}'"
    array = np.asarray(value)
    if array.ndim != 1 or array.dtype.kind not in "iu" or (array < 0).any():
        raise ModelError(f"{what}: its shape input {node.input[0]!r} is not a 1-D tensor of "
                         f"integers >= 0 ({array.dtype.name}, {list(array.shape)})",
                         hint="export the model again")
    shape = tuple(int(d) for d in array)
    value_attr = next((a.t for a in node.attribute if a.name == "value"), None)
    dtype = np.float32 if value_attr is None else _np_dtype(value_attr.data_type)
    limits.check_tensor(shape, dtype, what)
    return shape


def _check_loop(node: onnx.NodeProto, name: str, constants: Mapping[str, np.ndarray],
                source: str, limits: Limits) -> None:
    """A `Loop` whose trip count is a constant runs at most `limits.max_loop_trips` times."""
    if node.op_type != "Loop" or not node.input or node.input[0] not in constants:
        return
    trips = np.asarray(constants[node.input[0]]).reshape(-1)
    if trips.size == 1 and trips.dtype.kind in "iu":
        limits.check_trips(int(trips[0]), f"Loop node '{name}' in '{source}'")


def _check_memory(graph: Graph, limits: Limits) -> None:
    """The sum of the sizes of the graph's tensors (activations and weights) within the
    limits, naming the largest tensor and its producer."""
    producers = {o: n for n in graph.nodes for o in n.outputs if o}

    def describe(name: str) -> str:
        node = producers.get(name)
        kind = ("input" if name in graph.inputs else "constant" if name in graph.constants
                else "tensor")
        made = f" (output of {node.op} node '{node.name}')" if node is not None else ""
        return f"{kind} '{name}'{made} of '{graph.source}'"

    limits.check_total(((name, info.shape, info.dtype) for name, info in graph.tensors.items()),
                       f"'{graph.source}'", describe)


def _build_graph(proto: onnx.ModelProto, inferred: onnx.ModelProto, source: str,
                 limits: Limits) -> Graph:
    gp = proto.graph
    constants: dict[str, np.ndarray] = {}
    for tensor in gp.initializer:
        try:
            constants[tensor.name] = numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise ModelError(f"initializer '{tensor.name}' of '{source}' is malformed: "
                             f"{_first_line(exc)}", hint="export the model again") from exc
    for sparse in gp.sparse_initializer:
        node = helper.make_node("Constant", [], [sparse.values.name], sparse_value=sparse)
        constants[sparse.values.name] = _constant_value(node)
    infos = _value_infos(inferred, source)
    nodes: list[Node] = []
    for node, name in zip(gp.node, node_names(proto)):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants[node.output[0]] = _constant_value(node)
            continue
        if (node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx")
                and node.input[0] in constants):
            shape = _constant_shape(constants[node.input[0]], node, name, source, limits)
            value = next((numpy_helper.to_array(a.t) for a in node.attribute
                          if a.name == "value"), None)
            constants[node.output[0]] = constant_of_shape(np.array(shape, np.int64), value)
            continue
        if node.domain in ("", "ai.onnx"):
            _check_loop(node, name, constants, source, limits)
        attrs = {a.name: attribute_value(a) for a in node.attribute}
        nodes.append(Node(node.op_type, list(node.input), list(node.output), name, attrs,
                          "" if node.domain == "ai.onnx" else node.domain))
    tensors: dict[str, TensorInfo] = {}
    for name, array in constants.items():
        tensors[name] = TensorInfo(tuple(array.shape), array.dtype.name)
    unknown = []
    for name in [*(i.name for i in gp.input), *(o for n in nodes for o in n.outputs)]:
        if not name or name in tensors:
            continue
        info = infos.get(name)
        if info is None:
            unknown.append(name)
        else:
            tensors[name] = info
    inputs = [i.name for i in gp.input if i.name not in constants]
    opsets = {("" if e.domain == "ai.onnx" else e.domain): e.version for e in proto.opset_import}
    graph = Graph(nodes=nodes, inputs=inputs, outputs=[o.name for o in gp.output],
                  tensors=tensors, constants=constants, name=gp.name or "graph",
                  opsets=opsets, source=source)
    _check_memory(graph, limits)  # before evaluating anything for the shapes left open
    if unknown:
        complete_shapes(proto, graph, unknown, limits)
        _check_memory(graph, limits)
    return graph
