"""The search driver: tune the generated kernels of workloads and hand the winners on.

    result = tune_workload(workload, "ga", trials=64, deadline=None, runner=runner,
                           generated=target.generated, compile_pool=pool,
                           reference_time=vendor_s, seed=0)
    results = tune_model(items, TuneOptions("ga", trials=32, budget_s=900), vendor_times,
                         runner=runner, generated=target.generated, compile_pool=pool)
    extra = generated_candidates(results, target.generated)   # the winners, for the planner

One workload is tuned in a loop: the tuner proposes a batch; invalid points
are rejected by the template's `validate` inside the tuner (penalised, never
compiled); an optional cost model keeps the predicted best of a larger pool;
the batch's configs not yet in the records are compiled in parallel in the
`CompilePool` (a runner that `compiles` itself, on a cluster, needs none);
each is verified and timed in the isolated worker through the
`RecordedRunner` (a recorded config is reused, not measured; on a cluster,
every node measures one at a time and the results arrive as they are done);
the costs go back to the tuner. The loop ends at `trials` measured configs, at the
deadline, when the tuner has nothing left, or early when the best has not
improved by more than 1% during the last `patience` trials. The `k` fastest
records of the workload (generated and vendor alike) are then re-measured
alone with more repeats before the winner is chosen (`RecordedRunner.finalize`).

`tune_model` spends `--budget` on the workloads with the largest share of the
model latency first (`wpk.search.budget`) with at most `--trials` each; on a
runner with several measuring slots (the nodes of a cluster) a tuner's batch
is whole rounds of them, and a budget-only search allows that many times the
default trials, since the budget is wall time. It shows per workload the
trials, the best time so far (it never rises), the re-measured winner, the
speed-up over the vendor kernel and why its search ended (`STOP_REASONS`), as
a rich table on a terminal.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from wpk.core.errors import OptionError, WpkError
from wpk.core.workload import Workload
from wpk.kernels.generated import map_workload
from wpk.kernels.registry import Candidate
from wpk.kernels.target import GeneratedKernels
from wpk.search.budget import EarlyStop, ShareEntry, shares, split_trials, time_slice
from wpk.search.measure import Measurement
from wpk.search.recorded import RecordedRunner
from wpk.search.space import SearchSpace
from wpk.search.tuners import make_tuner

DEFAULT_TRIALS = 32
DEFAULT_BUDGET_TRIALS = 64   # per workload when only --budget limits the search

ProgressFn = Callable[["TuneResult"], None]


# Why a workload's search ended (`TuneResult.stopped`), how a person reads it, and the
# shorter words for a result that does not know its limits.
STOP_REASONS = {
    "trials": ("reached its trial limit ({trials})", "reached its trial limit"),
    "deadline": ("its share of the time budget ran out",) * 2,
    "converged": ("converged: no gain above {min_gain:.0%} in the last {patience} trials",
                  "converged: the best stopped improving"),
    "exhausted": ("the tuner had no untried config left",) * 2,
    "budget": ("the time budget was spent before its turn: not tuned",) * 2,
    "unsupported": ("not tunable on this target",) * 2,
    "": ("tuning",) * 2,
}


@dataclass
class TuneResult:
    """What tuning one workload's generated kernel found.

    `best_s` is the best time the search measured so far (it never rises); after the
    search the fastest records are re-measured alone (`finalize`), the winner's config
    becomes `best_config` and its re-measured time `final_s`."""

    workload: Workload
    tuner: str
    best_config: dict | None = None
    impl: str = ""            # the generated family tuned (its implementation name)
    best_s: float = math.inf
    reference_s: float | None = None
    trials: int = 0           # measured configs (fresh or from the records)
    measured: int = 0         # of those, measured in this run
    invalid: int = 0          # rejected by validate (never compiled)
    failed: int = 0           # compile errors, crashes, wrong answers, timeouts
    history: list[tuple[dict, float]] = field(default_factory=list)
    stopped: str = ""         # a key of STOP_REASONS
    seconds: float = 0.0
    final: Measurement | None = None   # the workload's winner after re-measurement
    final_s: float | None = None       # the generated winner's re-measured time
    limits: dict = field(default_factory=dict)   # trials, patience, min_gain
    detail: str = ""          # what made it unsupported

    @property
    def speedup(self) -> float | None:
        """Vendor time over the generated kernel's (re-measured when it was; > 1: generated
        is faster)."""
        best = self.final_s if self.final_s is not None else self.best_s
        if self.reference_s is None or not math.isfinite(best) or best <= 0:
            return None
        return self.reference_s / best

    @property
    def stopped_text(self) -> str:
        """Why the search ended, in words (STOP_REASONS with this search's limits)."""
        detailed, plain = STOP_REASONS.get(self.stopped, (self.stopped,) * 2)
        try:
            text = detailed.format(**self.limits)
        except KeyError:
            text = plain
        return f"{text}: {self.detail}" if self.detail else text

    def to_json(self) -> dict:
        finite = (lambda v: v if v is not None and math.isfinite(v) else None)  # noqa: E731
        return {"key": self.workload.key, "label": self.workload.label, "tuner": self.tuner,
                "impl": self.impl,
                "best_config": self.best_config, "best_s": finite(self.best_s),
                "final_s": finite(self.final_s),
                "reference_s": finite(self.reference_s), "speedup": self.speedup,
                "trials": self.trials, "measured": self.measured, "invalid": self.invalid,
                "failed": self.failed, "stopped": self.stopped,
                "stopped_text": self.stopped_text, "seconds": self.seconds,
                "history": [finite(cost) for _, cost in self.history],
                "winner": None if self.final is None else self.final.label}


def _compile(pool, workload: Workload, configs: Sequence[dict], runner: RecordedRunner,
             generated: GeneratedKernels) -> None:
    """Fill the compile cache for the configs that the records do not hold yet (`pool` is a
    `CompilePool`, or anything with `compile(jobs)`)."""
    if pool is None:
        return
    todo = [c for c in configs if runner.lookup(workload, generated.spec(c)) is None]
    if todo:
        pool.compile(generated.compile_jobs(workload, todo))


def tune_workload(workload: Workload, tuner_name: str = "ga", *, trials: int = DEFAULT_TRIALS,
                  deadline: float | None = None, runner: RecordedRunner,
                  generated: GeneratedKernels, compile_pool=None,
                  reference_time: float | None = None, seed: int = 0,
                  on_progress: ProgressFn | None = None, batch_size: int = 8,
                  patience: int = 16, min_gain: float = 0.01, cost_model: bool = False,
                  finalize_k: int = 3,
                  tuner_options: Mapping[str, Any] | None = None) -> TuneResult:
    """Search the schedule space of the workload's kernel in `generated` (a target's
    generated kernels; see the module docstring); `deadline` is a `time.monotonic()`
    value. Returns the best config found."""
    if trials < 1:
        raise OptionError(f"--trials must be at least 1, got {trials}")
    started = time.monotonic()
    result = TuneResult(workload, tuner_name, impl=generated.impl, reference_s=reference_time,
                        limits={"trials": trials, "patience": patience, "min_gain": min_gain})
    space = SearchSpace.from_template(generated.template(workload), name=workload.label)
    tuner = make_tuner(tuner_name, space, seed, **dict(tuner_options or {}))
    if cost_model:  # on demand: scikit-learn takes seconds to import, and only this uses it
        from wpk.search.cost_model import CostModelFilter

        tuner = CostModelFilter(tuner)
    stopper = EarlyStop(patience=patience, min_gain=min_gain)
    result.stopped = "exhausted"
    while tuner.has_next():
        if result.trials >= trials:
            result.stopped = "trials"
            break
        if deadline is not None and time.monotonic() >= deadline:
            result.stopped = "deadline"
            break
        configs = tuner.next_batch(min(batch_size, trials - result.trials))
        if not configs:
            break
        _compile(compile_pool, workload, configs, runner, generated)
        done, costs = [], []
        specs = [generated.spec(config) for config in configs]
        for index, m, fresh in runner.iter_batch(workload, specs, deadline):
            config = configs[index]
            result.measured += fresh
            cost = m.median_s if m.ok else None
            done.append(config)
            costs.append(cost)
            result.trials += 1
            result.failed += 0 if m.ok else 1
            result.history.append((dict(config), math.inf if cost is None else cost))
            if cost is not None and cost < result.best_s:
                result.best_s, result.best_config = cost, dict(config)
            if stopper.observe(cost):
                break
        tuner.update(done, costs)
        if on_progress:
            on_progress(result)
        if stopper.stopped:
            result.stopped = "converged"
            break
    if result.stopped == "exhausted" and result.trials >= trials:
        result.stopped = "trials"  # the last batch reached the limit as the space ran out
    result.invalid = sum(1 for t in tuner.history if t.status == "invalid")
    if finalize_k > 0 and result.best_config is not None:
        result.final = runner.finalize(workload, k=finalize_k)
        best = best_generated(runner, workload, generated.impl)
        if best is not None:  # the re-measured winner; best_s stays the search's best
            result.best_config, result.final_s = dict(best.config), best.median_s
    result.seconds = time.monotonic() - started
    if on_progress:
        on_progress(result)
    return result


def best_generated(runner: RecordedRunner, workload: Workload, impl: str):
    """The winning record of implementation `impl` of the workload (`RecordedRunner.best`:
    the re-measured ones decide), or None."""
    return runner.best(workload, impl)


# ----------------------------------------------------------------------------- a whole model
@dataclass(frozen=True)
class TuneOptions:
    """How `tune_model` searches: tuner, trials per workload, seconds for all of them."""

    tuner: str = "ga"
    trials: int | None = None
    budget_s: float | None = None
    seed: int = 0
    batch_size: int = 8
    patience: int = 16
    min_gain: float = 0.01
    finalize_k: int = 3
    cost_model: bool = False
    min_slice_s: float = 5.0

    @property
    def trials_per_workload(self) -> int:
        return self.trials_for(1)

    def trials_for(self, slots: int) -> int:
        """Trials per workload: `trials`, else under a budget `DEFAULT_BUDGET_TRIALS` per
        measuring slot (the budget is wall time, so more slots afford more trials), else
        `DEFAULT_TRIALS`."""
        if self.trials is not None:
            return self.trials
        if self.budget_s is not None:
            return DEFAULT_BUDGET_TRIALS * max(1, slots)
        return DEFAULT_TRIALS

    def batch_for(self, slots: int) -> int:
        """A tuner's batch on a runner measuring `slots` candidates at once (the nodes of a
        cluster): whole rounds of `slots`, at least `batch_size`."""
        slots = max(1, slots)
        return slots * math.ceil(self.batch_size / slots)


def tunable(items: Sequence, family: GeneratedKernels | None = None
            ) -> dict[str, tuple[Workload, int]]:
    """Distinct workloads (by key, graph order) that `family` tunes (default: those that map
    to a DSL kernel), with their node counts."""
    supports = family.supports if family is not None else (
        lambda w: not isinstance(map_workload(w), str))
    found: dict[str, tuple[Workload, int]] = {}
    for item in items:
        w = item.workload
        if w.key in found:
            found[w.key] = (w, found[w.key][1] + 1)
        elif supports(w):
            found[w.key] = (w, 1)
    return found


@dataclass(frozen=True)
class Search:
    """One search of `tune_families`: a family on a workload, with its budget share and its
    part of the workload's trials (`part` of `parts`: the families that tune it)."""

    family: GeneratedKernels
    workload: Workload
    vendor_s: float
    share: float
    part: int = 0
    parts: int = 1

    def trials(self, total: int) -> int:
        """This search's trials of the workload's `total` (`split_trials`)."""
        return split_trials(total, self.parts)[self.part]


def search_order(items: Sequence, families: Sequence[GeneratedKernels],
                 vendor_times: Mapping[str, float]) -> list[Search]:
    """The searches in the order they run: workloads by share of the model latency (graph
    order on ties), each workload's families in `families` order; a workload's share and
    its trials are split evenly among the families that tune it."""
    per_family = [tunable(items, family) for family in families]
    workloads: dict[str, tuple[Workload, int]] = {}
    for found in per_family:
        workloads.update(found)
    graph = {key: index for index, key in enumerate(
        dict.fromkeys(item.workload.key for item in items))}
    entries = [ShareEntry(k, float(vendor_times.get(k, math.nan)), n)
               for k, (_, n) in workloads.items()]
    fraction = shares(entries)
    latency = {e.key: e.latency_s for e in entries}
    tuners = {k: sum(k in found for found in per_family) for k in workloads}
    part = {k: [i for i, found in enumerate(per_family) if k in found] for k in workloads}
    jobs = [(-latency[k], graph[k], index, Search(family, w, float(vendor_times.get(k, math.nan)),
                                                fraction[k] / tuners[k], part[k].index(index),
                                                tuners[k]))
            for index, (family, found) in enumerate(zip(families, per_family))
            for k, (w, _) in found.items()]
    return [job for *_, job in sorted(jobs, key=lambda j: j[:3])]


def tune_model(items: Sequence, options: TuneOptions, vendor_times: Mapping[str, float], *,
               runner: RecordedRunner, generated: GeneratedKernels, compile_pool=None,
               progress: bool = False, deadline: float | None = None, stream=None
               ) -> dict[str, TuneResult]:
    """Tune every tunable workload of `items` (NodeWorkloads) in one generated family
    (`generated`): `tune_families` with that family alone, by workload key."""
    return tune_families(items, options, vendor_times, runner=runner, families=(generated,),
                         compile_pool=compile_pool, progress=progress, deadline=deadline,
                         stream=stream)[generated.impl]


def tune_families(items: Sequence, options: TuneOptions, vendor_times: Mapping[str, float], *,
                  runner: RecordedRunner, families: Sequence[GeneratedKernels],
                  compile_pool=None, progress: bool = False, deadline: float | None = None,
                  stream=None) -> dict[str, dict[str, TuneResult]]:
    """Tune the workloads of `items` (NodeWorkloads) in every generated family of `families`
    that supports them (`GeneratedKernels.supports`): `{impl: {workload key: TuneResult}}`,
    graph order. Workloads go largest share of the model latency (`vendor_times[key]` x
    node count) first, within `options.budget_s` seconds (or the absolute monotonic
    `deadline`, whichever is sooner); a workload's share of the time and its trials
    (`options.trials_for`: `--trials`, or the default) are split evenly among its families
    (`split_trials`), so `--trials N` is what the workload gets in all. A workload whose
    template has no space on the target is left untuned (stopped 'unsupported')."""
    jobs = search_order(items, families, vendor_times)
    start = time.monotonic()
    end = deadline
    if options.budget_s is not None:
        end = min(end if end is not None else math.inf, start + options.budget_s)
    results: dict[str, dict[str, TuneResult]] = {f.impl: {} for f in families}
    with TuningDisplay(progress, stream) as display:
        for index, job in enumerate(jobs):
            found = results[job.family.impl]
            key = job.workload.key
            limit = None
            if end is not None:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    found[key] = TuneResult(job.workload, options.tuner, impl=job.family.impl,
                                            reference_s=_finite(job.vendor_s),
                                            stopped="budget")
                    display.update(found[key])
                    continue
                left = sum(j.share for j in jobs[index:])
                limit = time.monotonic() + time_slice(remaining, job.share, left,
                                                      options.min_slice_s)
            found[key] = _tune_job(job, options, runner, compile_pool, limit, display)
    order = list(dict.fromkeys(item.workload.key for item in items))
    return {impl: {k: found[k] for k in order if k in found} for impl, found in results.items()}


def _tune_job(job: Search, options: TuneOptions, runner: RecordedRunner, compile_pool,
              deadline: float | None, display: TuningDisplay) -> TuneResult:
    """One search of `tune_families` (a result stopped 'unsupported' when the family has no
    schedule template for the workload on the target; 'trials', untried, when the workload's
    trials ran out before this family's turn)."""
    trials = job.trials(options.trials_for(runner.slots))
    if trials < 1:
        result = TuneResult(job.workload, options.tuner, impl=job.family.impl,
                            reference_s=_finite(job.vendor_s), stopped="trials",
                            limits={"trials": 0})
        display.update(result)
        return result
    try:
        return tune_workload(
            job.workload, options.tuner, trials=trials,
            deadline=deadline, runner=runner, generated=job.family,
            compile_pool=compile_pool, reference_time=_finite(job.vendor_s),
            seed=options.seed, on_progress=display.update,
            batch_size=options.batch_for(runner.slots), patience=options.patience,
            min_gain=options.min_gain, cost_model=options.cost_model,
            finalize_k=options.finalize_k)
    except OptionError:
        raise
    except WpkError as exc:
        result = TuneResult(job.workload, options.tuner, impl=job.family.impl,
                            reference_s=_finite(job.vendor_s), stopped="unsupported",
                            detail=exc.message)
        display.update(result)
        return result


def _finite(value: float) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# ----------------------------------------------------------------------------- planner glue
def generated_candidates(results: Mapping[str, TuneResult], generated: GeneratedKernels):
    """`(workload) -> [Candidate]`: the best generated kernel of each tuned workload, for
    the planner's second pass."""
    def provide(workload: Workload) -> list[Candidate]:
        found = results.get(workload.key)
        if found is None or found.best_config is None:
            return []
        return [generated.candidate(found.best_config)]
    return provide


def family_candidates(results: Mapping[str, Mapping[str, TuneResult]],
                      families: Sequence[GeneratedKernels]):
    """`(workload) -> [Candidate]`: the best kernel of each tuned workload in every family
    (`results` as `tune_families` gives them), for the planner's second pass."""
    providers = [generated_candidates(results.get(f.impl, {}), f) for f in families]
    return lambda workload: [c for provide in providers for c in provide(workload)]


# ----------------------------------------------------------------------------- display
class TuningDisplay:
    """Per workload: trials, best generated time, vendor time and speed-up (rich, on a
    terminal; silent otherwise)."""

    def __init__(self, enabled: bool = True, stream=None):
        stream = stream if stream is not None else sys.stderr
        self.enabled = bool(enabled) and hasattr(stream, "isatty") and stream.isatty()
        self.stream = stream
        self.rows: dict[tuple[str, str], TuneResult] = {}
        self.live = None

    def __enter__(self) -> TuningDisplay:
        if self.enabled:

            self.live = Live(self.table(), console=Console(file=self.stream),
                             refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self.table())
            self.live.__exit__(*exc)

    def update(self, result: TuneResult) -> None:
        self.rows[(result.impl, result.workload.key)] = result
        if self.live is not None:
            self.live.update(self.table())

    def table(self):
        """The rich Table of the rows so far: names wrap rather than being cut."""
        table = Table(title="tuning generated kernels", expand=False)
        for name, justify in (("workload", "left"), ("kernel", "left"), ("trials", "right"),
                              ("best so far", "right"), ("re-measured", "right"),
                              ("vendor", "right"), ("speed-up", "right"), ("state", "left")):
            table.add_column(name, justify=justify, overflow="fold")
        for r in self.rows.values():
            table.add_row(r.workload.label, r.impl, str(r.trials), _ms(r.best_s), _ms(r.final_s),
                          _ms(r.reference_s), "" if r.speedup is None else f"{r.speedup:.2f}x",
                          r.stopped_text)
        return table


def _ms(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.3f} ms"
