"""A plan with a value-dependent tail: the head's session, then the tail in onnxruntime.

    session = wpk.load("detector.wpk")        # a TailSession when the plan has a tail
    outputs = session.run({"images": x})      # every output of the model, in its order

A model whose last nodes have shapes that depend on the input values (NMS, NonZero, ...)
is built as a static head and a tail (`wpk.value_tail`). `TailSession` runs the head's
session (the target's own: CPU or CUDA), then the tail's onnxruntime session on the
boundary tensors the head output and the graph inputs the tail reads, and returns the
model's outputs in order: the tail's with the shapes that run gave them. The head's
outputs that only the tail reads are not returned. The tail's threads spin during its
run only (`session_options`), as onnxruntime regions of a plan do. Anything else (the
plan, a per-step profile) is the head session's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime

from wpk.core.errors import InputError, PlanError
from wpk.kernels.cpu.ort_node import session_options
from wpk.plans.planfile import KERNELS
from wpk.runtime import TensorMeta, _as_array, output_index, output_indices


class TailSession:
    """The head plan's session followed by the tail's onnxruntime session."""

    # (start, end) of the tail's call in the last `timeline`, on its clock (perf_counter)
    last_tail_span: tuple[float, float] | None = None

    def __init__(self, head: Any, path: str = "<plan>"):
        self.head = head
        self.path = path
        tail = head.plan.manifest["tail"]
        member = tail.get("model", "")
        if member not in head.plan.kernels:
            raise PlanError(f"plan '{path}': its tail model {KERNELS}{member} is missing",
                            hint="rebuild the plan with `wpk build`")
        try:
            self._session = onnxruntime.InferenceSession(   # threads spin during a run only
                head.plan.kernels[member], session_options(spin_during_run=True),
                providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types here
            raise PlanError(f"plan '{path}': its tail model does not load in onnxruntime "
                            f"{onnxruntime.__version__}: {str(exc).strip().splitlines()[0]}",
                            hint="rebuild the plan with `wpk build` on this machine") from exc
        self._reads = list(tail["reads"])
        self._tail_outputs = [entry["name"] for entry in tail["outputs"]]
        self._outputs = [TensorMeta(e["name"], list(e["shape"]), e["dtype"])
                         for e in tail["graph_outputs"]]
        self._output_index = output_index(self._outputs)
        # the graph inputs the tail reads (the head validates every feed)
        self._read_inputs = [m for m in head.get_inputs() if m.name in self._reads]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)   # plan, profile, call_steps, ... are the head's

    def __repr__(self) -> str:
        return f"<TailSession {self.path}: {self.head!r} then {len(self._tail_outputs)} " \
               "output(s) from onnxruntime>"

    def get_inputs(self):
        """The graph inputs: name, shape and type (the head keeps every one)."""
        return self.head.get_inputs()

    def get_outputs(self):
        """The model's outputs in order; a dim that depends on values is None."""
        return list(self._outputs)

    def run(self, output_names_or_feeds=None, feeds: Mapping | None = None, run_options=None):
        """`run(feeds) -> {name: array}` or onnxruntime-style `run(names|None, feeds) -> list`,
        as `Session.run`."""
        if feeds is None and isinstance(output_names_or_feeds, Mapping):
            return self._run_all(output_names_or_feeds)
        if feeds is None:
            raise InputError("run() needs the inputs: run(feeds) or run(output_names, feeds)",
                             hint="pass a dict {name: array} of the model's inputs")
        indices = output_indices(output_names_or_feeds, self._outputs, self._output_index)
        results = self._run_all(feeds)
        return [results[self._outputs[i].name] for i in indices]

    def timeline(self, feeds: Mapping):
        """The head's timed run (`Session.timeline`), then the tail's, whose start and end
        are `last_tail_span` (the tail is one onnxruntime call, not plan steps)."""
        with self.head._run_lock:   # the head's outputs are read from its buffers
            timings = self.head.timeline(feeds)
            head = {meta.name: source for meta, source in zip(self.head.get_outputs(),
                                                              self.head._output_sources)}
            began = time.perf_counter()
            self._run_tail({**self._inputs_read(feeds), **head})
            self.last_tail_span = (began, time.perf_counter())
        return timings

    def _run_all(self, feeds: Mapping) -> dict[str, np.ndarray]:
        head = self.head.run(feeds)   # checks every feed
        return self._run_tail({**self._inputs_read(feeds), **head})

    def _inputs_read(self, feeds: Mapping) -> dict[str, np.ndarray]:
        """The feeds the tail reads, as the arrays the head accepted them as."""
        return {meta.name: _as_array(meta, feeds[meta.name]) for meta in self._read_inputs}

    def _run_tail(self, available: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs, given every graph input and head output in `available`."""
        try:
            values = self._session.run(self._tail_outputs,
                                       {name: available[name] for name in self._reads})
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RuntimeError(f"plan '{self.path}': its onnxruntime tail failed: {text}") \
                from exc
        available.update(zip(self._tail_outputs, values))
        return {meta.name: available[meta.name] for meta in self._outputs}
