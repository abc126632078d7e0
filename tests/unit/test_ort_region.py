"""Consecutive onnxruntime steps of any kind run as one session (kernels/cpu/ort_region)."""

from __future__ import annotations

import pytest

import wpk
from tests import models
from wpk.core.numerics import relative_l2
from wpk.kernels import registry
from wpk.kernels.cpu.ort_region import RegionMember, region_model
from wpk.runtime import Session, example_feeds


def transformer_plan_on_onnxruntime():
    """The transformer encoder's plan with every step onnxruntime runs given to `ort`
    (whatever the timing chose), so the region logic is tested, not the planner."""
    plan = wpk.build(models.load_model("transformer_encoder"), target="cpu", progress=False,
                     warmup=0, repeats=1, min_time=0, partition=False)
    ort_node = registry.get("ort")
    for step in plan.manifest["steps"]:
        if ort_node.unsupported_reason(plan.workloads[step["workload_key"]]) is None:
            step.update(impl="ort", config={}, kind=ort_node.kind)
    return plan


def test_a_transformers_onnxruntime_steps_share_one_session_with_the_same_outputs():
    plan = transformer_plan_on_onnxruntime()
    assert sum(s.impl == "ort" for s in plan.steps) >= 15
    merged, stepwise = Session(plan), Session(plan, merge_regions=False)
    assert len(merged._calls) <= 2 < len(stepwise._calls)
    for seed in (0, 1):
        feeds = example_feeds(merged, seed)
        ours, reference = merged.run(feeds), stepwise.run(feeds)
        for name in reference:
            assert relative_l2(ours[name], reference[name]) <= 1e-6, name


def test_a_region_never_mixes_opsets():
    """Node semantics change between opsets (Squeeze's axes, Clip's bounds): a region model
    declares one, so steps of another opset start a new region."""
    plan = transformer_plan_on_onnxruntime()
    steps = [s for s in plan.steps if registry.get(s.impl).joins_regions][:2]

    def member(step, opset):
        workload = plan.workloads[step.workload_key]
        workload = type(workload)(**{**workload.__dict__, "opset": opset, "_key": ""})
        consts = {i: plan.weights[n] for i, n in enumerate(step.inputs) if n in plan.weights}
        return RegionMember(registry.get(step.impl), workload, consts, step.inputs,
                            step.outputs)

    model, *_ = region_model([member(steps[0], 17), member(steps[1], 17)])
    assert [o.version for o in model.opset_import if o.domain == ""] == [17]
    with pytest.raises(ValueError, match="one opset"):
        region_model([member(steps[0], 13), member(steps[1], 17)])
