"""The build report: per workload, every candidate measured and the one chosen.

`make_report` turns the planner's choices into the JSON document stored as
`report.json` in every plan. Its shape (`REPORT_VERSION` 1):

    {"report_version": 1, "model": str, "target": str, "device": {...},
     "build_time_s": float | null, "options": {...},
     "totals": {"latency_s", "workloads", "nodes", "fallback_nodes",
                "candidates", "verified", "arena_bytes", "no_reuse_bytes"},
     "passes": {...} | null,            # the pass report (op counts, rule hits)
     "workloads": [                      # graph order
        {"key", "label", "op", "nodes": [names], "count",
         "chosen": label, "chosen_impl", "chosen_kind", "algorithm", "median_s", "spread_s",
         "flops": per execution | null, "gflops": flops / median_s / 1e9 | null,
         "latency_s": median x count, "share": of totals.latency_s, "fallback": bool,
         "reason": {"rule": fastest | region | one-pool | untuned | in-run | in-place |
                            only_verified | timed_alone,
                    "verified": n, "runner_up": label,
                    "faster": label, "over_s", "credit_s",          # plans.planner
                    "in_run_s", "passed_over_in_run_s"} | null,      # in-run: wpk.in_run
         "onnxruntime_s": onnxruntime's fastest own kernel for it | null,
         "tolerance": the relative L2 its candidates were verified within, only where the
                      default was loosened to twice onnxruntime's own error (plans.planner),
         "candidates": [{"label", "impl", "kind", "algorithm", "status", "median_s",
                         "spread_s", "rel_l2_error", "message", "onnxruntime": bool}]}]}

Times are seconds; values that were not measured are null. `reason` and
`onnxruntime_s` are absent from reports of older builds; `choice_reason` and
`onnxruntime_time` answer for those too. `algorithm` (`Implementation.algorithm`), `flops`
(`wpk.kernels.flops`, null for ops without a FLOP count) and `gflops` are absent from
reports of builds before them; `gflops` answers for those (null). A build with `--search` adds
`"search"` (`wpk.pipeline`: per tuned workload its trials' times, `history`),
and one that compared the plan with onnxruntime's whole model `"partition"`
(`wpk.partition`). `"machine_load"`: {"others_share", "cores", "window_s"}, the share of the
build's cores other processes used while it ran (`wpk.core.machine_load`; absent where the
operating system does not tell, from builds shorter than a tenth of a second, from a
`--cluster` build and from older builds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wpk.core.workload import Workload
from wpk.kernels import registry
from wpk.kernels.flops import gflops_per_s
from wpk.plans.buffers import BufferPlan
from wpk.plans.planner import Choice, PlanChoices
from wpk.search.measure import Measurement

REPORT_VERSION = 1


def runs_on_onnxruntime(impl: str) -> bool:
    """Whether the implementation named `impl` is onnxruntime's (False when unknown here)."""
    try:
        return registry.get(impl).onnxruntime
    except KeyError:
        return False


def algorithm_of(impl: str, workload: Workload, config: Mapping) -> str:
    """The algorithm of implementation `impl` for the workload and config
    (`Implementation.algorithm`); the name itself for an implementation unknown here."""
    try:
        return registry.get(impl).algorithm(workload, config)
    except KeyError:
        return impl


def candidate_entry(measurement: Measurement, workload: Workload) -> dict:
    """A candidate's entry in the report."""
    data = measurement.to_json()
    entry = {name: data[name] for name in ("label", "impl", "kind", "status", "median_s",
                                           "spread_s", "rel_l2_error", "message")}
    entry["algorithm"] = algorithm_of(measurement.impl, workload, measurement.config)
    entry["onnxruntime"] = runs_on_onnxruntime(measurement.impl)
    return entry


def gflops(entry: Mapping) -> float | None:
    """The GFLOP/s of a workload entry's chosen candidate (its FLOPs over its median);
    None when its op has no FLOP count, it was not timed, or the report predates FLOPs."""
    return gflops_per_s(entry.get("flops"), entry.get("median_s"))


def verified_times(entry: Mapping) -> list[tuple[float, dict]]:
    """(median, candidate) of the workload's verified, timed candidates, fastest first."""
    timed = [(c["median_s"], c) for c in entry["candidates"]
             if c["status"] == "ok" and c["median_s"]]
    return sorted(timed, key=lambda pair: pair[0])


def onnxruntime_time(entry: Mapping) -> float | None:
    """onnxruntime's fastest verified kernel for the workload (None when it has none)."""
    times = [t for t, c in verified_times(entry)
             if c.get("onnxruntime", runs_on_onnxruntime(c["impl"]))]
    return times[0] if times else None


def next_best(entry: Mapping) -> dict | None:
    """The fastest verified candidate other than the chosen one, or None."""
    others = [c for _, c in verified_times(entry) if c["label"] != entry["chosen"]]
    return others[0] if others else None


def loosened_workloads(report: Mapping) -> list[dict]:
    """The workloads verified within twice onnxruntime's own error, not the default
    tolerance (their `tolerance`: `wpk.plans.planner.loosened_tolerance`)."""
    return [w for w in report.get("workloads", []) if w.get("tolerance") is not None]


def choice_reason(entry: Mapping) -> dict:
    """Why the workload's candidate was chosen: the report's `reason`, or for a report of an
    older build, what its times say (the fastest, the only verified one, or not recorded)."""
    if entry.get("reason"):
        return dict(entry["reason"])
    timed = verified_times(entry)
    if len(timed) == 1:
        return {"rule": "only_verified", "verified": 1}
    faster = [c for t, c in timed if entry["median_s"] is not None and t < entry["median_s"]]
    if faster:
        return {"rule": "not_recorded", "verified": len(timed), "faster": faster[0]["label"],
                "over_s": entry["median_s"] - faster[0]["median_s"]}
    return {"rule": "fastest", "verified": len(timed)}


def workload_entry(choice: Choice) -> dict:
    """A workload's entry in the report (without its share of the latency)."""
    chosen = choice.measurement.to_json()
    entry = {
        "key": choice.workload.key, "label": choice.workload.label, "op": choice.workload.op,
        "nodes": list(choice.node_names), "count": choice.count,
        "chosen": choice.candidate.label, "chosen_impl": choice.candidate.implementation.name,
        "chosen_kind": choice.candidate.implementation.kind, "algorithm": choice.algorithm,
        "median_s": chosen["median_s"], "spread_s": chosen["spread_s"],
        "flops": choice.flops,
        "latency_s": (chosen["median_s"] or 0.0) * choice.count,
        "fallback": choice.is_fallback,
        "reason": choice.reason,
        "candidates": [candidate_entry(m, choice.workload) for m in choice.measurements],
    }
    if choice.tolerance is not None:
        entry["tolerance"] = choice.tolerance
    entry["gflops"] = gflops(entry)
    entry["onnxruntime_s"] = onnxruntime_time(entry)
    return entry


def to_jsonable(value: Any) -> Any:
    """A JSON form of a pass report or options object (to_json, dataclass, mapping)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "to_json"):
        return to_jsonable(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    return str(value)


def make_report(choices: PlanChoices, *, target: str = "cpu", model: str = "",
                device: Mapping | None = None, pass_report: Any = None,
                build_time_s: float | None = None, buffers: BufferPlan | None = None,
                options: Any = None) -> dict:
    """The report document of a build (see the module docstring for its shape)."""
    workloads = [workload_entry(choice) for choice in choices]
    report = {
        "report_version": REPORT_VERSION, "model": model, "target": target,
        "device": dict(device or {}), "build_time_s": build_time_s,
        "options": to_jsonable(options) or {}, "totals": {},
        "passes": to_jsonable(pass_report), "workloads": workloads,
    }
    update_totals(report, buffers)
    return report


def update_totals(report: dict, buffers: BufferPlan | None = None) -> None:
    """Recompute the workloads' shares and the totals of `report` (after its workloads
    changed); the buffer figures stay unless `buffers` is given."""
    workloads = report["workloads"]
    total = sum(w["latency_s"] for w in workloads)
    for entry in workloads:
        entry["share"] = entry["latency_s"] / total if total > 0 else 0.0
    candidates = [c for w in workloads for c in w["candidates"]]
    totals = report.setdefault("totals", {})
    totals.update({
        "latency_s": total,
        "workloads": len(workloads),
        "nodes": sum(w["count"] for w in workloads),
        "fallback_nodes": sum(w["count"] for w in workloads if w["fallback"]),
        "candidates": len(candidates),
        "verified": sum(1 for c in candidates if c["status"] == "ok"),
    })
    if buffers is not None or "arena_bytes" not in totals:
        totals["arena_bytes"] = buffers.arena_bytes if buffers else None
        totals["no_reuse_bytes"] = buffers.no_reuse_bytes if buffers else None


def by_share(report: Mapping) -> list[dict]:
    """The report's workloads, largest share of the latency first."""
    return sorted(report.get("workloads", []), key=lambda w: -(w.get("share") or 0.0))
