"""The GPU search and `--parallel-measure` on a real GPU (skipped without one, see conftest.py).

* `measure_parallel`: candidates verified, timed on several streams, the fastest
  re-measured alone (flushed), the winner among those; a candidate that fails
  verification is reported, not timed; when none verifies there is no winner.
* `wpk build --gpu auto --search random`: candidates measured in the isolated worker,
  recorded under the GPU's fingerprint, the plan runs and matches onnxruntime, a
  rebuild from the records measures nothing.
* `--parallel-measure`: the build and `wpk tune` report the time saved.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import wpk
from tests import models
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs
from wpk.kernels.registry import Candidate
from wpk.search.measure import Status

pytestmark = pytest.mark.gpu
GEMM = Workload("Gemm", (TensorSpec((64, 256)), TensorSpec((256, 128)), TensorSpec((128,))),
                (TensorSpec((64, 128)),), const_inputs=(1, 2))
FAST = {"warmup": 1, "repeats": 3, "min_time": 0.0}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-search") / "tiny.onnx"
    onnx.save(models.tiny_conv_gemm(), path)
    return path


def gemm_candidates(gpu) -> list[Candidate]:
    from wpk.kernels.cuda.target import CudaTarget

    return CudaTarget.for_preset(gpu).candidates(GEMM, 4)


def test_measure_parallel_picks_a_winner_remeasured_alone(present_gpu):
    from wpk.search.measure_cuda import measure_parallel

    candidates = gemm_candidates(present_gpu)
    assert len(candidates) >= 3
    result = measure_parallel(GEMM, candidates, rng=np.random.default_rng(0), streams=4,
                              top=2, runs=10, **FAST)
    timed = [i for i, m in enumerate(result.parallel) if m.extra.get("contended")]
    assert len(timed) >= 2 and len(result.remeasured) == 2
    assert set(result.remeasured) <= set(timed)
    assert result.winner in result.remeasured
    for m in result.remeasured.values():
        assert not m.extra.get("contended") and m.extra["timer"] == "cuda_events"
    winner = result.remeasured[result.winner]
    assert all(winner.median_s <= m.median_s for m in result.remeasured.values() if m.ok)
    assert result.estimated_sequential_s > 0 and result.wall_s > 0
    assert len(result.measurements()) == len(candidates)


def test_measure_parallel_reports_failures_and_no_winner_when_none_verifies(present_gpu):
    from wpk.search.measure_cuda import measure_parallel

    (config,) = preferred_configs(GEMM, present_gpu, 1)
    broken = Candidate(DSL_CUDA, {**config, "threads": 7777})     # not a point of the space
    good = Candidate(DSL_CUDA, config)
    result = measure_parallel(GEMM, [broken, good], rng=np.random.default_rng(1), **FAST)
    assert result.parallel[0].status is Status.COMPILE_ERROR
    assert result.winner == 1
    none = measure_parallel(GEMM, [broken], rng=np.random.default_rng(1), **FAST)
    assert none.winner is None and none.remeasured == {} and none.saved_s == 0.0


def run_and_compare(plan_path, model) -> None:
    feeds = models.random_inputs(model, seed=5)
    got = wpk.load(str(plan_path)).run(feeds)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (name,) = [o.name for o in model.graph.output]
    error = np.linalg.norm(got[name] - expected) / np.linalg.norm(expected)
    assert error < 1e-4, error


def test_online_search_build_measures_records_and_rebuilds_from_them(model_path, tmp_path,
                                                                     present_gpu):
    db = tmp_path / "records.jsonl"
    options = dict(target="cuda", gpu="auto", search="random", trials=3, db=str(db),
                   progress=False, **FAST)
    plan = wpk.build(str(model_path), output=str(tmp_path / "a.wpk"), **options, partition=False)
    search = plan.report["search"]
    assert search["measured"] > 0 and not search.get("predicted")
    assert search["fingerprint"]["device"] == f"cuda:{present_gpu.arch}:{present_gpu.name}"
    assert search["tuned"] and all(t["trials"] <= 3 for t in search["tuned"])
    generated = [c for w in plan.report["workloads"] for c in w["candidates"]
                 if c["kind"] == "generated"]
    assert generated and all("predicted" not in c for c in generated)
    run_and_compare(tmp_path / "a.wpk", models.tiny_conv_gemm())

    again = wpk.build(str(model_path), output=str(tmp_path / "b.wpk"), **options, partition=False)
    assert again.report["search"]["measured"] == 0
    assert again.manifest["steps"] == plan.manifest["steps"]


def test_parallel_measure_build_search_and_tune_report_the_time_saved(model_path, tmp_path,
                                                                      present_gpu):
    from wpk.commands.tune import tune_plan
    from wpk.plans.planfile import read_plan

    plain = wpk.build(str(model_path), target="cuda", gpu="auto", parallel_measure=4,
                      output=str(tmp_path / "p.wpk"), progress=False, **FAST, partition=False)
    totals = plain.report["parallel_measure"]
    assert totals["streams"] == 4 and totals["candidates"] > 0 and totals["wall_s"] > 0
    run_and_compare(tmp_path / "p.wpk", models.tiny_conv_gemm())

    searched = wpk.build(str(model_path), target="cuda", gpu="auto", search="random",
                         trials=4, parallel_measure=2, progress=False, **FAST, partition=False)
    totals = searched.report["parallel_measure"]   # the build's totals, search included
    assert totals["streams"] == 2 and totals["candidates"] > 0
    assert searched.report["search"]["measured"] > 0

    offline = tmp_path / "o.wpk"
    wpk.build(str(model_path), target="cuda", gpu=present_gpu.name, offline=True,
              output=str(offline), progress=False, partition=False)
    summary = tune_plan(offline, trials=3, parallel=4)
    assert summary["parallel_measure"]["candidates"] > 0
    assert read_plan(offline).report["parallel_measure"]["streams"] == 4
