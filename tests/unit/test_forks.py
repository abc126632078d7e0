"""A process forked from one that ran a plan runs it too (`wpk.core.forks`), and its runs'
locks are its own."""

from __future__ import annotations

import faulthandler
import os
import pickle
import tempfile
import threading
import time

import numpy as np
import pytest

import wpk
from tests.unit.test_native_bundle import _matmul_model, _on_generated_gemm
from wpk.core import forks
from wpk.runtime import Session


def _matmul_plan(rng, tmp_path) -> tuple[str, np.ndarray]:
    """A [256, 256] x [256, 256] MatMul plan on micro.gemm's default schedule: an OpenMP
    kernel, whatever the build's timing chose."""
    model, weight = _matmul_model(rng, 256, 256, 256)
    built = wpk.build(model, target="cpu", progress=False, partition=False, search="none",
                      native_libraries=False)
    return str(_on_generated_gemm(built).save(tmp_path / "mm.wpk")), weight


def _in_a_forked_child(work, timeout_s: float = 60.0):
    """work()'s result computed in a forked child (pickled through a pipe, so small: the
    child's write waits for the parent to read beyond the pipe's 64 KiB); fails the test
    when the child is still running after `timeout_s`, with the child's Python stacks of
    shortly before."""
    read_end, write_end = os.pipe()
    stacks = tempfile.TemporaryFile()  # noqa: SIM115  (the child's threads if it hangs)
    pid = os.fork()
    if pid == 0:   # the child: no pytest machinery, only the work and its answer
        os.close(read_end)
        faulthandler.dump_traceback_later(max(1.0, timeout_s - 5), file=stacks)
        try:
            answer = pickle.dumps(("ok", work()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            answer = pickle.dumps(("error", repr(exc)))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(answer)
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read_end)
        stacks.seek(0)
        threads = stacks.read().decode(errors="replace")
        pytest.fail(f"the forked child was still running after {timeout_s:.0f} s (hung); "
                    f"its threads {timeout_s - 5:.0f} s in:\n{threads}")
    with os.fdopen(read_end, "rb") as pipe:
        status, value = pickle.loads(pipe.read())
    assert status == "ok", value
    return value


def test_a_forked_child_runs_the_plan_its_parent_ran(rng, tmp_path):
    """The parent runs an OpenMP kernel on this thread, then forks: libgomp's pool is not
    copied, and the child's first run on the forking thread waited for it forever. The
    child now runs on a thread of its own and gets the parent's answer."""
    path, weight = _matmul_plan(rng, tmp_path)
    session = wpk.load(path)
    assert session.plan.steps[0].impl == "micro.gemm"
    x = rng.standard_normal((256, 256)).astype(np.float32)
    expected = session.run({"x": x})["y"]
    np.testing.assert_allclose(expected, x @ weight, rtol=1e-4, atol=1e-3)
    assert not forks.forked()

    def child():
        first = session.run({"x": x})["y"]
        [second] = session.run(["y"], {"x": x})
        rows = session.profile({"x": x}, repeats=2)   # a keyword through the runner thread
        return (forks.forked(), [float(np.abs(y - expected).max()) for y in (first, second)],
                [row["node"] for row in rows])

    was_forked, differences, profiled = _in_a_forked_child(child)
    assert was_forked and differences == [0.0, 0.0] and profiled == ["mm"]
    assert np.array_equal(session.run({"x": x})["y"], expected)   # the parent still runs


def test_a_forked_child_loads_and_runs_a_plan(rng, tmp_path):
    """Loading a plan runs kernels too: micro.gemm packs its weight in OpenMP when its
    session prepares it. A forked child loading a plan on the forking thread waited
    forever (the fork test's build hung in CI the times its timing chose micro.gemm)."""
    path, weight = _matmul_plan(rng, tmp_path)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    wpk.load(path).run({"x": x})   # the parent's pool of OpenMP threads exists now

    def child():
        session = wpk.load(path)
        return session.plan.steps[0].impl, float(np.abs(session.run({"x": x})["y"]
                                                        - x @ weight).max())

    impl, difference = _in_a_forked_child(child, timeout_s=60)
    assert impl == "micro.gemm" and difference < 1e-3


def test_a_forked_child_builds_and_runs_a_plan(rng, tmp_path):
    """A build measures OpenMP kernels too, and runs its plan end to end: in a forked child
    it goes to the runner thread, where the plan's runs are called directly."""
    path, weight = _matmul_plan(rng, tmp_path)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    wpk.load(path).run({"x": x})   # the parent's pool of OpenMP threads exists now
    model, weight = _matmul_model(rng, 256, 256, 256)

    def child():
        plan = wpk.build(model, target="cpu", progress=False, search="none",
                         native_libraries=False)
        y = Session(plan).run({"x": x})["y"]
        return float(np.abs(y - x @ weight).max() / np.abs(x @ weight).max())

    assert _in_a_forked_child(child, timeout_s=120) < 1e-4


def test_a_run_lock_held_at_the_fork_is_free_in_the_child(rng, tmp_path):
    """Another thread of the parent held the session's run lock when it forked: that thread
    does not exist in the child, whose lock is a new one."""
    from tests.unit.plan_helpers import register_test_implementations
    from tests.unit.test_runtime import chain_plan

    register_test_implementations()
    session = Session.load(chain_plan(2).save(tmp_path / "chain.wpk"))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    held, release = threading.Event(), threading.Event()

    def hold():
        with session._run_lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    try:
        y = _in_a_forked_child(lambda: session.run({"x": x})["y"], timeout_s=30)   # 48 bytes
    finally:
        release.set()
        holder.join()
    np.testing.assert_allclose(y, 5 * x, rtol=1e-6)


def test_on_runner_thread_returns_and_raises_as_the_function_does():
    assert forks.on_runner_thread(lambda a, b: a + b, 2, 3) == 5
    assert forks.on_runner_thread(lambda a, b=0: a - b, 2, b=3) == -1
    assert forks.on_runner_thread(threading.get_ident) != threading.get_ident()
    nested = []   # from the runner to the runner: called there, no wait on itself

    def call_nested():
        nested.append(forks.on_runner_thread(lambda: forks.on_runner_thread(threading.get_ident)))

    caller = threading.Thread(target=call_nested, daemon=True)
    caller.start()
    caller.join(30)
    assert nested, "the runner waited on itself"
    assert nested == [forks.on_runner_thread(threading.get_ident)]

    def fails():
        raise ValueError("from the runner")

    with pytest.raises(ValueError, match="from the runner"):
        forks.on_runner_thread(fails)
