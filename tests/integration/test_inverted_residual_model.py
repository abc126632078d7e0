"""End to end: MobileNet-v2-like, EfficientNet-like (squeeze-excite, SiLU) and the corpus's
MobileNetV3 (HardSwish, HardSigmoid gates, expansion-1 blocks; paddle2onnx and torch
spellings) build with every inverted-residual block fused, match onnxruntime, and each plan
runs the fused kernel exactly where it was measured faster than onnxruntime's separate nodes
(by more than the planner's region credit: onnxruntime's candidate joins its regions)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import wpk
from tests import corpus, models
from wpk.plans.planfile import read_plan
from wpk.plans.planner import PlanOptions

FAST = {"warmup": 1, "repeats": 5, "min_time": 0.0, "progress": False}
# A step that keeps an onnxruntime region whole wins when at most this much slower
CREDIT_S = PlanOptions().region_credit_s


def _model(name: str):
    """(model, build options, feeds, fused blocks expected) of a test model."""
    if name == "mobilenet_v2_like":   # 10 expansion-6 blocks and the expansion-1 one
        model = models.mobilenet_v2_like(image_size=48, classes=10)
        return model, {}, models.random_inputs(model, seed=3), 11
    if name == "efficientnet_like":   # 8 gated blocks, SiLU, the first of expansion 1
        model = models.efficientnet_like(image_size=48, classes=10)
        return model, {}, models.random_inputs(model, seed=3), 8
    blocks = {"mobilenetv3_paddle": 4, "mobilenetv3_torchscript": 6}[name]
    return (corpus.build_model(name), {"input_shapes": corpus.input_shapes(name)},
            corpus.random_feeds(name, seed=3), blocks)


def _check_choices(plan) -> None:
    blocks = [w for w in plan.report["workloads"] if w["op"] == "InvertedResidual"]
    impls_of_steps = {}
    for step in plan.manifest["steps"]:
        impls_of_steps.setdefault(step["node"], step["impl"])
    for block in blocks:
        measured = {c["impl"]: c for c in block["candidates"] if c["status"] == "ok"}
        assert "micro.inverted_residual" in measured, block["candidates"]
        assert all(c["rel_l2_error"] < 1e-4 for c in measured.values())
        fused = measured["micro.inverted_residual"]
        separate = measured.get("ort.inverted_residual")
        if separate is None or fused["median_s"] + CREDIT_S < separate["median_s"]:
            expected_impl = fused["impl"]     # faster by more than a session call's worth
        elif separate["median_s"] <= fused["median_s"]:
            expected_impl = separate["impl"]
        else:                                  # within the credit: either rule may decide
            expected_impl = block["chosen_impl"]
        assert block["chosen_impl"] == expected_impl, block["reason"]
        assert all(impls_of_steps[node] == expected_impl for node in block["nodes"])


@pytest.mark.parametrize("name", ["mobilenet_v2_like", "efficientnet_like",
                                  "mobilenetv3_paddle", "mobilenetv3_torchscript"])
def test_fused_blocks_build_match_and_run_where_faster(name, tmp_path):
    if name.endswith("torchscript"):
        pytest.importorskip("torch")
    model, options, feeds, count = _model(name)
    path = tmp_path / "model.wpk"
    wpk.build(model, target="cpu", output=path, partition=False, **options, **FAST)
    plan = read_plan(path)
    blocks = [w for w in plan.report["workloads"] if w["op"] == "InvertedResidual"]
    assert sum(w["count"] for w in blocks) == count
    _check_choices(plan)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    actual = wpk.load(path).run(feeds)
    for output, value in zip(model.graph.output, expected):
        error = np.linalg.norm(actual[output.name] - value) / np.linalg.norm(value)
        assert error < 1e-4, (output.name, error)
