"""Runners: verify and time candidates (DESIGN.md: `Runner.run(workload, candidates)`).

    runner = create_runner(target)                     # in this process
    runner = create_runner(target, isolated=True)      # in a worker process
    runner = create_runner(target, parallel=4)         # CUDA: 4 streams at once
    runner = create_runner(target, cluster="local:3")  # on the nodes of a Ray cluster
    with runner:
        measurements = runner.run(workload, candidates)    # one per candidate, in order
        for index, m in runner.stream(workload, candidates, deadline=t): ...   # as each is done

Implementations:

* `LocalRunner`: in this process, with the target's timer (the host's wall
  clock, or CUDA events with an L2 flush per run);
* `IsolatedRunner`: the same in a worker process (`wpk.search.workers`), so a
  crash or a hang costs one candidate, not the build;
* `ParallelRunner` (`wpk.search.parallel_measure`): a workload's candidates
  timed together on N CUDA streams, the fastest re-measured alone;
* `PredictedRunner` (`wpk.search.predicted`): an offline build's candidates
  compiled, resource-checked, emulator-verified and predicted;
* `RayRunner` (`wpk.search.ray_runner`): candidates compiled anywhere on a Ray
  cluster and measured on its nodes of the target's fingerprint, one at a time
  per node, in each node's isolated worker (`--cluster`; Ray is imported only then);
* `RecordedRunner` (`wpk.search.recorded`): a `Database` in front of another
  runner (reuse what is recorded, record what is measured).

`create_runner` reads the target's capability fields (`timer`, `streams`,
`predicted`), never its name. `stream` hands measurements over as they are done
(one at a time in order, except on a runner with several measuring `slots`), so
a `RecordedRunner` commits each as it arrives. Every candidate's random inputs derive from
(seed, workload key, candidate), so they do not depend on measurement order.
"""

from __future__ import annotations

import hashlib
import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from wpk.core.errors import OptionError
from wpk.core.workload import Workload
from wpk.kernels import registry
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.registry import Candidate
from wpk.kernels.target import Target
from wpk.search.cluster import cluster_runner, parse_address
from wpk.search.measure import Measurement, Status, pooled
from wpk.search.precompile import Precompiler
from wpk.search.workers import MeasureOptions, MeasureWorker

AnyCandidate = Candidate | CandidateSpec
# `Runner.run_interleaved`: rounds in all, and how close to the fastest a candidate must
# be (its median over the fastest's) to be measured again: a slow window costs up to 2x
INTERLEAVED_ROUNDS = 3
CLOSE = 2.0
# timer (a Target capability) -> the function measuring one candidate in a process
TIMERS = {"host": "wpk.search.measure:measure_candidate",
          "cuda-events": "wpk.search.measure_cuda:measure_candidate"}


def measurement_seed(seed: int, workload_key: str) -> int:
    """A 32-bit seed for measuring a workload's candidates, independent of search order.
    Every candidate of the workload gets the same one: they are verified on the same
    random inputs, drawn and referenced once (`wpk.search.input_sets`)."""
    text = f"{seed}|{workload_key}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def timer_function(timer: str):
    """The measuring function of a timer name (see `TIMERS`)."""
    module, _, name = TIMERS[timer].partition(":")
    return getattr(importlib.import_module(module), name)


def as_candidate(candidate: AnyCandidate) -> Candidate:
    """A registry `Candidate` (a spec's modules imported and its implementation looked up)."""
    if isinstance(candidate, Candidate):
        return candidate
    for module in candidate.modules:
        importlib.import_module(module)
    return Candidate(registry.get(candidate.impl), dict(candidate.config))


def failed(workload: Workload, candidate: AnyCandidate, status: Status,
           message: str) -> Measurement:
    """The measurement of a candidate that never reached its kernel."""
    spec = CandidateSpec.of(candidate)
    return Measurement(label=spec.label, impl=spec.impl, config=dict(spec.config),
                       status=status, message=message, workload_key=workload.key)


class Runner(ABC):
    """Verifies and times candidates of a workload; `options` are the defaults of `run`."""

    concurrent = False   # whether `run` times a workload's candidates together
    compiles = False     # whether it compiles candidates itself (callers need no CompilePool)
    steady = False       # whether measuring again gives the same figures (a prediction)

    def __init__(self, options: MeasureOptions | None = None, seed: int = 0):
        self.options = options or MeasureOptions()
        self.seed = seed

    def run(self, workload: Workload, candidates: Sequence[AnyCandidate],
            options: MeasureOptions | None = None) -> list[Measurement]:
        """One measurement per candidate, in order; never raises for a failing candidate
        (the status says what happened)."""
        return [self.measure(workload, c, options) for c in candidates]

    def run_interleaved(self, workload: Workload, candidates: Sequence[AnyCandidate],
                        options: MeasureOptions | None = None,
                        rounds: int = INTERLEAVED_ROUNDS) -> list[Measurement]:
        """`run`, then `rounds - 1` more rounds of the candidates within `CLOSE` of the
        fastest verified one, in rotating order, each one's rounds pooled
        (`wpk.search.measure.pooled`). On a shared machine a kernel's time drifts from one
        window to the next (a VM's 2-thread kernel ran at 1-thread speed for seconds at a
        time); candidates measured one after the other meet different windows, so the
        close ones meet the same windows in turn. A runner whose measurements do not vary
        (`steady`: predictions) runs once."""
        first = self.run(workload, candidates, options)
        best = min((m.median_s for m in first if m.ok), default=float("nan"))
        close = [i for i, m in enumerate(first) if m.ok and m.median_s <= CLOSE * best]
        if self.steady or rounds < 2 or len(close) < 2:
            return first
        gathered = {i: [first[i]] for i in close}
        for shift in range(1, rounds):
            order = close[shift % len(close):] + close[:shift % len(close)]
            for index, measurement in zip(order, self.run(
                    workload, [candidates[i] for i in order], options)):
                gathered[index].append(measurement)
        return [pooled(gathered[i]) if i in gathered else m for i, m in enumerate(first)]

    def stream(self, workload: Workload, candidates: Sequence[AnyCandidate],
               options: MeasureOptions | None = None, deadline: float | None = None
               ) -> Iterator[tuple[int, Measurement]]:
        """(index in `candidates`, measurement) as each is done, in any order; no new
        measurement starts after the `time.monotonic()` `deadline` once one is done.
        Default: one at a time, in order, with `measure`."""
        for index, candidate in enumerate(candidates):
            if index and deadline is not None and time.monotonic() >= deadline:
                return
            yield index, self.measure(workload, candidate, options)

    @property
    def slots(self) -> int:
        """How many candidates it measures at once (a tuner's batch should fill them)."""
        return 1

    @abstractmethod
    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        """One candidate, alone (`seed` default: the workload's, `measurement_seed`)."""

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        """Start preparing candidates that will be measured later (compiling, say); the
        planner calls it for every workload first. Nothing by default."""
        return None

    def seed_of(self, workload: Workload, candidate: AnyCandidate) -> int:
        """The seed `candidate` is measured with (`measurement_seed`: the workload's)."""
        return measurement_seed(self.seed, workload.key)

    def summary(self) -> dict | None:
        """Where it measured, for the build report (None: nothing to add)."""
        return None

    def close(self) -> None:
        """Release worker processes and pools (a closed runner may be used again)."""
        return None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _loadable(candidate: AnyCandidate) -> Candidate | None:
    """The candidate, or None when this process cannot load its implementation (its
    measurement says so)."""
    try:
        return as_candidate(candidate)
    except Exception:  # noqa: BLE001 - any import or registry error, reported when measured
        return None


class HostRunner(Runner):
    """A runner that measures on this machine: with a `precompiler`, the generated
    candidates the planner announces (`prefetch`) are compiled side by side before the
    first measurement (`wpk.search.precompile`)."""

    precompiler: Precompiler | None = None

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        if self.precompiler is not None:
            self.precompiler.add(workload, [c for c in map(_loadable, candidates) if c])

    def compile_announced(self) -> None:
        """Compile what was announced and not compiled yet (before measuring)."""
        if self.precompiler is not None:
            self.precompiler.flush()


class LocalRunner(HostRunner):
    """Measures in this process with a timer of `TIMERS`."""

    def __init__(self, timer: str = "host", options: MeasureOptions | None = None,
                 seed: int = 0):
        super().__init__(options, seed)
        self.timer = timer
        self._measure = timer_function(timer)

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        self.compile_announced()
        options = options or self.options
        seed = self.seed_of(workload, candidate) if seed is None else seed
        try:
            chosen = as_candidate(candidate)
        except Exception as exc:  # an implementation this process cannot load
            return failed(workload, candidate, Status.COMPILE_ERROR,
                          f"cannot load implementation {CandidateSpec.of(candidate).impl!r}: "
                          f"{type(exc).__name__}: {exc}")
        return self._measure(workload, chosen, rng=np.random.default_rng(seed),
                             **options.timing())


class IsolatedRunner(HostRunner):
    """Measures in a long-lived worker process (restarted only after a crash or a hang)."""

    def __init__(self, timer: str = "host", options: MeasureOptions | None = None,
                 seed: int = 0, worker: MeasureWorker | None = None):
        super().__init__(options, seed)
        self.timer = timer
        self.worker = worker or MeasureWorker(self.options, timer=timer)
        self._owns_worker = worker is None

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        self.compile_announced()
        seed = self.seed_of(workload, candidate) if seed is None else seed
        return self.worker.measure(workload, candidate, options or self.options, seed=seed)

    def close(self) -> None:
        if self._owns_worker:
            self.worker.close()


def check_runner(target: Target, parallel: int | None = None,
                 cluster: str | None = None) -> None:
    """OptionError when `target` cannot be measured as asked (`parallel` streams on a target
    without streams, or on a predicted one; a `cluster` for a predicted target or with
    `parallel`)."""
    if cluster is not None:
        _check_cluster(target, parallel, cluster)
    if not parallel:
        return
    if target.predicted:
        raise OptionError("--parallel-measure times candidates on the GPU, and an "
                          "--offline build predicts instead of timing",
                          hint="drop --parallel-measure, then run `wpk tune PLAN "
                               "--parallel-measure N` on the GPU")
    if not target.streams:
        raise OptionError(f"--parallel-measure times candidates on device streams; target "
                          f"'{target.name}' has none",
                          hint="drop --parallel-measure, or build with --gpu NAME on a "
                               "machine with that GPU")


def _check_cluster(target: Target, parallel: int | None, cluster: str) -> None:
    parse_address(cluster)
    if target.predicted:
        raise OptionError("--cluster measures candidates on the cluster's nodes, and an "
                          "--offline build predicts instead of measuring",
                          hint="drop --offline to measure on nodes that have the GPU, or "
                               "drop --cluster")
    if parallel:
        raise OptionError("--cluster measures one candidate at a time per node; "
                          "--parallel-measure times several at once on one GPU",
                          hint="drop one of --cluster and --parallel-measure")


def create_runner(target: Target, *, isolated: bool = False, parallel: int | None = None,
                  options: MeasureOptions | None = None, seed: int = 0,
                  jobs: int | None = None, summary=None, cluster: str | None = None) -> Runner:
    """The runner a build for `target` measures with: predicted for a predicted target,
    else the target's timer in this process or (`isolated`) in a worker, and with
    `parallel` streams when the target has streams (their totals added to `summary`,
    a `ParallelSummary`), or on the nodes of the Ray `cluster` (an address of
    `wpk.search.cluster.parse_address`; Ray is imported only then). `jobs`: compile
    threads (of a predicted build, or compiling the announced candidates before a
    measured build measures; default one per usable core)."""
    check_runner(target, parallel, cluster)
    if cluster is not None:
        return cluster_runner(target, cluster, options, seed)
    # predicted and parallel_measure build on this module (cycles at module level)
    if target.predicted:
        from wpk.search.predicted import PredictedRunner

        return PredictedRunner(target.hardware, options, seed, jobs=jobs)
    base = (IsolatedRunner(target.timer, options, seed) if isolated
            else LocalRunner(target.timer, options, seed))
    base.precompiler = Precompiler(target.families, jobs)
    if not parallel:
        return base
    from wpk.search.parallel_measure import ParallelRunner

    return ParallelRunner(base, parallel, summary)


def final_phase(measurement: Measurement) -> Measurement:
    """`measurement` marked as a final (alone, more repeats) re-measurement."""
    return replace(measurement, extra={**measurement.extra, "phase": "final"})
