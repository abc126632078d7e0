"""Consecutive ort.nchwc steps run as one onnxruntime session: same tensors, fewer calls."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import wpk
from tests import models
from wpk.core.numerics import relative_l2
from wpk.runtime import Session, step_joins_regions

from .plan_helpers import without_micro_kernels

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa


@pytest.fixture(scope="module")
def mobilenet_plan():
    """An untuned plan whose convolutions are onnxruntime's, so consecutive ort.nchwc steps
    form regions (the micro-kernels' default configs, which may win some convolutions or
    fused blocks and break the runs of onnxruntime steps apart, are not offered here)."""
    model = models.load_model("mobilenet_v2_like")
    with without_micro_kernels():
        plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                         partition=False)
    return model, plan


def test_regions_compute_every_tensor_the_steps_compute(mobilenet_plan):
    model, plan = mobilenet_plan
    # onnxruntime's steps: NCHWc convs and the fused blocks' three-conv form
    assert sum(step_joins_regions(step) for step in plan.steps) >= 2
    steps, merged = Session(plan, merge_regions=False), Session(plan)
    assert len(merged._calls) < len(steps._calls)  # some steps did merge
    for seed in (0, 1):
        feeds = models.random_inputs(model, seed=seed)
        expected = steps.run(feeds)
        got = merged.run(feeds)
        for name in expected:
            assert relative_l2(got[name], expected[name]) < 1e-6


def test_region_boundaries_never_share_arena_bytes(mobilenet_plan):
    """onnxruntime may reorder a region's nodes, so the tensors crossing a region's
    boundary must not share buffers; with the plan's reuse that splits some runs."""
    from wpk.runtime import _region

    _, plan = mobilenet_plan
    session = Session(plan)
    steps, start = plan.steps, 0
    outputs = {meta.name for meta in session.get_outputs()}
    while start < len(steps):
        end, exported = _region(steps, plan.weights, start, session._arrays, outputs)
        if end - start >= 2:
            produced = {name for s in steps[start:end] for name in s.outputs}
            boundary = {n for s in steps[start:end] for n in s.inputs
                        if n and n not in produced and n not in plan.weights} | exported
            arrays = [session._arrays[n] for n in boundary]
            for i, a in enumerate(arrays):
                for b in arrays[i + 1:]:
                    assert not np.shares_memory(a, b)
        start = end


def test_merged_session_matches_onnxruntime(mobilenet_plan):
    model, plan = mobilenet_plan
    feeds = models.random_inputs(model, seed=3)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    reference = ort.InferenceSession(model.SerializeToString(), options,
                                     providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    expected = dict(zip(names, reference.run(names, feeds)))
    got = Session(plan).run(feeds)
    for name in names:
        assert relative_l2(got[name], expected[name]) < 1e-4


def test_profile_still_times_every_step(mobilenet_plan):
    model, plan = mobilenet_plan
    rows = Session(plan).profile(models.random_inputs(model, seed=0), repeats=2)
    assert [row["node"] for row in rows] == [step.node for step in plan.steps]
    assert all(row["median_s"] > 0 for row in rows)
