"""Steps timed inside whole runs, and the plan of two plans' faster steps.

    times = in_run_times({"tuned": tuned_plan, "untuned": untuned_plan})  # key -> seconds
    mixed = mixed_choices(tuned, untuned, times["tuned"], times["untuned"])

A search picks each workload's config timed alone, its weights and inputs warm in the
caches; inside a run the steps before it have streamed their own data through the caches,
and a config that reads more (a Winograd tile's larger transformed filter, a wider pass of
weights) can lose there what it won alone. The end-to-end check (`wpk.partition`) measures
a tuned build's plan against the plan of its untuned candidates as wholes and keeps one of
them: a tuned plan that wins some steps and loses others keeps the losses or gives up the
wins. On the 2-core AVX-512 VM a tuned ResNet-50 plan ran 41.7 ms where the untuned one
ran 38.9 ms (2026-12-02), the tuned configs faster alone.

So both plans run side by side (`Session.timeline`, the two alternating run by run), each
step timed where it runs (alone in its call, or inside a native chain), and each workload's
steps summed; the mix takes every workload's choice from the plan whose steps of it ran
faster. It is one more contender of the end-to-end check, which decides whether it runs
faster as a whole: steps interact (a step's layout decides its neighbours' reorders, its
data what is left in the caches for the next), so the sum of the faster steps is a
proposal, not a measurement. A workload with a step that a call runs together with other
steps without timing each (an onnxruntime region) is not compared: it keeps the first
plan's choice.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping

from wpk.plans.planfile import Plan
from wpk.plans.planner import PlanChoices
from wpk.runtime import Session, example_feeds

RUNS = 12     # timed runs of each plan
WARMUP = 2    # untimed runs of each plan first


def in_run_times(plans: Mapping[str, Plan], runs: int = RUNS, warmup: int = WARMUP
                 ) -> dict[str, dict[str, float]]:
    """For each named plan, the seconds its steps of each workload take inside runs (by
    workload key: the sum over the workload's steps of each step's median over `runs`
    runs), the plans' runs alternating (their order rotating) on the same random input.
    Workloads with a step that was not timed alone (see the module docstring) are left
    out."""
    sessions = {name: Session(plan) for name, plan in plans.items()}
    feeds = example_feeds(next(iter(sessions.values())), seed=0)
    spans: dict[str, dict[tuple[str, str], list[float]]] = {name: {} for name in sessions}
    untimed: dict[str, set[str]] = {name: set() for name in sessions}
    names = list(sessions)
    for index in range(warmup + runs):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            calls = sessions[name].timeline(feeds)
            if index >= warmup:
                _collect(calls, spans[name], untimed[name])
    return {name: _by_workload(spans[name], untimed[name]) for name in names}


def _collect(calls, spans: dict[tuple[str, str], list[float]], untimed: set[str]) -> None:
    """Add one run's step times (by (workload key, node)) to `spans`, and the workload keys
    of steps run together without their own times to `untimed`."""
    for call in calls:
        timed = call.step_spans()
        if not timed and len(call.steps) == 1:
            timed = [(call.steps[0], call.start_s, call.end_s)]
        if not timed:
            untimed.update(step.workload_key for step in call.steps)
        for step, start, end in timed:
            spans.setdefault((step.workload_key, step.node), []).append(end - start)


def _by_workload(spans: Mapping[tuple[str, str], list[float]], untimed: set[str]
                 ) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (key, _), times in spans.items():
        if key not in untimed:
            totals[key] = totals.get(key, 0.0) + statistics.median(times)
    return totals


def mixed_choices(first: PlanChoices, second: PlanChoices, first_s: Mapping[str, float],
                  second_s: Mapping[str, float]) -> PlanChoices | None:
    """`first`'s choices with `second`'s for every workload whose steps ran faster inside
    runs of `second`'s plan (`first_s`, `second_s`: `in_run_times` of the two plans; reason
    rule `in-run`); None when the mix would be one of the two plans (no workload, or every
    workload that differs, taken from `second`)."""
    differing = taken = 0
    result = dict(first.choices)
    for key, choice in first.choices.items():
        other = second.choices.get(key)
        if other is None or other.candidate.label == choice.candidate.label:
            continue
        differing += 1
        if key in first_s and key in second_s and second_s[key] < first_s[key]:
            taken += 1
            result[key] = dataclasses.replace(other, reason={
                "rule": "in-run", "verified": (other.reason or {}).get("verified", 1),
                "faster": choice.candidate.label,
                "over_s": other.measurement.median_s - choice.measurement.median_s,
                "in_run_s": second_s[key], "passed_over_in_run_s": first_s[key],
                "end_to_end": True})
    if taken == 0 or (taken == differing and set(second.choices) == set(first.choices)):
        return None
    return PlanChoices(result)


def tuned_and_untuned_mix(tuned: PlanChoices, tuned_plan: Plan, untuned: PlanChoices,
                          untuned_plan: Plan) -> PlanChoices | None:
    """A tuned build's extra contender for the end-to-end check: the tuned plan (`tuned`, as
    `tuned_plan` runs it) with the untuned candidates (`untuned`, `untuned_plan`) of the
    workloads whose steps ran faster inside runs of the untuned plan; None when that would
    be one of the two plans."""
    times = in_run_times({"tuned": tuned_plan, "untuned": untuned_plan})
    return mixed_choices(tuned, untuned, times["tuned"], times["untuned"])
