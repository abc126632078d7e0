"""Compiling candidates in parallel worker processes, each job with a timeout.

    jobs = [CompileJob.dsl("gemm", {"M": 64, "N": 64, "K": 64}, config) for config in configs]
    with CompilePool(jobs=4) as pool:              # default: one worker per usable core
        results = pool.compile(jobs, timeout_s=60)
    results[i].status   -> Status.OK | COMPILE_ERROR | TIMEOUT
    results[i].artifact -> what the job's function returned (the .so path for C jobs)

A job names a function `"module:name"` and its keyword arguments (JSON);
the worker imports and calls it. `CompileJob.c_source` and `CompileJob.dsl`
(`wpk.kernels.jobs`) build the two jobs wpk needs (C source -> shared library, DSL library
operator + bindings + schedule config -> shared library); both go through
the compile cache (`wpk.dsl.toolchain`), so the measuring worker's
`prepare` finds the library there. A job that runs past its timeout has its
worker killed (the worker is replaced); a job that crashes its worker is a
compile_error naming the signal. Results come back in the order of `jobs`.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wpk.core.errors import OptionError
from wpk.kernels.jobs import CompileJob
from wpk.search.measure import Status
from wpk.search.worker_process import WorkerCrash, WorkerProcess, WorkerTimeout

DEFAULT_COMPILE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class CompileResult:
    """Outcome of one job: status, the function's return value, error text, seconds taken."""

    job: CompileJob
    status: Status
    artifact: Any = None
    message: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class CompilePool:
    """`jobs` compile workers (default: one per usable core), started on first use, with
    environment `env` (default: this process's when a worker starts)."""

    def __init__(self, jobs: int | None = None, env: Mapping[str, str] | None = None):
        jobs = usable_cores() if jobs is None else jobs
        if jobs < 1:
            raise OptionError(f"--jobs must be at least 1, got {jobs}", hint="use --jobs 1 or more")
        self.jobs = jobs
        self.workers = [WorkerProcess(env=env) for _ in range(jobs)]

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End every worker."""
        for worker in self.workers:
            worker.close()

    def compile(self, jobs: Sequence[CompileJob],
                timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S) -> list[CompileResult]:
        """Run every job (at most `self.jobs` at a time); results in the order of `jobs`."""
        results: list[CompileResult | None] = [None] * len(jobs)
        queue = list(enumerate(jobs))[::-1]
        busy: dict[int, tuple[int, float]] = {}   # worker index -> (job index, start time)
        for worker in self.workers[:len(jobs)]:  # start the children side by side
            if not worker.alive:
                worker.launch()
        while queue or busy:
            for slot, worker in enumerate(self.workers):
                if slot in busy or not queue:
                    continue
                index, job = queue.pop()
                started = time.monotonic()
                try:
                    worker.start()
                    worker.send({"kind": "call", "function": job.function,
                                 "kwargs": dict(job.kwargs)}, timeout_s)
                except (WorkerCrash, WorkerTimeout) as exc:
                    results[index] = CompileResult(job, Status.COMPILE_ERROR,
                                                   message=f"compile worker failed: {exc}")
                    continue
                busy[slot] = (index, started)
            if busy:
                self._collect(jobs, busy, results)
        return results  # type: ignore[return-value]

    def _collect(self, jobs: Sequence[CompileJob], busy: dict[int, tuple[int, float]],
                 results: list[CompileResult | None]) -> None:
        """Wait for the next reply or deadline among busy workers and record what ended."""
        now = time.monotonic()
        wait = max(0.0, min(self.workers[s].deadline for s in busy) - now)
        pending = [s for s in busy if not self.workers[s].reply_ready()]
        if len(pending) == len(busy):
            select.select([self.workers[s].fileno for s in busy], [], [], wait)
        for slot in list(busy):
            worker = self.workers[slot]
            index, started = busy[slot]
            if not worker.reply_ready() and time.monotonic() < worker.deadline:
                continue
            del busy[slot]
            job = jobs[index]
            try:
                reply = worker.read_reply()
            except WorkerTimeout:
                results[index] = CompileResult(job, Status.TIMEOUT,
                                               message="compilation ran past its timeout; "
                                                       "worker killed",
                                               seconds=time.monotonic() - started)
                continue
            except WorkerCrash as crash:
                results[index] = CompileResult(job, Status.COMPILE_ERROR,
                                               message=f"compile {crash.reason}",
                                               seconds=time.monotonic() - started)
                continue
            seconds = time.monotonic() - started
            if "error" in reply:
                message = reply["error"].split(":")[0] + ": " + reply.get("detail", "")
                results[index] = CompileResult(job, Status.COMPILE_ERROR,
                                               message=message, seconds=seconds)
            else:
                results[index] = CompileResult(job, Status.OK, reply["result"], seconds=seconds)
