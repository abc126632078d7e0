"""End to end: a MobileNet-v2-like model builds with its inverted-residual blocks fused,
matches onnxruntime, and its plan runs the fused kernel exactly where it was measured faster
than onnxruntime's separate nodes (by more than the planner's region credit: onnxruntime's
candidate joins its regions)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import wpk
from tests import models
from wpk.plans.planfile import read_plan
from wpk.plans.planner import PlanOptions

FAST = {"warmup": 1, "repeats": 5, "min_time": 0.0, "progress": False}
# A step that keeps an onnxruntime region whole wins when at most this much slower
CREDIT_S = PlanOptions().region_credit_s


def test_mobilenet_v2_like_runs_fused_blocks_where_they_are_faster(tmp_path):
    model = models.mobilenet_v2_like(image_size=48, classes=10)
    path = tmp_path / "mobilenet.wpk"
    wpk.build(model, target="cpu", output=path, partition=False, **FAST)
    plan = read_plan(path)
    blocks = [w for w in plan.report["workloads"] if w["op"] == "InvertedResidual"]
    # 10 expansion-6 blocks (the expansion-1 block has no expand conv), 9 distinct
    assert sum(w["count"] for w in blocks) == 10 and len(blocks) == 9
    impls_of_steps = {}
    for step in plan.manifest["steps"]:
        impls_of_steps.setdefault(step["node"], step["impl"])
    for block in blocks:
        measured = {c["impl"]: c for c in block["candidates"] if c["status"] == "ok"}
        assert {"micro.inverted_residual", "ort.inverted_residual"} <= set(measured)
        assert all(c["rel_l2_error"] < 1e-4 for c in measured.values())
        fused, separate = measured["micro.inverted_residual"], measured["ort.inverted_residual"]
        if fused["median_s"] + CREDIT_S < separate["median_s"]:
            expected_impl = fused["impl"]     # faster by more than a session call's worth
        elif separate["median_s"] <= fused["median_s"]:
            expected_impl = separate["impl"]
        else:                                  # within the credit: either rule may decide
            expected_impl = block["chosen_impl"]
        assert block["chosen_impl"] == expected_impl, block["reason"]
        assert all(impls_of_steps[node] == expected_impl for node in block["nodes"])

    feeds = models.random_inputs(model, seed=3)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    actual = wpk.load(path).run(feeds)
    for output, value in zip(model.graph.output, expected):
        error = np.linalg.norm(actual[output.name] - value) / np.linalg.norm(value)
        assert error < 1e-4, (output.name, error)
