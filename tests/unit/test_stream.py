"""`Runner.stream` and the records: measurements handed over in any order (as the nodes of
a cluster finish) are each committed before the next is asked for, and a tuner gets them
in its batch's order, as from one machine; the sequential default keeps the deadline
rule."""

from __future__ import annotations

import time

from tests.unit import worker_fixtures as F
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.target import create_target
from wpk.search.driver import DEFAULT_BUDGET_TRIALS, TuneOptions, tune_model
from wpk.search.recorded import RecordedRunner
from wpk.search.records import RecordStore
from wpk.search.runner import LocalRunner
from wpk.search.workers import MeasureOptions

WORKLOAD = F.RELU_WORKLOAD
QUICK = MeasureOptions(warmup=1, repeats=3, max_repeats=10, min_time=0.001)


class ReversedRunner(LocalRunner):
    """Measures in this process but hands the measurements over last candidate first, as
    a runner with several slots may, and notes how many records the database held each
    time it was asked for the next one."""

    def __init__(self, database: RecordStore, limit: int | None = None):
        super().__init__(options=QUICK)
        self.database = database
        self.limit = limit   # how many it measures before its deadline stops it
        self.held: list[int] = []

    @property
    def slots(self) -> int:
        return 3

    def stream(self, workload, candidates, options=None, deadline=None):
        for index in list(reversed(range(len(candidates))))[:self.limit]:
            measurement = self.measure(workload, candidates[index], options)
            self.held.append(len(self.database))
            yield index, measurement


def specs() -> list[CandidateSpec]:
    return [CandidateSpec(F.TILED.name, config, ("tests.unit.worker_fixtures",))
            for config in F.TILED.configs(WORKLOAD)[:4]]


def test_records_commit_each_streamed_measurement_as_it_arrives(tmp_path):
    store = RecordStore(tmp_path / "db.jsonl")
    inner = ReversedRunner(store)
    runner = RecordedRunner(inner, store, create_target("cpu").fingerprint())
    batch = specs()
    seen = [(index, m.label, fresh) for index, m, fresh in runner.iter_batch(WORKLOAD, batch)]
    assert [index for index, _, _ in seen] == [0, 1, 2, 3]   # the tuner sees the batch's order
    assert all(label == batch[index].label and fresh == 1 for index, label, fresh in seen)
    assert inner.held == [0, 1, 2, 3]   # each committed before the next was measured
    assert len((tmp_path / "db.jsonl").read_text().splitlines()) == 4

    again = runner.run(WORKLOAD, [*batch, *specs()[:1]])   # all recorded: in order, reused
    assert [m.label for m in again] == [s.label for s in [*batch, batch[0]]]
    assert runner.measured == 4 and runner.reused == 5
    assert runner.slots == 3


def test_what_a_deadline_left_measured_past_a_gap_still_reaches_the_tuner(tmp_path):
    store = RecordStore(tmp_path / "db.jsonl")
    runner = RecordedRunner(ReversedRunner(store, limit=2), store,
                            create_target("cpu").fingerprint())
    batch = specs()
    runner.measure(WORKLOAD, batch[1])   # recorded before the batch
    seen = [(index, fresh) for index, _, fresh in runner.iter_batch(WORKLOAD, batch)]
    assert seen == [(1, 0), (2, 1), (3, 1)]   # 0 was not measured by the deadline


def test_the_sequential_stream_stops_at_the_deadline_after_one():
    runner = LocalRunner(options=QUICK)
    done = list(runner.stream(WORKLOAD, specs(), deadline=time.monotonic() - 1.0))
    assert [index for index, _ in done] == [0]
    assert len(list(runner.stream(WORKLOAD, specs()))) == 4


def test_batches_fill_the_slots_and_budgets_scale_with_them():
    options = TuneOptions("random", budget_s=60.0)
    assert [options.batch_for(n) for n in (1, 2, 3, 5, 16)] == [8, 8, 9, 10, 16]
    assert options.trials_for(3) == 3 * options.trials_for(1)
    assert TuneOptions("random", trials=7).trials_for(3) == 7


class Item:
    """A stand-in for a graph NodeWorkload (what tune_model takes)."""

    def __init__(self, workload: Workload):
        self.node = workload.op
        self.workload = workload


class ThreeSlotRunner(LocalRunner):
    """Measures one at a time in this process, but says it has three measuring slots (as a
    cluster of three nodes does), and notes the size of every batch it is asked for."""

    def __init__(self):
        super().__init__(options=QUICK)
        self.batches: list[int] = []

    @property
    def slots(self) -> int:
        return 3

    def stream(self, workload, candidates, options=None, deadline=None):
        self.batches.append(len(candidates))
        yield from super().stream(workload, candidates, options, deadline)


def test_a_budgeted_search_asks_for_whole_rounds_of_the_slots_and_more_trials(tmp_path):
    """tune_model hands a runner's slots to the tuner: batches of whole rounds of them, and
    under a budget (wall time) a trial limit that grows with them."""
    inner = ThreeSlotRunner()
    runner = RecordedRunner(inner, RecordStore(tmp_path / "db.jsonl"),
                            create_target("cpu").fingerprint())
    target = create_target("cpu")
    workload = Workload("Conv", (TensorSpec((1, 8, 6, 6)), TensorSpec((8, 1, 3, 3))),
                        (TensorSpec((1, 8, 6, 6)),), (("group", 8), ("pads", (1, 1, 1, 1))),
                        const_inputs=(1,))   # a depthwise convolution: a space of hundreds
    options = TuneOptions("random", budget_s=1.0, finalize_k=0)
    results = tune_model([Item(workload)], options, {workload.key: 1e-5}, runner=runner,
                         generated=target.generated)
    result = results[workload.key]
    assert inner.batches and inner.batches[0] == 9   # 8 rounded up to whole rounds of 3
    assert result.limits["trials"] == 3 * DEFAULT_BUDGET_TRIALS
    assert result.stopped == "deadline" and result.measured >= 1
