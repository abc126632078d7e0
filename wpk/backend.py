"""ONNX backend API (`onnx.backend.base.Backend`) on top of wpk, so ONNX's own tests drive it.

    import wpk.backend as backend
    rep = backend.prepare(model, device="CPU")     # -> WpkBackendRep
    outputs = rep.run([x])                         # tuple, also indexable by output name

wpk plans are built for static shapes, while ONNX backend models may leave
dims symbolic and pass shape-defining tensors (Reshape's shape, Slice's
starts, Resize's sizes, ...) as graph inputs. So the backend specializes: a
plan is built for the concrete input shapes of a run, and graph inputs that
only define shapes are folded into the model as constants with the values
of that run. Each specialization is cached on the rep; a later run with
other shapes or other shape values builds (and caches) another plan.
Models whose inputs are all static and not shape-defining are built at
`prepare` time, as with any other backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import wpk
from wpk.core.errors import DeviceError, InputError, ModelError, UnsupportedError
from wpk.frontend import MIN_OPSET
from wpk.runtime import Session, with_tail

# Node inputs (by position) whose values determine output shapes; a graph
# input that feeds one of these is folded into a constant per run.
SHAPE_DEFINING_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Range": (0, 1, 2), "TopK": (1,),
    "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,), "Resize": (1, 2, 3),
    "Upsample": (1,), "OneHot": (1,), "CenterCropPad": (1, 2), "Col2Im": (1, 2, 3),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "CumSum": (1,),
    "BlackmanWindow": (0,), "HannWindow": (0,), "HammingWindow": (0,),
    "MelWeightMatrix": (0, 1, 2), "DFT": (1, 2), "STFT": (1, 3), "Trilu": (1,),
    "CumProd": (1,), "AffineGrid": (1,), "Loop": (0, 1),
}
# Ops whose output depends on the shape of their input only, not on its values.
_SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})
# Options that ONNX's test runner passes to `prepare` and that are not build options.
_HARNESS_OPTIONS = ("rtol", "atol")


def _target_of(device: str) -> str:
    kind = Device(device).type
    if kind == DeviceType.CPU:
        return "cpu"
    if kind == DeviceType.CUDA:
        return "cuda"
    raise DeviceError(f"unknown backend device '{device}'", hint="use 'CPU' or 'CUDA'")


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    constants = {t.name for t in model.graph.initializer}
    constants |= {t.values.name for t in model.graph.sparse_initializer}
    return [i for i in model.graph.input if i.name not in constants]


def _shape_defining(model: onnx.ModelProto, names: set[str]) -> set[str]:
    """Names among `names` whose values reach a shape-defining input of a top-level node,
    directly or through other nodes (a window size cast, then fed to Range), but not
    through Shape or Size (which read the shape only)."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    pending = [node.input[index] for node in model.graph.node
               if node.domain in ("", "ai.onnx")
               for index in SHAPE_DEFINING_INPUTS.get(node.op_type, ())
               if index < len(node.input) and node.input[index]]
    found, seen = set(), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in names:
            found.add(name)
            continue
        node = producers.get(name)
        if node is not None and node.op_type not in _SHAPE_ONLY_OPS:
            pending.extend(i for i in node.input if i)
    return found


def _is_static(value: onnx.ValueInfoProto) -> bool:
    if not value.type.HasField("tensor_type"):
        return False
    tensor = value.type.tensor_type
    return tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim)


class WpkBackendRep(BackendRep):
    """A prepared model: one wpk plan per (input shapes, shape-defining values) seen so far."""

    def __init__(self, model: onnx.ModelProto, target: str, options: Mapping[str, Any],
                 lazy: bool = False):
        self.model = model
        self.target = target
        self.options = dict(options)
        self.input_names = [i.name for i in _real_inputs(model)]
        self.output_names = [o.name for o in model.graph.output]
        self.folded_inputs = _shape_defining(model, set(self.input_names))
        self._sessions: dict[tuple, Any] = {}
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        declared = {i.name: i for i in _real_inputs(model)}
        if (not lazy and not self.folded_inputs
                and all(_is_static(declared[n]) for n in self.input_names)):
            shapes = {n: tuple(d.dim_value for d in declared[n].type.tensor_type.shape.dim)
                      for n in self.input_names}
            self._session_for(shapes, {})

    @property
    def plans(self) -> list:
        """The plans built so far (one per specialization), in build order."""
        return [session.plan for session in self._sessions.values()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on `inputs` (a list in graph-input order, a dict by name, or one array)."""
        feeds = self._feeds(inputs)
        session = self._session_for(*self._specialization(feeds))
        runtime_feeds = {n: feeds[n] for n in self.input_names if n not in self.folded_inputs}
        results = session.run(runtime_feeds)
        return self._outputs_type(*(results[name] for name in self.output_names))

    def specialized_model(self, inputs: Any) -> onnx.ModelProto:
        """The model a plan is built from for these inputs (shapes fixed, shape inputs folded)."""
        return self._specialize(*self._specialization(self._feeds(inputs)))

    def _specialization(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
        shapes = {n: feeds[n].shape for n in self.input_names if n not in self.folded_inputs}
        folded = {n: feeds[n] for n in self.folded_inputs}
        return shapes, folded

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif isinstance(inputs, np.ndarray):
            feeds = dict(zip(self.input_names, [inputs]))
        elif isinstance(inputs, Sequence):
            if len(inputs) != len(self.input_names):
                raise InputError(f"the model takes {len(self.input_names)} inputs "
                                 f"({', '.join(self.input_names)}), got {len(inputs)}",
                                 hint="pass one array per graph input, in graph order")
            feeds = dict(zip(self.input_names, inputs))
        else:
            raise InputError(f"cannot use a {type(inputs).__name__} as backend inputs",
                             hint="pass a list of numpy arrays or a dict name -> array")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing model inputs: {', '.join(missing)}",
                             hint=f"the model inputs are {', '.join(self.input_names)}")
        return {n: np.asarray(feeds[n]) for n in self.input_names}

    def _session_for(self, shapes: Mapping[str, tuple[int, ...]],
                     folded: Mapping[str, np.ndarray]):
        key = (tuple(sorted((n, tuple(s)) for n, s in shapes.items())),
               tuple(sorted((n, v.dtype.str, v.shape, v.tobytes()) for n, v in folded.items())))
        session = self._sessions.get(key)
        if session is None:
            session = self._build(self._specialize(shapes, folded), shapes)
            self._sessions[key] = session
        return session

    def _specialize(self, shapes: Mapping[str, tuple[int, ...]],
                    folded: Mapping[str, np.ndarray]) -> onnx.ModelProto:
        """A copy of the model with fixed input shapes and shape-defining inputs as constants."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        kept = [i for i in graph.input if i.name not in folded]
        for value in kept:
            if value.name in shapes and value.type.HasField("tensor_type"):
                tensor = value.type.tensor_type
                tensor.ClearField("shape")
                tensor.shape.SetInParent()
                for dim in shapes[value.name]:
                    tensor.shape.dim.add().dim_value = int(dim)
        del graph.input[:]
        graph.input.extend(kept)
        for name, value in folded.items():
            graph.initializer.append(numpy_helper.from_array(value, name))
        if model.ir_version < 4:
            # Initializers must be graph inputs before IR 4; keep the folded ones listed.
            graph.input.extend(helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in folded.items())
        return model

    def _build(self, model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]):
        """Build a plan in memory and load it into a runtime session (no file written).

        The run's shapes are also given as `input_shapes`: a declared dim of 0 (an empty
        tensor) reads as an exporter's "dynamic" placeholder otherwise.
        """
        options = {"input_shapes": {n: tuple(s) for n, s in shapes.items()},
                   "native_libraries": False,   # the plan stays in this process
                   **self.options}
        plan = wpk.build(model, target=self.target, **options)
        return with_tail(Session(plan, f"<backend plan {len(self._sessions)} of "
                                       f"{model.graph.name}>"))


class WpkBackend(Backend):
    """wpk as an ONNX backend: `prepare` builds a plan, `WpkBackendRep.run` executes it."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether every graph input is a tensor (wpk plans take tensors only)."""
        return cls.supports_device(device) and all(
            i.type.HasField("tensor_type") for i in _real_inputs(model))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU always; CUDA when a GPU is visible to wpk."""
        try:
            target = _target_of(device)
        except (DeviceError, AttributeError, ValueError):
            return False
        if target == "cpu":
            return True
        try:
            import cupy

            return cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:  # noqa: BLE001 - no cupy, no driver or no device
            return False

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", lazy: bool = False,
                **kwargs: Any) -> WpkBackendRep:
        """Validate the model and return a rep; builds now when nothing depends on run inputs.

        `model` is a ModelProto, the bytes of one or a path. Models older than
        the frontend's minimum opset are converted with onnx.version_converter.
        With `lazy`, every build waits for the first `run`. Keyword arguments
        other than the test runner's `rtol`/`atol` are passed to `wpk.build`.
        """
        proto = _upgrade_opset(_as_model(model))
        try:
            onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as exc:
            raise ModelError(f"the model fails the ONNX checker: {str(exc).splitlines()[0]}",
                             hint="fix the model (onnx.checker.check_model shows where)") from exc
        options = {"progress": False}
        options.update((k, v) for k, v in kwargs.items() if k not in _HARNESS_OPTIONS)
        return WpkBackendRep(proto, _target_of(device), options, lazy=lazy)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        """Prepare and run once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run a single node on `inputs` (list in node-input order, or dict by name)."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        names = [n for n in node.input if n]
        arrays = [inputs[n] for n in names] if isinstance(inputs, Mapping) else list(inputs)
        graph_inputs = [helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape)
            for name, a in zip(names, arrays)]
        if outputs_info is not None:
            graph_outputs = [helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
                for name, (dtype, shape) in zip(node.output, outputs_info)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
        if outputs_info is None:
            model = onnx.shape_inference.infer_shapes(model)
            del model.graph.output[:]
            known = {v.name: v for v in model.graph.value_info}
            model.graph.output.extend(known.get(n) or helper.make_empty_tensor_value_info(n)
                                      for n in node.output if n)
        return cls.prepare(model, device, **kwargs).run(dict(zip(names, arrays)))


def _upgrade_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert a model below the frontend's minimum default-domain opset up to it."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= MIN_OPSET:
        return model
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        raise UnsupportedError(
            f"the model uses ONNX opset {opset} and cannot be converted to opset {MIN_OPSET}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            hint="convert it with onnx.version_converter to a newer opset") from exc


def _as_model(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return onnx.load(os.fspath(model))
    raise ModelError(f"cannot read an ONNX model from {model!r:.80}",
                     hint="pass an onnx.ModelProto, the bytes of an .onnx file or its path")


is_compatible = WpkBackend.is_compatible
prepare = WpkBackend.prepare
run = WpkBackend.run_model
run_model = WpkBackend.run_model
run_node = WpkBackend.run_node
supports_device = WpkBackend.supports_device
