"""Compiling a build's generated candidates side by side before anything is measured.

    precompiler = Precompiler(target.families, jobs=None)   # one thread per usable core
    precompiler.add(workload, candidates)    # the planner's prefetch, for every workload
    precompiler.flush()                      # before the first measurement: compile, wait

An untuned build measures the default config of every generated family that supports a
workload, and each is compiled (gcc, about 0.4 s) when it is first prepared, one after
the other: 137 compiles were 59 s of DenseNet-121's 75 s build with an empty compile
cache. The planner announces every workload's candidates first (`Runner.prefetch`);
the host runners hand the generated ones to a `Precompiler`, which runs their compile
jobs (`GeneratedKernels.compile_jobs`: generate the C source, compile it into the
compile cache) on threads, one per usable core (each waits on its own gcc process),
before the first measurement. The measurements then find every kernel in the compile
cache and never run beside a compiler. A job whose kernel is cached returns at once; a
job that fails is left to the measurement, which compiles it again and reports the error
for its candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from wpk.core.workload import Workload
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import Candidate
from wpk.kernels.target import GeneratedKernels
from wpk.search.compile_pool import usable_cores


class Precompiler:
    """Collects the compile jobs of announced generated candidates; `flush` runs them on
    `jobs` threads (default: one per usable core) and waits."""

    def __init__(self, families: Iterable[GeneratedKernels], jobs: int | None = None):
        self.families = {family.impl: family for family in families}
        self.jobs = usable_cores() if jobs is None else max(1, jobs)
        self.pending: list[CompileJob] = []
        self.failed = 0

    def add(self, workload: Workload, candidates: Sequence[Candidate]) -> None:
        """Queue the compile job of each candidate that belongs to a generated family."""
        for candidate in candidates:
            family = self.families.get(candidate.implementation.name)
            if family is not None:
                self.pending.extend(family.compile_jobs(workload, [candidate.config]))

    def flush(self) -> None:
        """Run the queued jobs (each distinct one once), then forget them."""
        jobs, self.pending = self.pending, []
        distinct = list({(job.function, repr(sorted(job.kwargs.items()))): job
                         for job in jobs}.values())
        if len(distinct) < 2 or self.jobs < 2:
            return   # compiled as fast by the measurement itself
        with ThreadPoolExecutor(min(self.jobs, len(distinct))) as pool:
            self.failed += sum(not ok for ok in pool.map(_run, distinct))


def _run(job: CompileJob) -> bool:
    """Run one compile job in this process; False when it failed (the measurement will
    compile it again and report why)."""
    try:
        job.run()
    except Exception:  # noqa: BLE001 - never the build's end: the measurement reports it
        return False
    return True
