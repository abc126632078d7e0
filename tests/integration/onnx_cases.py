"""ONNX's own backend test cases, loaded without downloads, and why wpk may not run one.

Three sources, as `OnnxCase`s (model, list of (inputs, expected outputs), tolerances):

- node cases: `onnx.backend.test.case.node.collect_testcases(None)` (~1,900);
- model folders in the onnx wheel: `onnx/backend/test/data/{pytorch-converted,
  pytorch-operator,simple}/<test>/model.onnx` with `test_data_set_*/{input,output}_*.pb`;
- the nine `light` CNNs, fed the way ONNX's runner feeds them
  (`arange(n).reshape(shape) / n`), against the stored `light_<name>_output_0.pb`.

`skip_reason(model, data_sets)` says why no wpk plan can take a case (a
sequence/optional/map type, strings, training mode, empty tensors, ...);
`unsupported_ops` lists the ops of a model outside wpk's claimed set.
"""

from __future__ import annotations

import collections
import glob
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

import numpy as np
import onnx
from onnx import numpy_helper

DATA_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODEL_FOLDERS = ("pytorch-converted", "pytorch-operator", "simple")
# Tolerances of ONNX's runner (onnx/backend/test/case/model/__init__.py for `light`).
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7
LIGHT_RTOL = {"densenet121": 2e-3}
_STRING_TYPES = (onnx.TensorProto.STRING,)


@dataclass
class OnnxCase:
    """One backend test case; `load()` gives the model and its data sets when needed."""

    name: str
    kind: str          # "node", "model-folder" or "light"
    load: Callable[[], tuple[onnx.ModelProto, list[tuple[list, list]]]]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


@cache
def _node_testcases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow warnings of the Cast case generators
        return tuple(collect_testcases(None))


def node_cases() -> list[OnnxCase]:
    """The ONNX node conformance cases (models built in memory, no downloads)."""
    cases = []
    for case in _node_testcases():
        if case.model is None or case.data_sets is None:
            continue

        def load(case=case):
            data = [(list(map(_to_array, ins)), list(map(_to_array, outs)))
                    for ins, outs in case.data_sets]
            return case.model, data
        cases.append(OnnxCase(case.name, "node", load, case.rtol, case.atol))
    return cases


def _to_array(value):
    """TensorProtos and numpy scalars (0-d tensors in the node cases) as arrays."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def folder_cases() -> list[OnnxCase]:
    """The model folders shipped in the onnx wheel (`pytorch-converted`, ... `simple`)."""
    cases = []
    for folder in MODEL_FOLDERS:
        for model_dir in sorted(glob.glob(os.path.join(DATA_DIR, folder, "*"))):
            if os.path.isfile(os.path.join(model_dir, "model.onnx")):
                name = f"{folder}/{os.path.basename(model_dir)}"
                cases.append(OnnxCase(name, "model-folder",
                                      lambda d=model_dir: _load_folder(d)))
    return cases


def _load_folder(model_dir: str) -> tuple[onnx.ModelProto, list[tuple[list, list]]]:
    model = onnx.load(os.path.join(model_dir, "model.onnx"))
    inputs_by_index = _real_inputs(model)
    data_sets = []
    for data_dir in sorted(glob.glob(os.path.join(model_dir, "test_data_set_*"))):
        n_in = len(glob.glob(os.path.join(data_dir, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(data_dir, "output_*.pb")))
        ins = [_load_pb(os.path.join(data_dir, f"input_{i}.pb"), inputs_by_index[i].type)
               for i in range(n_in)]
        outs = [_load_pb(os.path.join(data_dir, f"output_{i}.pb"), model.graph.output[i].type)
                for i in range(n_out)]
        data_sets.append((ins, outs))
    return model, data_sets


def _load_pb(path: str, type_proto: onnx.TypeProto):
    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("sequence_type"):
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(content)
        return numpy_helper.to_list(sequence)
    if type_proto.HasField("optional_type"):
        optional = onnx.OptionalProto()
        optional.ParseFromString(content)
        return numpy_helper.to_optional(optional)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(content)
    return numpy_helper.to_array(tensor)


def light_cases() -> list[OnnxCase]:
    """The nine `light` CNNs with ONNX's deterministic dummy input and stored outputs."""
    cases = []
    for path in sorted(glob.glob(os.path.join(DATA_DIR, "light", "light_*.onnx"))):
        arch = os.path.basename(path)[len("light_"):-len(".onnx")]
        cases.append(OnnxCase(f"light/{arch}", "light", lambda p=path: _load_light(p),
                              LIGHT_RTOL.get(arch, DEFAULT_RTOL)))
    return cases


def _load_light(path: str) -> tuple[onnx.ModelProto, list[tuple[list, list]]]:
    model = onnx.load(path)
    inputs = []
    for value in _real_inputs(model):
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                      for d in value.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
    logits = _undetermined_softmax_logits(model, inputs)
    if logits is not None:
        return logits
    outputs = []
    for i in range(len(model.graph.output)):
        tensor = onnx.TensorProto()
        with open(f"{path[:-len('.onnx')]}_output_{i}.pb", "rb") as f:
            tensor.ParseFromString(f.read())
        outputs.append(numpy_helper.to_array(tensor))
    return model, [(inputs, outputs)]


# A softmax of logits z is fixed by float32 arithmetic only while the rounding error of z,
# about |z| * eps, is far below 1.
SOFTMAX_DETERMINED = 1e-3


def _undetermined_softmax_logits(model: onnx.ModelProto, inputs: list):
    """The light models carry constant weights, so every logit is equal and the stored
    output is a uniform softmax. Where the logits are so large that float32 rounding
    (|z| * eps) exceeds `SOFTMAX_DETERMINED` (AlexNet's are 3.6e12), that softmax is
    not determined by float32 arithmetic: any other summation order across output
    columns (a BLAS kernel's, say) flips it. For such a model the case checks the
    logits instead: the model without its final Softmax, against onnxruntime's logits
    on the same input. None when the softmax is determined (the stored output holds)."""
    import onnxruntime as ort

    last = model.graph.node[-1]
    if last.op_type != "Softmax" or len(model.graph.output) != 1:
        return None
    truncated = onnx.ModelProto()
    truncated.CopyFrom(model)
    del truncated.graph.node[-1]
    del truncated.graph.output[:]
    truncated.graph.output.append(onnx.helper.make_tensor_value_info(
        last.input[0], onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(truncated.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [value.name for value in _real_inputs(model)]
    (logits,) = session.run(None, dict(zip(names, inputs)))
    if np.abs(logits).max() * np.finfo(np.float32).eps <= SOFTMAX_DETERMINED:
        return None
    del truncated.graph.output[:]
    truncated.graph.output.append(onnx.helper.make_tensor_value_info(
        last.input[0], onnx.TensorProto.FLOAT, list(logits.shape)))
    return truncated, [(inputs, [logits])]


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    weights = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


# Why a case cannot run ---------------------------------------------------------------------


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph, including the nodes of its subgraphs (If, Loop, Scan)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_nodes(sub)


def op_label(node: onnx.NodeProto) -> str:
    """`Op` for the default domain, `domain.Op` otherwise."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _type_problem(type_proto: onnx.TypeProto) -> str | None:
    which = type_proto.WhichOneof("value")
    if which != "tensor_type":
        return f"{(which or 'unknown').replace('_type', '')} type"
    if type_proto.tensor_type.elem_type in _STRING_TYPES:
        return "string dtype"
    return None


def unsupported_ops(model: onnx.ModelProto,
                    is_supported: Callable[[onnx.NodeProto], bool]) -> list[str]:
    """Sorted labels of the ops in the model (subgraphs included) that wpk does not claim."""
    return sorted({op_label(n) for n in iter_nodes(model.graph) if not is_supported(n)})


def skip_reason(model: onnx.ModelProto, data_sets: list[tuple[list, list]]) -> str | None:
    """Why no plan can take this case whatever its ops (types, training mode, ...), or None."""
    if model.functions:
        return "model-local functions"
    for value in list(_real_inputs(model)) + list(model.graph.output):
        problem = _type_problem(value.type)
        if problem:
            return problem
    for node in iter_nodes(model.graph):
        if any(a.name == "training_mode" and a.i for a in node.attribute):
            return "training mode"
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            return "training mode"
    for inputs, _ in data_sets:
        for value in inputs:
            if not isinstance(value, np.ndarray):
                return "non-tensor input"
            if value.dtype == object or value.dtype.kind in "US":
                return "string dtype"
            if value.size == 0:
                return "zero-size tensor input"
    return None


# What a pytest-xdist worker hands the controller: its cases' outcomes (JSON).
SUMMARY_KEY = "onnx_backend_outcomes"


def _category(reason: str) -> str:
    if reason.startswith("unsupported op"):
        return "unsupported op"
    if reason.startswith("unsupported workload"):
        return "unsupported workload (" + reason.split(": ", 1)[-1] + ")"
    return reason


def summary_lines(outcomes: dict[str, list], fallback_seconds: float) -> list[str]:
    """The counts of `outcomes` (case key -> (outcome, reason, seconds, fallback outcome))."""
    by_kind = collections.defaultdict(collections.Counter)
    skips, fallback, fallback_errors = (collections.Counter(), collections.Counter(),
                                        collections.Counter())
    seconds = 0.0
    for name, (outcome, reason, elapsed, fallback_outcome) in outcomes.items():
        by_kind[name.split("::")[0]][outcome] += 1
        seconds += elapsed
        if outcome == "skipped":
            skips[_category(reason)] += 1
        if fallback_outcome:
            fallback[fallback_outcome.split(" ")[0]] += 1
            if fallback_outcome != "passed":
                fallback_errors[fallback_outcome.split(" ", 1)[-1].strip("()")] += 1
    total = collections.Counter()
    for counts in by_kind.values():
        total.update(counts)
    lines = [f"onnx backend: {total['passed']} passed, {total['failed']} failed, "
             f"{total['skipped']} skipped of {sum(total.values())} cases "
             f"({seconds:.1f} s in cases)"]
    for kind, counts in sorted(by_kind.items()):
        lines.append(f"  {kind}: {counts['passed']} passed, {counts['failed']} failed, "
                     f"{counts['skipped']} skipped")
    lines.append("  skipped by reason: " + ", ".join(
        f"{reason}: {count}" for reason, count in skips.most_common()))
    if fallback:
        lines.append(f"  unclaimed cases run anyway through the fallbacks (onnxruntime, "
                     f"onnx.reference): "
                     f"{fallback['passed']} passed, {fallback['failed']} failed "
                     f"({fallback_seconds:.1f} s of the time in cases); failures by error: "
                     + ", ".join(f"{e}: {n}" for e, n in fallback_errors.most_common()))
    return lines
