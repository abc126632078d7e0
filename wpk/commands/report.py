"""`wpk report PLAN.wpk`: the per-operator benchmark report a build stored in the plan;
with `--graph FILE.onnx`, the plan's chosen graph as ONNX (for Netron), each node's
doc_string giving its chosen implementation, time and why."""

from __future__ import annotations

import io
from pathlib import Path

import click
from rich.console import Console

from wpk.commands.common import write_text
from wpk.commands.onnx_export import chosen_graph_model, write_onnx
from wpk.commands.render import render_json, render_table
from wpk.commands.render_html import render_html
from wpk.core.safe_write import check_output
from wpk.plans.planfile import read_plan, read_report


@click.command("report")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to FILE instead of standard output.")
@click.option("--graph", "graph_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.onnx", help="Also write the plan's chosen graph as ONNX, each "
                                        "node annotated with its implementation and time.")
def command(plan: Path, fmt: str, output: Path | None, graph_path: Path | None) -> None:
    """Show the per-operator benchmark report stored in PLAN."""
    for path, flag in ((output, "-o"), (graph_path, "--graph")):
        if path is not None:  # before reading the plan
            check_output(path, flag, inputs=[plan])
    if graph_path:  # the chosen graph needs the whole plan
        loaded = read_plan(str(plan))
        write_onnx(chosen_graph_model(loaded), graph_path)
        data = loaded.report
    else:  # only the manifest and the report are read (and checked), nothing else inflated
        _, data = read_report(str(plan))
    if fmt == "table":
        if output:
            console = Console(file=io.StringIO(), width=160)
            console.print(render_table(data))
            write_text(console.file.getvalue(), output)
        else:
            Console().print(render_table(data))
        return
    write_text(render_json(data) if fmt == "json" else render_html(data), output)
