"""wait_until_idle (wpk.core.idle): the wait before a timed block lasts as long as another
thread of the process burns a core, and no longer."""

import threading
import time

from wpk.core.idle import wait_until_idle


def _burn_until(deadline: float) -> None:
    while time.perf_counter() < deadline:
        sum(range(1000))


def _spinning_thread(seconds: float) -> threading.Thread:
    thread = threading.Thread(target=_burn_until, args=(time.perf_counter() + seconds,))
    thread.start()
    return thread


def test_it_waits_while_another_thread_burns_a_core():
    thread = _spinning_thread(0.25)
    waited = wait_until_idle(limit_s=5.0)
    thread.join()
    assert waited >= 0.2


def test_it_gives_up_at_its_limit():
    thread = _spinning_thread(2.0)
    waited = wait_until_idle(limit_s=0.1)
    thread.join()
    assert 0.1 <= waited < 1.5


def test_it_returns_within_a_few_slices_when_nothing_spins():
    time.sleep(0.2)   # whatever an earlier test left spinning stops
    assert wait_until_idle(limit_s=5.0) < 1.0
