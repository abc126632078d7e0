"""Close candidates measured in interleaved rounds (`Runner.run_interleaved`): a slow time
window that lands on one candidate's turn does not decide the choice."""

from __future__ import annotations

import math

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.target import TargetFingerprint
from wpk.search.measure import Measurement, Status, pooled
from wpk.search.recorded import RecordedRunner
from wpk.search.records import RecordStore
from wpk.search.runner import CLOSE, Runner

WORKLOAD = Workload("Relu", (TensorSpec((4, 4)),), (TensorSpec((4, 4)),))
FAST, SLOWER, FAR = (CandidateSpec(name, {}) for name in ("fast", "slower", "far"))
# what each candidate takes in a quiet window
BASE = {"fast": 0.9e-3, "slower": 1.0e-3, "far": 5.0e-3}


def timed(impl: str, seconds: float, status: Status = Status.OK) -> Measurement:
    return Measurement(label=impl, impl=impl, config={}, status=status, times_s=(seconds,),
                       median_s=seconds, spread_s=(seconds, seconds), rel_l2_error=1e-7,
                       workload_key=WORKLOAD.key)


class WindowedRunner(Runner):
    """Every call in `slow_calls` (0-based) runs in a window twice as slow; candidates in
    `failing` fail verification from their `fail_from`-th call on."""

    def __init__(self, slow_calls=(), failing=(), fail_from: int = 0):
        super().__init__()
        self.slow_calls, self.failing, self.fail_from = set(slow_calls), set(failing), fail_from
        self.calls: list[str] = []

    def measure(self, workload, candidate, options=None, seed=None):
        impl = candidate.impl
        index = len(self.calls)
        self.calls.append(impl)
        if impl in self.failing and self.calls.count(impl) > self.fail_from:
            return timed(impl, math.nan, Status.WRONG_ANSWER)
        return timed(impl, BASE[impl] * (2 if index in self.slow_calls else 1))


def test_a_slow_window_on_one_turn_does_not_pick_the_slower_kernel():
    once = WindowedRunner(slow_calls={0})
    alone = once.run(WORKLOAD, [FAST, SLOWER])
    assert alone[0].median_s > alone[1].median_s  # one round: the slower kernel looks faster

    runner = WindowedRunner(slow_calls={0})
    pooled_rounds = runner.run_interleaved(WORKLOAD, [FAST, SLOWER])
    assert runner.calls == ["fast", "slower", "slower", "fast", "fast", "slower"]  # rotating
    assert pooled_rounds[0].median_s < pooled_rounds[1].median_s
    assert [m.extra["rounds"] for m in pooled_rounds] == [3, 3]
    assert len(pooled_rounds[0].times_s) == 3


def test_only_the_close_candidates_are_measured_again():
    assert BASE["far"] > CLOSE * BASE["fast"]
    runner = WindowedRunner()
    found = runner.run_interleaved(WORKLOAD, [FAR, FAST, SLOWER])
    assert runner.calls.count("far") == 1 and "rounds" not in found[0].extra
    assert runner.calls.count("fast") == runner.calls.count("slower") == 3


def test_one_round_a_lone_candidate_and_a_steady_runner_measure_once():
    for runner, candidates, rounds in ((WindowedRunner(), [FAST, SLOWER], 1),
                                       (WindowedRunner(), [FAST, FAR], 3)):
        runner.run_interleaved(WORKLOAD, candidates, rounds=rounds)
        assert len(runner.calls) == len(candidates)
    steady = WindowedRunner()
    steady.steady = True
    steady.run_interleaved(WORKLOAD, [FAST, SLOWER])
    assert steady.calls == ["fast", "slower"]


def test_a_round_that_fails_verification_fails_the_candidate():
    runner = WindowedRunner(failing={"slower"}, fail_from=1)  # right first, wrong after
    found = runner.run_interleaved(WORKLOAD, [FAST, SLOWER])
    assert found[0].ok and found[1].status is Status.WRONG_ANSWER
    assert pooled([timed("fast", 1.0), timed("fast", 3.0), timed("fast", 2.0)]).median_s == 2.0


def test_records_hold_the_pooled_measurement_and_a_rebuild_measures_nothing(tmp_path):
    store = RecordStore(tmp_path / "db.jsonl")
    fingerprint = TargetFingerprint("cpu:x86_64:avx2", "gcc (test) 1.0", "1")
    first = RecordedRunner(WindowedRunner(slow_calls={0}), store, fingerprint)
    found = first.run_interleaved(WORKLOAD, [FAST, SLOWER])
    assert first.measured == 2 and len(store) == 2
    assert [r.times_s for r in store] == [m.times_s for m in found]

    inner = WindowedRunner()
    again = RecordedRunner(inner, store, fingerprint)
    reused = again.run_interleaved(WORKLOAD, [FAST, SLOWER])
    assert (inner.calls, again.measured, again.reused) == ([], 0, 2)
    assert [m.median_s for m in reused] == [m.median_s for m in found]
