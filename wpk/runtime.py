"""The runtime: load a plan, allocate once, run the steps.

    session = Session.load("model.wpk")
    outputs = session.run({"x": x})                # dict: output name -> array
    [y] = session.run(["y"], {"x": x})              # onnxruntime style: list

`Session.load` checks the plan (format, checksums, device), prepares every
step's kernel with the real constants and carves every buffer out of one
arena allocated once. `run` validates and copies the feeds into the input
buffers, calls the kernels from a precomputed list of (kernel, input arrays,
output arrays) and returns copies of the outputs, since buffers are reused by
the next run. Runs of one session from several threads take turns (a lock: the
buffers are the session's); a session per thread runs them side by side.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime

from wpk.core import forks
from wpk.core.aligned import aligned_bytes, touch_pages
from wpk.core.errors import DeviceError, InputError, OptionError, PlanError
from wpk.core.workload import TensorSpec
from wpk.dsl import build
from wpk.dsl.toolchain import MissingLibraryError
from wpk.kernels import registry
from wpk.kernels.cpu.blas_threads import OneBlasThread, one_blas_thread
from wpk.kernels.cpu.native_chain import chain_kernel, native_call
from wpk.kernels.cpu.ort_region import RegionMember, region_kernel
from wpk.kernels.target import target_class
from wpk.native_bundle import install_native_libraries
from wpk.plans.planfile import KERNELS, Plan, Step, read_plan

_ORT_TYPES = {"float32": "float", "float64": "double", "float16": "float16",
              "bfloat16": "bfloat16", "int64": "int64", "int32": "int32", "int16": "int16",
              "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
              "uint64": "uint64", "bool": "bool"}


@dataclass(frozen=True)
class TensorMeta:
    """Name, shape and type of a plan input/output (like onnxruntime's NodeArg)."""

    name: str
    shape: list[int]
    dtype: str

    @property
    def type(self) -> str:
        return f"tensor({_ORT_TYPES.get(self.dtype, self.dtype)})"


@dataclass(frozen=True)
class CallTiming:
    """One kernel call of a timed run (`Session.timeline`): the plan steps it executed and
    when it started and ended (seconds on the `time.perf_counter` clock). A native chain
    of generated kernels also knows when each of its steps ended (`step_ends_s`, one per
    step; the first step starts at `start_s`); an onnxruntime region does not (empty)."""

    steps: tuple[Step, ...]
    start_s: float
    end_s: float
    step_ends_s: tuple[float, ...] = ()

    def step_spans(self) -> list[tuple[Step, float, float]]:
        """(step, start, end) of each step timed inside the call (none for a region)."""
        if len(self.step_ends_s) != len(self.steps):
            return []
        starts = (self.start_s, *self.step_ends_s[:-1])
        return list(zip(self.steps, starts, self.step_ends_s))


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(int(d)) for d in shape) + ")"


def one_run_at_a_time(method):
    """`method` of a session holds the session's run lock (`_run_lock`, reentrant): every
    run writes the same arena and reads its outputs back from it, so two threads running
    one session at once got each other's results (120 of 120 runs of DenseNet-121 from four
    threads wrong before). In a forked child it runs on the runner thread (`wpk.core.forks`:
    the forking thread's OpenMP regions would wait forever)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._run_lock:
            return forks.fork_safe_call(method, self, *args, **kwargs)
    return locked


# Live sessions, whose run locks a forked child replaces: a lock another thread held at the
# fork stays held in the child, where that thread does not exist.
_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def track_run_lock(session) -> None:
    """Give `session` its run lock (`_run_lock`) and renew it in forked children."""
    session._run_lock = threading.RLock()
    _SESSIONS.add(session)


def _renew_run_locks() -> None:
    for session in list(_SESSIONS):
        session._run_lock = threading.RLock()


os.register_at_fork(after_in_child=_renew_run_locks)


class Session:
    """A loaded plan of the host CPU, ready to run; its runs from several threads take
    turns."""

    target = "cpu"
    _direct = None  # the whole plan's one call taking feeds as they are (`_direct_call`)

    def __init__(self, plan: Plan, path: str = "<plan>", merge_regions: bool = True,
                 spin_threads: bool = False):
        if plan.target != self.target:
            raise DeviceError(f"plan '{path}' targets {plan.target}; {type(self).__name__} "
                              f"executes {self.target} plans", hint="load it with wpk.load")
        self.plan = plan
        self.path = path
        track_run_lock(self)
        # before any kernel library loads libgomp, which reads its wait policy once
        build.openmp_defaults(openmp_spin_count(plan))
        install_native_libraries(plan, path)   # its compiled kernels: no compiler needed
        self._inputs = [TensorMeta(e["name"], list(e["shape"]), e["dtype"])
                        for e in plan.inputs]
        self._outputs = [TensorMeta(e["name"], list(e["shape"]), e["dtype"])
                         for e in plan.outputs]
        specs = self._tensor_specs()
        self._arena, views = self._allocate(specs)
        self._input_views = {meta.name: views[meta.name] for meta in self._inputs}
        arrays = {**plan.weights, **views}
        self.merge_regions = merge_regions
        self.spin_threads = spin_threads  # regions' threads spin during runs (ort_region)
        self._arrays, self._step_calls = arrays, None
        self.region_failures: list[str] = []
        # BLAS on one thread while preparing (filter transforms, packing): OpenBLAS's idle
        # workers spin for about 0.1 s after a call, and on a small machine they took the
        # cores from the first run's kernels (DenseNet-121's first run 106 ms, the next 35).
        # Preparing runs kernels too (micro.gemm packs its weight in OpenMP), so in a forked
        # child it goes to the runner thread as runs do (`wpk.core.forks`)
        with one_blas_thread():
            self._calls, self._step_names = forks.fork_safe_call(self._prepare_steps, arrays)
        # after the kernels loaded their libraries; entering it costs ~10 us a run, so only
        # when some step may call BLAS
        self._one_blas_thread = OneBlasThread() if _uses_blas(plan) else contextlib.nullcontext
        self._output_sources = []
        for meta in self._outputs:
            if meta.name not in arrays:
                raise PlanError(f"plan '{path}': output '{meta.name}' is produced by no step",
                                hint="rebuild the plan with `wpk build`")
            self._output_sources.append(arrays[meta.name])
        self._output_index = output_index(self._outputs)
        self._direct = self._direct_call()

    def _direct_call(self):
        """The whole plan's one call when it can take the feeds as they are and give fresh
        outputs (`kernel.run_feeds`, e.g. onnxruntime's whole model, `ort.model`): then a
        run copies neither the inputs into the arena nor the outputs out of it."""
        if len(self._calls) != 1:
            return None
        run_feeds = getattr(self._calls[0][0], "run_feeds", None)
        if run_feeds is None or list(run_feeds.output_names) != [m.name for m in self._outputs]:
            return None
        return run_feeds

    @classmethod
    def load(cls, path: str | os.PathLike, spin_threads: bool = False) -> Session:
        """Read, check and prepare the plan at `path`, as the session class of its target
        (`Target.session`: a CUDA plan loads as a CudaSession); `spin_threads`: onnxruntime
        regions spin during runs, stopping at the end of each (CPU plans)."""
        if not isinstance(path, (str, os.PathLike)):
            raise PlanError(f"a plan path must be a str or a path, not {type(path).__name__}",
                            hint="pass the path of a .wpk file written by `wpk build`")
        plan = read_plan(path)
        session_class = session_class_of(plan, os.fspath(path)) if cls is Session else cls
        return with_tail(session_class(plan, os.fspath(path), spin_threads=spin_threads))

    def __repr__(self) -> str:
        return (f"<Session {self.path}: {len(self._calls)} steps, "
                f"{self.plan.buffer_plan.arena_bytes} arena bytes>")

    def get_inputs(self) -> list[TensorMeta]:
        """The graph inputs: name, shape and type."""
        return list(self._inputs)

    def get_outputs(self) -> list[TensorMeta]:
        """The graph outputs: name, shape and type."""
        return list(self._outputs)

    # -- loading ------------------------------------------------------------------

    def _tensor_specs(self) -> dict[str, TensorSpec]:
        specs = {m.name: TensorSpec(tuple(m.shape), m.dtype) for m in self._inputs}
        workloads = self.plan.workloads
        for step in self.plan.steps:
            workload = workloads.get(step.workload_key)
            if workload is None or len(workload.outputs) != len(step.outputs):
                raise PlanError(f"plan '{self.path}': step '{step.node}' does not match its "
                                "workload", hint="rebuild the plan with `wpk build`")
            specs.update(zip(step.outputs, workload.outputs))
        for meta in self._outputs:
            specs.setdefault(meta.name, TensorSpec(tuple(meta.shape), meta.dtype))
        return specs

    def _allocate(self, specs: Mapping[str, TensorSpec]) -> tuple[np.ndarray, dict]:
        buffers = self.plan.buffer_plan
        arena = aligned_bytes(buffers.arena_bytes, buffers.alignment)
        touch_pages(arena)   # mapped at load: the first run runs as fast as the next
        views = {}
        for name, index in buffers.assignment.items():
            spec = specs[name]
            dtype = np.dtype(spec.dtype)
            nbytes = spec.size * dtype.itemsize
            within = buffers.tensor_offset(name)
            if within + nbytes > buffers.sizes[index]:
                raise PlanError(f"plan '{self.path}': buffer of tensor '{name}' is too small",
                                hint="rebuild the plan with `wpk build`")
            offset = buffers.offsets[index] + within
            views[name] = arena[offset:offset + nbytes].view(dtype).reshape(spec.shape)
        return arena, views

    def _prepare_steps(self, arrays: Mapping[str, np.ndarray], merge: bool = True):
        """(kernel, inputs, outputs) calls and their names; with `merge`, runs of two or
        more consecutive steps run by onnxruntime become one session (`ort_region`)."""
        steps = self.plan.steps
        calls, names, start = [], [], 0
        while start < len(steps):
            end = start + 1
            exported: set[str] = set()
            if merge and self.merge_regions:
                end, exported = _region(steps, self.plan.weights, start, arrays,
                                        {meta.name for meta in self._outputs})
            region = None
            if end - start >= 2:
                region = self._try_region(steps[start:end], arrays, exported)
            if region is not None:
                calls.append(region)
                names.append(f"{steps[start].node}..{steps[end - 1].node}")
            else:
                for step in steps[start:end]:
                    calls.append(self._prepare_step(step, arrays))
                    names.append(step.node)
            start = end
        if merge and self.merge_regions:
            return _chained(calls, names)
        return calls, names

    def _prepare_step(self, step, arrays: Mapping[str, np.ndarray]):
        impl, workload, inputs, outputs, consts = bind_step(
            self.plan, step, arrays, self.plan.weights, self.path)
        try:
            if step.artifacts and hasattr(impl, "prepare_from_artifacts"):
                files = {m.split("/")[-1]: self.plan.kernels[m] for m in step.artifacts}
                kernel = impl.prepare_from_artifacts(workload, consts, step.config, files)
            else:
                kernel = impl.prepare(workload, consts, step.config)
        except KeyError as exc:
            raise PlanError(f"plan '{self.path}': artifact {exc} of node '{step.node}' is "
                            f"missing under {KERNELS}", hint="rebuild the plan") from None
        except Exception as exc:   # a library the host lacks has its own hint: install it
            hint = exc.hint if isinstance(exc, MissingLibraryError) else \
                "rebuild the plan on this machine"
            raise PlanError(f"plan '{self.path}': node '{step.node}' ({step.impl}) failed "
                            f"to load: {exc}", hint=hint) from exc
        return kernel, inputs, outputs

    def _try_region(self, steps, arrays: Mapping[str, np.ndarray], exported: set[str]):
        """The region's call, or None when onnxruntime cannot load the merged model (the
        steps then run one by one, as verified; `region_failures` says why)."""
        try:
            return self._prepare_region(steps, arrays, exported)
        except PlanError as exc:
            self.region_failures.append(str(exc))
            return None

    def _prepare_region(self, steps, arrays: Mapping[str, np.ndarray], exported: set[str]):
        members = []
        for step in steps:
            impl, workload, _, _, consts = bind_step(self.plan, step, arrays,
                                                     self.plan.weights, self.path)
            members.append(RegionMember(impl, workload, consts, step.inputs, step.outputs))
        try:
            kernel, inputs, outputs = region_kernel(members, exported, self.spin_threads)
        except Exception as exc:
            raise PlanError(f"plan '{self.path}': nodes '{steps[0].node}'..'{steps[-1].node}' "
                            f"failed to load as one onnxruntime session: {exc}",
                            hint="rebuild the plan on this machine") from exc
        return kernel, [arrays[n] for n in inputs], [arrays[n] for n in outputs]

    # -- running ------------------------------------------------------------------

    def run(self, output_names_or_feeds=None, feeds: Mapping | None = None, run_options=None):
        """`run(feeds) -> {name: array}` or onnxruntime-style `run(names|None, feeds) -> list`
        (under the run lock, taken here rather than by `one_run_at_a_time`: on a 20 us run
        of a tiny plan the wrapper cost 1.5 us, the lock alone 0.4)."""
        if feeds is None and isinstance(output_names_or_feeds, Mapping):
            feeds, indices = output_names_or_feeds, None
        elif feeds is None:
            raise InputError("run() needs the inputs: run(feeds) or run(output_names, feeds)",
                             hint=f"pass a dict {{name: array}} for {self._input_names()}")
        else:
            indices = output_indices(output_names_or_feeds, self._outputs, self._output_index)
        with self._run_lock:
            return forks.fork_safe_call(self._results, feeds, indices)

    def _results(self, feeds: Mapping, indices: list[int] | None):
        """One run: a dict of every output (`indices` None) or the list of those outputs."""
        if self._direct is not None:
            results = self._run_direct(feeds)
            if indices is None:
                return dict(zip(self._direct.output_names, results))
            return [results[i] for i in indices]
        self._execute(feeds)
        if indices is None:
            return {meta.name: source.copy()
                    for meta, source in zip(self._outputs, self._output_sources)}
        return [self._output_sources[i].copy() for i in indices]

    @one_run_at_a_time
    def profile(self, feeds: Mapping, repeats: int = 10) -> list[dict]:
        """Median seconds of every step, each called alone on this input's real data.

        Rows in execution order: node, op, impl, kind, median_s, min_s.
        """
        self._execute(feeds)  # fill every buffer with this input's intermediate values
        if self._step_calls is None:
            self._step_calls, _ = self._prepare_steps(self._arrays, merge=False)
        for kernel, inputs, outputs in self._step_calls:  # regions leave internal buffers
            kernel(inputs, outputs)
        rows = []
        for step, (kernel, inputs, outputs) in zip(self.plan.steps, self._step_calls):
            times = []
            with self._one_blas_thread():
                for _ in range(max(1, repeats)):
                    start = time.perf_counter()
                    kernel(inputs, outputs)
                    times.append(time.perf_counter() - start)
            rows.append({"node": step.node, "op": step.op, "impl": step.impl, "kind": step.kind,
                         "median_s": float(np.median(times)), "min_s": min(times)})
        return rows

    @one_run_at_a_time
    def timeline(self, feeds: Mapping) -> list[CallTiming]:
        """One run with every call timed on the host clock, in execution order: each
        call's plan steps (one, the members of an onnxruntime region or of a native chain)
        and its start and end (`time.perf_counter` seconds); a native chain also times
        each of its steps, as they run inside it. The outputs are the run's, as after
        `run`."""
        self._load_feeds(feeds)
        timings = []
        with self._one_blas_thread():
            for (kernel, inputs, outputs), steps in zip(self._calls, self.call_steps()):
                timed = getattr(kernel, "timed", None)
                if timed is not None and len(steps) > 1:
                    stamps = timed()
                    timings.append(CallTiming(steps, float(stamps[0]), float(stamps[-1]),
                                              tuple(float(t) for t in stamps[1:])))
                    continue
                began = time.perf_counter()
                kernel(inputs, outputs)
                timings.append(CallTiming(steps, began, time.perf_counter()))
        return timings

    def call_steps(self) -> list[tuple[Step, ...]]:
        """The plan steps each call runs, in order: a call named after one step runs it, a
        region's call, named 'first..last', the steps from its first to its last."""
        steps, found, cursor = self.plan.steps, [], 0
        for name in self._step_names:
            end = cursor + 1
            if name != steps[cursor].node:
                end = next(j + 1 for j in range(cursor + 1, len(steps))
                           if name == f"{steps[cursor].node}..{steps[j].node}")
            found.append(tuple(steps[cursor:end]))
            cursor = end
        return found

    def _input_names(self) -> str:
        return ", ".join(repr(m.name) for m in self._inputs) or "(none)"

    def _execute(self, feeds: Mapping) -> None:
        self._load_feeds(feeds)
        calls = self._calls
        kernel = None
        try:
            with self._one_blas_thread():
                for kernel, inputs, outputs in calls:
                    kernel(inputs, outputs)
        except Exception as exc:
            index = next(i for i, call in enumerate(calls) if call[0] is kernel)
            raise self._step_failure(self._step_names[index], exc) from exc

    def _run_direct(self, feeds: Mapping) -> list[np.ndarray]:
        checked = self._checked_feeds(feeds)
        try:
            return self._direct(checked)
        except Exception as exc:
            raise self._step_failure(self._step_names[0], exc) from exc

    def _step_failure(self, name: str, exc: Exception) -> Exception:
        """What a failing step raises: onnxruntime refusing a step that was verified when
        the plan was built means the plan was altered or built with another onnxruntime
        (a PlanError); any other failure is wpk's bug (RuntimeError)."""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if _from_onnxruntime(exc):
            return PlanError(f"plan '{self.path}': step '{name}' fails in onnxruntime "
                             f"{onnxruntime.__version__}: {text}",
                             hint="its steps were verified when it was built, so the plan was "
                                  "altered or built with another onnxruntime: rebuild the "
                                  "plan with `wpk build` on this machine")
        return RuntimeError(f"node '{name}' failed: {exc}")

    def _load_feeds(self, feeds: Mapping) -> None:
        for name, array in self._checked_feeds(feeds).items():
            np.copyto(self._input_views[name], array)

    def _checked_feeds(self, feeds: Mapping) -> dict[str, np.ndarray]:
        """The feeds as arrays of the plan's inputs, each checked for dtype and shape."""
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of name -> array, not {type(feeds).__name__}",
                             hint=f"the plan's inputs are: {self._input_names()}")
        unknown = [name for name in feeds if name not in self._input_views]
        if unknown:
            raise InputError(f"unknown input '{unknown[0]}'",
                             hint=f"the plan's inputs are: {self._input_names()}")
        checked = {}
        for meta in self._inputs:
            if meta.name not in feeds:
                raise InputError(f"missing input '{meta.name}' (shape {_shape_text(meta.shape)}, "
                                 f"{meta.dtype})", hint=f"feed every input: {self._input_names()}")
            array = _as_array(meta, feeds[meta.name])
            if array.dtype != np.dtype(meta.dtype):
                raise InputError(f"input '{meta.name}' has dtype {array.dtype} but the plan "
                                 f"expects {meta.dtype}",
                                 hint=f"convert it with .astype(np.{meta.dtype})")
            if tuple(array.shape) != tuple(meta.shape):
                raise InputError(f"input '{meta.name}' has shape {_shape_text(array.shape)} but "
                                 f"the plan expects {_shape_text(meta.shape)}",
                                 hint="rebuild the plan with --input-shape "
                                      f"{meta.name}={'x'.join(map(str, array.shape)) or '1'} "
                                      "for this shape")
            checked[meta.name] = array
        return checked


def output_index(outputs: Sequence[TensorMeta]) -> dict[str, int]:
    """Each output's position by name (made once per session, for `output_indices`)."""
    return {meta.name: i for i, meta in enumerate(outputs)}


def output_indices(names, outputs: Sequence[TensorMeta], index: Mapping[str, int]) -> list[int]:
    """The positions in `outputs` (`index`: `output_index(outputs)`) of the output names a
    run asks for (onnxruntime's form: None for all, a name or a list of names); InputError
    naming a bad or unknown one."""
    if names is None:
        return list(range(len(outputs)))
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise InputError(f"output names must be a list of str, not {names!r}",
                         hint="pass None for every output, or a list of names: "
                              + ", ".join(m.name for m in outputs))
    unknown = [n for n in names if n not in index]
    if unknown:
        raise InputError(f"unknown output '{unknown[0]}'",
                         hint="the plan's outputs are: " + ", ".join(m.name for m in outputs))
    return [index[n] for n in names]


_ORT_MARKS = ("[ONNXRuntimeError]", "Non-zero status code returned while running")


def _from_onnxruntime(exc: BaseException) -> bool:
    """Whether onnxruntime raised `exc` (its own types, or the RuntimeError its I/O-binding
    runs raise with its status text)."""
    return type(exc).__module__.startswith("onnxruntime") or \
        any(mark in str(exc) for mark in _ORT_MARKS)


def _as_array(meta: TensorMeta, value: Any) -> np.ndarray:
    """A feed as an array (an ndarray as it is, anything else converted to the input's
    dtype); InputError when it is not numbers."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (str, bytes)):
        reason = f"a {type(value).__name__}"
    else:
        try:
            return np.asarray(value, meta.dtype)
        except (ValueError, TypeError, OverflowError):
            reason = f"a {type(value).__name__} that is not an array of numbers"
    raise InputError(f"input '{meta.name}' is {reason}, not an array of {meta.dtype}",
                     hint=f"feed a numpy array of shape {_shape_text(meta.shape)} and dtype "
                          f"{meta.dtype}")


def example_feeds(session: Session, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for every plan input (U(0,1) floats, small ints)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for meta in session.get_inputs():
        dtype = np.dtype(meta.dtype)
        if dtype.kind == "f":
            feeds[meta.name] = rng.random(meta.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[meta.name] = rng.random(meta.shape) < 0.5
        else:
            feeds[meta.name] = rng.integers(0, 2, size=meta.shape).astype(dtype)
    return feeds


def with_tail(session: Session):
    """`session`, or for a plan with a value-dependent tail (`wpk.value_tail`) a
    `TailSession` running it after the session's plan."""
    if "tail" not in session.plan.manifest:
        return session
    from wpk.runtime_tail import TailSession

    return TailSession(session, session.path)


def session_class_of(plan: Plan, path: str = "<plan>") -> type[Session]:
    """The runtime session class of the plan's target (`Target.session`)."""
    try:
        module, _, name = target_class(plan.target).session.partition(":")
    except OptionError:
        raise PlanError(f"plan '{path}' targets '{plan.target}', which this wpk does not know",
                        hint="rebuild the plan with this wpk version") from None
    return getattr(importlib.import_module(module), name)


def openmp_spin_count(plan: Plan) -> int:
    """How long idle OpenMP threads spin in a process whose first kernels are this plan's
    (`wpk.dsl.build.openmp_defaults`): as long as onnxruntime's threads do after a run
    (`OPENMP_IDLE_SPIN_COUNT`) where nothing but generated kernels runs, so that a run
    after an idle gap finds the threads awake; briefly where an onnxruntime step or BLAS
    may run, whose threads a spinning one would keep from a core."""
    try:
        shares_cores = _uses_blas(plan) or any(s.impl.startswith("ort") for s in plan.steps)
    except KeyError:   # an implementation this wpk lacks: preparing the steps says so
        shares_cores = True
    return build.OPENMP_SPIN_COUNT if shares_cores else build.OPENMP_IDLE_SPIN_COUNT


def _uses_blas(plan: Plan) -> bool:
    """Whether any step's implementation may call BLAS (see `Implementation.uses_blas`)."""
    return any(registry.get(step.impl).uses_blas for step in plan.steps)


def bind_step(plan: Plan, step, arrays: Mapping, weights: Mapping, path: str):
    """Resolve one plan step against the allocated arrays (host or device).

    Returns (implementation, workload, input arrays, output arrays, constants by
    input index); PlanError when this wpk lacks the implementation or a tensor
    has no buffer.
    """
    try:
        impl = registry.get(step.impl)
    except KeyError:
        raise PlanError(f"plan '{path}' uses implementation '{step.impl}' (node "
                        f"'{step.node}') which this wpk does not have",
                        hint="rebuild the plan with this wpk version") from None
    try:
        inputs = [arrays[name] if name else None for name in step.inputs]
        outputs = [arrays[name] for name in step.outputs]
    except KeyError as exc:
        raise PlanError(f"plan '{path}': tensor {exc} of node '{step.node}' has "
                        "no buffer", hint="rebuild the plan with `wpk build`") from None
    consts = {i: arrays[name] for i, name in enumerate(step.inputs) if name in weights}
    return impl, plan.workload(step.workload_key), inputs, outputs, consts


def _chained(calls: list, names: list[str]) -> tuple[list, list[str]]:
    """The calls with every run of consecutive calls that have a native form (`native_chain`)
    replaced by one call of the chain, named 'first..last' (a run of one named after its
    step: a lone call runs as a chain of one): the same C function on the same buffers,
    without the Python wrapper's per-call work (converting each operand to a pointer: 10 us
    a call of a small attention step, against 1-2 us for the driver; a data-movement step's
    `wpk_moves`, on the threads, is also faster than numpy's copy)."""
    natives = [native_call(*call) for call in calls]
    merged, merged_names, start = [], [], 0
    while start < len(calls):
        end = start
        while end < len(calls) and natives[end] is not None:
            end += 1
        if end > start:
            members = [call[0] for call in calls[start:end]]
            merged.append((chain_kernel(natives[start:end], keep=members), [], []))
            merged_names.append(names[start] if end - start == 1
                                else f"{names[start]}..{names[end - 1]}")
            start = end
            continue
        merged.append(calls[start])
        merged_names.append(names[start])
        start += 1
    return merged, merged_names


def step_joins_regions(step) -> bool:
    """Whether the step's implementation may join an onnxruntime region."""
    try:
        return registry.get(step.impl).joins_regions
    except KeyError:
        return False


def _region(steps: Sequence, weights: Mapping, start: int, arrays: Mapping,
            graph_outputs: set[str]) -> tuple[int, set[str]]:
    """The longest run of region-joining steps from `start` that can share
    one onnxruntime session, as (end, outputs read after it). The tensors crossing its
    boundary must sit in their own arena bytes: onnxruntime may order independent nodes
    differently from the plan and knows nothing of buffer reuse. `steps`: the plan's, decoded
    once by the caller (`Plan.steps` decodes them all at every read)."""
    if not step_joins_regions(steps[start]):
        return start + 1, set()
    limit = start + 1
    while limit < len(steps) and step_joins_regions(steps[limit]):
        limit += 1
    best = (start + 1, set())
    for end in range(start + 2, limit + 1):
        produced = {name for s in steps[start:end] for name in s.outputs}
        later = {n for s in steps[end:] for n in s.inputs} | graph_outputs
        exported = produced & later
        boundary = ({n for s in steps[start:end] for n in s.inputs
                     if n and n not in produced and n not in weights} | exported)
        spans = sorted((arrays[n].ctypes.data, arrays[n].ctypes.data + arrays[n].nbytes)
                       for n in boundary)
        if all(a[1] <= b[0] for a, b in zip(spans, spans[1:])):
            best = (end, exported)
    return best
