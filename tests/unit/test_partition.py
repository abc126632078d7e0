"""The end-to-end check against onnxruntime's whole model (wpk.partition)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.plan_helpers import SLOW
from wpk import pipeline
from wpk.cli import main
from wpk.core.errors import WpkError
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.kernels.registry import Candidate
from wpk.partition import (
    ONNXRUNTIME,
    REGIONS,
    UNTUNED,
    WPK,
    PartitionOptions,
    choose_partition,
    decide,
    paired_ratio,
)
from wpk.plans.assemble import whole_model_plan
from wpk.plans.planfile import read_plan
from wpk.plans.planner import (
    Choice,
    PlanChoices,
    on_generated_kernels,
    untuned_choices,
    within_regions,
)
from wpk.runtime import Session
from wpk.search.measure import Measurement, Status


def tiny_matmuls(count: int = 120, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """`count` chained 8x8 MatMuls: onnxruntime runs them in one session call, a plan in
    `count` steps, so onnxruntime's whole model is many times faster."""
    rng = np.random.default_rng(seed)
    nodes, weights, value = [], [], "x"
    for i in range(count):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        value = f"y{i}"
    graph = helper.make_graph(nodes, "tiny_matmuls",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, size])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT,
                                                             [4, size])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_decide_gives_ties_to_onnxruntime():
    """wpk's plan replaces onnxruntime's whole model only when measured `margin` faster."""
    times = {WPK: [1.01, 1.02, 1.00], ONNXRUNTIME: [1.0, 1.0, 1.0]}
    assert decide(times, margin=0.02)[:2] == (ONNXRUNTIME, pytest.approx(1.01))
    times = {WPK: [0.99, 0.99, 0.99], ONNXRUNTIME: [1.0, 1.0, 1.0]}
    assert decide(times, margin=0.02)[0] == ONNXRUNTIME  # within the margin
    times = {WPK: [0.97, 0.98, 0.96], ONNXRUNTIME: [1.0, 1.0, 1.0]}
    assert decide(times, margin=0.02) == (WPK, pytest.approx(0.97), 1, 1)
    times = {WPK: [1.5, 1.4, 1.6], ONNXRUNTIME: [1.0, 1.1, 0.9]}
    assert decide(times, margin=0.02)[0] == ONNXRUNTIME
    assert decide({WPK: [0.5], ONNXRUNTIME: [1.0]}, margin=0.02) == (WPK, 0.5, 1, 1)


def test_decide_wants_wpk_faster_round_after_round_not_only_in_the_pooled_median():
    """Four rounds of two runs: wpk far ahead in two slow-machine rounds pulls its median
    7.5% below onnxruntime's, though it lost the other two rounds: onnxruntime's whole
    model stays. Ahead in three of four rounds (the default share) is enough."""
    ort = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    split = {WPK: [0.80, 0.80, 1.03, 1.03, 0.82, 0.82, 1.04, 1.04], ONNXRUNTIME: ort}
    winner, ratio, won, rounds = decide(split, margin=0.02, runs=2)
    assert ratio <= 0.98 and (winner, won, rounds) == (ONNXRUNTIME, 2, 4)
    steady = {WPK: [0.95, 0.95, 0.96, 0.96, 1.01, 1.01, 0.95, 0.95], ONNXRUNTIME: ort}
    assert decide(steady, margin=0.02, runs=2) == (WPK, pytest.approx(0.955), 3, 4)
    assert decide(steady, margin=0.02, runs=2, win_share=1.0)[0] == ONNXRUNTIME
    # a negative margin lets a slower plan stay, round by round too
    assert decide({WPK: [1.2, 1.2], ONNXRUNTIME: [1.0, 1.0]}, margin=-0.5, runs=1)[0] == WPK


def test_decide_compares_the_two_within_each_round_not_medians_pooled_over_stages():
    """Confirmations at three speeds of the machine (a SqueezeNet build: 1.01x, 0.90x
    and 0.88x, ahead in 19 of 24 rounds): the medians pooled over all of them put wpk's plan
    level with onnxruntime's, although it lost only the first stage's rounds; compared round
    by round, it runs at 0.90x and stays."""
    stages = [(8.87, [9.0] * 5 + [8.8] * 3), (9.87, [8.9] * 8), (6.83, [6.0] * 8)]
    times = {WPK: [], ONNXRUNTIME: []}
    for theirs, ours in stages:
        for value in ours:
            times[WPK] += [value] * 2
            times[ONNXRUNTIME] += [theirs] * 2
    pooled = np.median(times[WPK]) / np.median(times[ONNXRUNTIME])
    assert pooled > 0.99
    winner, ratio, won, rounds = decide(times, margin=0.02, runs=2, paired=True)
    assert (winner, won, rounds) == (WPK, 19, 24)
    assert ratio == pytest.approx(8.9 / 9.87)
    assert paired_ratio(times, runs=2) == ratio
    assert paired_ratio(times) == pytest.approx(pooled)   # one round of all: the medians
    # unpaired (among all of wpk's plans, whose rounds are long): the pooled medians
    assert decide(times, margin=0.02, runs=2)[:2] == (ONNXRUNTIME, pytest.approx(pooled))


def test_a_plan_slower_than_onnxruntime_becomes_onnxruntimes_whole_model(tmp_path):
    model = tiny_matmuls(count=6)
    slow = wpk.build(model, target="cpu", progress=False, partition=False)
    for step in slow.manifest["steps"]:
        step["impl"] = SLOW.name
    whole = whole_model_plan(load_model(model), model.SerializeToString())
    chosen, summary = choose_partition(slow, whole, PartitionOptions(blocks=2, runs=3))
    assert chosen is whole and summary["winner"] == ONNXRUNTIME, summary
    assert summary["ratio"] > 10 and summary["rel_l2_between"] <= 1e-4
    (step,) = chosen.steps
    assert step.impl == "ort.model" and step.artifacts
    path = chosen.save(tmp_path / "m.wpk")
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = wpk.load(str(path)).run(None, {"x": x})
    assert relative_l2(got, expected) <= 1e-6


def test_a_build_measures_the_whole_model_and_keeps_the_per_operator_report():
    model = tiny_matmuls()
    plan = wpk.build(model, target="cpu", progress=False)
    summary = plan.report["partition"]
    assert summary["winner"] in (WPK, ONNXRUNTIME) and summary["rel_l2_between"] <= 1e-4
    assert summary["runs"] >= 6 and summary["wpk_median_s"] > 0
    # ties go to onnxruntime: wpk's plan stays only when at least 2% faster, in 3/4 of
    # the rounds
    kept = summary["ratio"] <= 0.98 and summary["rounds_won"] >= 0.75 * summary["rounds"]
    assert (summary["winner"] == WPK) == kept and summary["rounds"] >= 1
    assert (plan.steps[0].impl == "ort.model") == (summary["winner"] == ONNXRUNTIME)
    assert len(plan.report["workloads"]) >= 1   # the per-operator report stays
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = Session(plan).run(None, {"x": x})
    assert relative_l2(got, expected) <= 1e-5


def _stages(monkeypatch, *stages: tuple[float, ...]):
    """Make the n-th call of `measure_blocks` return `stages[n]` (the last one again after
    that): wpk's block medians against onnxruntime's at 1.0, runs of 2 per block; record
    which sessions each call timed."""
    from wpk import partition

    calls = []

    def fake(sessions, feeds, options):
        ratios = stages[min(len(calls), len(stages) - 1)]
        calls.append(sorted(sessions))
        ort = [1.0] * 2 * len(ratios)
        ours = [r for r in ratios for _ in range(2)]
        return {name: (ort if name == ONNXRUNTIME else ours) for name in sessions}

    monkeypatch.setattr(partition, "measure_blocks", fake)
    return calls


def _tiny_plans():
    model = tiny_matmuls(count=4)
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    return per_op, whole_model_plan(load_model(model), model.SerializeToString())


@pytest.mark.parametrize("selection, confirmation, winner", [
    # ahead in the pooled median, behind in half the rounds: the confirmation decides
    ((0.80, 1.03, 0.82, 1.04), (0.90, 0.91, 0.89, 0.90), WPK),
    # ahead round after round among all plans, not against onnxruntime alone
    ((0.93, 0.94, 0.92, 0.93), (0.99, 1.02, 0.97, 1.01), ONNXRUNTIME),
])
def test_the_fastest_plan_is_confirmed_against_onnxruntime_alone(monkeypatch, selection,
                                                                 confirmation, winner):
    per_op, whole = _tiny_plans()
    calls = _stages(monkeypatch, selection, confirmation)
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(runs=2))
    assert calls == [sorted([WPK, ONNXRUNTIME])] * 2  # the second: the two alone
    assert summary["winner"] == winner and summary["confirmed"] is True
    assert (chosen is per_op) == (winner == WPK)
    assert summary["ratio"] == pytest.approx(np.median(confirmation))
    assert summary["selection_ratio"] == pytest.approx(np.median(selection))
    assert summary["rounds"] == 4 and "which decide" in summary["method"]
    assert summary["paired"] is True
    from wpk.commands.render import partition_lines
    line = partition_lines({"partition": summary})[0]
    assert "confirmation against onnxruntime alone" in line
    assert f"{np.median(confirmation):.2f}x round by round, faster in" in line


@pytest.mark.parametrize("stages, ratios, winner, unsteady", [
    # the usual flattery of the fastest plan: one confirmation
    (((0.85,) * 4, (0.90,) * 4), (0.90,), WPK, False),
    # DeepLab's build in a slow stretch (0.87x, then 1.05x), still slow: onnxruntime
    (((0.87,) * 4, (1.05,) * 4, (1.04,) * 4), (1.05, 1.04), ONNXRUNTIME, False),
    # both ahead, a third apart, then steady: wpk
    (((0.60,) * 4, (0.80,) * 4), (0.80, 0.80), WPK, False),
    # slow, then quiet twice: the 12 rounds pooled, 8 of 12 won (short of 3 in 4)
    (((0.87,) * 4, (1.05,) * 4, (0.86,) * 4, (0.85,) * 4), (1.05, 0.86, 0.85), ONNXRUNTIME,
     False),
    # never steady: three confirmations (two more at most), still unsteady
    (((0.87,) * 4, (1.05,) * 4, (0.80,) * 4, (1.10,) * 4, (0.5,) * 4), (1.05, 0.80, 1.10),
     ONNXRUNTIME, True),
])
def test_a_confirmation_that_disagrees_with_the_stage_before_is_measured_again(
        monkeypatch, stages, ratios, winner, unsteady):
    """A confirmation more than 10% off the stage before it (the machine's speed changed):
    up to two more, until two in a row agree, and all of them decide together."""
    per_op, whole = _tiny_plans()
    calls = _stages(monkeypatch, *stages)
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(runs=2, settle_s=0))
    assert len(calls) == 1 + len(ratios)
    assert summary["confirmations"] == pytest.approx(list(ratios))
    assert summary["rounds"] == 4 * len(ratios)
    assert summary["winner"] == winner and (chosen is per_op) == (winner == WPK)
    assert summary["unsteady"] is unsteady
    from wpk.commands.render import partition_lines
    lines = partition_lines({"partition": summary})
    assert (f"{len(ratios)} confirmations against onnxruntime alone" in lines[0]) == (
        len(ratios) > 1)
    assert any("confirmed" in line and f"{ratios[-1]:.2f}x), all of them deciding" in line
               for line in lines) == (len(ratios) > 1)
    assert any("still disagree" in line and f"({ratios[-2]:.2f}x, {ratios[-1]:.2f}x)" in line
               for line in lines) == unsteady


@pytest.mark.parametrize("extension, winner, won", [
    ((0.90, 0.90, 0.90, 0.90), WPK, 6),          # 2 of 4, then 4 of 4: 6 of 8
    ((0.90, 1.10, 0.90, 0.90), ONNXRUNTIME, 5),  # 2 + 3: 5 of 8, short of 3 in 4
])
def test_a_confirmation_whose_median_and_rounds_disagree_gets_as_many_rounds_again(
        monkeypatch, extension, winner, won):
    """Ahead in the median, behind in half the rounds (a slow stretch on two of wpk's
    blocks): 4 more rounds, and all 8 decide by the same rule."""
    per_op, whole = _tiny_plans()
    calls = _stages(monkeypatch, (0.9,) * 4, (0.85, 0.85, 1.3, 1.01), extension)
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(runs=2))
    assert len(calls) == 3 and summary["rounds"] == 8
    assert summary["winner"] == winner and summary["rounds_won"] == won
    assert (chosen is per_op) == (winner == WPK)


def test_a_confirmation_behind_in_the_median_gets_no_more_rounds(monkeypatch):
    per_op, whole = _tiny_plans()
    calls = _stages(monkeypatch, (0.92,) * 4, (0.99, 1.3, 0.99, 0.90), (0.5,) * 4)
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(runs=2))
    assert len(calls) == 2 and chosen is whole and summary["rounds"] == 4


def test_a_plan_not_ahead_among_all_is_not_confirmed(monkeypatch):
    """wpk's fastest plan within the margin of onnxruntime's in the first stage: no second
    stage, onnxruntime's whole model stays."""
    per_op, whole = _tiny_plans()
    calls = _stages(monkeypatch, (0.99, 0.99, 0.99, 0.99), (0.5, 0.5, 0.5, 0.5))
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(runs=2))
    assert len(calls) == 1 and chosen is whole and summary["confirmed"] is False
    assert summary["ratio"] == pytest.approx(0.99) and "not 2% faster" in summary["reason"]


def test_no_partition_keeps_the_per_operator_plan(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_matmuls(count=6), path)
    out = tmp_path / "m.wpk"
    assert main(["build", str(path), "-q", "--no-partition", "-o", str(out)]) == 0
    plan = read_plan(out)
    assert "partition" not in plan.report and len(plan.steps) == 6


def test_a_whole_model_that_disagrees_is_never_chosen():
    """Outputs of the two must agree before timing decides: here the 'whole model' is
    another network, so the per-operator plan (verified per operator) stays."""
    per_op = wpk.build(tiny_matmuls(count=3, seed=0), target="cpu", progress=False,
                       partition=False)
    other = tiny_matmuls(count=3, seed=1)
    whole = whole_model_plan(load_model(other), other.SerializeToString())
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(blocks=1, runs=1))
    assert chosen is per_op and summary["winner"] == WPK
    assert "differ" in summary["reason"] and summary["rel_l2_between"] > 1e-4


def test_a_plan_with_a_rounding_sensitive_node_may_differ_within_its_tolerance():
    """A plan holding a workload verified within twice onnxruntime's own error (the
    report's `tolerance`, `wpk.plans.planner.loosened_tolerance`) is compared with
    onnxruntime within that tolerance: here a "whole model" whose weights are 0.2% off
    (about 3e-3 relative L2 at the output) is timed against a plan with a workload at
    0.02, and refused with one at 1e-3 and with none."""
    per_op = wpk.build(tiny_matmuls(count=3, seed=0), target="cpu", progress=False,
                       partition=False)
    other = tiny_matmuls(count=3, seed=0)
    for weight in other.graph.initializer:
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.002,
                                                weight.name))
    whole = whole_model_plan(load_model(other), other.SerializeToString())
    options = PartitionOptions(blocks=1, runs=1, confirm_blocks=0)
    decided = {}
    for tolerance in (None, 1e-3, 0.02):
        if tolerance is not None:
            per_op.report["workloads"][0]["tolerance"] = tolerance
        _, decided[tolerance] = choose_partition(per_op, whole, options)
    for refused in (None, 1e-3):
        assert "differ" in decided[refused]["reason"] and "wpk_median_s" not in decided[refused]
    assert 1e-3 < decided[0.02]["rel_l2_between"] < 0.02
    assert decided[0.02]["agreement_tolerance"] == 0.02 and "wpk_median_s" in decided[0.02]


def test_a_negative_margin_keeps_a_slower_plan():
    """margin < 0 lets wpk's plan stay up to |margin| slower (here: whatever the times)."""
    model = tiny_matmuls(count=4)
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    whole = whole_model_plan(load_model(model), model.SerializeToString())
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(blocks=1, runs=2,
                                                                       margin=-1e6))
    assert chosen is per_op and summary["winner"] == WPK and summary["ratio"] > 0
    outputs = Session(chosen).run({"x": np.ones((4, 8), np.float32)})
    assert np.isfinite(next(iter(outputs.values()))).all()


def test_a_whole_model_plan_feeds_onnxruntime_directly_and_gives_fresh_outputs():
    model = tiny_matmuls(count=3)
    session = Session(whole_model_plan(load_model(model), model.SerializeToString()))
    assert session._direct is not None  # no copy into the arena, none out of it
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    first = rng.standard_normal((4, 8)).astype(np.float32)
    second = rng.standard_normal((4, 8)).astype(np.float32)
    got_first = session.run({"x": first})["y2"]
    got_second = session.run(["y2"], {"x": second})[0]
    assert got_first is not got_second  # a run's result is not overwritten by the next
    assert relative_l2(got_first, peer.run(None, {"x": first})[0]) <= 1e-6
    assert relative_l2(got_second, peer.run(None, {"x": second})[0]) <= 1e-6
    with pytest.raises(WpkError, match="dtype"):
        session.run({"x": first.astype(np.float64)})
    with pytest.raises(WpkError, match="shape"):
        session.run({"x": first[:2]})


def _slow_choices(choices):
    """Every choice given to SlowMatMul, as if it had measured fastest on its own; what
    onnxruntime measured for the workload stays among its measurements."""
    swapped = {}
    for key, choice in choices.choices.items():
        fast = Measurement(label=SLOW.name, impl=SLOW.name, config={}, status=Status.OK,
                           times_s=(1e-9,), median_s=1e-9, workload_key=key)
        swapped[key] = dataclasses.replace(choice, candidate=Candidate(SLOW, {}),
                                           measurement=fast,
                                           measurements=[fast, *choice.measurements])
    return PlanChoices(swapped)


def test_within_regions_gives_back_every_step_that_leaves_them():
    model = tiny_matmuls(count=3)
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    timed = Measurement("ort", "ort", {}, Status.OK, (2e-6,), 2e-6)
    choices = PlanChoices({key: Choice(workload, ["mm"], ["MatMul"],
                                       Candidate(registry.get("ort"), {}), timed, [timed])
                           for key, workload in per_op.workloads.items()})
    assert within_regions(choices) is None  # nothing leaves a region: nothing to compare
    kept = within_regions(_slow_choices(choices))
    assert kept is not None
    for choice in kept:
        assert choice.candidate.implementation.name == "ort"
        assert choice.reason["rule"] == "region" and choice.reason["faster"] == SLOW.name
        assert choice.reason["over_s"] == pytest.approx(2e-6 - 1e-9)


def test_a_build_whose_per_operator_wins_lose_end_to_end_keeps_the_regions(monkeypatch):
    """Per-operator choices that leave onnxruntime's regions (here: a kernel 'measured' at
    1 ns that sleeps 2 ms in the plan) are measured end to end against the same plan with
    those steps given back to onnxruntime, and lose."""
    real = pipeline.plan_workloads

    def slow_plan_workloads(*args, **kwargs):
        choices, search, parallel = real(*args, **kwargs)
        return _slow_choices(choices), search, parallel

    monkeypatch.setattr(pipeline, "plan_workloads", slow_plan_workloads)
    plan = wpk.build(tiny_matmuls(count=6), target="cpu", progress=False)
    summary = plan.report["partition"]
    medians = summary["medians_s"]
    assert summary["compared"] == [WPK, REGIONS, ONNXRUNTIME]
    assert medians["within regions"] * 5 < medians["per-operator"]
    assert all(step.impl != SLOW.name for step in plan.steps)
    if summary["winner"] == WPK:
        assert summary["plan"] == "within regions" and "given back" in summary["reason"]
        rules = {entry["reason"]["rule"] for entry in plan.report["workloads"]}
        assert rules == {"region"}


def test_untuned_choices_take_the_fastest_candidate_an_untuned_build_offers():
    """The tuned (here: SlowMatMul, 'measured' at 1 ns) choice of every workload is replaced
    by the fastest measured candidate an untuned build offers; nothing changes when the
    tuned candidate is offered too."""
    per_op = wpk.build(tiny_matmuls(count=3), target="cpu", progress=False, partition=False)
    timed = Measurement("ort", "ort", {}, Status.OK, (2e-6,), 2e-6)
    slower = Measurement("numpy.matmul", "numpy.matmul", {}, Status.OK, (5e-6,), 5e-6)
    choices = PlanChoices({key: Choice(workload, ["mm"], ["MatMul"],
                                       Candidate(registry.get("ort"), {}), timed,
                                       [slower, timed])
                           for key, workload in per_op.workloads.items()})
    tuned = _slow_choices(choices)
    offered = {key: {"ort", "numpy.matmul"} for key in per_op.workloads}
    untuned = untuned_choices(tuned, offered)
    assert untuned is not None and untuned.untuned is None
    for choice in untuned:
        assert choice.candidate.implementation.name == "ort"
        assert choice.reason["rule"] == "untuned" and choice.reason["faster"] == SLOW.name
    offered = {key: {"ort", SLOW.name} for key in per_op.workloads}
    assert untuned_choices(tuned, offered) is None
    from wpk.commands.render import reason_tag, reason_text
    entry = {"candidates": [{}, {}], "reason": next(iter(untuned)).reason}
    assert "tuned plan lost end to end" in reason_text(entry) and SLOW.name in reason_text(entry)
    assert reason_tag(entry).startswith("untuned +")


def test_a_tuned_plan_that_loses_end_to_end_to_the_untuned_one_is_not_kept(monkeypatch):
    """A tuned build (here: every choice SlowMatMul, 1 ns alone, 2 ms in the plan) measures
    the plan of its untuned candidates next to the tuned plan, and the tuned one loses."""
    real = pipeline.plan_workloads

    def tuned_plan_workloads(*args, **kwargs):
        choices, search, parallel = real(*args, **kwargs)
        tuned = _slow_choices(choices)
        tuned.untuned = choices          # what the untuned candidates chose
        return tuned, search, parallel

    monkeypatch.setattr(pipeline, "plan_workloads", tuned_plan_workloads)
    plan = wpk.build(tiny_matmuls(count=6), target="cpu", progress=False)
    summary = plan.report["partition"]
    assert UNTUNED in summary["compared"], summary["compared"]
    assert summary["medians_s"]["untuned"] * 5 < summary["medians_s"]["per-operator"]
    assert all(step.impl != SLOW.name for step in plan.steps)
    if summary["winner"] == WPK and summary["plan"] == "untuned":
        assert "untuned build offers" in summary["reason"]
        from wpk.commands.render import partition_lines
        assert "untuned build's candidates" in partition_lines(plan.report)[0]


def test_the_report_says_when_a_step_went_back_into_its_region():
    from wpk.commands.render import partition_lines, reason_text
    workload = {"candidates": [{}, {}], "reason": {"rule": "region", "verified": 2,
                                                  "faster": "gen.conv[x=1]", "over_s": 3e-6,
                                                  "credit_s": 3e-6, "end_to_end": True}}
    assert "lost end to end" in reason_text(workload) and "gen.conv[x=1]" in reason_text(workload)
    report = {"partition": {"winner": WPK, "plan": "within regions", "wpk_median_s": 1e-3,
                            "onnxruntime_median_s": 1.1e-3, "ratio": 0.91}}
    (line,) = partition_lines(report)   # a plan built before the rounds were reported
    assert "given back" in line and "0.91x" in line and "rounds" not in line
    report["partition"].update(rounds_won=7, rounds=8)
    assert "0.91x, faster in 7 of 8 rounds" in partition_lines(report)[0]


def _one_node_model(op: str, elem_type: int, out_type: int | None = None,
                    **attrs) -> onnx.ModelProto:
    inputs = ["x", "y"] if op == "Max" else ["x"]
    node = helper.make_node(op, inputs, ["z"], **attrs)
    graph = helper.make_graph([node], op.lower(),
                              [helper.make_tensor_value_info(n, elem_type, [4, 8])
                               for n in inputs],
                              [helper.make_tensor_value_info("z", out_type or elem_type,
                                                             [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_a_whole_model_onnxruntime_cannot_run_is_never_chosen():
    """onnxruntime has no int16 Max kernel: the node runs on onnx.reference, and the
    partition keeps the verified plan instead of failing on onnxruntime's session."""
    plan = wpk.build(_one_node_model("Max", TensorProto.INT16), target="cpu", progress=False)
    summary = plan.report["partition"]
    assert summary["winner"] == WPK and "cannot run the whole model" in summary["reason"]
    assert [s.impl for s in plan.steps] == ["onnx.reference"]
    rng = np.random.default_rng(0)
    x, y = (rng.integers(-1000, 1000, (4, 8)).astype(np.int16) for _ in range(2))
    assert np.array_equal(Session(plan).run({"x": x, "y": y})["z"], np.maximum(x, y))


def test_a_whole_model_onnxruntime_computes_wrongly_is_never_chosen():
    """onnxruntime's float -> float8e4m3fn Cast fails verification against the reference:
    its whole model cannot stand in for the plan, whatever its speed."""
    model = _one_node_model("Cast", TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN,
                            to=TensorProto.FLOAT8E4M3FN)
    plan = wpk.build(model, target="cpu", progress=False)
    summary = plan.report["partition"]
    assert summary["winner"] == WPK and "failed verification" in summary["reason"], summary
    (entry,) = plan.report["workloads"]
    statuses = {c["impl"]: c["status"] for c in entry["candidates"]}
    assert statuses["ort.fallback"] != "ok" and statuses["onnx.reference"] == "ok"
    x = np.random.default_rng(1).uniform(-500, 500, (4, 8)).astype(np.float32)
    from onnx.reference import ReferenceEvaluator
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = Session(plan).run({"x": x})["z"]
    assert got.dtype == expected.dtype and np.array_equal(got.astype(np.float32),
                                                          expected.astype(np.float32))


def test_on_generated_kernels_gives_close_onnxruntime_steps_to_generated_kernels():
    """The one-pool contender: a step onnxruntime won is given to the fastest verified
    generated kernel measured for it when that is at most `max_slowdown` slower alone."""
    model = tiny_matmuls(count=3)
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    ort_time = Measurement("ort", "ort", {}, Status.OK, (2e-6,), 2e-6)
    gemm = registry.get("micro.gemm")

    def choices(generated_s: float, status: Status = Status.OK) -> PlanChoices:
        found = {}
        for key, workload in per_op.workloads.items():
            config = gemm.configs(workload)[0]
            generated = Measurement("micro.gemm", "micro.gemm", config, status,
                                    (generated_s,), generated_s, workload_key=key)
            found[key] = Choice(workload, ["mm"], ["MatMul"], Candidate(registry.get("ort"), {}),
                                ort_time, [ort_time, generated])
        return PlanChoices(found)

    pooled = on_generated_kernels(choices(2.4e-6), max_slowdown=1.25)
    assert pooled is not None
    for choice in pooled:
        assert choice.candidate.implementation.name == "micro.gemm"
        assert choice.reason["rule"] == "one-pool" and choice.reason["faster"] == "ort"
        assert choice.reason["over_s"] == pytest.approx(0.4e-6)
    assert on_generated_kernels(choices(2.6e-6), max_slowdown=1.25) is None  # too slow
    from wpk.commands.render import partition_lines, reason_text
    entry = {"candidates": [{}, {}], "reason": pooled.choices[next(iter(pooled.choices))].reason}
    assert "one thread pool" in reason_text(entry) and "ort" in reason_text(entry)
    report = {"partition": {"winner": WPK, "plan": "generated kernels", "wpk_median_s": 1e-3,
                            "onnxruntime_median_s": 1.1e-3, "ratio": 0.91}}
    assert "given to generated kernels" in partition_lines(report)[0]
    assert on_generated_kernels(choices(1e-6, Status.WRONG_ANSWER), max_slowdown=1.25) is None


def test_on_generated_kernels_keeps_pool_free_library_steps_and_takes_them_from_ort():
    """numpy's data movement (no thread pool of its own; it joins the native chain) counts
    as one-pool: an onnxruntime Transpose goes to numpy.copy, a BLAS-backed numpy step
    does not stand in for onnxruntime."""
    assert registry.get("numpy.copy").one_pool
    assert not registry.get("numpy.matmul").one_pool
    assert not registry.get("ort").one_pool
    workload = Workload("Transpose", (TensorSpec((4, 8), "float32"),),
                        (TensorSpec((8, 4), "float32"),))
    ort_time = Measurement("ort", "ort", {}, Status.OK, (2e-6,), 2e-6)
    copy_time = Measurement("numpy.copy", "numpy.copy", {}, Status.OK, (3e-6,), 3e-6)
    onnxruntime_won = PlanChoices({"t": Choice(workload, ["t"], ["Transpose"],
                                               Candidate(registry.get("ort"), {}), ort_time,
                                               [ort_time, copy_time])})
    (choice,) = on_generated_kernels(onnxruntime_won)
    assert choice.candidate.implementation.name == "numpy.copy"
    assert choice.reason["rule"] == "one-pool"
    numpy_won = PlanChoices({"t": Choice(workload, ["t"], ["Transpose"],
                                         Candidate(registry.get("numpy.copy"), {}), copy_time,
                                         [ort_time, copy_time])})
    assert on_generated_kernels(numpy_won) is None


def test_on_generated_kernels_takes_steps_without_a_native_form_into_the_chain():
    """numpy's elementwise Add computes on the calling thread but has no native form, so it
    splits the generated kernels' chain: a generated kernel up to 3x slower alone takes it
    (ConvNeXt's residual Adds: 45 us alone, 220-240 us between two native calls); a
    numpy copy, which is one native copy, stays."""
    add = registry.get("numpy.elementwise")
    assert add.one_pool and not add.native_chain(_add_workload())
    assert registry.get("numpy.copy").native_chain(
        Workload("Transpose", (TensorSpec((4, 8), "float32"),), (TensorSpec((8, 4), "float32"),)))
    numpy_time = Measurement("numpy.elementwise", "numpy.elementwise", {}, Status.OK,
                             (45e-6,), 45e-6)
    dsl_time = Measurement("dsl.cpu", "dsl.cpu", {"vector": 16, "parallel": 1}, Status.OK,
                           (56e-6,), 56e-6)
    numpy_won = PlanChoices({"a": Choice(_add_workload(), ["a"], ["Add"],
                                         Candidate(add, {}), numpy_time,
                                         [numpy_time, dsl_time])})
    (choice,) = on_generated_kernels(numpy_won).choices.values()
    assert choice.candidate.implementation.name == "dsl.cpu"
    assert choice.reason["rule"] == "one-pool"
    slow = dataclasses.replace(dsl_time, median_s=200e-6, times_s=(200e-6,))
    far = PlanChoices({"a": Choice(_add_workload(), ["a"], ["Add"], Candidate(add, {}),
                                   numpy_time, [numpy_time, slow])})
    assert on_generated_kernels(far) is None


def _add_workload() -> Workload:
    spec = TensorSpec((1, 6, 56, 56, 16), "float32")
    return Workload("Add", (spec, spec), (spec,))
