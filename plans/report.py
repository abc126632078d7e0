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
         "chosen": label, "chosen_impl", "chosen_kind", "median_s", "spread_s",
         "latency_s": median x count, "share": of totals.latency_s, "fallback": bool,
         "candidates": [{"label", "impl", "kind", "status", "median_s", "spread_s",
                         "rel_l2_error", "message"}]}]}

Times are seconds; values that were not measured are null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wpk.plans.buffers import BufferPlan
from wpk.plans.planner import Choice, PlanChoices
from wpk.search.measure import Measurement

REPORT_VERSION = 1


def _candidate_entry(measurement: Measurement) -> dict:
    data = measurement.to_json()
    return {name: data[name] for name in ("label", "impl", "kind", "status", "median_s",
                                          "spread_s", "rel_l2_error", "message")}


def _workload_entry(choice: Choice) -> dict:
    chosen = choice.measurement.to_json()
    return {
        "key": choice.workload.key, "label": choice.workload.label, "op": choice.workload.op,
        "nodes": list(choice.node_names), "count": choice.count,
        "chosen": choice.candidate.label, "chosen_impl": choice.candidate.implementation.name,
        "chosen_kind": choice.candidate.implementation.kind,
        "median_s": chosen["median_s"], "spread_s": chosen["spread_s"],
        "latency_s": (chosen["median_s"] or 0.0) * choice.count,
        "fallback": choice.is_fallback,
        "candidates": [_candidate_entry(m) for m in choice.measurements],
    }


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
    workloads = [_workload_entry(choice) for choice in choices]
    total = sum(w["latency_s"] for w in workloads)
    for entry in workloads:
        entry["share"] = entry["latency_s"] / total if total > 0 else 0.0
    candidates = [c for w in workloads for c in w["candidates"]]
    totals = {
        "latency_s": total,
        "workloads": len(workloads),
        "nodes": sum(w["count"] for w in workloads),
        "fallback_nodes": sum(w["count"] for w in workloads if w["fallback"]),
        "candidates": len(candidates),
        "verified": sum(1 for c in candidates if c["status"] == "ok"),
        "arena_bytes": buffers.arena_bytes if buffers else None,
        "no_reuse_bytes": buffers.no_reuse_bytes if buffers else None,
    }
    return {
        "report_version": REPORT_VERSION, "model": model, "target": target,
        "device": dict(device or {}), "build_time_s": build_time_s,
        "options": to_jsonable(options) or {}, "totals": totals,
        "passes": to_jsonable(pass_report), "workloads": workloads,
    }


def by_share(report: Mapping) -> list[dict]:
    """The report's workloads, largest share of the latency first."""
    return sorted(report.get("workloads", []), key=lambda w: -(w.get("share") or 0.0))
