"""`wpk build MODEL.onnx`: optimize, tune and plan a model; write the plan and its report."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console

from wpk.commands.common import (
    SEARCHES,
    cluster_option,
    max_memory_option,
    parallel_measure_option,
    parse_input_shapes,
    stderr,
    target_of,
)
from wpk.commands.render import render_summary
from wpk.core.safe_write import check_output
from wpk.pipeline import build


@click.command("build")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Plan file to write (default: MODEL with suffix .wpk).")
@click.option("--cpu", is_flag=True, help="Build for the host CPU (the default without a GPU).")
@click.option("--gpu", metavar="NAME|auto", help="Build for a GPU preset (p100, v100, t4, a100, "
              "h100, h200) or the detected one.")
@click.option("--search", type=click.Choice(SEARCHES), default="none", show_default=True,
              help="Schedule search for generated kernels.")
@click.option("--trials", type=click.IntRange(min=1), help="Search trials per workload.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the whole build.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path),
              help="Tuning records (JSON lines) to reuse and extend.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compile jobs.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix the shape of an input with symbolic dimensions (repeatable).")
@click.option("--strict", is_flag=True,
              help="Fail if any node would fall back to onnxruntime.")
@click.option("--offline", is_flag=True,
              help="Build for a GPU that is not present (predicted, not measured).")
@parallel_measure_option("GPU: time each workload's candidates together on N CUDA streams")
@cluster_option("Measure")
@click.option("--no-partition", "no_partition", is_flag=True,
              help="Keep wpk's per-operator plan even where onnxruntime runs the whole model "
                   "faster (by default the faster of the two, measured, is the plan).")
@max_memory_option()
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary table.")
def command(model: Path, output: Path | None, cpu: bool, gpu: str | None, search: str,
            trials: int | None, budget: float | None, db: Path | None, jobs: int | None,
            input_shapes: tuple[str, ...], strict: bool, offline: bool,
            parallel_measure: int | None, cluster: str | None, no_partition: bool,
            max_memory: int | None, quiet: bool) -> None:
    """Optimize, tune and plan MODEL; write the plan and its benchmark report."""
    target, gpu_name = target_of(cpu, gpu)
    output = output or model.with_suffix(".wpk")
    check_output(output, "-o", inputs=[model])  # before the build, not after it
    options = {"gpu": gpu_name, "search": search, "strict": strict, "offline": offline,
               "input_shapes": parse_input_shapes(input_shapes), "progress": not quiet,
               "partition": not no_partition}
    optional = {"trials": trials, "budget": budget, "db": None if db is None else str(db),
                "jobs": jobs, "parallel_measure": parallel_measure, "cluster": cluster,
                "max_memory": max_memory}
    options.update({k: v for k, v in optional.items() if v is not None})
    started = time.perf_counter()
    plan = build(str(model), target=target, output=str(output), **options)
    elapsed = time.perf_counter() - started
    if not quiet:
        Console(stderr=True).print(render_summary(plan.report))
    stderr(f"wrote {output} ({elapsed:.1f} s)")
