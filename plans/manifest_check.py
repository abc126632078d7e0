"""The fields of a plan's manifest, checked before anything uses them: a manifest that was
edited and checksummed again (or written by a buggy tool) is a `PlanError` naming the field,
never a KeyError or a crash of the runtime.

    check_manifest(manifest, "model.wpk")    # PlanError, or None

Two stages: the JSON schema (`MANIFEST_SCHEMA`, JSON Schema draft 7: every field's presence
and type, down to the dims of each tensor), then what a schema cannot say: dtypes
numpy knows, steps whose workload exists and whose inputs are produced before they are
read with the shapes their workloads expect, buffers inside the arena and large enough for
their tensors.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping

import fastjsonschema
import numpy as np

from wpk.core.code_cache import cached_code
from wpk.core.errors import PlanError
from wpk.core.op_checks import op_problem
from wpk.core.workload import Workload
from wpk.dsl import toolchain

REBUILD_HINT = "rebuild the plan with `wpk build`"
MAX_DIM = 2**62
_NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex

_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_DIM}
_DIMS = {"type": "array", "items": _COUNT}
_SPEC = {"type": "object", "required": ["shape", "dtype"],
         "properties": {"shape": _DIMS, "dtype": _STRING}}
_TENSOR = {"type": "object", "required": ["name", "shape", "dtype"],
           "properties": {"name": _STRING, "shape": _DIMS, "dtype": _STRING}}
_STEP = {"type": "object", "required": ["node", "op", "workload_key", "impl", "inputs", "outputs"],
         "properties": {"node": _STRING, "op": _STRING, "workload_key": _STRING,
                        "impl": _STRING, "config": {"type": "object"}, "kind": _STRING,
                        "inputs": _STRINGS, "outputs": _STRINGS, "artifacts": _STRINGS}}
_EPILOGUE = {"type": "object", "required": ["op"],
             "properties": {"op": _STRING, "attrs": {"type": "object"},
                            "operand": {"type": ["integer", "null"], "minimum": 0},
                            "swap": {"type": "boolean"}}}
_WORKLOAD = {"type": "object", "required": ["op", "inputs", "outputs"],
             "properties": {"op": _STRING, "domain": _STRING,
                            "opset": {"type": "integer", "minimum": 1},
                            "inputs": {"type": "array",
                                       "items": {"anyOf": [_SPEC, {"type": "null"}]}},
                            "outputs": {"type": "array", "items": _SPEC},
                            "attrs": {"type": "object"},
                            "epilogue": {"type": "array", "items": _EPILOGUE},
                            "const_inputs": {"type": "array", "items": _COUNT},
                            "static_inputs": {"type": "array",
                                              "items": {"type": "array", "minItems": 2,
                                                        "maxItems": 2,
                                                        "items": [_COUNT]}}}}
_BUFFERS = {"type": "object", "required": ["buffers", "tensors", "no_reuse_bytes"],
            "properties": {"alignment": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
                           "buffers": {"type": "array",
                                       "items": {"type": "object",
                                                 "required": ["offset", "nbytes"],
                                                 "properties": {"offset": _COUNT,
                                                                "nbytes": _COUNT}}},
                           "tensors": {"type": "array",
                                       "items": {"type": "object",
                                                 "required": ["name", "buffer"],
                                                 "properties": {"name": _STRING,
                                                                "buffer": _COUNT,
                                                                "offset": _COUNT}}},
                           "arena_bytes": _COUNT, "no_reuse_bytes": _COUNT}}
# A value-dependent tail (`wpk.value_tail`): dims that depend on values are null.
_TAIL_TENSOR = {"type": "object", "required": ["name", "shape", "dtype"],
                "properties": {"name": _STRING, "dtype": _STRING,
                               "shape": {"type": "array",
                                         "items": {"anyOf": [_COUNT, {"type": "null"}]}}}}
_TAIL = {"type": "object", "required": ["model", "reads", "outputs", "graph_outputs"],
         "properties": {"model": _STRING, "reads": _STRINGS,
                        "outputs": {"type": "array", "items": _TAIL_TENSOR, "minItems": 1},
                        "graph_outputs": {"type": "array", "items": _TAIL_TENSOR,
                                          "minItems": 1}}}
MANIFEST_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["target", "steps", "workloads", "buffers", "inputs", "outputs", "members"],
    "properties": {
        "format_version": {"type": "integer", "minimum": 1},
        "wpk_version": _STRING, "target": _STRING, "graph": _STRING,
        "device": {"type": "object"},
        "requires": {"type": "object",
                     "properties": {"isa": _STRINGS, "machine": {"type": ["string", "null"]}}},
        "steps": {"type": "array", "items": _STEP},
        "workloads": {"type": "object", "additionalProperties": _WORKLOAD},
        "buffers": _BUFFERS,
        "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "constants": {"type": "array", "items": _TENSOR},
        "members": {"type": "object", "additionalProperties": _STRING},
        "tail": _TAIL,
    },
}


@functools.cache
def _fast_validator():
    """`MANIFEST_SCHEMA` compiled to Python by fastjsonschema: a DenseNet-121 manifest's 247
    steps take 4 ms against jsonschema's 100. Its code is kept compiled under the cache
    root (`schema/`, `wpk.core.code_cache`): generating and compiling it took 37 ms of
    every process that read a plan, reading it back and running it 0.7 ms."""
    key = hashlib.sha256(json.dumps([MANIFEST_SCHEMA, fastjsonschema.VERSION],
                                    sort_keys=True).encode()).hexdigest()[:32]
    code = cached_code(toolchain.cache_root() / "schema", "manifest", key,
                       lambda: fastjsonschema.compile_to_code(MANIFEST_SCHEMA))
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - fastjsonschema's code for our own schema
    return namespace["validate"]


def _schema_error(manifest: Mapping):
    """jsonschema's most relevant error in the manifest, None when it finds none: the
    message shown (imported only for a malformed manifest: 55 ms of imports)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(MANIFEST_SCHEMA)
    return jsonschema.exceptions.best_match(validator.iter_errors(manifest))


def _check_schema(manifest: Mapping, path: str) -> None:
    """A `PlanError` naming the first malformed field: fastjsonschema decides, jsonschema
    (the reference implementation) words the message; should they ever disagree, the
    manifest passes to the checks below, which name what they find themselves."""
    try:
        _fast_validator()(manifest)
        return
    except fastjsonschema.JsonSchemaValueException:
        error = _schema_error(manifest)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the manifest"
        shown = error.message if len(error.message) <= 200 else error.message[:200] + "..."
        raise PlanError(f"plan '{path}': manifest field {where} is malformed: {shown}",
                        hint=REBUILD_HINT)


def _dtype(text: str) -> np.dtype | None:
    """numpy's dtype of `text`, names of ml_dtypes' types (bfloat16, float8_*, int4)
    included; None when it names no type."""
    try:
        return np.dtype(text)
    except (TypeError, ValueError):
        pass
    try:
        import ml_dtypes  # noqa: F401 - registers its type names with numpy
        return np.dtype(text)
    except (ImportError, TypeError, ValueError):
        return None


def _is_numeric(dtype: np.dtype) -> bool:
    return dtype.kind in _NUMERIC_KINDS or dtype.type.__module__.startswith("ml_dtypes")


def _numeric_dtype(text: str, where: str, path: str) -> np.dtype:
    dtype = _dtype(text)
    if dtype is None or not _is_numeric(dtype):
        raise PlanError(f"plan '{path}': {where} has dtype {text!r}, not a numeric type",
                        hint=REBUILD_HINT)
    return dtype


def _nbytes(shape, dtype: np.dtype) -> int:
    return int(np.prod([int(d) for d in shape], dtype=object)) * dtype.itemsize


class _Tensors:
    """Every tensor the plan names, with its shape and dtype once known."""

    def __init__(self, manifest: Mapping, path: str):
        self.path = path
        self.known: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for field in ("inputs", "constants"):
            for entry in manifest.get(field, []):
                dtype = _numeric_dtype(entry["dtype"], f"{field[:-1]} '{entry['name']}'", path)
                self.known[entry["name"]] = (tuple(entry["shape"]), dtype)

    def read(self, name: str, expected, step: str) -> None:
        if name not in self.known:
            raise PlanError(f"plan '{self.path}': step '{step}' reads tensor '{name}', which no "
                            "input, constant or earlier step provides", hint=REBUILD_HINT)
        shape, dtype = self.known[name]
        if expected is not None and (tuple(expected.shape) != shape
                                     or np.dtype(expected.dtype) != dtype):
            raise PlanError(f"plan '{self.path}': step '{step}' reads tensor '{name}' of shape "
                            f"{list(shape)} {dtype.name}, its workload expects "
                            f"{list(expected.shape)} {expected.dtype}", hint=REBUILD_HINT)


def _workloads(manifest: Mapping, path: str) -> dict[str, Workload]:
    workloads = {}
    for key, data in manifest["workloads"].items():
        try:
            workload = Workload.from_json(data)
            for spec in (*workload.inputs, *workload.outputs):
                if spec is not None:
                    _numeric_dtype(spec.dtype, f"workload {key}", path)
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PlanError(f"plan '{path}': workload {key} is malformed "
                            f"({type(exc).__name__}: {exc})", hint=REBUILD_HINT) from None
        workloads[key] = workload
    return workloads


def _check_steps(manifest: Mapping, path: str) -> None:
    tensors = _Tensors(manifest, path)
    workloads = _workloads(manifest, path)
    for step in manifest["steps"]:
        workload = workloads.get(step["workload_key"])
        present = [i < len(step["inputs"]) and step["inputs"][i]
                   for i, spec in enumerate(workload.inputs if workload else ()) if spec]
        if workload is None or len(workload.outputs) != len(step["outputs"]) \
                or not all(present):
            raise PlanError(f"plan '{path}': step '{step['node']}' does not match its workload "
                            f"({step['workload_key']})", hint=REBUILD_HINT)
        if workload.domain == "wpk" and workload.op == "Model" and (
                workload.attr("inputs") != tuple(step["inputs"])
                or workload.attr("outputs") != tuple(step["outputs"])):
            raise PlanError(f"plan '{path}': step '{step['node']}' runs a whole model whose "
                            "inputs or outputs are not the step's", hint=REBUILD_HINT)
        for index, name in enumerate(step["inputs"]):
            if name:  # inputs past the workload's are epilogue operands
                spec = workload.inputs[index] if index < len(workload.inputs) else None
                tensors.read(name, spec, step["node"])
        for name, spec in zip(step["outputs"], workload.outputs):
            tensors.known[name] = (tuple(spec.shape), np.dtype(spec.dtype))
    placed = {entry["name"] for entry in manifest["buffers"]["tensors"]}
    for entry in manifest["inputs"]:
        if entry["name"] not in placed:
            raise PlanError(f"plan '{path}': input '{entry['name']}' has no buffer",
                            hint=REBUILD_HINT)
    for entry in manifest["outputs"]:
        dtype = _numeric_dtype(entry["dtype"], f"output '{entry['name']}'", path)
        known = tensors.known.setdefault(entry["name"], (tuple(entry["shape"]), dtype))
        if known != (tuple(entry["shape"]), dtype):
            raise PlanError(f"plan '{path}': output '{entry['name']}' is declared "
                            f"{list(entry['shape'])} {dtype.name} but computed as "
                            f"{list(known[0])} {known[1].name}", hint=REBUILD_HINT)
    _check_buffers(manifest["buffers"], tensors, path)


def _check_buffers(buffers: Mapping, tensors: _Tensors, path: str) -> None:
    regions = buffers["buffers"]
    alignment = buffers.get("alignment", 1)
    arena = regions[-1]["offset"] + -(-regions[-1]["nbytes"] // alignment) * alignment \
        if regions else 0
    for index, region in enumerate(regions):
        if region["offset"] + region["nbytes"] > arena:
            raise PlanError(f"plan '{path}': buffer {index} lies outside the arena",
                            hint=REBUILD_HINT)
    for entry in buffers["tensors"]:
        name, index = entry["name"], entry["buffer"]
        if index >= len(regions):
            raise PlanError(f"plan '{path}': tensor '{name}' is in buffer {index}, which does "
                            "not exist", hint=REBUILD_HINT)
        if name not in tensors.known:
            raise PlanError(f"plan '{path}': buffer tensor '{name}' is no input, output or "
                            "step output", hint=REBUILD_HINT)
        shape, dtype = tensors.known[name]
        if entry.get("offset", 0) + _nbytes(shape, dtype) > regions[index]["nbytes"]:
            raise PlanError(f"plan '{path}': buffer {index} is too small for tensor '{name}'",
                            hint=REBUILD_HINT)


def _check_op_specs(manifest: Mapping, path: str) -> None:
    for key, data in manifest["workloads"].items():
        problem = op_problem(Workload.from_json(data))
        if problem:
            raise PlanError(f"plan '{path}': workload {key} ({data['op']}): {problem}",
                            hint=REBUILD_HINT)


def _check_tail(manifest: Mapping, path: str) -> None:
    """A tail reads only the plan's inputs and outputs and is in `members`; the model's
    outputs are the plan's or the tail's."""
    tail = manifest.get("tail")
    if tail is None:
        return
    if "kernels/" + tail["model"] not in manifest["members"]:
        raise PlanError(f"plan '{path}': its tail model kernels/{tail['model']} is not a "
                        "member", hint=REBUILD_HINT)
    plan_tensors = {e["name"] for e in (*manifest["inputs"], *manifest["outputs"])}
    unknown = [name for name in tail["reads"] if name not in plan_tensors]
    if unknown:
        raise PlanError(f"plan '{path}': its tail reads '{unknown[0]}', which is neither an "
                        "input nor an output of the plan", hint=REBUILD_HINT)
    computed = {e["name"] for e in (*manifest["outputs"], *tail["outputs"])}
    missing = [e["name"] for e in tail["graph_outputs"] if e["name"] not in computed]
    if missing:
        raise PlanError(f"plan '{path}': output '{missing[0]}' is computed by neither the "
                        "plan nor its tail", hint=REBUILD_HINT)


def check_manifest(manifest: Mapping, path: str) -> None:
    """Raise PlanError naming the first field of `manifest` that is missing, of the wrong
    type, or inconsistent with the others."""
    _check_schema(manifest, path)
    _check_steps(manifest, path)
    _check_op_specs(manifest, path)
    _check_tail(manifest, path)
