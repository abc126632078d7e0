"""`wpk report PLAN.wpk`: the per-operator benchmark report a build stored in the plan."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from wpk.commands.common import write_text
from wpk.commands.render import render_json, render_table
from wpk.commands.render_html import render_html
from wpk.plans.planfile import read_plan


@click.command("report")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to FILE instead of standard output.")
def command(plan: Path, fmt: str, output: Path | None) -> None:
    """Show the per-operator benchmark report stored in PLAN."""
    data = read_plan(str(plan)).report
    if fmt == "table":
        if output:
            with open(output, "w", encoding="utf-8") as handle:
                Console(file=handle, width=160).print(render_table(data))
        else:
            Console().print(render_table(data))
        return
    write_text(render_json(data) if fmt == "json" else render_html(data), output)
