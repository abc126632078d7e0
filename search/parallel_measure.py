"""`--parallel-measure N`: the candidates of a workload timed together on N CUDA streams.

    runner = ParallelRunner(base, streams=4, summary=ParallelSummary(4))
    measurements = runner.run(workload, candidates)   # concurrently, the fastest alone
    runner.measure(workload, candidate)               # one candidate alone (base runner)
    summary.to_json()  # {'streams', 'workloads', 'candidates', 'wall_s', 'saved_s', ...}

`run` executes `wpk.search.measure_cuda.measure_parallel` in this process (base
a `LocalRunner`) or in the base's worker process (an `IsolatedRunner`: a crash
or a hang costs the batch, whose candidates are then failed measurements, not
the build): every candidate verified against the float64 reference, the
verified ones timed concurrently (one stream each, round robin), the `top`
fastest re-measured alone with L2 flushes (`measure_candidate`). Per candidate
the caller gets the alone re-measurement when there is one, else the contended
timing marked `extra["contended"]` (which ranks but never wins against a time
taken alone, `wpk.search.choice`), or the failure. `ParallelSummary` adds up,
over workloads, the wall time and the estimated time of measuring every
candidate alone; their difference is the tuning time saved, shown in the
build/tune summary and in `wpk report` (`report["parallel_measure"]`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import OptionError
from wpk.core.workload import Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.search.measure import Measurement, Status
from wpk.search.measure_cuda import ParallelResult, measure_parallel
from wpk.search.runner import (
    AnyCandidate,
    IsolatedRunner,
    LocalRunner,
    Runner,
    as_candidate,
    failed,
)
from wpk.search.worker_process import WorkerCrash, WorkerTimeout
from wpk.search.workers import MeasureOptions

MEASURE_FIELDS = ("warmup", "repeats", "max_repeats", "min_time", "tolerance", "run_timeout_s")

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


def parallel_request(workload: Mapping, candidates: Sequence[Mapping],
                     options: Mapping | None = None, seed: int = 0,
                     streams: int = DEFAULT_STREAMS, top: int = DEFAULT_TOP) -> dict:
    """Worker entry point (`{"kind": "call", "function": PARALLEL_FUNCTION}`): JSON in,
    {'parallel': ParallelResult JSON} out; a missing GPU fails every candidate."""
    load = Workload.from_json(workload)
    specs = [CandidateSpec.from_json(c) for c in candidates]
    timing = MeasureOptions(**{k: v for k, v in dict(options or {}).items()
                               if k in MEASURE_FIELDS}).timing()
    try:
        chosen = [as_candidate(s) for s in specs]
        result = measure_parallel(load, chosen, rng=np.random.default_rng(seed),
                                  streams=streams, top=top, **timing)
    except Exception as exc:  # DeviceError (no GPU), unknown implementation ...
        why = f"{type(exc).__name__}: {exc}"
        result = ParallelResult([failed(load, s, Status.RUNTIME_ERROR, why) for s in specs],
                                {}, None, 0.0, 0.0, streams)
    return {"parallel": result.to_json()}


class ParallelRunner(Runner):
    """Times a workload's candidates together on `streams` CUDA streams (module docstring)."""

    concurrent = True

    def __init__(self, base: LocalRunner | IsolatedRunner, streams: int = DEFAULT_STREAMS,
                 summary: ParallelSummary | None = None, top: int = DEFAULT_TOP):
        super().__init__(base.options, base.seed)
        self.base = base
        self.streams = check_streams(streams)
        self.totals = summary if summary is not None else ParallelSummary(self.streams)
        self.top = top

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        return self.base.measure(workload, candidate, options, seed)

    def run(self, workload: Workload, candidates: Sequence[AnyCandidate],
            options: MeasureOptions | None = None) -> list[Measurement]:
        if not candidates:
            return []
        options = options or self.options
        seed = self.seed_of(workload, candidates[0])
        if isinstance(self.base, IsolatedRunner):
            result = self._isolated(workload, candidates, options, seed)
            if isinstance(result, list):
                return result
        else:
            result = measure_parallel(workload, [as_candidate(c) for c in candidates],
                                      rng=np.random.default_rng(seed), streams=self.streams,
                                      top=self.top, **options.timing())
        self.totals.add(result)
        return result.measurements()

    def _isolated(self, workload: Workload, candidates: Sequence[AnyCandidate],
                  options: MeasureOptions, seed: int):
        """`measure_parallel` in the base's worker, with a wall-clock limit of the per-
        measurement limit times (candidates + top); a list of failures when it fails."""
        specs = [CandidateSpec.of(c) for c in candidates]
        limit = options.timeout_s * (len(specs) + self.top)
        kwargs = {"workload": workload.to_json(), "candidates": [s.to_json() for s in specs],
                  "options": options.to_json(), "seed": int(seed), "streams": self.streams,
                  "top": self.top}
        try:
            reply = self.base.worker.process.request(
                {"kind": "call", "function": PARALLEL_FUNCTION, "kwargs": kwargs}, limit)
        except (WorkerTimeout, WorkerCrash) as exc:
            status = Status.TIMEOUT if isinstance(exc, WorkerTimeout) else Status.RUNTIME_ERROR
            why = (f"the parallel batch gave no result within {limit:g} s; worker killed"
                   if status is Status.TIMEOUT else f"the parallel batch crashed: {exc}")
            return [failed(workload, s, status, why) for s in specs]
        if "error" in reply:
            return [failed(workload, s, Status.RUNTIME_ERROR, f"worker failed: {reply['error']}")
                    for s in specs]
        return ParallelResult.from_json(reply["result"]["parallel"])

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        self.base.prefetch(workload, candidates)

    def close(self) -> None:
        self.base.close()
