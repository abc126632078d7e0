"""Steps timed inside runs, and the plan of two plans' faster steps (wpk.in_run)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.plan_helpers import SLEEP_S, SLOW
from wpk import pipeline
from wpk.in_run import in_run_times, mixed_choices
from wpk.kernels import registry
from wpk.kernels.registry import Candidate
from wpk.partition import MIXED, WPK
from wpk.plans.planfile import Plan
from wpk.plans.planner import Choice, PlanChoices
from wpk.search.measure import Measurement, Status


def two_workloads(count: int = 4) -> onnx.ModelProto:
    """`count` chained MatMuls alternating [4, 8] x [8, 12] and [4, 12] x [12, 8]: two
    distinct workloads, `count // 2` nodes each, never two of one after the other."""
    rng = np.random.default_rng(0)
    nodes, weights, value = [], [], "x"
    for i in range(count):
        shape = (8, 12) if i % 2 == 0 else (12, 8)
        w = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        value = f"y{i}"
    width = 12 if count % 2 else 8
    graph = helper.make_graph(nodes, "two_workloads",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT,
                                                             [4, width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _keys(plan: Plan) -> tuple[str, str]:
    """The workload keys of the model's even and odd MatMuls."""
    by_node = {step.node: step.workload_key for step in plan.steps}
    return by_node["mm0"], by_node["mm1"]


def _with_slow(plan: Plan, key: str) -> Plan:
    """`plan` with every step of workload `key` run by SlowMatMul."""
    manifest = dict(plan.manifest)
    manifest["steps"] = [{**step, "impl": SLOW.name, "artifacts": []}
                         if step["workload_key"] == key else step
                         for step in plan.manifest["steps"]]
    return Plan(manifest, plan.weights, report=plan.report, kernels=plan.kernels)


def test_steps_are_timed_inside_runs_by_workload():
    plan = wpk.build(two_workloads(), target="cpu", progress=False, partition=False)
    even, odd = _keys(plan)
    times = in_run_times({"a": _with_slow(plan, even), "b": _with_slow(plan, odd)}, runs=4)
    assert times["a"][even] >= 2 * SLEEP_S > times["a"][odd]   # two nodes of each workload
    assert times["b"][odd] >= 2 * SLEEP_S > times["b"][even]


def test_a_workload_run_inside_an_onnxruntime_region_is_not_timed():
    """Three MatMuls, the first two in one onnxruntime region: the region's call has no
    time per step, so neither workload is timed (the even one has a step in it too)."""
    plan = wpk.build(two_workloads(3), target="cpu", progress=False, partition=False)
    manifest = dict(plan.manifest)
    # The build may pick a generated kernel for a tiny MatMul on a loaded machine: the
    # regions are set here, not left to the measurement.
    on_ort = {"impl": "ort", "kind": "vendor"}
    manifest["steps"] = [{**step, **({"impl": SLOW.name} if step["node"] == "mm2" else on_ort),
                          "config": {}, "artifacts": []} for step in plan.manifest["steps"]]
    regioned = Plan(manifest, plan.weights, kernels=plan.kernels)
    assert [registry.get(step.impl).joins_regions for step in regioned.steps] == [True, True,
                                                                                   False]
    times = in_run_times({"a": regioned}, runs=2)
    assert times["a"] == {}


def _choices(labels: dict[str, str]) -> PlanChoices:
    """Choices of the given implementation (by workload key), each timed at 1 us alone."""
    workload = next(iter(wpk.build(two_workloads(), target="cpu", progress=False,
                                   partition=False).workloads.values()))
    result = {}
    for key, impl in labels.items():
        timed = Measurement(impl, impl, {}, Status.OK, (1e-6,), 1e-6, workload_key=key)
        result[key] = Choice(workload, [key], ["MatMul"], Candidate(registry.get(impl), {}),
                             timed, [timed])
    return PlanChoices(result)


def test_the_mix_takes_each_workload_from_the_plan_whose_steps_ran_faster():
    tuned = _choices({"a": SLOW.name, "b": SLOW.name, "c": "ort"})
    untuned = _choices({"a": "ort", "b": "ort", "c": "ort"})
    mixed = mixed_choices(tuned, untuned, {"a": 5e-3, "b": 1e-5, "c": 1e-5},
                          {"a": 1e-5, "b": 2e-5, "c": 1e-5})
    assert mixed is not None
    assert [mixed[k].candidate.label for k in "abc"] == ["ort", SLOW.name, "ort"]
    reason = mixed["a"].reason
    assert reason["rule"] == "in-run" and reason["faster"] == SLOW.name
    assert (reason["in_run_s"], reason["passed_over_in_run_s"]) == (1e-5, 5e-3)
    assert mixed["b"] is tuned["b"] and mixed["c"] is tuned["c"]
    from wpk.commands.render import reason_tag, reason_text
    entry = {"candidates": [{}, {}], "reason": reason}
    assert "faster inside runs" in reason_text(entry) and SLOW.name in reason_text(entry)
    assert reason_tag(entry).startswith("faster in runs")


def test_no_mix_when_it_would_be_one_of_the_two_plans():
    tuned = _choices({"a": SLOW.name, "b": SLOW.name})
    untuned = _choices({"a": "ort", "b": "ort"})
    slow, fast = {"a": 5e-3, "b": 5e-3}, {"a": 1e-5, "b": 1e-5}
    assert mixed_choices(tuned, untuned, slow, fast) is None      # all of the untuned plan
    assert mixed_choices(tuned, untuned, fast, slow) is None      # all of the tuned plan
    # a workload not timed in one plan keeps the tuned choice: the mix is neither plan
    mixed = mixed_choices(tuned, untuned, slow, {"a": 1e-5})
    assert [mixed[k].candidate.label for k in "ab"] == ["ort", SLOW.name]


def test_a_tuned_build_measures_the_mix_of_its_faster_steps_end_to_end(monkeypatch):
    """The tuned plan (SlowMatMul on the even MatMuls, 'measured' at 1 ns alone) and the
    untuned one (SlowMatMul on the odd ones) each sleep in half their steps; the mix of
    their faster steps sleeps in none, and the end-to-end check measures it so."""
    real = pipeline.plan_workloads

    def tuned_plan_workloads(*args, **kwargs):
        choices, search, parallel = real(*args, **kwargs)
        even, odd = list(choices.choices)

        def sleepy(key):
            swapped = dict(choices.choices)
            fast = Measurement(SLOW.name, SLOW.name, {}, Status.OK, (1e-9,), 1e-9,
                               workload_key=key)
            swapped[key] = dataclasses.replace(
                swapped[key], candidate=Candidate(SLOW, {}), measurement=fast,
                measurements=[fast, *swapped[key].measurements])
            return PlanChoices(swapped)
        tuned = sleepy(even)
        tuned.untuned = sleepy(odd)
        return tuned, search, parallel

    monkeypatch.setattr(pipeline, "plan_workloads", tuned_plan_workloads)
    # The plan with every step on onnxruntime (within regions) would be the mix's only rival
    # without a sleep: two microsecond plans, a coin toss on a busy machine. Left out.
    monkeypatch.setattr(pipeline, "within_regions", lambda choices: None)
    plan = wpk.build(two_workloads(), target="cpu", progress=False)
    summary = plan.report["partition"]
    assert MIXED in summary["compared"], summary["compared"]
    medians = summary["medians_s"]
    assert medians["faster in runs"] < 2 * SLEEP_S <= min(medians["per-operator"],
                                                           medians["untuned"])
    if summary["winner"] == WPK:
        assert summary["plan"] == "faster in runs", summary
        assert all(step.impl != SLOW.name for step in plan.steps)
        rules = {entry["reason"]["rule"] for entry in plan.report["workloads"]}
        assert "in-run" in rules
        from wpk.commands.render import partition_lines
        assert "faster inside runs (1 workload)" in partition_lines(plan.report)[0]
    assert summary["from_untuned"] == 1
