"""`wpk build --gpu h100 --offline --search ...` end to end on a machine without a GPU.

The search explores the CUDA template's knob space with the analytical model
as its objective: every candidate it tries is compiled by nvcc for sm_90, its
ptxas usage checked and its loop IR verified in the GPU emulator; the records
hold predictions under a fingerprint of their own, a rebuild from them
predicts nothing new, and the plan and report still say the choices are
predicted.
"""

from __future__ import annotations

import json

import onnx
import pytest

import wpk
from tests import models
from wpk.cli import main
from wpk.core.devices import GPU_PRESETS, detect_gpus
from wpk.kernels.cuda.offline import cubin_arch
from wpk.kernels.cuda.target import CudaTarget
from wpk.plans.planfile import read_plan
from wpk.search.records import RecordStore

pytestmark = pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-search") / "tiny.onnx"
    onnx.save(models.tiny_conv_gemm(), path)
    return path


def generated_candidates(report: dict) -> list[dict]:
    return [c for w in report["workloads"] for c in w["candidates"] if c["kind"] == "generated"]


def test_offline_search_predicts_verified_kernels_and_rebuild_predicts_nothing(
        model_path, tmp_path, capsys):
    db = tmp_path / "records.jsonl"
    plan = wpk.build(str(model_path), target="cuda", gpu="h100", offline=True, search="ga",
                     trials=4, db=str(db), progress=False, partition=False)
    search = plan.report["search"]
    assert search["predicted"] is True and search["search"] == "ga"
    assert search["fingerprint"]["device"] == "predicted:cuda:sm_90:h100"
    tuned = {t["label"].split()[0]: t for t in search["tuned"]}
    assert {"Conv", "Gemm", "GlobalAveragePool"} <= set(tuned)
    assert all(1 <= t["trials"] <= 4 and t["best_config"] for t in tuned.values())
    assert search["measured"] == len(RecordStore(db)) > 0   # every prediction recorded

    generated = generated_candidates(plan.report)
    assert generated, "no searched kernel reached the planner"
    for cand in generated:   # compiled for the preset, checked by ptxas, emulator-verified
        assert cand["predicted"] is True and cand["status"] == "ok"
        assert cand["arch"] == cand["cubin_arch"] == "sm_90"
        assert cand["usage"] and cand["verified"].startswith("emulator")
        assert cand["model"]["model"] == "generated"
        assert cand["model"]["seconds"] == pytest.approx(cand["median_s"])
    assert plan.manifest["predicted"]["gpu"] == "h100"
    assert all(step["predicted"] for step in plan.manifest["steps"])
    for step in plan.manifest["steps"]:
        if step["impl"] == "dsl.cuda":
            cubin = plan.kernels[next(a for a in step["artifacts"] if a.endswith(".cubin"))]
            assert cubin_arch(cubin) == "sm_90"

    out = tmp_path / "again.wpk"
    assert main(["build", str(model_path), "--gpu", "h100", "--offline", "--search", "ga",
                 "--trials", "4", "--db", str(db), "-o", str(out), "--no-partition"]) == 0
    rebuilt = read_plan(out, check_device=False)
    assert rebuilt.report["search"]["measured"] == 0
    assert rebuilt.report["search"]["reused"] >= search["measured"]
    assert json.dumps(rebuilt.manifest["steps"], sort_keys=True) == \
        json.dumps(plan.manifest["steps"], sort_keys=True)
    err = capsys.readouterr().err
    assert "search ga: 3 workloads tuned; 0 new predictions" in err

    # predictions never stand in for measurements on the GPU itself
    measured = CudaTarget.for_preset(GPU_PRESETS["h100"]).fingerprint()
    store = RecordStore(db)
    assert all(r.fingerprint.key != measured.key for r in store)
    assert store.workload_keys() and all(
        store.best(key, measured) is None for key in store.workload_keys())


def test_offline_search_stays_within_its_trials(model_path, tmp_path):
    plan = wpk.build(str(model_path), target="cuda", gpu="h100", offline=True,
                     search="random", trials=2, progress=False, partition=False)
    tuned = plan.report["search"]["tuned"]
    assert tuned and all(1 <= t["trials"] <= 2 for t in tuned)
    # the search's trials, plus the last pass's candidates (library, default schedules)
    planned = sum(len(w["candidates"]) for w in plan.report["workloads"])
    assert plan.report["search"]["measured"] <= 2 * len(tuned) + planned
