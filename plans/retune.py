"""Re-planning a plan's predicted choices with measurements (what `wpk tune` runs).

    summary = retune(plan, target, runner, trials=8, budget=120.0)

Every workload whose choice was predicted (an `--offline` build) is planned
again by the planner (`wpk.plans.planner.plan`) over the target's candidates
with the generated kernel in up to `trials` configs, measured by `runner`; the
chosen candidate replaces the predicted one in the plan's steps, kernels and
report (`replace_choice`). Within `budget` seconds, workloads left unmeasured
stay predicted and the plan still says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from wpk.core.devices import GPU_PRESETS, HardwareSpec
from wpk.core.errors import PlanError, WpkError
from wpk.core.workload import Workload
from wpk.kernels.target import Target
from wpk.plans.planfile import Plan
from wpk.plans.planner import Choice, PlanOptions, plan
from wpk.plans.report import update_totals, workload_entry
from wpk.search.runner import Runner

DEFAULT_TRIALS = 8


@dataclass(frozen=True)
class StepNode:
    """A plan step seen as the graph node it computes (what the planner names)."""

    name: str
    op: str


@dataclass(frozen=True)
class StepWorkload:
    """A plan step and its workload, as `extract_workloads` gives graph nodes."""

    node: StepNode
    workload: Workload


def plan_gpu(plan_: Plan, path: str = "<plan>") -> HardwareSpec:
    """The preset an offline CUDA plan was built for (PlanError for other plans)."""
    if plan_.target != "cuda":
        raise PlanError(f"plan '{path}' is for target {plan_.target}; `wpk tune` measures the "
                        "predicted choices of CUDA plans", hint="build with --gpu NAME "
                        "--offline, then tune that plan on the GPU")
    name = plan_.manifest.get("device", {}).get("name")
    if name not in GPU_PRESETS:
        raise PlanError(f"plan '{path}' names no GPU preset in its device ({name!r})",
                        hint="rebuild the plan with `wpk build --gpu NAME`")
    return GPU_PRESETS[name]


def predicted_keys(plan_: Plan) -> list[str]:
    """Keys of the workloads whose choice is predicted, in plan order."""
    keys = [e["key"] for e in plan_.report.get("workloads", []) if e.get("predicted")] or \
        [s["workload_key"] for s in plan_.manifest["steps"] if s.get("predicted")]
    return list(dict.fromkeys(keys))


def retune(plan_: Plan, target: Target, runner: Runner, trials: int = DEFAULT_TRIALS,
           budget: float | None = None) -> dict:
    """Re-plan the predicted choices of `plan_` measured by `runner` and rewrite it in
    memory; returns {'measured', 'changed', 'left_predicted', 'seconds'}."""
    started = time.monotonic()
    workloads = plan_.workloads
    measured, changed, left = 0, 0, []
    for key in predicted_keys(plan_):
        if budget is not None and time.monotonic() - started > budget:
            left.append(key)
            continue
        items = [StepWorkload(StepNode(s["node"], s["op"]), workloads[key])
                 for s in plan_.manifest["steps"] if s["workload_key"] == key]
        try:
            choice = plan(items, lambda w: target.candidates(w, trials), runner,
                          PlanOptions())[key]
        except WpkError:  # nothing verified on the GPU: the prediction stays
            left.append(key)
            continue
        measured += len(choice.measurements)
        predicted = bool(choice.measurement.extra.get("predicted"))
        if predicted:
            left.append(key)
        changed += replace_choice(plan_, choice, predicted)
    update_totals(plan_.report)
    if left:
        plan_.manifest.setdefault("predicted", {})["workloads"] = len(left)
        plan_.report.setdefault("predicted", {})["workloads"] = len(left)
    else:
        plan_.manifest.pop("predicted", None)
        plan_.report.pop("predicted", None)
    return {"measured": measured, "changed": changed, "left_predicted": len(left),
            "seconds": time.monotonic() - started}


def replace_choice(plan_: Plan, choice: Choice, predicted: bool = False) -> int:
    """Make `choice` the plan's implementation of its workload: steps, kernel artifacts,
    report entry. Returns how many steps changed implementation or config."""
    key = choice.workload.key
    impl, config = choice.candidate.implementation, dict(choice.candidate.config)
    for name in [n for n in plan_.kernels if n.startswith(f"{key}/")]:
        del plan_.kernels[name]
    members = []
    provide = getattr(impl, "artifacts", None)
    for file_name, data in (provide(choice.workload, config) if provide else {}).items():
        member = f"{key}/{impl.name}/{file_name}"
        plan_.kernels[member] = bytes(data)
        members.append(member)
    changed = 0
    for step in plan_.manifest["steps"]:
        if step["workload_key"] == key:
            changed += (step["impl"], step["config"]) != (impl.name, config)
            step.update(impl=impl.name, config=config, kind=impl.kind, artifacts=members,
                        predicted=predicted)
    for index, entry in enumerate(plan_.report.get("workloads", [])):
        if entry["key"] == key:
            plan_.report["workloads"][index] = dict(
                workload_entry(choice), nodes=entry["nodes"], count=entry["count"],
                latency_s=(choice.measurement.median_s or 0.0) * entry["count"],
                predicted=predicted)
    return changed
