"""The GPU runtime: a CUDA plan loaded once, its step list replayed as CUDA graphs.

    session = CudaSession.load("model.wpk")       # or wpk.load / Session.load (dispatches)
    outputs = session.run({"x": x})                # numpy in, numpy out

Loading checks that cupy sees a GPU that can run the plan's binaries
(`binary_choice`: the cubin on the same major architecture, the PTX, JIT
compiled by the driver, on a newer one), uploads the weights once, carves
every intermediate tensor out of one device arena laid out by the plan's
buffer plan (`buffer_layout`), and prepares every step: generated kernels
from their stored cubin/PTX (`wpk.kernels.cuda.generated.load_cubin_kernel`),
cuDNN and cuBLAS steps through their implementations, device copies with
cupy. All steps run once eagerly (module loads, cuDNN plan setup, cupy
kernel compilation), then every run of consecutive device steps is captured
into a CUDA graph on a non-default stream (`segment_steps`; host steps, which
synchronise, stay outside). A run copies the feeds into pinned host buffers
and from there into the arena, replays the graphs, copies the outputs into
pinned host buffers and synchronises once: no allocation, one host sync.

"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.errors import DeviceError, OptionError, PlanError
from wpk.core.workload import TensorSpec
from wpk.kernels.cpu.blas_threads import OneBlasThread
from wpk.kernels.cuda.cupy_support import compute_capability, require_cupy
from wpk.kernels.cuda.generated import load_cubin_kernel
from wpk.plans.planfile import KERNELS, Plan, read_plan
from wpk.runtime import (
    Session,
    TensorMeta,
    bind_step,
    one_run_at_a_time,
    output_index,
    track_run_lock,
)
from wpk.search.measure_cuda import summarize, time_gpu

HOST_KINDS = frozenset({"fallback"})   # steps that copy to the host and synchronise


def binary_choice(plan_arch: str, device_cc: tuple[int, int], has_ptx: bool) -> str:
    """'cubin' when the plan's cubin runs on the device (same major, minor not older),
    'ptx' when only the PTX can be JIT compiled for it (a newer device); DeviceError
    otherwise."""
    digits = plan_arch.removeprefix("sm_").rstrip("a")
    built = (int(digits[:-1]), int(digits[-1]))
    device = tuple(device_cc)
    if device[0] == built[0] and device[1] >= built[1]:
        return "cubin"
    if device > built and has_ptx:
        return "ptx"
    raise DeviceError(f"the plan's kernels are built for {plan_arch}; this GPU is "
                      f"sm_{device[0]}{device[1]}" + ("" if has_ptx else " and the plan holds "
                                                      "no PTX to JIT compile"),
                      hint=f"rebuild the plan with --gpu auto on this machine, or build for "
                           f"sm_{device[0]}{device[1]}")


def buffer_layout(buffer_plan, specs: Mapping[str, TensorSpec],
                  path: str = "<plan>") -> dict[str, tuple[int, int, tuple, str]]:
    """Tensor name -> (arena offset, bytes, shape, dtype) from the plan's buffer plan;
    PlanError when a buffer is smaller than its tensor."""
    layout = {}
    for name, index in buffer_plan.assignment.items():
        spec = specs[name]
        nbytes = spec.size * np.dtype(spec.dtype).itemsize
        within = buffer_plan.tensor_offset(name)
        if within + nbytes > buffer_plan.sizes[index]:
            raise PlanError(f"plan '{path}': buffer of tensor '{name}' is too small",
                            hint="rebuild the plan with `wpk build`")
        layout[name] = (buffer_plan.offsets[index] + within, nbytes, tuple(spec.shape),
                        spec.dtype)
    return layout


def segment_steps(capturable: Sequence[bool]) -> list[tuple[bool, list[int]]]:
    """Consecutive steps grouped: (True, indices) for a run of device steps captured as one
    CUDA graph, (False, [i]) for each host step run eagerly in between."""
    segments: list[tuple[bool, list[int]]] = []
    for index, device in enumerate(capturable):
        if device and segments and segments[-1][0]:
            segments[-1][1].append(index)
        else:
            segments.append((bool(device), [index]))
    return segments


def generated_artifacts(files: Mapping[str, bytes], choice: str) -> bytes:
    """The module image to load: the cubin, or the PTX text NUL-terminated for the JIT."""
    if choice == "cubin":
        return bytes(files["kernel.cubin"])
    return bytes(files["kernel.ptx"]).rstrip(b"\0") + b"\0"


class CudaSession(Session):
    """A loaded CUDA plan (see the module docstring); its runs from several threads take
    turns."""

    target = "cuda"

    def __init__(self, plan: Plan, path: str = "<plan>", cuda_graph: bool = True,
                 spin_threads: bool = False):
        """`spin_threads` has no effect on the GPU (it is the CPU session's option)."""
        if plan.target != self.target:
            raise PlanError(f"plan '{path}' targets {plan.target}, not {self.target}",
                            hint="load it with wpk.load")
        cupy = require_cupy(f"plan '{path}' (target cuda)")
        self.cupy, self.plan, self.path = cupy, plan, path
        track_run_lock(self)
        self.cuda_graph = cuda_graph
        self.device_cc = compute_capability()
        self._inputs = [TensorMeta(e["name"], list(e["shape"]), e["dtype"]) for e in plan.inputs]
        self._outputs = [TensorMeta(e["name"], list(e["shape"]), e["dtype"])
                         for e in plan.outputs]
        self._output_index = output_index(self._outputs)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self._arena, views = self._allocate_device(self._tensor_specs())
            weights = {name: cupy.asarray(np.ascontiguousarray(w))
                       for name, w in plan.weights.items()}
            arrays = {**weights, **views}
            self._weights = weights
            self._calls, self._step_names, kinds = self._prepare_device_steps(arrays)
        self._one_blas_thread = OneBlasThread()  # host steps, as in the CPU runtime
        self._input_views = {m.name: views[m.name] for m in self._inputs}
        missing = [m.name for m in self._outputs if m.name not in arrays]
        if missing:
            raise PlanError(f"plan '{path}': output '{missing[0]}' is produced by no step",
                            hint="rebuild the plan with `wpk build`")
        self._device_outputs = [arrays[m.name] for m in self._outputs]
        self._host_inputs = {m.name: self._pinned(m) for m in self._inputs}
        self._output_sources = [self._pinned(m) for m in self._outputs]
        self.segments = segment_steps([kind not in HOST_KINDS for kind in kinds])
        self._warm_up()
        self.capture_errors: dict[int, str] = {}
        self._graphs = self._capture() if cuda_graph else {}

    @classmethod
    def load(cls, path: str | os.PathLike, cuda_graph: bool = True) -> CudaSession:
        """Read, check and prepare the CUDA plan at `path` on the current GPU."""
        return cls(read_plan(path), os.fspath(path), cuda_graph)

    def __repr__(self) -> str:
        return (f"<CudaSession {self.path}: {len(self._calls)} steps, "
                f"{len(self._graphs)} CUDA graphs ({len(self.capture_errors)} segments eager), "
                f"{self.plan.buffer_plan.arena_bytes} arena bytes>")

    # -- loading ------------------------------------------------------------------

    def _pinned(self, meta: TensorMeta) -> np.ndarray:
        dtype = np.dtype(meta.dtype)
        count = int(np.prod(meta.shape, dtype=np.int64))
        memory = self.cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        return np.frombuffer(memory, dtype, count).reshape(meta.shape)

    def _allocate_device(self, specs: Mapping[str, TensorSpec]):
        cupy = self.cupy
        buffers = self.plan.buffer_plan
        raw = cupy.empty(buffers.arena_bytes + buffers.alignment, cupy.uint8)
        shift = (-raw.data.ptr) % buffers.alignment
        views = {}
        for name, (offset, nbytes, shape, dtype) in buffer_layout(buffers, specs,
                                                                  self.path).items():
            start = shift + offset
            views[name] = raw[start:start + nbytes].view(dtype).reshape(shape)
        return raw, views

    def _prepare_device_steps(self, arrays: Mapping):
        calls, names, kinds = [], [], []
        for step in self.plan.steps:
            impl, workload, inputs, outputs, consts = bind_step(
                self.plan, step, arrays, self._weights, self.path)
            files = {m.split("/")[-1]: self.plan.kernels[m] for m in step.artifacts
                     if m in self.plan.kernels}
            try:
                kernel = self._prepare_one(impl, workload, consts, step.config, files)
            except (DeviceError, PlanError):
                raise
            except Exception as exc:
                raise PlanError(f"plan '{self.path}': node '{step.node}' ({step.impl}) failed "
                                f"to load on the GPU: {exc}",
                                hint="rebuild the plan on this machine") from exc
            calls.append((kernel, inputs, outputs))
            names.append(step.node)
            kinds.append(step.kind)
        return calls, names, kinds

    def _prepare_one(self, impl, workload, consts, config, files: Mapping[str, bytes]):
        if impl.name in ("dsl.cuda", "cuda.fused") and "launch.json" in files:
            launch = json.loads(files["launch.json"])
            choice = binary_choice(launch["arch"], self.device_cc, "kernel.ptx" in files)
            return load_cubin_kernel(generated_artifacts(files, choice), launch)
        if files and hasattr(impl, "prepare_from_artifacts"):
            return impl.prepare_from_artifacts(workload, consts, config, files)
        return impl.prepare(workload, consts, config)

    def _run_steps(self, indices: Sequence[int]) -> None:
        calls = self._calls
        for index in indices:
            kernel, inputs, outputs = calls[index]
            try:
                kernel(inputs, outputs)
            except Exception as exc:
                raise RuntimeError(f"node '{self._step_names[index]}' failed: {exc}") from exc

    def _warm_up(self) -> None:
        with self.stream:
            self._run_steps(range(len(self._calls)))
        self.stream.synchronize()

    def _capture(self) -> dict[int, object]:
        """One CUDA graph per device segment; a segment whose capture fails (a library call
        that cannot be captured) runs eagerly instead, its error kept in `capture_errors`."""
        graphs = {}
        with self.stream:
            for number, (device, indices) in enumerate(self.segments):
                if not device:
                    continue
                try:
                    self.stream.begin_capture()
                    try:
                        self._run_steps(indices)
                    finally:
                        graph = self.stream.end_capture()
                    graph.upload(self.stream)
                    graphs[number] = graph
                except Exception as exc:
                    names = [self._step_names[i] for i in indices]
                    self.capture_errors[number] = f"{names[0]}..{names[-1]}: {exc}"
        self.stream.synchronize()
        return graphs

    # -- running ------------------------------------------------------------------

    def _execute(self, feeds: Mapping) -> None:
        self._enqueue(feeds)
        self.stream.synchronize()

    def _enqueue(self, feeds: Mapping) -> None:
        """Everything of a run but the final synchronisation: feeds into the pinned buffers,
        copies in, graph launches (host steps eagerly), copies out; all asynchronous on
        `stream` unless a host step runs."""
        self._load_feeds(feeds)
        stream = self.stream
        with stream:
            for meta in self._inputs:
                self._input_views[meta.name].set(self._host_inputs[meta.name], stream=stream)
            for number, (_, indices) in enumerate(self.segments):
                graph = self._graphs.get(number)
                if graph is not None:
                    graph.launch(stream)
                else:
                    self._run_steps(indices)
            for source, host in zip(self._device_outputs, self._output_sources):
                source.get(stream=stream, out=host, blocking=False)

    def _load_feeds(self, feeds: Mapping) -> None:
        # Validation as on the CPU, into the pinned host buffers (the base class copies into
        # `_input_views`, which here are device arrays: swap them for the staging buffers).
        device_views = self._input_views
        self._input_views = self._host_inputs
        try:
            super()._load_feeds(feeds)
        finally:
            self._input_views = device_views

    def timeline(self, feeds: Mapping):
        """Not available for CUDA plans yet: a run replays CUDA graphs, whose steps the
        host clock cannot see one by one."""
        raise OptionError(f"plan '{self.path}': timing every step of one run (wpk run "
                          "--profile) is available for CPU plans only",
                          hint="time a CUDA plan's steps with `wpk run --repeat N` overall, or "
                               "Session.profile(feeds) per step (CUDA events)")

    @one_run_at_a_time
    def profile(self, feeds: Mapping, repeats: int = 10) -> list[dict]:
        """Median seconds of every step alone (CUDA events), in execution order."""
        self._execute(feeds)
        rows = []
        for step, (kernel, inputs, outputs) in zip(self.plan.steps, self._calls):
            times = time_gpu(kernel, inputs, outputs, stream=self.stream, warmup=1,
                             repeats=repeats, max_repeats=repeats, min_time=0.0)
            median, _ = summarize(times)
            rows.append({"node": step.node, "op": step.op, "impl": step.impl, "kind": step.kind,
                         "median_s": median, "min_s": min(times)})
        return rows


__all__ = ["CudaSession", "KERNELS", "binary_choice", "buffer_layout", "generated_artifacts",
           "segment_steps"]
