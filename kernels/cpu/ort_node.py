"""onnxruntime single-node kernels: the CPU vendor baseline and the fallback for every op.

Each prepared kernel owns one `InferenceSession` holding the node and its
epilogue (as standard ONNX nodes), with constant inputs baked in as
initializers so onnxruntime can pre-pack weights. Two implementations are
registered:

- `ort` (kind `vendor`) for workloads wpk supports itself (`wpk.kernels.support`),
- `ort.fallback` (kind `fallback`) for every other op, so reports can mark
  the parts of a model that wpk only runs through onnxruntime.

`kind_for(workload)` tells which of the two applies. Calls bind the caller's
arrays by pointer (IOBinding) so outputs are written in place; small outputs
go through `run` and one copy, which is cheaper below a few kilobytes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as ort_capi

from wpk.core.errors import UnsupportedError
from wpk.core.workload import Workload
from wpk.kernels.cpu.node_model import (
    OnnxPart,
    build_node_model,
    check_buildable,
    input_name,
    node_part,
    output_name,
)
from wpk.kernels.epilogue import validate_epilogue
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.registry import FALLBACK, VENDOR, Implementation, Kernel, register
from wpk.kernels.support import is_supported

_THREADS: int | None = None
# Outputs up to this many bytes are returned by `run` and copied; bigger ones are bound.
_SMALL_OUTPUT_BYTES = 16384
# Constants this big are handed to a session as external initializers, not copied into
# its model (`build_node_model`).
EXTERNAL_MIN_BYTES = 1 << 20
_CPU = ort_capi.OrtDevice(ort_capi.OrtDevice.cpu(), ort_capi.OrtDevice.default_memory(), 0)


def cpu_threads() -> int:
    """Intra-op threads for every onnxruntime session (default: the cores this process may use)."""
    if _THREADS is not None:
        return _THREADS
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def set_cpu_threads(threads: int | None) -> None:
    """Set the intra-op thread count of sessions created from now on (None: back to default)."""
    global _THREADS
    if threads is not None and threads < 1:
        raise UnsupportedError(f"thread count must be at least 1, got {threads}",
                               hint="pass a positive number of threads, or None for all cores")
    _THREADS = threads


_OPTIMIZATION_LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
# Ops that onnxruntime's NCHWc layout transformer rewrites (with reorders around each session).
_NCHWC_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})


def session_options(threads: int | None = None, optimization: str = "all",
                    spin_during_run: bool = False) -> ort.SessionOptions:
    """Options shared by all wpk sessions: full graph optimization, no spinning threads.

    `optimization` "extended" stops before the layout transformations (NCHWc),
    which in a one-node session cost a reorder in and out around the node.
    `spin_during_run`: the intra-op threads spin between the session's nodes (no
    wake-up per node) and stop spinning when the run returns, so nothing is left
    burning a core for the next step or program (for sessions of many nodes).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = _OPTIMIZATION_LEVELS[optimization]
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads or cpu_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if spin_during_run else "0")
    if spin_during_run:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 4  # failures surface as exceptions
    return options


def create_session(model_bytes: bytes, label: str, threads: int | None = None,
                   optimization: str = "all", external: Mapping[str, np.ndarray] | None = None
                   ) -> ort.InferenceSession:
    """An onnxruntime CPU session for a serialized model; UnsupportedError if ORT refuses it.
    `external`: the data of the model's external initializers, by name (C-contiguous
    arrays, kept alive as long as the session: onnxruntime may read them in place)."""
    options = session_options(threads, optimization)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in (external or {}).values()]
    if values:
        options.add_external_initializers(list(external), values)
    try:
        session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        session.wpk_external_initializers = (external, values)   # alive with the session
        return session
    except Exception as exc:  # onnxruntime raises its own untyped errors
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedError(f"{label}: onnxruntime cannot run it: {first_line}",
                               hint="the op, its attributes or its dtypes are not supported "
                                    "by onnxruntime's CPU provider") from exc


def kind_for(workload: Workload) -> str:
    """`vendor` when wpk supports the workload's op itself, else `fallback`."""
    return VENDOR if is_supported(workload) else FALLBACK


def static_consts(workload: Workload) -> dict[int, np.ndarray]:
    """The fixed values of the static inputs (shapes, indices, scales), as arrays."""
    return {i: np.asarray(v, dtype=workload.inputs[i].dtype).reshape(workload.inputs[i].shape)
            for i, v in workload.static_inputs if workload.inputs[i] is not None}


def make_ort_kernel(workload: Workload, consts: Mapping[int, np.ndarray],
                    threads: int | None = None, optimization: str = "all") -> Kernel:
    """Prepare a kernel running the workload (with epilogue) in one onnxruntime session."""
    node_model = build_node_model(workload, {**static_consts(workload), **consts},
                                  external_min_bytes=EXTERNAL_MIN_BYTES)
    session = create_session(node_model.model.SerializeToString(), workload.label, threads,
                             optimization, node_model.external)
    feeds = [(i, input_name(i)) for i in node_model.feeds]
    return session_kernel(session, workload, feeds)


def session_kernel(session: ort.InferenceSession, workload: Workload,
                   feeds: list[tuple[int, str]]) -> Kernel:
    """A kernel running `session` (inputs `feeds`: (workload input index, graph input name);
    outputs `out0`...): small outputs are returned and copied, bigger ones bound in place."""
    out_names = [output_name(j) for j in range(len(workload.outputs))]
    small = sum(np.dtype(s.dtype).itemsize * s.size for s in workload.outputs)
    if small <= _SMALL_OUTPUT_BYTES:
        return _run_kernel(session, feeds, out_names)
    return _binding_kernel(session, feeds, out_names)


def _run_kernel(session: ort.InferenceSession, feeds: list[tuple[int, str]],
                out_names: list[str]) -> Kernel:
    run = session._sess.run
    options = ort.RunOptions()

    def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
        results = run(out_names, {name: inputs[i] for i, name in feeds}, options)
        for out, value in zip(outputs, results):
            np.copyto(out, value)

    return kernel


def _binding_kernel(session: ort.InferenceSession, feeds: list[tuple[int, str]],
                    out_names: list[str]) -> Kernel:
    """Bind the caller's buffers by address; rebind only when an address changes.

    Only integer addresses are remembered between calls (no references): a
    buffer at the same address is the same memory, so the binding stays valid.
    """
    binding = session.io_binding()._iobinding
    bind_input, bind_output = binding.bind_input, binding.bind_output
    run = session._sess.run_with_iobinding
    options = ort.RunOptions()
    outs = list(enumerate(out_names))
    bound: list[tuple[int, ...]] = [()]

    def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
        arrays = []
        for i, _ in feeds:
            x = inputs[i]
            arrays.append(x if x.flags.c_contiguous else np.ascontiguousarray(x))
        addresses = tuple(a.ctypes.data for a in arrays) + tuple(
            outputs[j].ctypes.data for j, _ in outs)
        if addresses != bound[0]:
            for x, (_, name) in zip(arrays, feeds):
                bind_input(name, _CPU, x.dtype, x.shape, x.ctypes.data)
            for j, name in outs:
                y = outputs[j]
                bind_output(name, _CPU, y.dtype, y.shape, y.ctypes.data)
            bound[0] = addresses
        run(binding, options)  # `arrays` keeps contiguous copies alive until here

    return kernel


class OrtNode(Implementation):
    """onnxruntime runs the node and its epilogue; constants are initializers."""

    name = "ort"
    onnxruntime = True
    uses_blas = False
    kind = VENDOR
    fallback = False
    joins_regions = True

    def __init__(self):
        self._probe_cache: dict[str, str | None] = {}

    def unsupported_reason(self, workload: Workload) -> str | None:
        if is_supported(workload) == self.fallback:
            return ("wpk supports this op: use 'ort'" if self.fallback
                    else "not an op wpk supports: see 'ort.fallback'")
        reason = check_buildable(workload) or validate_epilogue(workload.epilogue,
                                                                len(workload.inputs))
        if reason:
            return reason
        return self._probe(workload)

    def _probe(self, workload: Workload) -> str | None:
        """Whether onnxruntime runs the node (built and run once per workload, then cached)."""
        key = workload.key
        if key not in self._probe_cache:
            try:
                model = build_node_model(workload, static_consts(workload))
                session = create_session(model.model.SerializeToString(), workload.label,
                                         threads=1)
                inputs = random_inputs(workload, np.random.default_rng(0))
                session.run(None, {input_name(i): inputs[i] for i in model.feeds})
                self._probe_cache[key] = None
            except UnsupportedError as exc:
                self._probe_cache[key] = exc.message
            except Exception as exc:  # an attribute onnx rejects, or ORT failing at run time
                text = str(exc).strip().splitlines()
                self._probe_cache[key] = f"onnxruntime fails on it: {text[0] if text else exc}"
        return self._probe_cache[key]

    def configs(self, workload: Workload) -> list[dict]:
        """Full optimization, plus plain NCHW (no layout reorders) for NCHWc-able ops."""
        if workload.op in _NCHWC_OPS and workload.domain in ("", "ai.onnx"):
            return [{}, {"optimization": "extended"}]
        return [{}]

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        optimization = config.get("optimization", "all")
        if optimization not in _OPTIMIZATION_LEVELS:
            raise UnsupportedError(f"unknown onnxruntime optimization level {optimization!r}",
                                   hint=f"use one of {sorted(_OPTIMIZATION_LEVELS)}")
        return make_ort_kernel(workload, consts, config.get("threads"), optimization)


    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        return node_part(workload, {**static_consts(workload), **consts})


class OrtFallback(OrtNode):
    """The same onnxruntime kernel, for ops wpk has no implementation of."""

    name = "ort.fallback"
    kind = FALLBACK
    fallback = True


ORT_NODE = register(OrtNode())
ORT_FALLBACK = register(OrtFallback())
