"""Graphs written as ONNX files for Netron and other tools: `wpk inspect --export` (the
graph after the passes) and `wpk report --graph` (the plan's chosen graph, each node's
doc_string giving its chosen implementation, time and the reason).

    write_onnx(model, path)            # onnx.checker (full check), then an atomic write
    model = chosen_graph_model(plan)   # the plan's graph, annotated from its report
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnx

from wpk.commands.common import stderr
from wpk.commands.render import format_time, plural, reason_text
from wpk.core.errors import WpkError
from wpk.core.safe_write import write_bytes
from wpk.passes import to_onnx
from wpk.plans.plan_graph import is_whole_model, plan_graph, whole_model_bytes
from wpk.plans.planfile import Plan


def write_onnx(model: onnx.ModelProto, path: Path, flag: str = "--graph") -> None:
    """Check the model with `onnx.checker` (full check, shapes included) and write it to
    `path` atomically (a temporary file, then a rename)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise WpkError(f"the exported graph is not valid ONNX: {str(exc).splitlines()[0]}",
                       hint="this is a bug in wpk's export; please report it with the model"
                       ) from None
    write_bytes(path, model.SerializeToString(), flag)
    stderr(f"wrote {path} ({plural(len(model.graph.node), 'node')})")


def choice_note(workload: Mapping) -> str:
    """A node's doc_string in the chosen graph: implementation, kind, time, why."""
    shared = (f"; {workload['count']} nodes share this workload"
              if workload["count"] > 1 else "")
    return (f"wpk chose {workload['chosen']} ({workload['chosen_kind']}): "
            f"{format_time(workload['median_s'])} per call measured alone, "
            f"{100 * workload['share']:.1f}% of the estimated latency; why: "
            f"{reason_text(workload)}{shared}; workload {workload['label']}")


def plan_notes(report: Mapping) -> dict[str, str]:
    """Node name -> its `choice_note`, for every node of the report's workloads."""
    return {node: choice_note(w) for w in report.get("workloads", []) for node in w["nodes"]}


def chosen_graph_model(plan: Plan) -> onnx.ModelProto:
    """The plan's chosen graph as ONNX: its steps (one node per step, fusions expanded and
    named after it), annotated from the plan's report; or for a plan of onnxruntime's
    whole model, that model with every node saying so."""
    if is_whole_model(plan):
        return whole_model_graph(plan)
    report = plan.report or {}
    doc = (f"wpk plan of {report.get('model') or 'a model'} for {plan.target}: the graph "
           "its steps execute; each node's doc_string gives the implementation chosen for "
           "it, its time and why")
    return to_onnx(plan_graph(plan), notes=plan_notes(report), doc=doc)


def whole_model_graph(plan: Plan) -> onnx.ModelProto:
    """A whole-model plan's ONNX model, every node annotated with why onnxruntime runs it."""
    model = onnx.load_from_string(whole_model_bytes(plan))
    reason = (plan.report.get("partition") or {}).get("reason", "")
    note = f"run by onnxruntime's whole-model session: {reason}".rstrip(": ")
    for node in model.graph.node:
        node.doc_string = note
    model.graph.doc_string = f"wpk plan: {note}"
    return model
