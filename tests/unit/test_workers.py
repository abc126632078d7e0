"""Isolated measurement and the compile pool, with real gcc-compiled kernels.

The worker must survive a kernel that segfaults, one that never returns and
one that writes wrong values, record each with the right status, and keep
measuring; it is restarted only after a crash or a hang. The kernels live in
`tests.unit.worker_fixtures`, which the worker imports by name.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.unit import worker_fixtures as F
from wpk.core.errors import OptionError
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.jobs import CandidateSpec, CompileJob
from wpk.kernels.registry import Candidate
from wpk.kernels.target import create_target
from wpk.kernels.templates import build_cpu
from wpk.search.compile_pool import CompilePool
from wpk.search.measure import Status
from wpk.search.recorded import RecordedRunner
from wpk.search.records import FINAL, RecordStore
from wpk.search.runner import IsolatedRunner, LocalRunner, create_runner
from wpk.search.workers import MeasureOptions, MeasureWorker, crash_location

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

FIXTURES = "tests.unit.worker_fixtures"
QUICK = MeasureOptions(warmup=1, repeats=3, max_repeats=10, min_time=0.001, timeout_s=20.0)
HANG_LIMIT_S = 2.0


@pytest.fixture(scope="module")
def worker_env(tmp_path_factory):
    """One compile cache for the module's long-lived workers (they outlive a test)."""
    return dict(os.environ, WPK_CACHE_DIR=str(tmp_path_factory.mktemp("worker-cache")))


@pytest.fixture(scope="module")
def compiled(worker_env):
    """Every fixture kernel compiled ahead, in parallel, into the shared cache."""
    jobs = [CompileJob.c_source(F.source_of(b), label=b) for b in F.BODIES]
    with CompilePool(jobs=2, env=worker_env) as pool:
        results = pool.compile(jobs, timeout_s=120)
    return {job.label: result for job, result in zip(jobs, results)}


@pytest.fixture(scope="module")
def worker(worker_env, compiled):
    with MeasureWorker(QUICK, env=worker_env) as measure_worker:
        yield measure_worker


def spec(behaviour: str) -> CandidateSpec:
    return CandidateSpec.of(Candidate(F.IMPLEMENTATIONS[behaviour], {}))


def test_compile_pool_builds_every_kernel_into_the_cache(compiled):
    assert set(compiled) == set(F.BODIES)
    for result in compiled.values():
        assert result.ok, result.message
        assert os.path.exists(result.artifact) and result.artifact.endswith(".so")


def test_candidate_spec_names_the_module_that_registers_it():
    assert spec("good").modules == (FIXTURES,)
    assert spec("good").impl == "test.worker.good"
    assert spec("good").to_json()["config"] == {}


def test_good_kernel_is_verified_and_timed(worker):
    measurement = worker.measure(F.RELU_WORKLOAD, spec("good"), seed=3)
    assert measurement.status is Status.OK, measurement.message
    assert len(measurement.times_s) >= QUICK.repeats
    assert measurement.median_s > 0
    low, high = measurement.spread_s
    assert low <= measurement.median_s <= high
    assert measurement.rel_l2_error < 1e-6
    assert measurement.workload_key == F.RELU_WORKLOAD.key


def test_segfault_is_a_runtime_error_naming_the_signal_and_the_worker_goes_on(worker):
    worker.measure(F.RELU_WORKLOAD, spec("good"))
    starts = worker.starts
    crashed = worker.measure(F.RELU_WORKLOAD, spec("segfault"))
    assert crashed.status is Status.RUNTIME_ERROR
    assert "SIGSEGV" in crashed.message
    assert "worker_fixtures.py" in crashed.message  # faulthandler's innermost frame
    after = worker.measure(F.RELU_WORKLOAD, spec("good"))
    assert after.status is Status.OK, after.message
    assert worker.starts == starts + 1


def test_endless_kernel_times_out_and_the_restarted_worker_measures_the_next(worker):
    worker.measure(F.RELU_WORKLOAD, spec("good"))
    starts = worker.starts
    options = MeasureOptions(warmup=1, repeats=3, min_time=0.001, timeout_s=HANG_LIMIT_S)
    began = time.monotonic()
    hung = worker.measure(F.RELU_WORKLOAD, spec("hang"), options)
    waited = time.monotonic() - began
    assert hung.status is Status.TIMEOUT
    assert HANG_LIMIT_S <= waited < HANG_LIMIT_S + 10
    assert f"{HANG_LIMIT_S:g} s" in hung.message
    after = worker.measure(F.RELU_WORKLOAD, spec("good"))
    assert after.status is Status.OK, after.message
    assert worker.starts == starts + 1


def test_wrong_values_are_a_wrong_answer_without_a_restart(worker):
    worker.measure(F.RELU_WORKLOAD, spec("good"))
    starts = worker.starts
    wrong = worker.measure(F.RELU_WORKLOAD, spec("wrong"))
    assert wrong.status is Status.WRONG_ANSWER
    assert wrong.rel_l2_error > 0.1
    raised = worker.measure(F.RELU_WORKLOAD, CandidateSpec.of(Candidate(F.RAISES, {})))
    assert raised.status is Status.RUNTIME_ERROR
    assert "kernel gave up" in raised.message
    assert worker.starts == starts


def test_unknown_implementation_is_a_compile_error(worker):
    missing = worker.measure(F.RELU_WORKLOAD, CandidateSpec("test.worker.nonexistent"))
    assert missing.status is Status.COMPILE_ERROR
    assert "test.worker.nonexistent" in missing.message
    bad_module = worker.measure(F.RELU_WORKLOAD,
                                CandidateSpec("test.worker.good", modules=("no.such.module",)))
    assert bad_module.status is Status.COMPILE_ERROR
    assert "no.such.module" in bad_module.message


def test_finalize_remeasures_the_fastest_ok_candidates_alone_with_more_repeats(worker):
    runner = RecordedRunner(IsolatedRunner(options=QUICK, worker=worker), RecordStore(None),
                            create_target("cpu").fingerprint())
    tiled = CandidateSpec("test.worker.tiled", {"block": 256, "unroll": 4}, (FIXTURES,))
    measured = runner.run(F.RELU_WORKLOAD, [spec("good"), spec("wrong"), tiled])
    assert [m.ok for m in measured] == [True, False, True]
    runner.finalize(F.RELU_WORKLOAD, k=2, factor=2)
    final = [r for r in runner.database.records(F.RELU_WORKLOAD.key) if r.phase == FINAL]
    assert {r.impl for r in final} == {"test.worker.good", "test.worker.tiled"}
    assert all(r.ok and len(r.times_s) >= 2 * QUICK.repeats for r in final)
    best = runner.database.top_k(F.RELU_WORKLOAD.key, runner.fingerprint, 2)
    assert [r.phase for r in best] == [FINAL, FINAL] and best[0].median_s <= best[1].median_s


@pytest.mark.parametrize("isolated", [False, True])
def test_runners_of_the_cpu_target_measure_in_process_or_in_a_worker(isolated, compiled):
    with create_runner(create_target("cpu"), isolated=isolated, options=QUICK) as runner:
        assert isinstance(runner, IsolatedRunner if isolated else LocalRunner)
        good, wrong = runner.run(F.RELU_WORKLOAD, [
            Candidate(F.IMPLEMENTATIONS["good"], {}), spec("wrong")])
    assert good.status is Status.OK, good.message
    assert wrong.status is Status.WRONG_ANSWER


def test_compile_pool_times_out_and_survives_crashing_jobs(worker_env):
    jobs = [CompileJob("tests.unit.worker_fixtures:slow_compile", {"seconds": 30}, "slow"),
            CompileJob("tests.unit.worker_fixtures:crashing_compile", {}, "crash"),
            CompileJob.c_source("int broken(void) { return }", label="syntax error"),
            CompileJob.c_source(F.source_of("good"), label="good")]
    began = time.monotonic()
    with CompilePool(jobs=2, env=worker_env) as pool:
        # the 3 s limit for the slow job alone: gcc on a machine busy with the rest of the
        # suite may take longer than that for the others
        results = pool.compile(jobs[:1], timeout_s=3.0) + pool.compile(jobs[1:], timeout_s=60)
        again = pool.compile([jobs[-1]], timeout_s=60)
    assert time.monotonic() - began < 25
    statuses = [r.status for r in results]
    assert statuses == [Status.TIMEOUT, Status.COMPILE_ERROR, Status.COMPILE_ERROR, Status.OK]
    assert "SIGSEGV" in results[1].message
    assert "ToolchainError" in results[2].message and "expected expression" in results[2].message
    assert again[0].ok and again[0].artifact == results[3].artifact


def test_compile_pool_builds_a_dsl_library_operator_into_the_cache_build_cpu_reads():
    with CompilePool(jobs=1) as pool:  # this test's cache directory
        (result,) = pool.compile([CompileJob.dsl("add", {"L": 1000})], timeout_s=120)
    assert result.ok, result.message
    kernel = build_cpu(load_operator("add"), {"L": 1000})
    assert str(kernel.library) == result.artifact


def test_options_are_checked():
    with pytest.raises(OptionError):
        MeasureOptions(timeout_s=0)
    with pytest.raises(OptionError):
        CompilePool(jobs=0)


def test_crash_location_reads_faulthandler_output():
    dump = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call "
            "first):\n  File \"/x/k.py\", line 7 in kernel\n  File \"/x/m.py\", line 3 in run\n")
    assert crash_location(dump) == "/x/k.py:7 in kernel"
    assert crash_location("just a line\n") == "just a line"
    assert crash_location("") == ""
