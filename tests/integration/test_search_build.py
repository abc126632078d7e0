"""End to end with the schedule search: `wpk build --search ga --trials 8 --db FILE`.

A small transformer encoder layer (MatMul, Softmax, LayerNormalization and
elementwise chains all map to generated kernels) is built with the search,
run and compared with onnxruntime; its report lists generated and vendor
candidates side by side; a rebuild from the same records measures nothing
new and gives the same plan.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

import wpk
from tests import models
from wpk.plans.planfile import read_plan

SEARCH_BUILD = {"search": "ga", "trials": 8, "warmup": 1, "repeats": 3, "min_time": 0.0,
                "progress": False}


def small_encoder() -> onnx.ModelProto:
    return models.transformer_encoder(seq_len=16, d_model=32, heads=2, ffn=64)


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_search_build_matches_onnxruntime_and_rebuild_measures_nothing(tmp_path,
                                                                      records_never_contended):
    model = small_encoder()
    model_path = tmp_path / "encoder.onnx"
    onnx.save(model, str(model_path))
    db = tmp_path / "records.jsonl"

    plan = wpk.build(str(model_path), target="cpu", db=str(db), **SEARCH_BUILD, partition=False)
    search = plan.report["search"]
    assert search["search"] == "ga" and search["measured"] > 0
    assert search["tuned"], "no workload was tuned"
    assert all(t["trials"] <= 8 for t in search["tuned"])
    kinds = [{c["kind"] for c in w["candidates"]} for w in plan.report["workloads"]
             if any(c["impl"] == "dsl.cpu" for c in w["candidates"])]  # the searched kernels
    # (the fused attention's generated kernel, also kind 'generated', is enumerated instead)
    side_by_side = [k for k in kinds if "generated" in k and k & {"vendor", "library"}]
    # one tuned entry per (workload, generated family): MatMuls are tuned by micro.gemm too
    assert len(side_by_side) == len({t["key"] for t in search["tuned"]})
    path = tmp_path / "encoder.wpk"
    plan.save(path)

    feeds = models.random_inputs(model, seed=3)
    actual = wpk.load(path).run(feeds)
    expected = onnxruntime_outputs(model, feeds)
    for name, value in zip([o.name for o in model.graph.output], expected):
        error = np.linalg.norm(actual[name] - value) / np.linalg.norm(value)
        assert error < 1e-4, (name, error)

    # The CLI rebuild from the same records: nothing new is measured, same steps.
    again = tmp_path / "again.wpk"
    done = subprocess.run([sys.executable, "-m", "wpk.cli", "build", str(model_path), "--cpu",
                           "--search", "ga", "--trials", "8", "--db", str(db), "-o", str(again),
                           "--quiet", "--no-partition"],  # as the first build: per operator
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rebuilt = read_plan(again)
    assert rebuilt.report["search"]["measured"] == 0
    assert rebuilt.report["search"]["reused"] > 0
    assert json.dumps(rebuilt.manifest["steps"], sort_keys=True) == \
        json.dumps(plan.manifest["steps"], sort_keys=True)


def test_tuning_only_adds_candidates_to_what_an_untuned_build_measures(tmp_path):
    """The last pass of a tuned build measures every candidate of an untuned build (the
    default schedules included) next to the tuned ones, side by side: a tuned plan can
    only pick a slower kernel by measurement noise, not by missing the default."""
    model_path = tmp_path / "encoder.onnx"
    onnx.save(small_encoder(), str(model_path))
    untuned = wpk.build(str(model_path), target="cpu", progress=False, partition=False)
    tuned = wpk.build(str(model_path), target="cpu", db=str(tmp_path / "db.jsonl"),
                      **{**SEARCH_BUILD, "trials": 4}, partition=False)

    def offered(plan) -> dict[str, set[str]]:
        return {w["key"]: {c["label"] for c in w["candidates"]}
                for w in plan.report["workloads"]}

    before, after = offered(untuned), offered(tuned)
    assert before.keys() == after.keys()
    assert all(before[key] <= after[key] for key in before), \
        {key: before[key] - after[key] for key in before if not before[key] <= after[key]}
    assert any(after[key] > before[key] for key in before), "tuning added nothing"

