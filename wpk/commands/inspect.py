"""`wpk inspect`: what the passes do to a model and which workloads it yields; with
`--export FILE.onnx`, the graph after the passes as an ONNX file (for Netron)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import onnx
from rich.console import Group
from rich.table import Table

from wpk.commands.common import echo, max_memory_option, parse_input_shapes
from wpk.commands.onnx_export import write_onnx
from wpk.core.safe_write import check_output
from wpk.passes import optimize, to_onnx
from wpk.value_tail import load_head
from wpk.workloads import distinct, extract_workloads


def optimized_graph(model: str, input_shapes: dict[str, tuple[int, ...]] | None = None,
                    target: str = "cpu", max_memory: int | str | None = None):
    """(the loaded graph, the graph after the target's passes, the pass report, the
    value-dependent tail or None); `max_memory` bounds the model's tensors
    (`wpk.core.limits`). Of a model with a tail (`wpk.value_tail`) the graphs are its
    static head's."""
    graph, _, tail = load_head(model, input_shapes or None, max_memory)
    optimized, report = optimize(graph, target=target)
    return graph, optimized, report, tail


def exported_model(optimized, model: str, target: str) -> onnx.ModelProto:
    """The graph after the passes as ONNX, its fused nodes named and annotated."""
    doc = (f"{os.path.basename(model)} after wpk's graph passes for {target}: fused nodes "
           "are expanded into standard ops named after them, their doc_string says what "
           "was fused")
    return to_onnx(optimized, doc=doc)


def inspect_model(model: str, input_shapes: dict[str, tuple[int, ...]] | None = None,
                  target: str = "cpu", max_memory: int | str | None = None) -> dict:
    """Load and optimize `model`; return op counts, pass/rule hits and distinct workloads."""
    graph, optimized, report, tail = optimized_graph(model, input_shapes, target, max_memory)
    groups = distinct(extract_workloads(optimized))
    workloads = []
    for key, members in groups.items():
        workload = members[0].workload
        workloads.append({"key": key, "label": workload.label, "op": workload.op,
                          "count": len(members), "nodes": [m.node.name for m in members]})
    return {"model": model, "target": target, "inputs": {
                name: list(graph.tensors[name].shape) for name in graph.inputs},
            "passes": report.to_json(), "workloads": workloads,
            "tail": None if tail is None else {**tail.summary(), "text": tail.describe()}}


def render_inspection(info: dict):
    """A rich renderable of `inspect_model`'s result."""

    passes = info["passes"]
    ops = Table(title=f"{os.path.basename(info['model'])}: {passes['nodes_before']} nodes -> "
                      f"{passes['nodes_after']} after passes ({info['target']})")
    ops.add_column("op")
    ops.add_column("before", justify="right")
    ops.add_column("after", justify="right")
    for op in sorted(set(passes["ops_before"]) | set(passes["ops_after"])):
        ops.add_row(op, str(passes["ops_before"].get(op, "")),
                    str(passes["ops_after"].get(op, "")))

    rules = Table(title="pass and rule hits")
    rules.add_column("pass / rule")
    rules.add_column("hits", justify="right")
    for name, hits in passes["passes"].items():
        rules.add_row(f"[bold]{name}[/bold]", str(hits))
    for name, hits in passes["rules"].items():
        rules.add_row(f"  {name}", str(hits))

    loads = Table(title=f"{len(info['workloads'])} distinct workloads")
    loads.add_column("workload")
    loads.add_column("nodes", justify="right")
    loads.add_column("key")
    for entry in info["workloads"]:
        loads.add_row(entry["label"], str(entry["count"]), entry["key"])
    parts = [ops, rules, loads]
    if info.get("tail"):
        parts.append(f"tail: {info['tail']['text']}; the tables show the nodes before it")
    return Group(*parts)


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix the shape of an input with symbolic dimensions (repeatable).")
@click.option("--cpu/--gpu", "cpu_target", default=True, help="Target whose passes to run.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--export", "export_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.onnx", help="Also write the graph after the passes as ONNX "
                                        "(checked with onnx.checker; open it in Netron).")
@max_memory_option()
def command(model: Path, input_shapes: tuple[str, ...], cpu_target: bool,
            as_json: bool, export_path: Path | None, max_memory: int | None) -> None:
    """Show MODEL's graph before/after the passes, each rule's hits and the workloads."""
    target = "cpu" if cpu_target else "cuda"
    shapes = parse_input_shapes(input_shapes)
    if export_path:
        check_output(export_path, "--export", inputs=[model])
    info = inspect_model(str(model), shapes, target=target, max_memory=max_memory)
    echo(json.dumps(info, indent=2) if as_json else render_inspection(info))
    if export_path:
        _, optimized, _, _ = optimized_graph(str(model), shapes, target, max_memory)
        write_onnx(exported_model(optimized, str(model), target), export_path, "--export")
