"""GPU search on the CPU: option checks, the generated target, parallel-measure bookkeeping.

What needs a GPU (the measurements themselves) is in tests/gpu/test_gpu_search.py;
here: `--parallel-measure` refused with one error line where it cannot run, the
CUDA generated target's space/spec/compile job (nvcc, sm_90), the arithmetic of
`measure_parallel`'s time-saved estimate, the rule that a time taken
concurrently ranks but does not win, and batch measurement through records
(recorded once, reused after).
"""

from __future__ import annotations

import math

import onnx
import pytest

from tests import models
from tests.unit.plan_helpers import FunctionRunner
from wpk.cli import main
from wpk.core.devices import GPU_PRESETS, detect_gpus
from wpk.core.errors import OptionError
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cuda.generated import compile_for_cache
from wpk.kernels.cuda.target import CudaTarget
from wpk.kernels.target import create_target
from wpk.pipeline import BuildOptions
from wpk.search.measure import Measurement, Status
from wpk.search.measure_cuda import (
    ParallelResult,
    alone_estimates,
    estimated_sequential_s,
    runs_alone,
)
from wpk.search.parallel_measure import ParallelSummary, check_streams, summary_line
from wpk.search.runner import check_runner
from wpk.search.space import SearchSpace

H100 = GPU_PRESETS["h100"]
GEMM = Workload("Gemm", (TensorSpec((4, 16)), TensorSpec((16, 8)), TensorSpec((8,))),
                (TensorSpec((4, 8)),), const_inputs=(1, 2))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("opts") / "tiny.onnx"
    onnx.save(models.tiny_conv_gemm(), path)
    return path


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize("kwargs, match", [
    (dict(target="cpu", parallel_measure=4), "target 'cpu' has none"),
    (dict(target="cuda", gpu="h100", offline=True, parallel_measure=2), "--offline"),
    (dict(target="cuda", gpu="h100", parallel_measure=0), "from 1 to 64"),
    (dict(target="cuda", gpu="h100", parallel_measure=True), "from 1 to 64"),
    (dict(target="cuda", gpu="h100", parallel_measure="4"), "from 1 to 64"),
])
def test_parallel_measure_is_refused_where_it_cannot_run(kwargs, match):
    with pytest.raises(OptionError, match=match) as caught:
        options = BuildOptions(**kwargs)
        target = create_target(options.target, gpu=options.gpu, offline=options.offline)
        check_runner(target, options.parallel_measure)
    assert caught.value.hint


def test_options_accept_an_online_gpu_parallel_build_and_an_offline_search():
    assert BuildOptions(target="cuda", gpu="h100", parallel_measure=4).parallel_measure == 4
    assert BuildOptions(target="cuda", gpu="h100", offline=True, search="ga").search == "ga"
    assert check_streams(None) is None and check_streams(8) == 8


@pytest.mark.parametrize("args, first", [
    (["--cpu", "--parallel-measure"], "error: --parallel-measure times candidates on device"),
    (["--parallel-measure", "--gpu", "h100", "--offline"],       # N omitted: 4 streams
     "error: --parallel-measure times candidates on the GPU, and an --offline"),
    (["--gpu", "h100", "--offline", "--parallel-measure", "0"], "error: Invalid value"),
])
def test_cli_parallel_measure_errors_are_one_line_and_exit_2(model_path, capsys, args, first):
    assert main(["build", str(model_path), *args, "--no-partition"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith(first), err
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert "Traceback" not in err


def test_cli_tune_parallel_measure_checks_its_value(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "missing.wpk"), "--parallel-measure", "65"]) == 2
    assert capsys.readouterr().err.startswith("error: Invalid value for '--parallel-measure'")


# ----------------------------------------------------------------------------- targets
@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
def test_cpu_target_generates_c_kernels():
    spec = create_target("cpu").generated.spec({"a": 1})
    assert spec.impl == "dsl.cpu" and spec.config == {"a": 1}
    assert spec.modules == ("wpk.kernels.generated",)


def test_cuda_target_searches_the_preset_template_and_compiles_for_its_arch():
    cuda = CudaTarget.for_preset(H100).generated
    space = SearchSpace.from_template(cuda.template(GEMM))
    point = space.config(next(i for i in space.points() if space.is_valid(i)))
    spec = cuda.spec(point)
    assert spec.impl == "dsl.cuda" and spec.config == {**point, "gpu": "h100"}
    assert "wpk.kernels.cuda.generated" in spec.modules
    assert cuda.candidate(point).label.startswith("dsl.cuda[")
    (job,) = cuda.compile_jobs(GEMM, [point])
    assert job.function == "wpk.kernels.cuda.generated:compile_for_cache"
    assert compile_for_cache(**job.kwargs) == "sm_90"     # nvcc, cached for the worker


# ----------------------------------------------------------------------------- estimates
def ok(label: str, median: float, **extra) -> Measurement:
    return Measurement(label=label, impl=label, config={}, status=Status.OK, median_s=median,
                       times_s=(median,), spread_s=(median, median), extra=extra)


def test_runs_alone_follows_time_gpu():
    assert runs_alone(1e-3, repeats=5, max_repeats=50, min_time=0.05) == 50
    assert runs_alone(1e-2, repeats=5, max_repeats=50, min_time=0.05) == 5
    assert runs_alone(1e-4, repeats=5, max_repeats=50, min_time=0.05) == 50   # capped
    assert runs_alone(math.nan, repeats=3) == 3


def test_estimated_sequential_time_counts_warmup_runs_and_flushes():
    # 10 ms kernel: 2 warm-up + 5 runs, 5 flushes of 1 ms
    assert estimated_sequential_s([1e-2], 1e-3, warmup=2, repeats=5, max_repeats=50,
                                  min_time=0.05) == pytest.approx(7e-2 + 5e-3)
    assert estimated_sequential_s([math.nan], 1e-3) == 0.0


def test_alone_estimates_scale_contended_times_by_the_remeasured_ratio():
    parallel = [ok("a", 2e-3, contended=True), ok("b", 4e-3, contended=True),
                ok("c", 8e-3, contended=True)]
    remeasured = {0: ok("a", 1e-3)}
    assert alone_estimates(parallel, remeasured, [0, 1, 2]) == pytest.approx(
        [1e-3, 2e-3, 4e-3])


def test_parallel_result_round_trips_and_hands_out_alone_times():
    failed = Measurement(label="d", impl="d", config={}, status=Status.WRONG_ANSWER,
                         message="bad")
    result = ParallelResult([ok("a", 2e-3, contended=True), ok("b", 3e-3, contended=True),
                             failed], {0: ok("a", 1.5e-3)}, 0, 0.5, 2.0, 4)
    again = ParallelResult.from_json(result.to_json())
    assert again.to_json() == result.to_json() and again.saved_s == pytest.approx(1.5)
    chosen = again.measurements()
    assert [m.label for m in chosen] == ["a", "b", "d"]
    assert not chosen[0].extra.get("contended") and chosen[1].extra["contended"]
    summary = ParallelSummary(4)
    summary.add(again)
    data = summary.to_json()
    assert data["candidates"] == 3 and data["saved_s"] == pytest.approx(1.5)
    assert "saved 1.5 s" in summary_line(data)


def test_nothing_verified_saves_nothing():
    bad = Measurement(label="x", impl="x", config={}, status=Status.COMPILE_ERROR)
    result = ParallelResult([bad], {}, None, 1.0, 0.8, 4)
    assert result.saved_s == 0.0 and result.measurements() == [bad]


# ----------------------------------------------------------------------------- choosing
def test_a_time_taken_concurrently_ranks_but_does_not_win():
    from wpk.kernels.target import TargetFingerprint
    from wpk.search.records import TuningRecord, top_records

    fp = TargetFingerprint("cuda:sm_90:h100", "nvcc", "1")
    fast = TuningRecord.from_measurement(ok("a", 1e-4, contended=True), GEMM, fp)
    slow = TuningRecord.from_measurement(ok("b", 2e-4), GEMM, fp)
    assert top_records([fast, slow]) == [slow]
    assert top_records([fast]) == [fast]       # only contended times: the best of those


class ContendedBlas(FunctionRunner):
    """As a ParallelRunner hands them out: test.blas timed only concurrently."""

    concurrent = True

    def run(self, workload, candidates, options=None):
        return [m if m.impl != "test.blas" else
                Measurement(**{**m.__dict__, "extra": {"contended": True}})
                for m in super().run(workload, candidates, options)]


def test_the_planner_prefers_the_candidate_timed_alone():
    from tests.unit.test_planner import (
        FAST,
        MATMUL,
        MEASURE,
        BlasMatMul,
        LoopMatMul,
        node,
        provider_of,
    )
    from wpk.plans.planner import plan

    choices = plan([node("mm", MATMUL)], provider_of(LoopMatMul(), BlasMatMul()),
                   ContendedBlas(MEASURE), FAST)
    choice = choices[MATMUL.key]
    assert choice.candidate.implementation.name == "test.loops"
    assert {m.impl for m in choice.measurements} == {"test.loops", "test.blas"}


# ----------------------------------------------------------------------------- batches
class CountingBatches(FunctionRunner):
    """Runs every batch in one call (as a ParallelRunner does), counting the calls."""

    concurrent = True

    def __init__(self, worker):
        super().__init__(None)
        self.worker, self.calls = worker, []

    def measure(self, workload, candidate, options=None, seed=None):
        seed = self.seed_of(workload, candidate) if seed is None else seed
        return self.worker.measure(workload, candidate, options, seed)

    def run(self, workload, candidates, options=None):
        self.calls.append(len(candidates))
        return super().run(workload, candidates, options)


def test_batch_measurements_are_recorded_once_and_reused(tmp_path):
    from wpk.search.recorded import RecordedRunner
    from wpk.search.records import RecordStore
    from wpk.search.workers import MeasureOptions, MeasureWorker

    cpu = create_target("cpu")
    space = SearchSpace.from_template(cpu.generated.template(GEMM))
    configs = [space.config(i) for i in space.points() if space.is_valid(i)][:3]
    specs = [cpu.generated.spec(c) for c in configs]
    with MeasureWorker(MeasureOptions(warmup=0, repeats=1, min_time=0.0)) as worker:
        batches = CountingBatches(worker)
        first_runner = RecordedRunner(batches, RecordStore(tmp_path / "r.jsonl"),
                                      cpu.fingerprint())
        first = list(first_runner.iter_batch(GEMM, specs))
        again = RecordedRunner(batches, RecordStore(tmp_path / "r.jsonl"), cpu.fingerprint())
        second = list(again.iter_batch(GEMM, specs))
    assert batches.calls == [3]                          # one batch, nothing re-measured
    assert [i for i, _, _ in first] == [0, 1, 2] and [f for *_, f in first] == [1, 1, 1]
    assert [f for *_, f in second] == [0, 0, 0] and again.measured == 0
    assert [m.median_s for _, m, _ in second] == [m.median_s for _, m, _ in first]


@pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour")
def test_isolated_parallel_batch_without_a_gpu_fails_each_candidate(tmp_path):
    from wpk.search.parallel_measure import ParallelRunner
    from wpk.search.runner import IsolatedRunner

    cuda = CudaTarget.for_preset(H100).generated
    space = SearchSpace.from_template(cuda.template(GEMM))
    points = [space.config(i) for i in space.points() if space.is_valid(i)][:2]
    summary = ParallelSummary(2)
    with ParallelRunner(IsolatedRunner("cuda-events"), 2, summary) as runner:
        found = runner.run(GEMM, [cuda.spec(p) for p in points])
    assert [m.status for m in found] == [Status.RUNTIME_ERROR] * 2
    assert all("cupy" in m.message or "GPU" in m.message for m in found)
    assert summary.to_json()["saved_s"] == 0.0


@pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour")
def test_isolated_cuda_timer_without_a_gpu_is_a_failed_measurement():
    from wpk.search.runner import IsolatedRunner

    cuda = CudaTarget.for_preset(H100)
    (candidate, *_) = cuda.candidates(GEMM, 1)
    with IsolatedRunner("cuda-events") as runner:
        (found,) = runner.run(GEMM, [candidate])
    assert found.status is Status.RUNTIME_ERROR
    assert "cupy" in found.message or "GPU" in found.message


def test_a_recorded_parallel_runner_reports_its_totals_and_no_cluster(tmp_path):
    """The first GPU run (H200, 2026-11-27) failed `--search random --parallel-measure 2` with
    "'ParallelSummary' object is not callable": the runner's totals shadowed `summary()`,
    which the recorded runner calls for the build report."""
    from wpk.search.parallel_measure import ParallelRunner
    from wpk.search.recorded import RecordedRunner
    from wpk.search.records import RecordStore
    from wpk.search.runner import LocalRunner

    totals = ParallelSummary(2)
    parallel = ParallelRunner(LocalRunner(), streams=2, summary=totals)
    target = create_target("cuda", gpu="h100", offline=True)
    recorded = RecordedRunner(parallel, RecordStore(tmp_path / "r.jsonl"), target.fingerprint())
    assert recorded.summary() is None and parallel.totals is totals
