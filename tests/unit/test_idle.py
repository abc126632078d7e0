"""wait_until_idle (wpk.core.idle): the wait before a timed block lasts as long as another
thread of the process burns a core, and no longer. The process's CPU time is scripted (a
real spinning thread is itself descheduled for whole slices on a busy machine, and would
end the wait early in a test); one test reads the real clocks."""

import pytest

from wpk.core import idle
from wpk.core.idle import wait_until_idle


class ScriptedClock:
    """`time` as wait_until_idle reads it: sleeping advances the wall clock, and the
    process's CPU time by `cores(now)` cores over the sleep."""

    def __init__(self, cores):
        self.now, self.cpu, self.cores = 0.0, 0.0, cores

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.cpu += seconds * self.cores(self.now)
        self.now += seconds


def scripted(monkeypatch, cores) -> ScriptedClock:
    clock = ScriptedClock(cores)
    monkeypatch.setattr(idle, "time", clock)
    return clock


def test_it_waits_while_another_thread_burns_a_core(monkeypatch):
    scripted(monkeypatch, lambda now: 1.0 if now < 0.25 else 0.0)
    assert wait_until_idle(limit_s=5.0) == pytest.approx(0.255)   # the first idle slice


def test_a_thread_on_part_of_a_core_still_counts_as_busy(monkeypatch):
    scripted(monkeypatch, lambda now: 0.3 if now < 0.1 else 0.1)   # under 0.2: idle
    assert wait_until_idle(limit_s=5.0) == pytest.approx(0.105)


def test_it_gives_up_at_its_limit(monkeypatch):
    scripted(monkeypatch, lambda now: 2.0)
    assert wait_until_idle(limit_s=0.1) == pytest.approx(0.1)


def test_it_returns_after_one_slice_when_nothing_spins(monkeypatch):
    scripted(monkeypatch, lambda now: 0.0)
    assert wait_until_idle(limit_s=5.0, slice_s=0.005) == pytest.approx(0.005)


def test_it_returns_within_a_few_slices_on_the_real_clocks():
    assert wait_until_idle(limit_s=5.0) < 1.0
