"""Compiling a build's generated candidates side by side before measuring
(`wpk.search.precompile`, `HostRunner.prefetch`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.dsl.toolchain import compile_cache_dir
from wpk.kernels.cpu.target import CpuTarget
from wpk.kernels.jobs import CompileJob
from wpk.search.precompile import Precompiler
from wpk.search.runner import LocalRunner, create_runner
from wpk.search.workers import MeasureOptions

# Which libraries a build compiles ahead: a compile cache of its own, empty at the start.
pytestmark = pytest.mark.private_compile_cache

QUICK = MeasureOptions(warmup=0, repeats=1, min_time=0.0)


def matmul(m: int) -> Workload:
    return Workload("MatMul", (TensorSpec((m, 48)), TensorSpec((48, 40))),
                    (TensorSpec((m, 40)),), const_inputs=(1,))


def softmax(n: int) -> Workload:
    return Workload("Softmax", (TensorSpec((4, n)),), (TensorSpec((4, n)),), (("axis", -1),))


def libraries() -> set[Path]:
    return set(compile_cache_dir().glob("*.so"))


def generated(target, workload):
    return [c for c in target.candidates(workload)
            if target.family(c.implementation.name) is not None]


def test_announced_generated_candidates_are_compiled_before_the_first_measurement():
    target = CpuTarget.create()
    workloads = [matmul(32), matmul(24), softmax(100)]   # micro.gemm, dsl.cpu
    runner = create_runner(target, options=QUICK)
    assert isinstance(runner, LocalRunner) and runner.precompiler is not None
    for workload in workloads:
        runner.prefetch(workload, target.candidates(workload))
    announced = sum(len(generated(target, w)) for w in workloads)
    assert announced >= 2 and len(runner.precompiler.pending) == announced
    assert not libraries()                       # nothing compiled while announcing
    first = generated(target, workloads[0])[0]
    measurement = runner.measure(workloads[0], first)
    assert measurement.ok, measurement.message
    assert not runner.precompiler.pending and runner.precompiler.failed == 0
    # every announced kernel is in the compile cache, the unmeasured ones included
    compiled = libraries()
    assert len(compiled) >= announced
    for workload in workloads:
        for candidate in generated(target, workload):
            assert runner.measure(workload, candidate).ok
    assert libraries() == compiled               # measuring compiled nothing more


def test_a_job_that_fails_is_counted_and_left_to_the_measurement():
    precompiler = Precompiler([], jobs=2)
    precompiler.pending = [CompileJob.c_source("this is not C", label="bad"),
                           CompileJob("wpk.kernels.jobs:compile_c_source", {"sauce": 1}),
                           CompileJob.c_source("int wpk_ok(void) { return 1; }")]
    precompiler.flush()
    assert precompiler.failed == 2 and not precompiler.pending
    assert len(libraries()) == 1


def test_one_job_or_one_thread_compiles_nothing_ahead():
    for jobs, pending in ((2, 1), (1, 2)):
        precompiler = Precompiler([], jobs=jobs)
        precompiler.pending = [CompileJob.c_source(f"int wpk_f{i}(void) {{ return {i}; }}")
                               for i in range(pending)]
        precompiler.flush()
        assert not precompiler.pending
    assert not libraries()
