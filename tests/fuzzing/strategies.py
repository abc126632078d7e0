"""Hypothesis strategies over ONNX models and plan archives, for the fuzzing harness.

`models()`: random small graphs (1-5 nodes) of ops wpk supports, with random
attributes, shapes and dtypes, mostly valid (shapes are tracked) and sometimes
not (an attribute out of range, a wrong channel count); then, now and then, a
corrupted field (a dim, an element type, an opset, a name, an attribute type).
`model_bytes()`: those models serialized, sometimes with bytes flipped,
truncated or inserted. `plan_mutations()`: edits of a real plan's members
(flipped, truncated, replaced, removed, added, manifest fields changed), with
or without the checksums recomputed (never over a kernel library's flipped code), or of
the whole file's bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import zipfile

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

DTYPES = [T.FLOAT] * 6 + [T.FLOAT16, T.DOUBLE, T.INT64, T.INT32, T.BOOL, T.UINT8, T.STRING]
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Sqrt", "Erf", "Softplus",
         "HardSwish", "Identity", "Floor", "Not", "Log"]
BINARY = ["Add", "Mul", "Sub", "Div", "Max", "Min", "Pow", "Equal", "Less"]
OPS = ["unary", "binary", "Conv", "MaxPool", "AveragePool", "Gemm", "MatMul", "Softmax",
       "Transpose", "Reshape", "Concat", "Pad", "Slice", "ReduceMean", "LeakyRelu", "Clip",
       "BatchNormalization", "GlobalAveragePool", "Flatten", "Resize", "Cast", "Where",
       "Expand", "Tile", "ConstantOfShape", "Range", "Loop"]
HUGE = st.sampled_from([1, 7, 2**10, 2**16, 2**20, 2**31, 10**12])
SMALL = st.integers(1, 6)
MAX_CONST_ELEMENTS = 1 << 12  # constants the strategy makes stay this small
SHAPE_NOTE = "fuzz input shape: "  # a model's doc_string: the shape of its input 'x'

WEIRD_INTS = st.sampled_from([0, -1, -2, 2**31, 2**40, 10**12, -(2**63), 2**63 - 1])


class _Builder:
    """A graph under construction: nodes, initializers and the shape of each tensor."""

    def __init__(self):
        self.nodes, self.inits, self.shapes, self.count = [], [], {}, 0

    def name(self, prefix="t"):
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array) -> str:
        name = self.name("w")
        self.inits.append(nh.from_array(np.asarray(array), name))
        return name

    def add(self, op, inputs, shape, **attrs):
        out = self.name()
        self.nodes.append(h.make_node(op, inputs, [out], name=f"{op.lower()}_{self.count}",
                                      **attrs))
        self.shapes[out] = shape
        return out


def _maybe_weird(draw, value):
    """`value`, or (1 in 12) an out-of-range integer."""
    return draw(WEIRD_INTS) if draw(st.integers(0, 11)) == 0 else value


def _add_node(draw, b: _Builder, src: str, rng: np.random.Generator) -> str:
    shape = b.shapes[src]
    rank = len(shape)
    op = draw(st.sampled_from(OPS))
    if math.prod(shape) > MAX_CONST_ELEMENTS:  # after a hostile op: no constant of its shape
        return b.add(draw(st.sampled_from(UNARY)), [src], shape)
    def rand(*s):
        return (rng.standard_normal(s).astype(np.float32))
    if op == "unary":
        return b.add(draw(st.sampled_from(UNARY)), [src], shape)
    if op == "binary":
        other = shape[draw(st.integers(0, rank)):] if rank else shape
        return b.add(draw(st.sampled_from(BINARY)), [src, b.const(rand(*other))], shape)
    if op in ("LeakyRelu",):
        alpha = draw(st.one_of(st.floats(-2, 2), st.just(float("nan"))))
        return b.add(op, [src], shape, alpha=alpha)
    if op == "Clip":
        high = b.const(np.float32(draw(st.floats(-1, 6))))
        return b.add(op, [src, b.const(np.float32(-1)), high], shape)
    if op == "Softmax":
        axis = draw(st.integers(-rank, max(rank - 1, 0)))
        return b.add(op, [src], shape, axis=_maybe_weird(draw, axis))
    if op == "Transpose":
        perm = list(draw(st.permutations(range(rank))))
        return b.add(op, [src], tuple(shape[p] for p in perm), perm=perm)
    if op == "Flatten":
        axis = draw(st.integers(0, rank))
        return b.add(op, [src], (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))),
                     axis=axis)
    if op == "Reshape":
        last = int(shape[-1]) if rank else 1
        return b.add(op, [src, b.const(np.array([-1, last]))],
                     (int(np.prod(shape)) // max(last, 1), last))
    if op == "Concat" and rank:
        axis = draw(st.integers(0, rank - 1))
        out = tuple(d * 2 if i == axis else d for i, d in enumerate(shape))
        return b.add(op, [src, src], out, axis=_maybe_weird(draw, axis))
    if op == "Pad" and rank:
        pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
        out = tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(shape))
        return b.add(op, [src, b.const(np.array(pads, np.int64))], out,
                     mode=draw(st.sampled_from(["constant", "reflect", "edge", "wrap", "bogus"])))
    if op == "Slice" and rank:
        axis = draw(st.integers(0, rank - 1))
        start, end = sorted(draw(st.lists(st.integers(-8, 8), min_size=2, max_size=2)))
        sliced = len(range(shape[axis])[slice(start, end)])
        out = tuple(sliced if i == axis else d for i, d in enumerate(shape))
        return b.add(op, [src, b.const(np.array([start])), b.const(np.array([end])),
                          b.const(np.array([axis]))], out)
    if op == "ReduceMean" and rank:
        axes = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
        keep = draw(st.integers(0, 1))
        out = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(shape))
        return b.add(op, [src], tuple(d for d in out if d is not None), axes=axes, keepdims=keep)
    if op in ("Gemm", "MatMul") and rank == 2:
        n = draw(SMALL)
        k = _maybe_weird(draw, shape[1]) if op == "Gemm" else shape[1]
        weight = b.const(rand(max(min(k, 64), 1), n))
        if op == "MatMul":
            return b.add(op, [src, weight], (shape[0], n))
        return b.add(op, [src, weight, b.const(rand(n))], (shape[0], n),
                     alpha=draw(st.floats(-2, 2)), transA=0, transB=0)
    if op in ("Conv", "MaxPool", "AveragePool", "BatchNormalization", "GlobalAveragePool",
              "Resize") and (rank == 4 or rank == 3 and op != "Resize"):
        # 2-d, or 1-d (speech and time series: lifted to 2-d on the CPU)
        n, c, *spatial = shape
        if op == "GlobalAveragePool":
            return b.add(op, [src], (n, c, *[1] * len(spatial)))
        if op == "BatchNormalization":
            return b.add(op, [src, *(b.const(np.abs(rand(c)) + 0.5) for _ in range(4))], shape,
                         epsilon=draw(st.floats(0, 0.1)))
        if op == "Resize":
            height, width = spatial
            scale = draw(st.sampled_from([1.0, 2.0, 0.5]))
            out = (n, c, int(height * scale), int(width * scale))
            return b.add(op, [src, "", b.const(np.array([1, 1, scale, scale], np.float32))], out,
                         mode=draw(st.sampled_from(["nearest", "linear", "cubic"])))
        kernel = draw(st.integers(1, 3))
        stride = _maybe_weird(draw, draw(st.integers(1, 2)))
        pad = draw(st.integers(0, kernel - 1))
        dims = len(spatial)
        def size(d):
            return ((d + 2 * pad - kernel) // stride + 1 if stride > 0 else 0)
        window = {"kernel_shape": [kernel] * dims, "strides": [stride] * dims,
                  "pads": [pad] * 2 * dims}
        out_spatial = tuple(size(d) for d in spatial)
        if op == "Conv":
            group = draw(st.sampled_from([1, 1, c, 2, 0]))
            out_c = draw(SMALL) * max(group, 1)
            weight = b.const(rand(out_c, max(c // max(group, 1), 1), *[kernel] * dims))
            return b.add(op, [src, weight], (n, out_c, *out_spatial), group=group, **window)
        return b.add(op, [src], (n, c, *out_spatial), **window)
    if op == "Cast":
        return b.add(op, [src], shape, to=draw(st.sampled_from([T.FLOAT, T.FLOAT16, T.INT32,
                                                                T.DOUBLE, T.BOOL])))
    if op == "Where":
        cond = b.const(rng.integers(0, 2, shape).astype(bool))
        return b.add(op, [cond, src, b.const(rand(*shape))], shape)
    return _add_hostile(draw, b, src, op, shape)


def _add_hostile(draw, b: _Builder, src: str, op: str, shape) -> str:
    """Ops whose output size comes from values: sometimes small, sometimes enormous."""
    rank = len(shape)
    if op == "Expand":
        dims = [draw(HUGE) for _ in range(draw(st.integers(rank, rank + 2)))]
        return b.add(op, [src, b.const(np.array(dims, np.int64))], tuple(dims))
    if op == "Tile" and rank:
        repeats = [draw(HUGE) for _ in range(rank)]
        return b.add(op, [src, b.const(np.array(repeats, np.int64))],
                     tuple(d * r for d, r in zip(shape, repeats)))
    if op == "ConstantOfShape":
        dims = [draw(HUGE) for _ in range(draw(st.integers(1, 3)))]
        made = b.add(op, [b.const(np.array(dims, np.int64))], tuple(dims),
                     value=h.make_tensor("v", T.FLOAT, [1], [1.0]))
        return b.add("Add", [made, src], tuple(dims)) if draw(st.booleans()) else made
    if op == "Range":
        limit = draw(HUGE)
        return b.add(op, [b.const(np.float32(0)), b.const(np.float32(limit)),
                          b.const(np.float32(draw(st.sampled_from([1, 0.5, 0, -1]))))],
                     (limit,))
    if op == "Loop":
        trips = draw(st.sampled_from([0, 3, 10**5 + 1, 10**12, None]))
        body = h.make_graph(
            [h.make_node("Identity", ["cond_in"], ["cond_out"]),
             h.make_node("Identity", ["v_in"], ["v_out"])], "body",
            [h.make_tensor_value_info("i", T.INT64, []),
             h.make_tensor_value_info("cond_in", T.BOOL, []),
             h.make_tensor_value_info("v_in", T.FLOAT, None)],
            [h.make_tensor_value_info("cond_out", T.BOOL, []),
             h.make_tensor_value_info("v_out", T.FLOAT, None)])
        count = "" if trips is None else b.const(np.array(trips, np.int64))
        return b.add(op, [count, b.const(np.array(True)), src], shape, body=body)
    return b.add("Relu", [src], shape)


@st.composite
def models(draw) -> onnx.ModelProto:
    """A random small model of ops wpk supports, sometimes with a corrupted field."""
    rank = draw(st.sampled_from([1, 2, 2, 4, 4, 4, 0, 3]))
    shape = tuple(draw(st.lists(SMALL, min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    builder = _Builder()
    builder.shapes["x"] = shape
    names = ["x"]
    for _ in range(draw(st.integers(1, 5))):
        src = draw(st.sampled_from(names))
        try:
            names.append(_add_node(draw, builder, src, rng))
        except (ValueError, ZeroDivisionError, OverflowError):
            names.append(builder.add("Relu", [src], builder.shapes[src]))
    symbolic = draw(st.booleans())
    declared = [f"d{i}" if symbolic and i == 0 else d for i, d in enumerate(shape)]
    graph = h.make_graph(
        builder.nodes, "fuzz", [h.make_tensor_value_info("x", dtype, declared)],
        [_output_info(builder, names[-1], dtype, shape)], builder.inits)
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", draw(
        st.sampled_from([17] * 8 + [7, 11, 13, 18, 21])))])
    proto.doc_string = SHAPE_NOTE + "x".join(map(str, shape))  # the shape to give
    _infer_output_type(proto)
    if draw(st.integers(0, 3)) == 0:
        _corrupt(draw, proto)
    return proto


def _output_info(builder: _Builder, name: str, dtype: int, shape) -> onnx.ValueInfoProto:
    rank = len(builder.shapes.get(name, shape))
    return h.make_tensor_value_info(name, dtype, [f"o{i}" for i in range(rank)])


def _infer_output_type(proto: onnx.ModelProto) -> None:
    """Declare the output's element type and rank as ONNX infers them, where it can (so
    that most models are valid and reach the build)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - an invalid model stays as it is
        return
    output = proto.graph.output[0]
    for value in inferred.graph.value_info:
        if value.name == output.name and value.type.tensor_type.elem_type:
            output.type.tensor_type.elem_type = value.type.tensor_type.elem_type
            if value.type.tensor_type.HasField("shape"):
                rank = len(value.type.tensor_type.shape.dim)
                output.type.tensor_type.ClearField("shape")
                output.type.tensor_type.shape.SetInParent()
                for i in range(rank):
                    output.type.tensor_type.shape.dim.add().dim_param = f"o{i}"


def _corrupt(draw, proto: onnx.ModelProto) -> None:
    """Change one field of `proto` to something odd."""
    graph = proto.graph
    kind = draw(st.sampled_from(["dim", "elem_type", "opset", "name", "attribute", "init",
                                 "output", "domain", "ir"]))
    if kind == "dim" and graph.input[0].type.tensor_type.shape.dim:
        dims = graph.input[0].type.tensor_type.shape.dim
        dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(WEIRD_INTS)
    elif kind == "elem_type":
        graph.input[0].type.tensor_type.elem_type = draw(st.integers(0, 30))
    elif kind == "opset":
        proto.opset_import[0].version = draw(st.integers(-1, 40))
    elif kind == "name" and graph.node:
        node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
        node.input[0] = draw(st.sampled_from(["", "missing", node.output[0], "x"]))
    elif kind == "attribute" and graph.node:
        node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
        node.attribute.append(h.make_attribute(
            draw(st.sampled_from(["axis", "perm", "group", "mode", "bogus", "to"])),
            draw(st.one_of(st.integers(-5, 5), st.text(max_size=4), st.floats(),
                           st.lists(st.integers(-3, 3), min_size=1, max_size=3)))))
    elif kind == "init" and graph.initializer:
        tensor = graph.initializer[draw(st.integers(0, len(graph.initializer) - 1))]
        tensor.dims.append(draw(st.sampled_from([0, 3, 2**20, 2**40])))
    elif kind == "output":
        graph.output[0].name = draw(st.sampled_from(["", "x", "nowhere", "y\u00e9\x00"]))
    elif kind == "domain" and graph.node:
        graph.node[0].domain = draw(st.sampled_from(["com.microsoft", "bogus", "ai.onnx.ml"]))
    elif kind == "ir":
        proto.ir_version = draw(st.integers(-1, 20))


def input_shape_of(data: bytes) -> str | None:
    """The `--input-shape` of a model made by `models()` (None if it does not parse)."""
    try:
        note = onnx.load_model_from_string(data).doc_string
    except Exception:  # noqa: BLE001 - damaged bytes
        return None
    if not isinstance(note, str) or not note.startswith(SHAPE_NOTE):
        return None  # a damaged doc_string can decode to bytes
    shape = note[len(SHAPE_NOTE):]
    return f"x={shape}" if shape else None  # a scalar input needs no shape


@st.composite
def model_bytes(draw) -> bytes:
    """A random model serialized; 1 in 3 with its bytes damaged."""
    data = bytearray(draw(models()).SerializeToString())
    damage = draw(st.sampled_from(["none", "none", "flip", "truncate", "insert"]))
    if damage == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif damage == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif damage == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


# --- plan archives --------------------------------------------------------------------------

JSON_VALUES = st.sampled_from([None, -1, 0, 2**70, 1.5, "", "x" * 3, [], {}, [1, 2], {"a": 1},
                               True, "../../etc/passwd", "1e400", float("inf"),
                               float("nan"), 10**400])


class Blob(bytes):
    """Bytes that print as their size and digest (a falsifying example stays readable)."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes, sha256 {hashlib.sha256(self).hexdigest()[:12]}>"


def members_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def archive_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name == "weights.npz" \
                else zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()


def rechecksum(members: dict[str, bytes]) -> dict[str, bytes]:
    """The members with the manifest's checksums recomputed, where the manifest is JSON."""
    from wpk.plans.planfile import MANIFEST, _manifest_digest

    try:
        manifest = json.loads(members[MANIFEST])
        manifest["members"] = {n: hashlib.sha256(d).hexdigest() for n, d in members.items()
                               if n != MANIFEST}
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        return {**members, MANIFEST: json.dumps(manifest).encode()}
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
        return members


def _edit_manifest(draw, data: bytes) -> bytes:
    manifest = json.loads(data)
    target = manifest
    key = draw(st.sampled_from(sorted(manifest)))
    nested = manifest[key]
    if isinstance(nested, dict) and nested and draw(st.booleans()):
        target, key = nested, draw(st.sampled_from(sorted(nested)))
    elif (isinstance(nested, list) and nested and isinstance(nested[0], dict)
          and draw(st.booleans())):
        target = nested[draw(st.integers(0, len(nested) - 1))]
        key = draw(st.sampled_from(sorted(target))) if target else "x"
    if draw(st.integers(0, 4)) == 0:
        target.pop(key, None)
    else:
        target[key] = draw(JSON_VALUES)
    return json.dumps(manifest).encode()


@st.composite
def plan_mutations(draw, plan: bytes) -> bytes:
    """A real plan's bytes with one to three edits (see the module docstring)."""
    if draw(st.integers(0, 7)) == 0:  # the whole file: flip or truncate
        data = bytearray(plan)
        if draw(st.booleans()):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        else:
            data = data[:draw(st.integers(0, len(data) - 1))]
        return Blob(data)
    from wpk.native_bundle import NATIVE_PREFIX
    from wpk.plans.planfile import KERNELS

    members = members_of(plan)
    code_altered = False
    for _ in range(draw(st.integers(1, 3))):
        names = sorted(members)
        name = draw(st.sampled_from(names))
        edit = draw(st.sampled_from(["flip", "truncate", "replace", "remove", "add", "manifest",
                                     "manifest", "manifest"]))
        data = bytearray(members[name])
        if edit == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
            members[name] = bytes(data)
            code_altered |= name.startswith(KERNELS + NATIVE_PREFIX)
        elif edit == "truncate":
            members[name] = bytes(data[:draw(st.integers(0, len(data)))])
        elif edit == "replace":
            members[name] = draw(st.binary(max_size=64))
        elif edit == "remove":
            members.pop(name)
        elif edit == "add":
            members[draw(st.sampled_from(["kernels/x.so", "../evil", "extra.json",
                                          "kernels/"]))] = draw(st.binary(max_size=32))
        elif edit == "manifest" and "manifest.json" in members:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                members["manifest.json"] = _edit_manifest(draw, members["manifest.json"])
    # A kernel library's machine code changed under recomputed checksums is not damage but
    # tampering, which no load can tell from a kernel (plans carry trusted native code):
    # such a plan keeps its checksums, which catch it. A library cut short or replaced is
    # rechecksummed like any member (`wpk.core.shared_object` catches it).
    if draw(st.integers(0, 2)) > 0 and not code_altered:
        members = rechecksum(members)
    return Blob(archive_of(members))
