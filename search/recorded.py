"""Measuring through tuning records: reuse what is recorded, record what is measured.

    store = RecordStore(db_path)
    measurer = RecordedMeasurer(store, target_fingerprint(), worker=MeasureWorker())
    for config in tuner.next_batch(8):
        m = measurer.measure(workload, CandidateSpec("dsl.gemm", config, modules=(...)))
    winner = measurer.finalize(workload, k=3)      # top-k re-measured once, then recorded
    plan(..., measure=measurer.planner_measure)    # the planner's measurements, recorded
    measurer.measured, measurer.reused              # what this run measured / took from records

`measure` looks the candidate up in the store (same workload key, target
fingerprint, implementation and config, search phase); a hit is returned as a
`Measurement` (with `extra["from_record"]`) and nothing runs. A miss is measured
in the isolated worker and appended (fsynced) before `measure` returns, so a
build killed at any point resumes from its last completed measurement, and a
rebuild from complete records measures nothing. Failed measurements (crash,
timeout, wrong answer) are records too and are not retried.

`finalize` re-measures the `k` fastest search records of the workload alone
with more repeats (`remeasure_top`), records them in the final phase, and
returns the store's best; a candidate that already has a final record is not
re-measured, so the winner of a rebuild is the same as the first build's.
Each measurement's seed derives from (seed, workload key, candidate), so the
inputs a candidate is verified on do not depend on the order of the search.

What "measure" means is pluggable: by default the CPU `MeasureWorker`; a
`measure_fn(workload, spec, options, seed)` replaces it (the CUDA measurement in
the worker, `measure_isolated_cuda`, or the offline build's analytical
prediction). `iter_batch` measures a tuner's batch: one at a time, or, with a
`batch_fn(workload, specs, options, seeds)` (`--parallel-measure`), the
unrecorded ones together.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from wpk.core.workload import Workload
from wpk.kernels.registry import Candidate
from wpk.search.measure import Measurement
from wpk.search.records import (
    FINAL,
    SEARCH,
    RecordStore,
    TargetFingerprint,
    TuningRecord,
    config_key,
)
from wpk.search.workers import (
    CandidateSpec,
    MeasureOptions,
    MeasureWorker,
    default_worker,
    remeasure_top,
)


def candidate_seed(seed: int, workload_key: str, impl: str, config: dict) -> int:
    """A 32-bit seed for one candidate's measurement, independent of search order."""
    text = f"{seed}|{workload_key}|{impl}|{config_key(config)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


MeasureFn = Callable[[Workload, CandidateSpec, "MeasureOptions | None", int], Measurement]
BatchFn = Callable[[Workload, Sequence[CandidateSpec], "MeasureOptions | None",
                    Sequence[int]], list[Measurement]]


class RecordedMeasurer:
    """Measurements of candidates on one target, through a `RecordStore` (`measure_fn` and
    `batch_fn`: see the module docstring)."""

    def __init__(self, store: RecordStore, fingerprint: TargetFingerprint, *,
                 worker: MeasureWorker | None = None, options: MeasureOptions | None = None,
                 seed: int = 0, measure_fn: MeasureFn | None = None,
                 batch_fn: BatchFn | None = None):
        self.store = store
        self.fingerprint = fingerprint
        self.worker = worker
        self.options = options
        self.seed = seed
        self.measure_fn = measure_fn
        self.batch_fn = batch_fn
        self.measured = 0   # measurements this run made (each appended to the store)
        self.reused = 0     # measurements taken from the store instead

    def _worker(self) -> MeasureWorker:
        if self.worker is None:
            self.worker = default_worker()
        return self.worker

    def lookup(self, workload: Workload, candidate: Candidate | CandidateSpec,
               phase: str = SEARCH) -> TuningRecord | None:
        """The recorded measurement of a candidate, or None."""
        spec = CandidateSpec.of(candidate)
        return self.store.lookup(workload.key, self.fingerprint, spec.impl, spec.config, phase)

    def measure(self, workload: Workload, candidate: Candidate | CandidateSpec) -> Measurement:
        """The candidate's recorded measurement, or a fresh one (then recorded)."""
        spec = CandidateSpec.of(candidate)
        record = self.lookup(workload, spec)
        if record is not None:
            self.reused += 1
            return record.to_measurement()
        seed = candidate_seed(self.seed, workload.key, spec.impl, dict(spec.config))
        measurement = self._measure_one(workload, spec, self.options, seed)
        self._record(workload, spec.modules, measurement, SEARCH)
        return measurement

    def _measure_one(self, workload: Workload, spec: CandidateSpec,
                     options: MeasureOptions | None, seed: int) -> Measurement:
        if self.measure_fn is not None:
            return self.measure_fn(workload, spec, options, seed)
        return self._worker().measure(workload, spec, options, seed=seed)

    def iter_batch(self, workload: Workload, specs: Sequence[CandidateSpec],
                   deadline: float | None = None) -> Iterator[tuple[int, Measurement, int]]:
        """(index in `specs`, measurement, how many fresh measurements it took) for a tuner's
        batch. One at a time, stopping at the `time.monotonic()` `deadline` once at least
        one is done; with `batch_fn`, the unrecorded ones are measured together first."""
        if self.batch_fn is None:
            for index, spec in enumerate(specs):
                if index and deadline is not None and time.monotonic() >= deadline:
                    return
                before = self.measured
                measurement = self.measure(workload, spec)
                yield index, measurement, self.measured - before
            return
        found = {i: self.lookup(workload, s) for i, s in enumerate(specs)}
        missing = [i for i, record in found.items() if record is None]
        fresh: dict[int, Measurement] = {}
        if missing:
            seeds = [candidate_seed(self.seed, workload.key, specs[i].impl,
                                    dict(specs[i].config)) for i in missing]
            batch = self.batch_fn(workload, [specs[i] for i in missing], self.options, seeds)
            for i, measurement in zip(missing, batch):
                self._record(workload, specs[i].modules, measurement, SEARCH)
                fresh[i] = measurement
        for index, record in found.items():
            if record is not None:
                self.reused += 1
                yield index, record.to_measurement(), 0
            else:
                yield index, fresh[index], 1

    def planner_measure(self, workload: Workload, candidate: Candidate, *, rng=None,
                        warmup: int = 2, repeats: int = 5, max_repeats: int = 50,
                        min_time: float = 0.05, tolerance: float | None = None,
                        timeout: float | None = None) -> Measurement:
        """`measure` with the signature of `wpk.search.measure.measure_candidate`, so the
        planner can take it as its `measure=` (`rng` is unused: seeds derive from the
        candidate; `timeout` limits one kernel run, as in-process)."""
        original = self.options
        self.options = replace(original or MeasureOptions(), warmup=warmup, repeats=repeats,
                               max_repeats=max_repeats, min_time=min_time, tolerance=tolerance,
                               run_timeout_s=timeout)
        try:
            return self.measure(workload, candidate)
        finally:
            self.options = original

    def measure_many(self, workload: Workload,
                     candidates: Iterable[Candidate | CandidateSpec]) -> list[Measurement]:
        """`measure` each candidate in turn."""
        return [self.measure(workload, c) for c in candidates]

    def _record(self, workload: Workload, modules: Sequence[str], measurement: Measurement,
                phase: str) -> None:
        extra = {**measurement.extra, "modules": list(modules)}
        self.store.append(TuningRecord.from_measurement(
            replace(measurement, extra=extra), workload, self.fingerprint, phase=phase))
        self.measured += 1

    def finalize(self, workload: Workload, k: int = 3, factor: int = 3) -> Measurement | None:
        """Re-measure the top `k` search records alone (unless already done) and return the
        winner: the store's best for the workload, or None when nothing verified."""
        search = [r for r in self.store.for_workload(workload.key, self.fingerprint)
                  if r.phase == SEARCH and r.ok]
        latest = {r.identity: r for r in search}
        top = sorted(latest.values(), key=lambda r: r.median_s)[:k]
        for record in top:
            if self.store.lookup(workload.key, self.fingerprint, record.impl, record.config,
                                 FINAL) is not None:
                continue
            modules = tuple(record.extra.get("modules", ()))
            seed = candidate_seed(self.seed + 1, workload.key, record.impl, dict(record.config))
            if self.measure_fn is None:
                (fresh,) = remeasure_top(workload, [record.to_measurement()], k=1,
                                         modules=modules, options=self.options, factor=factor,
                                         seed=seed, worker=self._worker())
            else:  # alone, with `factor` times the repeats, as `remeasure_top` does
                base = self.options or (self.worker.options if self.worker else None)
                options = (base or MeasureOptions()).scaled(factor)
                fresh = self.measure_fn(workload, CandidateSpec(record.impl, dict(record.config),
                                                                modules), options, seed)
                fresh = replace(fresh, extra={**fresh.extra, "phase": FINAL})
            self._record(workload, modules, fresh, FINAL)
        best = self.store.best(workload.key, self.fingerprint)
        return None if best is None else best.to_measurement()
