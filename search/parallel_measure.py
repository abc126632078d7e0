"""`--parallel-measure N`: the candidates of a workload timed together on N CUDA streams.

    summary = ParallelSummary(streams=4)
    many = in_process_many(summary, streams=4)          # planner / `wpk tune`: measure_many
    batch = isolated_batch(worker, summary, streams=4)  # search: RecordedMeasurer batch_fn
    summary.to_json()  # {'streams', 'workloads', 'candidates', 'wall_s', 'saved_s', ...}

Both run `wpk.search.measure_cuda.measure_parallel`: every candidate verified
against the float64 reference, the verified ones timed concurrently (one
stream each, round robin), the `top` fastest re-measured alone with L2 flushes
(`measure_candidate`); the winner is the fastest of those. Per candidate the
caller gets the alone re-measurement when there is one, else the contended
timing marked `extra["contended"]` (which ranks but never wins against a time
taken alone), or the failure. `ParallelSummary` adds up, over workloads, the
wall time and the estimated time of measuring every candidate alone; their
difference is the tuning time saved, shown in the build/tune summary and in
`wpk report` (`report["parallel_measure"]`).

`isolated_batch` runs `measure_parallel` in a `MeasureWorker`'s child (the
search's isolation: a crash or a hang costs the batch, whose candidates are
then recorded as failed, not the build).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import OptionError
from wpk.core.workload import Workload
from wpk.kernels.registry import Candidate
from wpk.search.measure import Measurement, Status

DEFAULT_STREAMS = 4
DEFAULT_TOP = 3
PARALLEL_FUNCTION = "wpk.search.parallel_measure:parallel_request"


def check_streams(streams: int | None) -> int | None:
    """`--parallel-measure N` validated: None (off) or a stream count from 1 to 64."""
    if streams is None:
        return None
    if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 64:
        raise OptionError(f"--parallel-measure must be a number of CUDA streams from 1 to 64, "
                          f"not {streams!r}", hint="e.g. --parallel-measure 4")
    return streams


@dataclass
class ParallelSummary:
    """Totals of the parallel measurements of a build or a tune (see the module docstring)."""

    streams: int = DEFAULT_STREAMS
    workloads: int = 0
    candidates: int = 0
    remeasured: int = 0
    wall_s: float = 0.0
    estimated_sequential_s: float = 0.0

    def add(self, result) -> None:
        """Count one `ParallelResult`."""
        self.workloads += 1
        self.candidates += len(result.parallel)
        self.remeasured += len(result.remeasured)
        self.wall_s += result.wall_s
        self.estimated_sequential_s += result.estimated_sequential_s

    @property
    def saved_s(self) -> float:
        return max(0.0, self.estimated_sequential_s - self.wall_s)

    def to_json(self) -> dict:
        return {"streams": self.streams, "workloads": self.workloads,
                "candidates": self.candidates, "remeasured": self.remeasured,
                "wall_s": self.wall_s, "estimated_sequential_s": self.estimated_sequential_s,
                "saved_s": self.saved_s}


def summary_line(data: Mapping) -> str:
    """One line for a build/tune summary from `ParallelSummary.to_json()`."""
    return (f"parallel measurement on {data['streams']} streams: {data['candidates']} "
            f"candidates of {data['workloads']} workloads in {data['wall_s']:.1f} s, about "
            f"{data['estimated_sequential_s']:.1f} s alone: saved {data['saved_s']:.1f} s "
            "(estimated)")


def in_process_many(summary: ParallelSummary, streams: int = DEFAULT_STREAMS,
                    top: int = DEFAULT_TOP) -> Callable[..., list[Measurement]]:
    """A planner `measure_many` (and `wpk tune`'s): `measure_parallel` in this process."""
    def measure_many(workload: Workload, candidates: Sequence[Candidate], *, rng,
                     **timing) -> list[Measurement]:
        from wpk.search.measure_cuda import measure_parallel

        result = measure_parallel(workload, list(candidates), rng=rng, streams=streams,
                                  top=top, **timing)
        summary.add(result)
        return result.measurements()
    return measure_many


def parallel_request(workload: Mapping, candidates: Sequence[Mapping],
                     options: Mapping | None = None, seed: int = 0,
                     streams: int = DEFAULT_STREAMS, top: int = DEFAULT_TOP) -> dict:
    """Worker entry point (`{"kind": "call", "function": PARALLEL_FUNCTION}`): JSON in,
    {'parallel': ParallelResult JSON} out; a missing GPU fails every candidate."""
    import importlib

    from wpk.kernels import registry
    from wpk.search.measure_cuda import ParallelResult, measure_parallel
    from wpk.search.workers import CandidateSpec

    load = Workload.from_json(workload)
    specs = [CandidateSpec(c["impl"], dict(c.get("config", {})), tuple(c.get("modules", ())))
             for c in candidates]
    options = dict(options or {})
    options["timeout"] = options.pop("run_timeout_s", None)
    try:
        for module in dict.fromkeys(m for s in specs for m in s.modules):
            importlib.import_module(module)
        chosen = [Candidate(registry.get(s.impl), s.config) for s in specs]
        result = measure_parallel(load, chosen, rng=np.random.default_rng(seed),
                                  streams=streams, top=top, **options)
    except Exception as exc:  # DeviceError (no GPU), unknown implementation ...
        from wpk.search.measure import _describe

        failed = [Measurement(label=s.label, impl=s.impl, config=dict(s.config),
                              status=Status.RUNTIME_ERROR, message=_describe(exc),
                              workload_key=load.key) for s in specs]
        result = ParallelResult(failed, {}, None, 0.0, 0.0, streams)
    return {"parallel": result.to_json()}


def isolated_batch(worker, summary: ParallelSummary, streams: int = DEFAULT_STREAMS,
                   top: int = DEFAULT_TOP):
    """A `RecordedMeasurer` batch_fn: `measure_parallel` in `worker`'s child process, with a
    wall-clock limit of the worker's per-measurement limit times (candidates + top)."""
    def batch(workload: Workload, specs: Sequence, options=None,
              seeds: Sequence[int] = ()) -> list[Measurement]:
        from wpk.search.measure_cuda import ParallelResult
        from wpk.search.workers import WorkerCrash, WorkerTimeout, failed_measurement

        options = options or worker.options
        limit = options.timeout_s * (len(specs) + top)
        kwargs = {"workload": workload.to_json(), "candidates": [s.to_json() for s in specs],
                  "options": options.to_json(), "seed": int(seeds[0]) if seeds else 0,
                  "streams": streams, "top": top}
        try:
            reply = worker.process.request({"kind": "call", "function": PARALLEL_FUNCTION,
                                            "kwargs": kwargs}, limit)
        except (WorkerTimeout, WorkerCrash) as exc:
            status = Status.TIMEOUT if isinstance(exc, WorkerTimeout) else Status.RUNTIME_ERROR
            why = (f"the parallel batch gave no result within {limit:g} s; worker killed"
                   if status is Status.TIMEOUT else f"the parallel batch crashed: {exc}")
            return [failed_measurement(workload.key, s, status, why) for s in specs]
        if "error" in reply:
            return [failed_measurement(workload.key, s, Status.RUNTIME_ERROR,
                                       f"worker failed: {reply['error']}") for s in specs]
        result = ParallelResult.from_json(reply["result"]["parallel"])
        summary.add(result)
        return result.measurements()
    return batch
