"""Kernel-by-kernel verification of big CUDA pipelines (`kernels/cuda/kernel_by_kernel.py`)
and the point evaluation of the reference interpreter it compares with."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.dsl_workloads import draw_workload
from tests.unit.test_dsl_properties import SETTINGS
from tests.unit.test_winograd_cuda import H100, conv
from wpk.core.workload import EpilogueStep
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.evaluate import evaluate_points
from wpk.kernels.cuda.kernel_by_kernel import (
    FULL_PIPELINE_LANES,
    earlier_lanes,
    verify_kernel_by_kernel,
)
from wpk.kernels.cuda.winograd import (
    WINOGRAD_CUDA,
    error_bound,
    preferred_winograd_configs,
    winograd_constants,
)
from wpk.kernels.dsl_library import list_operators, load_operator
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.search.predicted import verify_generated

ALWAYS_SAMPLED = 1     # grids of more than one block run on sampled blocks


@pytest.mark.parametrize("name", list_operators())
def test_points_of_every_stage_equal_the_whole_evaluation(name):
    @settings(max_examples=3, **SETTINGS)
    @given(st.data())
    def run(data):
        op = load_operator(name)
        bindings, arrays = draw_workload(data, op)
        special = C.specialize(op, bindings)
        whole = C.evaluate(op, arrays, bindings, keep_locals=True)
        rng = np.random.default_rng(0)
        for stage in special.stages:
            values = whole[stage.name]
            if values.size == 0:
                continue
            points = np.stack([rng.integers(0, d, 40) for d in values.shape], axis=1)
            got = evaluate_points(special, arrays, stage.name, points.reshape(40, -1),
                                  bindings)
            np.testing.assert_array_equal(got, values[tuple(points.T)])

    run()


def test_a_stage_given_in_memory_is_read_not_recomputed():
    func, feeds, _, _ = _pipeline(conv(c=2, k=3, h=5, w=5, bias=False), 2)
    op = func.meta["operator"]
    whole = C.evaluate(op, feeds, keep_locals=True)
    points = np.array([[0, 1, 2, 3], [0, 2, 2, 2]])
    computed = evaluate_points(op, feeds, "Y", points)
    np.testing.assert_array_equal(computed, whole["Y"][tuple(points.T)])
    as_given = evaluate_points(op, dict(feeds, M=whole["M"] + 1.0), "Y", points)
    assert not np.allclose(as_given, computed)


def _pipeline(workload, m: int):
    config = next(c for c in preferred_winograd_configs(workload, H100, 2) if c["m"] == m)
    built = WINOGRAD_CUDA.build(workload, config, compile=False)
    inputs = random_inputs(workload, np.random.default_rng(2))
    feeds, output = WINOGRAD_CUDA.emulator_feeds(workload, inputs, config)
    return built.func, feeds, {output: reference(workload, inputs)[0]}, inputs


ODD = dict(c=5, k=7, h=9, w=11, pads=(1, 0, 2, 1),
           epilogue=(EpilogueStep("add", operand=3), EpilogueStep("relu")))


@pytest.mark.parametrize("m", [2, 4])
def test_every_kernel_of_a_winograd_pipeline_is_checked_on_sampled_blocks(m):
    workload = conv(**ODD)
    func, feeds, expected, _ = _pipeline(workload, m)
    result = verify_kernel_by_kernel(func, feeds, expected, error_bound(workload, m),
                                     full_grid_blocks=ALWAYS_SAMPLED)
    assert result.ok, result.message
    assert result.sampled and 0 < result.rel_l2_error <= error_bound(workload, m)


def test_a_wrong_constant_fails_the_operator_check():
    workload = conv(**ODD)
    func, feeds, expected, inputs = _pipeline(workload, 4)
    flipped = winograd_constants(inputs[1][:, :, ::-1, :], 4)["U"]
    result = verify_kernel_by_kernel(func, dict(feeds, U=flipped),
                                     expected, error_bound(workload, 4),
                                     full_grid_blocks=ALWAYS_SAMPLED)
    assert not result.ok and "the operator differs from the reference" in result.message


def _edit_stores(stmt: L.Stmt, buffer: str, edit) -> L.Stmt | None:
    """`stmt` with every store to `buffer` replaced by `edit(store)` (None drops it)."""
    if isinstance(stmt, L.Store):
        return edit(stmt) if stmt.buffer == buffer else stmt
    changes = {}
    for field in dataclasses.fields(stmt):
        value = getattr(stmt, field.name)
        if isinstance(value, L.Stmt):
            changes[field.name] = _edit_stores(value, buffer, edit) or L.Seq(())
        elif isinstance(value, tuple) and value and isinstance(value[0], L.Stmt):
            changes[field.name] = tuple(_edit_stores(s, buffer, edit) or L.Seq(())
                                        for s in value)
    return dataclasses.replace(stmt, **changes)


def _with_kernel_edited(func: L.PrimFunc, buffer: str, edit) -> L.PrimFunc:
    kernels = tuple(dataclasses.replace(k, body=_edit_stores(k.body, buffer, edit))
                    for k in func.kernels)
    return dataclasses.replace(func, kernels=kernels, meta=func.meta)


def test_a_kernel_off_by_a_little_fails_on_its_own_inputs():
    workload = conv(**ODD)
    func, feeds, expected, _ = _pipeline(workload, 2)
    scaled = _with_kernel_edited(func, "M", lambda s: dataclasses.replace(
        s, value=L.binary("*", s.value, L.const(1.001, "f32"))))
    result = verify_kernel_by_kernel(scaled, feeds, expected, error_bound(workload, 2),
                                     full_grid_blocks=ALWAYS_SAMPLED)
    assert not result.ok
    assert "winograd_conv2d_bias_M" in result.message and "of M on its inputs" in result.message


def test_a_kernel_that_writes_nothing_fails():
    workload = conv(**ODD)
    func, feeds, expected, _ = _pipeline(workload, 2)
    silent = _with_kernel_edited(func, "V", lambda s: None)
    result = verify_kernel_by_kernel(silent, feeds, expected, error_bound(workload, 2),
                                     full_grid_blocks=ALWAYS_SAMPLED)
    assert not result.ok and "wrote no element of V" in result.message


def test_big_pipelines_are_verified_kernel_by_kernel_small_ones_end_to_end():
    big = conv(c=64, k=64, h=56, w=56)
    config = preferred_winograd_configs(big, H100, 1)[0]
    built = WINOGRAD_CUDA.build(big, config, compile=False)
    assert earlier_lanes(built.func) > FULL_PIPELINE_LANES
    result = verify_generated(big, built, candidate=Candidate(WINOGRAD_CUDA, config))
    assert result.ok, result.message
    first_grid = int(np.prod(built.launches[0].launch.grid))
    assert result.blocks < first_grid          # not even the first kernel ran fully
    small = conv(**ODD)
    config = preferred_winograd_configs(small, H100, 1)[0]
    built = WINOGRAD_CUDA.build(small, config, compile=False)
    result = verify_generated(small, built, candidate=Candidate(WINOGRAD_CUDA, config))
    earlier = sum(int(np.prod(item.launch.grid)) for item in built.launches[:-1])
    assert result.ok and result.blocks > earlier   # the earlier kernels ran fully
