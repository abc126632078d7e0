"""The search driver and budgets: tuning real generated kernels through records.

Every test measures real compiled kernels in the isolated worker; the
records live in tmp_path, so a second run over the same file must measure
nothing and find the same best config.
"""

from __future__ import annotations

import math
import os
import time

import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.generated import DSL_CPU
from wpk.kernels.target import create_target
from wpk.plans.planner import PlanOptions, plan
from wpk.search.budget import EarlyStop, ShareEntry, by_latency_share, shares, time_slice
from wpk.search.compile_pool import CompilePool
from wpk.search.driver import TuneOptions, generated_candidates, tune_model, tune_workload
from wpk.search.recorded import RecordedRunner
from wpk.search.records import FINAL, RecordStore, config_key
from wpk.search.runner import IsolatedRunner
from wpk.search.workers import MeasureOptions, MeasureWorker

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

CPU = create_target("cpu")


def t(*shape: int) -> TensorSpec:
    return TensorSpec(tuple(shape))


DEPTHWISE = Workload("Conv", (t(1, 16, 12, 12), t(16, 1, 3, 3), t(16)), (t(1, 16, 12, 12),),
                     (("group", 16), ("pads", (1, 1, 1, 1))), (EpilogueStep("relu"),),
                     const_inputs=(1, 2))
# A long arithmetic chain: numpy and onnxruntime make one pass over memory per step, the
# generated kernel one pass in all, so the generated kernel is the fastest by a wide margin.
CHAIN = Workload("Elementwise", (t(1, 32, 64, 64), t(32, 1, 1), t(32, 1, 1)),
                 (t(1, 32, 64, 64),), (),
                 (EpilogueStep("mul", operand=1), EpilogueStep("add", operand=2),
                  EpilogueStep("relu"), EpilogueStep("mul", operand=1),
                  EpilogueStep("add", operand=2), EpilogueStep("clip", (("max", 6.0),
                                                                        ("min", 0.0))),
                  EpilogueStep("mul", operand=1), EpilogueStep("sub", operand=2)),
                 domain="wpk")
SOFTMAX = Workload("Softmax", (t(4, 32),), (t(4, 32),), (("axis", -1),))


class Item:
    """A stand-in for a graph NodeWorkload (what the planner and tune_model take)."""

    def __init__(self, name: str, workload: Workload):
        self.node = name
        self.workload = workload


@pytest.fixture(scope="module")
def worker():
    with MeasureWorker(MeasureOptions(warmup=1, repeats=3, min_time=0.005)) as w:
        yield w


@pytest.fixture(scope="module")
def pool():
    with CompilePool(jobs=2) as p:
        yield p


@pytest.fixture(scope="module")
def serial_worker():
    """A worker whose kernels run on one thread. A parallel kernel's barrier waits for a
    descheduled thread when the suite's workers crowd two cores (a 20 us chain then
    measured 1.5 ms, slower than numpy's), so comparing kernels by speed needs one."""
    with MeasureWorker(MeasureOptions(warmup=1, repeats=3, min_time=0.005),
                       env={**os.environ, "OMP_NUM_THREADS": "1"}) as w:
        yield w


def measurer_on(path, worker) -> RecordedRunner:
    return RecordedRunner(IsolatedRunner(options=worker.options, worker=worker),
                          RecordStore(path), CPU.fingerprint())


@pytest.mark.parametrize("tuner", ["random", "ga"])
def test_tuning_finds_a_verified_kernel_within_the_trials(tuner, tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    result = tune_workload(DEPTHWISE, tuner, trials=6, deadline=None, runner=measurer,
                           generated=CPU.generated, compile_pool=pool, seed=1, patience=50,
                           finalize_k=2)
    assert result.trials == 6 and result.stopped == "trials"
    assert result.best_config is not None and math.isfinite(result.best_s)
    # The two fastest search records were re-measured alone, and those re-measurements
    # decide: a logical check, not a timing ratio a busy machine breaks.
    finals = {config_key(r.config): r.median_s for r in measurer.database.records()
              if r.phase == FINAL}
    assert result.final_s == min(finals.values())
    assert finals[config_key(result.best_config)] == result.final_s
    searched = sorted(cost for _, cost in result.history)
    assert result.best_s == searched[0]   # the search's best, never re-measured upwards
    assert {config_key(c) for c, cost in result.history if cost in searched[:2]} == set(finals)
    assert result.failed == 0
    # The two fastest were re-measured alone, and the winner is one of the records.
    finals = [r for r in measurer.database.records() if r.phase == FINAL]
    assert len(finals) == 2
    assert result.final is not None and result.final.ok
    assert measurer.measured == 6 + 2


def test_second_run_over_the_records_measures_nothing(tmp_path, worker, pool):
    path = tmp_path / "r.jsonl"
    first = tune_workload(DEPTHWISE, "ga", trials=5, deadline=None,
                          runner=measurer_on(path, worker), generated=CPU.generated,
                          compile_pool=pool, seed=3)
    again = measurer_on(path, worker)
    second = tune_workload(DEPTHWISE, "ga", trials=5, deadline=None, runner=again,
                           generated=CPU.generated,
                           compile_pool=pool, seed=3)
    assert again.measured == 0 and again.reused >= 5
    assert second.best_config == first.best_config and second.final_s == first.final_s
    assert len(second.history) == len(first.history)


def test_deadline_stops_the_search(tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    result = tune_workload(DEPTHWISE, "random", trials=500, deadline=time.monotonic() - 1,
                           runner=measurer, generated=CPU.generated, compile_pool=pool)
    assert result.stopped == "deadline" and result.trials == 0
    assert measurer.measured == 0 and result.best_config is None


def test_search_stops_early_when_the_best_stops_improving(tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    # No trial can improve on the first by 99%: the search stops after 1 + patience.
    result = tune_workload(DEPTHWISE, "random", trials=40, deadline=None, runner=measurer,
                           generated=CPU.generated, compile_pool=pool, patience=3,
                           min_gain=0.99, finalize_k=0)
    assert result.stopped == "converged" and result.trials == 4


def test_budget_goes_to_the_largest_share_first(tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    items = [Item("a", SOFTMAX), Item("b", DEPTHWISE), Item("c", DEPTHWISE)]
    vendor = {SOFTMAX.key: 1e-5, DEPTHWISE.key: 2e-5}     # depthwise: 2 nodes x 2e-5
    results = tune_model(items, TuneOptions("random", trials=2, finalize_k=0), vendor,
                         runner=measurer, generated=CPU.generated, compile_pool=pool)
    assert list(results) == [SOFTMAX.key, DEPTHWISE.key]          # graph order back
    assert measurer.database.records()[0].workload_key == DEPTHWISE.key   # tuned first
    assert all(r.trials == 2 for r in results.values())
    assert results[DEPTHWISE.key].reference_s == 2e-5


def test_an_exhausted_budget_tunes_nothing_more(tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    results = tune_model([Item("a", SOFTMAX)], TuneOptions("ga", trials=4), {SOFTMAX.key: 1e-5},
                         runner=measurer, generated=CPU.generated, compile_pool=pool,
                         deadline=time.monotonic() - 1)
    assert results[SOFTMAX.key].stopped == "budget" and measurer.measured == 0


def test_planner_picks_the_generated_kernel_when_it_is_fastest(tmp_path, serial_worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", serial_worker)
    items = [Item("chain", CHAIN)]
    options = PlanOptions(repeats=3, min_time=0.01)
    first = plan(items, CPU.candidates, measurer, options)
    library = [m.median_s for m in first[CHAIN.key].measurements
               if m.ok and m.kind != "generated"]  # the untuned build measures dsl.cpu too
    vendor = {CHAIN.key: min(library)}
    results = tune_model(items, TuneOptions("ga", trials=6), vendor, runner=measurer,
                         generated=CPU.generated, compile_pool=pool)
    extra = generated_candidates(results, CPU.generated)
    choices = plan(items, lambda w: [*CPU.candidates(w), *extra(w)], measurer, options)
    choice = choices[CHAIN.key]
    seen = [(m.label, m.status.value, m.median_s) for m in choice.measurements]
    kinds = {m.kind for m in choice.measurements}
    assert "generated" in kinds and kinds & {"library", "vendor"}, seen   # side by side
    assert choice.candidate.implementation is DSL_CPU, seen
    assert results[CHAIN.key].speedup > 1, (results[CHAIN.key], seen)


def test_budget_helpers():
    entries = [ShareEntry("a", 1.0, 1), ShareEntry("b", 1.0, 3), ShareEntry("c", math.nan, 2)]
    assert [e.key for e in by_latency_share(entries)] == ["b", "a", "c"]
    assert shares(entries) == {"a": 0.25, "b": 0.75, "c": 0.0}
    assert time_slice(100.0, 0.25, 1.0) == 25.0
    assert time_slice(100.0, 0.25, 0.5) == 50.0
    assert time_slice(10.0, 0.0, 1.0, minimum_s=3.0) == 3.0
    assert time_slice(0.0, 1.0, 1.0) == 0.0
    stop = EarlyStop(patience=2, min_gain=0.1)
    assert [stop.observe(c) for c in (10.0, 9.5, 8.0, 7.9, None)] == [False, False, False,
                                                                        False, True]


def test_progress_table_shows_trials_best_and_speedup():
    from rich.console import Console

    from wpk.search.driver import TuneResult, TuningDisplay

    display = TuningDisplay(enabled=False)
    display.update(TuneResult(SOFTMAX, "ga", best_config={"vector": 16}, best_s=2e-6,
                              reference_s=5e-6, trials=7, stopped="converged",
                              limits={"trials": 32, "patience": 16, "min_gain": 0.01}))
    console = Console(width=160, record=True)
    console.print(display.table())
    text = console.export_text()
    assert "Softmax 4x32" in text and " 7 " in text and "0.002 ms" in text
    assert "2.50x" in text and "converged: no gain above 1% in the last 16 trials" in text


def test_progress_table_wraps_long_names_instead_of_cutting_them():
    from rich.console import Console

    from wpk.search.driver import TuneResult, TuningDisplay

    long = Workload("Conv", (TensorSpec((1, 512, 7, 7)), TensorSpec((2048, 512, 1, 1))),
                    (TensorSpec((1, 2048, 7, 7)),),
                    epilogue=tuple(EpilogueStep(op) for op in ("relu", "sigmoid", "tanh")))
    display = TuningDisplay(enabled=False)
    display.update(TuneResult(long, "ga", stopped="unsupported",
                              detail="no schedule template for Conv with this epilogue"))
    console = Console(width=80, record=True)
    console.print(display.table())
    text = console.export_text()
    rows = [line.split("\u2502")[1:-1] for line in text.splitlines() if "\u2502" in line]
    column = ["".join("".join(row[i].split()) for row in rows) for i in range(len(rows[0]))]
    assert column[0] == "".join(long.label.split())      # every character, wrapped
    assert column[-1] == "nottunableonthistarget:noscheduletemplateforConvwiththisepilogue"
    assert "\u2026" not in text                           # nothing cut


def test_the_stop_reasons_are_explained():
    from wpk.search.driver import STOP_REASONS, TuneResult

    limits = {"trials": 32, "patience": 16, "min_gain": 0.01}
    texts = {code: TuneResult(SOFTMAX, "ga", stopped=code, limits=limits).stopped_text
             for code in STOP_REASONS}
    assert texts["trials"] == "reached its trial limit (32)"
    assert texts["budget"].endswith("not tuned") and texts[""] == "tuning"
    assert len(set(texts.values())) == len(texts)           # each says something different
    assert TuneResult(SOFTMAX, "ga", stopped="trials").stopped_text == "reached its trial limit"


def test_the_summary_carries_the_curve_and_the_best_never_rises(tmp_path, worker, pool):
    measurer = measurer_on(tmp_path / "r.jsonl", worker)
    seen = []
    result = tune_workload(DEPTHWISE, "random", trials=6, deadline=None, runner=measurer,
                           generated=CPU.generated, compile_pool=pool, seed=2, patience=50,
                           batch_size=2, finalize_k=2,
                           on_progress=lambda r: seen.append(r.best_s))
    assert seen == sorted(seen, reverse=True)                  # best so far never rises
    summary = result.to_json()
    assert len(summary["history"]) == summary["trials"] == 6
    assert summary["best_s"] == min(t for t in summary["history"] if t is not None)
    assert summary["final_s"] is not None and summary["stopped"] == "trials"
    assert summary["stopped_text"] == "reached its trial limit (6)"
