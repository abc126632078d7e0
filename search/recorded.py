"""A runner through tuning records: reuse what is recorded, record what is measured.

    runner = RecordedRunner(create_runner(target, isolated=True), RecordStore(db_path),
                            target.fingerprint())
    m = runner.measure(workload, spec)                     # recorded, or measured and recorded
    for index, m, fresh in runner.iter_batch(workload, specs, deadline): ...  # as they arrive
    winner = runner.finalize(workload, k=3)                # top-k re-measured once, recorded
    with runner.side_by_side():                            # the planner's last pass
        measurements = runner.run(workload, finalists)     # in "plan" records only
    runner.measured, runner.reused                          # what this run measured / reused

A candidate is looked up in the `Database` (same workload key, target
fingerprint, implementation and config; its latest record, a final
re-measurement when it has one); a hit is returned as a `Measurement` (with
`extra["from_record"]`) and nothing runs. A miss is measured by the inner
runner and committed (fsynced) before `measure` returns (`run` and
`iter_batch` commit each as the inner runner's `stream` hands it over, so
measurements from the nodes of a cluster land as they arrive), so a build
killed at any point resumes from its last completed measurement, and a rebuild
from complete records measures nothing. Failed measurements (crash, timeout, wrong
answer) are records too and are not retried.

`finalize` re-measures the `k` fastest search records of the workload alone
with more repeats and records them in the final phase; a candidate that
already has a final record is not re-measured, so the winner of a rebuild is
the same as the first build's.

`side_by_side` is the planner's last pass of a tuned build: inside it, `run`
reuses only records of that pass (phase "plan") and measures the rest of a
workload's finalists together, one after the other, recording them in that
phase. Records taken minutes apart while searching carry that window's load
(a 2-core machine with anything else running measures a 2-thread kernel at
half speed), so the finalists are compared in one window, and a rebuild still
measures nothing. Seeds derive from (seed, workload key,
candidate), so the inputs a candidate is verified on do not depend on the
order of the search.

A request under an explicit tolerance (`MeasureOptions.tolerance`: the planner's second
pass over a node whose result onnxruntime's own kernel misses the default tolerance by a
rounding-sized error) reuses and records only phase "tolerance" records of that same
tolerance (`extra["tolerance"]`); the search's and the last pass's records never answer
it, and its records never answer them.

A last pass measured while something else holds the cores is not kept as if it were
true: when the fastest of a workload's fresh last-pass measurements reads `CONTENDED`
times or more the fastest search record of the same candidates (a 2-core machine running
a test suite beside the build read 40-130 us kernels at 1.5-1.9 ms), the finalists are
measured again after a pause, up to `RETRIES` times (not once a workload of the build
stayed slow: the machine is busy); if they are still that slow, they
are recorded with `extra["contended"]` (the slowdown), a rebuild measures them again
instead of reusing them, and `contended` lists the workloads for the build's summary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from wpk.core.workload import Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.target import TargetFingerprint
from wpk.search.measure import Measurement
from wpk.search.records import (
    FINAL,
    PLAN,
    SEARCH,
    TOLERANCE,
    Database,
    TuningRecord,
    top_records,
)
from wpk.search.runner import (
    INTERLEAVED_ROUNDS,
    AnyCandidate,
    Runner,
    final_phase,
    measurement_seed,
)
from wpk.search.workers import MeasureOptions

# A last pass whose fastest fresh measurement reads this many times the fastest search
# record of the same candidates ran while something else held the cores ...
CONTENDED = 3.0
# ... and is measured again after a pause of this long, up to this many times (none once a
# workload of the build stayed that slow: the machine is busy, waiting costs more)
CONTENDED_PAUSE_S = 2.0
RETRIES = 2
# Search records shorter than this are not compared: a few microseconds' kernel reads 3x
# from the timer and a preemption alone
CONTENDED_FLOOR_S = 20e-6


class RecordedRunner(Runner):
    """`runner`'s measurements through `database` for targets of `fingerprint` (module
    docstring)."""

    def __init__(self, runner: Runner, database: Database, fingerprint: TargetFingerprint):
        super().__init__(runner.options, runner.seed)
        self.runner = runner
        self.database = database
        self.fingerprint = fingerprint
        self.concurrent = runner.concurrent
        self.steady = runner.steady
        self.compiles = runner.compiles
        self.measured = 0   # measurements this run made (each committed)
        self.reused = 0     # measurements taken from the database instead
        self.phase = SEARCH  # what `run` and `measure` record (PLAN in `side_by_side`)
        self.contended: list[str] = []   # workload keys whose last pass stayed slow

    @contextmanager
    def side_by_side(self):
        """Inside: `run` reuses only the planner's last-pass records and records what it
        measures in that phase (module docstring)."""
        self.phase = PLAN
        try:
            yield self
        finally:
            self.phase = SEARCH

    def _reusable(self, workload: Workload, candidate: AnyCandidate,
                  options: MeasureOptions | None = None) -> TuningRecord | None:
        """The record `run` and `measure` reuse: the search's while searching, only one of
        the planner's last pass inside `side_by_side`; under an explicit tolerance, only a
        record measured under the same one."""
        tolerance = self._tolerance(options)
        if tolerance is not None:
            record = self.lookup(workload, candidate, TOLERANCE)
            return (record if record is not None and record.extra.get("tolerance") == tolerance
                    else None)
        if self.phase == PLAN:
            record = self.lookup(workload, candidate, PLAN)
            return None if record is None or record.extra.get("contended") else record
        return self.searched(workload, candidate)

    def searched(self, workload: Workload, candidate: AnyCandidate) -> TuningRecord | None:
        """The candidate's record as the search sees it: its final re-measurement, else its
        search measurement. The planner's last-pass records are not part of it, so a rebuild
        searches through the same measurements as the first build."""
        return self.lookup(workload, candidate, FINAL) or self.lookup(workload, candidate, SEARCH)

    def lookup(self, workload: Workload, candidate: AnyCandidate,
               phase: str | None = SEARCH) -> TuningRecord | None:
        """The recorded measurement of a candidate (in `phase`; any with None), or None."""
        spec = CandidateSpec.of(candidate)
        return self.database.lookup(workload.key, self.fingerprint, spec.impl, spec.config,
                                    phase)

    def _tolerance(self, options: MeasureOptions | None) -> float | None:
        """The explicit tolerance of a request (None: each output dtype's default)."""
        return (options or self.options).tolerance

    def _reuse(self, record: TuningRecord) -> Measurement:
        self.reused += 1
        return record.to_measurement()

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        """The candidate's latest record (its final one when re-measured), or a fresh
        measurement, then recorded."""
        record = self._reusable(workload, candidate, options)
        if record is not None:
            return self._reuse(record)
        spec = CandidateSpec.of(candidate)
        measurement = self.runner.measure(workload, spec, options, seed)
        self._record_under(workload, spec.modules, measurement, options)
        return measurement

    def _recorded(self, workload: Workload, candidates: Sequence[AnyCandidate],
                  options: MeasureOptions | None = None
                  ) -> tuple[list[CandidateSpec], list[Measurement | None], list[int]]:
        """(specs, the reusable records' measurements or None, the indices to measure)."""
        specs = [CandidateSpec.of(c) for c in candidates]
        found = [self._reusable(workload, s, options) for s in specs]
        results = [None if record is None else self._reuse(record) for record in found]
        return specs, results, [i for i, record in enumerate(found) if record is None]

    def run(self, workload: Workload, candidates: Sequence[AnyCandidate],
            options: MeasureOptions | None = None) -> list[Measurement]:
        """Recorded measurements where there are; the rest measured by the inner runner
        (together on a concurrent one, recorded after; else committed one by one as they
        arrive, `Runner.stream`)."""
        specs, results, missing = self._recorded(workload, candidates, options)
        if missing and self.concurrent:
            for index, measurement in zip(missing, self.runner.run(
                    workload, [specs[i] for i in missing], options)):
                self._record_under(workload, specs[index].modules, measurement, options)
                results[index] = measurement
        elif missing:
            for index, measurement in self._stream(workload, specs, missing, options):
                results[index] = measurement
        return results  # type: ignore[return-value]

    def run_interleaved(self, workload: Workload, candidates: Sequence[AnyCandidate],
                        options: MeasureOptions | None = None,
                        rounds: int = INTERLEAVED_ROUNDS) -> list[Measurement]:
        """Recorded measurements where there are; the rest measured in interleaved rounds
        by the inner runner (`Runner.run_interleaved`), each pooled one recorded."""
        specs, results, missing = self._recorded(workload, candidates, options)
        if missing:
            chosen = [specs[i] for i in missing]
            for index, measurement in zip(missing, self._uncontended(
                    workload, chosen, lambda: self.runner.run_interleaved(
                        workload, chosen, options, rounds))):
                self._record_under(workload, specs[index].modules, measurement, options)
                results[index] = measurement
        return results  # type: ignore[return-value]

    def _uncontended(self, workload: Workload, specs: Sequence[CandidateSpec],
                     measure) -> list[Measurement]:
        """`measure()`'s measurements of `specs`; in the last pass measured again after a
        pause while they read `CONTENDED` times their search records or more, and marked
        `contended` when they still do after `RETRIES` tries (module docstring)."""
        found = measure()
        if self.phase != PLAN:
            return found
        slowdown = self.slowdown(workload, specs, found)
        retries = 0 if self.contended else RETRIES
        while slowdown >= CONTENDED and retries:
            time.sleep(CONTENDED_PAUSE_S)
            found = measure()
            slowdown, retries = self.slowdown(workload, specs, found), retries - 1
        if slowdown < CONTENDED:
            return found
        self.contended.append(workload.key)
        return [replace(m, extra={**m.extra, "contended": round(slowdown, 2)}) for m in found]

    def slowdown(self, workload: Workload, specs: Sequence[CandidateSpec],
                 found: Sequence[Measurement]) -> float:
        """The fastest verified of `found` over the fastest search record (final or search
        phase, at least `CONTENDED_FLOOR_S`) of the same candidates; 0 when there is
        nothing to compare."""
        fresh, recorded = [], []
        for spec, measurement in zip(specs, found):
            record = self.searched(workload, spec)
            if measurement.ok and record is not None and record.ok \
                    and record.median_s >= CONTENDED_FLOOR_S:
                fresh.append(measurement.median_s)
                recorded.append(record.median_s)
        return min(fresh) / min(recorded) if fresh else 0.0

    def _stream(self, workload: Workload, specs: Sequence[CandidateSpec],
                missing: Sequence[int], options: MeasureOptions | None = None,
                deadline: float | None = None) -> Iterator[tuple[int, Measurement]]:
        """(index in `specs`, measurement) of the `missing` candidates as the inner runner
        streams them, each committed before it is handed on."""
        chosen = [specs[i] for i in missing]
        for position, measurement in self.runner.stream(workload, chosen, options, deadline):
            index = missing[position]
            self._record_under(workload, specs[index].modules, measurement, options)
            yield index, measurement

    def iter_batch(self, workload: Workload, specs: Sequence[CandidateSpec],
                   deadline: float | None = None) -> Iterator[tuple[int, Measurement, int]]:
        """(index in `specs`, measurement, how many fresh measurements it took) for a tuner's
        batch, in the batch's order: recorded ones as they come, the rest measured by the
        inner runner's `stream` (one at a time, or on every node of a cluster at once) and
        committed as they arrive, then handed on in order, so a tuner sees the same sequence
        however they arrived. None starts after the `time.monotonic()` `deadline` once one
        is done; what was recorded or measured by then is handed on, in order. On a
        concurrent runner, the unrecorded ones are measured together."""
        if self.concurrent:
            for index, measurement in enumerate(self.run(workload, specs)):
                yield index, measurement, int(not measurement.extra.get("from_record"))
            return
        found = [self.searched(workload, spec) for spec in specs]
        missing = [index for index, record in enumerate(found) if record is None]
        arrivals = self._stream(workload, specs, missing, deadline=deadline)
        arrived: dict[int, Measurement] = {}
        for index, record in enumerate(found):
            if record is not None:
                yield index, self._reuse(record), 0
                continue
            while index not in arrived:
                got = next(arrivals, None)
                if got is None:   # the deadline ended the stream: this one was not measured
                    break
                arrived[got[0]] = got[1]
            if index in arrived:
                yield index, arrived.pop(index), 1

    def _record_under(self, workload: Workload, modules: Sequence[str],
                      measurement: Measurement, options: MeasureOptions | None) -> None:
        """Record a measurement made under `options`: in the current phase, or under an
        explicit tolerance in phase TOLERANCE with that tolerance."""
        tolerance = self._tolerance(options)
        phase = self.phase if tolerance is None else TOLERANCE
        self._record(workload, modules, measurement, phase, tolerance)

    def _record(self, workload: Workload, modules: Sequence[str], measurement: Measurement,
                phase: str, tolerance: float | None = None) -> None:
        extra = {**measurement.extra, "modules": list(modules)}
        if tolerance is not None:
            extra["tolerance"] = tolerance
        self.database.commit(TuningRecord.from_measurement(
            replace(measurement, extra=extra), workload, self.fingerprint, phase=phase))
        self.measured += 1

    def finalize(self, workload: Workload, k: int = 3, factor: int = 3) -> Measurement | None:
        """Re-measure the top `k` search records alone with `factor` times the repeats
        (unless already done) and return the winner (`best`), or None when nothing
        verified."""
        search = [r for r in self.database.records(workload.key, self.fingerprint)
                  if r.phase == SEARCH and r.ok]
        latest = {r.identity: r for r in search}
        top = sorted(latest.values(), key=lambda r: r.median_s)[:k]
        options = self.options.scaled(factor)
        for record in top:
            if self.lookup(workload, CandidateSpec(record.impl, record.config),
                           FINAL) is not None:
                continue
            modules = tuple(record.extra.get("modules", ()))
            spec = CandidateSpec(record.impl, dict(record.config), modules)
            seed = measurement_seed(self.seed + 1, workload.key)
            fresh = final_phase(self.runner.measure(workload, spec, options, seed))
            self._record(workload, modules, fresh, FINAL)
        best = self.best(workload)
        return None if best is None else best.to_measurement()

    def best(self, workload: Workload, impl: str | None = None) -> TuningRecord | None:
        """The winning record of the workload (of `impl`): the best of those re-measured
        alone (final phase) when there are any, since the re-measurement decides among the
        top candidates; else the best record."""
        found = [r for r in self.database.records(workload.key, self.fingerprint)
                 if (impl is None or r.impl == impl) and r.phase in (SEARCH, FINAL)]
        final = top_records([r for r in found if r.phase == FINAL])
        best = final or top_records(found)
        return best[0] if best else None

    @property
    def slots(self) -> int:
        return self.runner.slots

    def summary(self) -> dict | None:
        return self.runner.summary()

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        self.runner.prefetch(workload, [c for c in candidates
                                        if self._reusable(workload, c) is None])

    def close(self) -> None:
        self.runner.close()
