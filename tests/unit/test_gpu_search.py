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
from wpk.cli import main
from wpk.core.devices import GPU_PRESETS, detect_gpus
from wpk.core.errors import OptionError
from wpk.core.workload import TensorSpec, Workload
from wpk.pipeline import BuildOptions
from wpk.search.driver import generated_spec
from wpk.search.generated_target import compile_cuda, generated_target
from wpk.search.measure import Measurement, Status
from wpk.search.measure_cuda import (
    ParallelResult,
    alone_estimates,
    estimated_sequential_s,
    runs_alone,
)
from wpk.search.parallel_measure import ParallelSummary, check_streams, summary_line

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
        BuildOptions(**kwargs)
    assert caught.value.hint


def test_options_accept_an_online_gpu_parallel_build_and_an_offline_search():
    assert BuildOptions(target="cuda", gpu="h100", parallel_measure=4).parallel_measure == 4
    assert BuildOptions(target="cuda", gpu="h100", offline=True, search="ga").search == "ga"
    assert check_streams(None) is None and check_streams(8) == 8


@pytest.mark.parametrize("args, first", [
    (["--cpu", "--parallel-measure"], "error: --parallel-measure times candidates on CUDA"),
    (["--parallel-measure", "--gpu", "h100", "--offline"],       # N omitted: 4 streams
     "error: --parallel-measure times candidates on the GPU, and an --offline"),
    (["--gpu", "h100", "--offline", "--parallel-measure", "0"], "error: Invalid value"),
])
def test_cli_parallel_measure_errors_are_one_line_and_exit_2(model_path, capsys, args, first):
    assert main(["build", str(model_path), *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith(first), err
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert "Traceback" not in err


def test_cli_tune_parallel_measure_checks_its_value(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "missing.wpk"), "--parallel-measure", "65"]) == 2
    assert capsys.readouterr().err.startswith("error: Invalid value for '--parallel-measure'")


# ----------------------------------------------------------------------------- targets
def test_cpu_target_keeps_the_cpu_spec():
    cpu = generated_target("cpu")
    assert cpu.impl == "dsl.cpu" and cpu.spec({"a": 1}) == generated_spec({"a": 1})


def test_cuda_target_searches_the_preset_template_and_compiles_for_its_arch():
    cuda = generated_target("cuda", H100)
    space = cuda.space(GEMM)
    point = space.config(next(i for i in space.points() if space.is_valid(i)))
    spec = cuda.spec(point)
    assert spec.impl == "dsl.cuda" and spec.config == {**point, "gpu": "h100"}
    assert "wpk.kernels.cuda.generated" in spec.modules
    assert cuda.candidate(point).label.startswith("dsl.cuda[")
    (job,) = cuda.compile_jobs(GEMM, [point])
    assert compile_cuda(**job.kwargs) == "sm_90"     # nvcc, cached for the worker


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
    from wpk.search.records import TargetFingerprint, TuningRecord, best_of

    fp = TargetFingerprint("cuda:sm_90:h100", "nvcc", "1")
    fast = TuningRecord.from_measurement(ok("a", 1e-4, contended=True), GEMM, fp)
    slow = TuningRecord.from_measurement(ok("b", 2e-4), GEMM, fp)
    assert best_of([fast, slow]) is slow
    assert best_of([fast]) is fast       # only contended times: the best of those


def test_planner_measure_many_prefers_the_candidate_timed_alone():
    from tests.unit.test_planner import FAST, MEASURE, BlasMatMul, LoopMatMul, node, provider_of
    from wpk.plans.planner import plan

    def measure_many(workload, candidates, *, rng, **timing):
        found = [MEASURE(workload, c, rng=rng, **timing) for c in candidates]
        # as measure_parallel hands them out: blas timed only concurrently
        return [m if m.impl != "test.blas" else
                Measurement(**{**m.__dict__, "extra": {"contended": True}}) for m in found]

    from tests.unit.test_planner import MATMUL

    choices = plan([node("mm", MATMUL)], "cpu", FAST,
                   providers=[provider_of(LoopMatMul(), BlasMatMul())],
                   measure_many=measure_many)
    choice = choices[MATMUL.key]
    assert choice.candidate.implementation.name == "test.loops"
    assert {m.impl for m in choice.measurements} == {"test.loops", "test.blas"}


# ----------------------------------------------------------------------------- batches
def test_batch_measurements_are_recorded_once_and_reused(tmp_path):
    from wpk.kernels.generated import search_space
    from wpk.search.recorded import RecordedMeasurer
    from wpk.search.records import RecordStore, target_fingerprint
    from wpk.search.workers import MeasureOptions, MeasureWorker

    space = search_space(GEMM, "cpu")
    configs = [space.config(i) for i in space.points() if space.is_valid(i)][:3]
    specs = [generated_spec(c) for c in configs]
    calls = []
    with MeasureWorker(MeasureOptions(warmup=0, repeats=1, min_time=0.0)) as worker:
        def batch(workload, todo, options, seeds):
            calls.append(len(todo))
            return [worker.measure(workload, s, options, seed) for s, seed in zip(todo, seeds)]

        store = RecordStore(tmp_path / "r.jsonl")
        measurer = RecordedMeasurer(store, target_fingerprint(), worker=worker, batch_fn=batch)
        first = list(measurer.iter_batch(GEMM, specs))
        again = RecordedMeasurer(RecordStore(tmp_path / "r.jsonl"), target_fingerprint(),
                                 worker=worker, batch_fn=batch)
        second = list(again.iter_batch(GEMM, specs))
    assert calls == [3]                                  # one batch, nothing re-measured
    assert [i for i, _, _ in first] == [0, 1, 2] and [f for *_, f in first] == [1, 1, 1]
    assert [f for *_, f in second] == [0, 0, 0] and again.measured == 0
    assert [m.median_s for _, m, _ in second] == [m.median_s for _, m, _ in first]


@pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour")
def test_isolated_parallel_batch_without_a_gpu_fails_each_candidate(tmp_path):
    from wpk.search.parallel_measure import isolated_batch
    from wpk.search.workers import MeasureWorker

    cuda = generated_target("cuda", H100)
    space = cuda.space(GEMM)
    points = [space.config(i) for i in space.points() if space.is_valid(i)][:2]
    summary = ParallelSummary(2)
    with MeasureWorker() as worker:
        found = isolated_batch(worker, summary, 2)(GEMM, [cuda.spec(p) for p in points],
                                                   None, [7])
    assert [m.status for m in found] == [Status.RUNTIME_ERROR] * 2
    assert all("cupy" in m.message or "GPU" in m.message for m in found)
    assert summary.to_json()["saved_s"] == 0.0
