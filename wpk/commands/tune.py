"""`wpk tune PLAN`: measure on the GPU what an `--offline` build predicted, rewrite the plan.

    summary = tune_plan("model.wpk", trials=8, budget=120.0)

The plan must be a CUDA plan and its GPU (the preset in the manifest's
device) must be present, else a DeviceError names the preset and what is
present; with `--cluster`, the nodes of the Ray cluster that have it measure
instead (each checks its GPU, compiler and code generator). `wpk.plans.retune`
plans every predicted workload again with measurements on the GPU (CUDA
events, or `--parallel-measure N`: the candidates of each workload timed
together on N streams, the fastest re-measured alone; the time saved goes to
the summary and to `report["parallel_measure"]`). The plan is rewritten atomically (`write_plan`).
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from wpk.commands.common import cluster_option, parallel_measure_option, stderr
from wpk.core.devices import detect_gpus
from wpk.core.errors import DeviceError
from wpk.core.safe_write import check_output
from wpk.kernels.cuda.target import CudaTarget, describe_present
from wpk.plans.planfile import read_plan, write_plan
from wpk.plans.retune import DEFAULT_TRIALS, plan_gpu, retune
from wpk.search.parallel_measure import ParallelSummary, check_streams, summary_line
from wpk.search.runner import check_runner, create_runner


def tune_plan(path: str | os.PathLike, trials: int | None = None,
              budget: float | None = None, present=None, parallel: int | None = None,
              cluster: str | None = None) -> dict:
    """`wpk tune PLAN`: measure the plan's predicted choices on its GPU and rewrite it
    atomically. DeviceError when that GPU is absent (`present`: detected GPUs, default
    `detect_gpus()`), unless `cluster` names a Ray cluster whose nodes have it (each node
    checks its own GPU and fingerprint). `parallel`: CUDA streams to time each workload's
    candidates on together. Returns the summary of `retune` plus 'gpu' and 'path' (and
    'parallel_measure' with `parallel`, 'cluster' with `cluster`)."""
    check_streams(parallel)
    name = os.fspath(path)
    plan = read_plan(name, check_device=False)
    check_output(name, "PLAN")  # it is rewritten at the end: say so before the work
    gpu = plan_gpu(plan, name)
    target = CudaTarget.for_preset(gpu)
    check_runner(target, parallel, cluster)
    present = detect_gpus() if present is None and cluster is None else present
    if cluster is None and not any(g.preset == gpu.name for g in present):
        raise DeviceError(f"wpk tune: plan '{name}' was built for {gpu.name} "
                          f"({gpu.description}, {gpu.arch}); {describe_present(present)}",
                          hint=f"run `wpk tune` on a machine with a {gpu.name}, or with "
                               "--cluster on a cluster of such machines")
    totals = ParallelSummary(parallel) if parallel else None
    with create_runner(target, parallel=parallel, summary=totals, cluster=cluster) as runner:
        summary = retune(plan, target, runner, trials or DEFAULT_TRIALS, budget)
        if runner.summary() is not None:
            summary["cluster"] = plan.report["cluster"] = runner.summary()
    if totals is not None:
        summary["parallel_measure"] = plan.report["parallel_measure"] = totals.to_json()
    write_plan(plan, name)
    return dict(summary, gpu=gpu.name, path=name)


@click.command("tune")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trials", type=click.IntRange(min=1), help="Configs to measure per workload.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the whole tuning.")
@parallel_measure_option("Time each workload's candidates together on N CUDA streams")
@cluster_option("Measure")
def command(plan: Path, trials: int | None, budget: float | None,
            parallel_measure: int | None, cluster: str | None) -> None:
    """Measure on the present GPU (or a cluster's) what an --offline build predicted, and
    rewrite PLAN."""
    summary = tune_plan(str(plan), trials=trials, budget=budget, parallel=parallel_measure,
                        cluster=cluster)
    stderr(f"tuned {summary['path']} on {summary['gpu']}: {summary['measured']} measured, "
           f"{summary['changed']} choices changed, {summary['left_predicted']} still predicted")
    if summary.get("parallel_measure"):
        stderr(summary_line(summary["parallel_measure"]))
