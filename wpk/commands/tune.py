"""`wpk tune PLAN`: measure on the GPU what an `--offline` build predicted, rewrite the plan.

    summary = tune_plan("model.wpk", trials=8, budget=120.0)

The plan must be a CUDA plan and its GPU (the preset in the manifest's
device) must be present, else a DeviceError names the preset and what is
present. Every workload whose choice was predicted is measured again on the
GPU: the generated kernel in up to `trials` configs for the preset, the real
vendor implementations registered for 'cuda' (cuDNN, cuBLAS), device copies
or the host step; the fastest verified one replaces the prediction. Timing
is the GPU measurement's (`wpk.search.measure_cuda.measure_candidate`, CUDA events),
with the same signature as `wpk.search.measure.measure_candidate`. Within
`budget` seconds, workloads left unmeasured stay predicted and the plan
still says so. The plan is rewritten atomically (`write_plan`).

With `parallel=N` (`--parallel-measure N`) the candidates of each workload
are timed together on N CUDA streams and the fastest re-measured alone
(`wpk.search.parallel_measure`); the time saved goes to the summary and to
`report["parallel_measure"]`.

`retune(plan, gpu, measure, ...)` is the plan rewrite itself, for any
measure function (and `measure_many`, all candidates of a workload at once).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

from wpk.commands.common import parallel_measure_option, stderr
from wpk.core.errors import DeviceError, PlanError
from wpk.core.workload import Workload

DEFAULT_TRIALS = 8


def _gpu_measure() -> Callable:
    try:
        from wpk.search.measure_cuda import measure_candidate
    except ImportError as exc:
        raise DeviceError(f"wpk tune needs the GPU measurement (wpk.search.measure_cuda): "
                          f"{exc}", hint="install cupy on the GPU machine") from None
    return measure_candidate


def tune_candidates(workload: Workload, gpu, trials: int) -> list:
    """What `wpk tune` measures for a workload: generated configs, registered CUDA vendor
    implementations, device copies, else the host step."""
    from wpk.kernels import registry
    from wpk.kernels.cuda.predicted import PLACEHOLDER_TARGET, offline_candidates

    found = [c for c in offline_candidates(workload, gpu, trials)
             if c.implementation.target != PLACEHOLDER_TARGET
             or c.implementation.kind != "vendor"]
    labels = {c.label for c in found}
    for candidate in registry.candidates(workload, "cuda"):
        if candidate.label not in labels:
            found.append(candidate)
    return found


def retune(plan, gpu, measure: Callable, trials: int = DEFAULT_TRIALS,
           budget: float | None = None, seed: int = 0,
           measure_many: Callable | None = None) -> dict:
    """Re-measure the predicted choices of `plan` with `measure` (or `measure_many`, every
    candidate of a workload in one call) and rewrite it in memory; returns a summary
    {'measured', 'changed', 'left_predicted', 'seconds'}."""
    from wpk.kernels import registry
    from wpk.plans.planner import _rng_for

    started = time.monotonic()
    workloads = plan.workloads
    entries = {w["key"]: w for w in plan.report.get("workloads", [])}
    keys = [k for k, e in entries.items() if e.get("predicted")] or \
        [s["workload_key"] for s in plan.manifest["steps"] if s.get("predicted")]
    measured, changed, left = 0, 0, []
    for key in dict.fromkeys(keys):
        if budget is not None and time.monotonic() - started > budget:
            left.append(key)
            continue
        workload = workloads[key]
        candidates = tune_candidates(workload, gpu, trials)
        if measure_many is not None:
            found = measure_many(workload, candidates, rng=_rng_for(seed, key))
        else:
            found = [measure(workload, c, rng=_rng_for(seed, key)) for c in candidates]
        results = list(zip(candidates, found))
        ok = [(c, m) for c, m in results if m.ok and np.isfinite(m.median_s)]
        measured += len(results)
        if not ok:
            left.append(key)
            continue
        alone = [(c, m) for c, m in ok if not m.extra.get("contended")]  # contended: rank only
        best, timing = min(alone or ok, key=lambda pair: pair[1].median_s)
        still_predicted = bool(timing.extra.get("predicted"))
        if still_predicted:
            left.append(key)
        impl = registry.get(best.implementation.name)
        artifacts = _replace_kernels(plan, key, impl, workload, dict(best.config))
        for step in plan.manifest["steps"]:
            if step["workload_key"] != key:
                continue
            changed += (step["impl"], step["config"]) != (impl.name, dict(best.config))
            step.update(impl=impl.name, config=dict(best.config), kind=impl.kind,
                        artifacts=artifacts, predicted=still_predicted)
        entry = entries.get(key)
        if entry is not None:
            _update_entry(entry, best, timing, [m for _, m in results], still_predicted)
    _update_totals(plan.report)
    if left:
        plan.manifest.setdefault("predicted", {})["workloads"] = len(left)
        plan.report.setdefault("predicted", {})["workloads"] = len(left)
    else:
        plan.manifest.pop("predicted", None)
        plan.report.pop("predicted", None)
    return {"measured": measured, "changed": changed, "left_predicted": len(left),
            "seconds": time.monotonic() - started}


def _replace_kernels(plan, key: str, impl, workload: Workload, config: dict) -> list[str]:
    """Drop the workload's old artifacts from `plan.kernels`, add the new ones."""
    for name in [n for n in plan.kernels if n.startswith(f"{key}/")]:
        del plan.kernels[name]
    provide = getattr(impl, "artifacts", None)
    members = []
    for file_name, data in (provide(workload, config) if provide else {}).items():
        member = f"{key}/{impl.name}/{file_name}"
        plan.kernels[member] = bytes(data)
        members.append(member)
    return members


def _update_entry(entry: dict, best, timing, measurements, predicted: bool) -> None:
    from wpk.plans.report import _candidate_entry

    data = timing.to_json()
    entry.update(chosen=best.label, chosen_impl=best.implementation.name,
                 chosen_kind=best.implementation.kind, median_s=data["median_s"],
                 spread_s=data["spread_s"], latency_s=(data["median_s"] or 0.0) * entry["count"],
                 fallback=best.implementation.kind == "fallback", predicted=predicted,
                 candidates=[_candidate_entry(m) for m in measurements])


def _update_totals(report: dict) -> None:
    workloads = report.get("workloads", [])
    total = sum(w["latency_s"] for w in workloads)
    for entry in workloads:
        entry["share"] = entry["latency_s"] / total if total > 0 else 0.0
    totals = report.setdefault("totals", {})
    candidates = [c for w in workloads for c in w["candidates"]]
    totals.update(latency_s=total, candidates=len(candidates),
                  verified=sum(1 for c in candidates if c["status"] == "ok"),
                  fallback_nodes=sum(w["count"] for w in workloads if w["fallback"]))


def plan_gpu(plan, path: str = "<plan>"):
    """The preset an offline CUDA plan was built for (PlanError for other plans)."""
    from wpk.core.devices import GPU_PRESETS

    if plan.target != "cuda":
        raise PlanError(f"plan '{path}' is for target {plan.target}; `wpk tune` measures the "
                        "predicted choices of CUDA plans", hint="build with --gpu NAME "
                        "--offline, then tune that plan on the GPU")
    name = plan.manifest.get("device", {}).get("name")
    if name not in GPU_PRESETS:
        raise PlanError(f"plan '{path}' names no GPU preset in its device ({name!r})",
                        hint="rebuild the plan with `wpk build --gpu NAME`")
    return GPU_PRESETS[name]


def tune_plan(path: str | os.PathLike, trials: int | None = None,
              budget: float | None = None, present=None, parallel: int | None = None) -> dict:
    """`wpk tune PLAN`: measure the plan's predicted choices on its GPU and rewrite it
    atomically. DeviceError when that GPU is absent (`present`: detected GPUs, default
    `detect_gpus()`). `parallel`: CUDA streams to time each workload's candidates on
    together. Returns the summary of `retune` plus 'gpu' and 'path' (and
    'parallel_measure' with `parallel`)."""
    from wpk.core.devices import detect_gpus
    from wpk.offline import describe_present
    from wpk.plans.planfile import read_plan, write_plan
    from wpk.search.parallel_measure import check_streams

    check_streams(parallel)
    name = os.fspath(path)
    plan = read_plan(name, check_device=False)
    gpu = plan_gpu(plan, name)
    present = detect_gpus() if present is None else present
    if not any(g.preset == gpu.name for g in present):
        raise DeviceError(f"wpk tune: plan '{name}' was built for {gpu.name} "
                          f"({gpu.description}, {gpu.arch}); {describe_present(present)}",
                          hint=f"run `wpk tune` on a machine with a {gpu.name}")
    many = totals = None
    if parallel:
        from wpk.search.parallel_measure import ParallelSummary, in_process_many

        totals = ParallelSummary(parallel)
        many = in_process_many(totals, parallel)
    summary = retune(plan, gpu, _gpu_measure(), trials or DEFAULT_TRIALS, budget,
                     measure_many=many)
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
def command(plan: Path, trials: int | None, budget: float | None,
            parallel_measure: int | None) -> None:
    """Measure on the present GPU what an --offline build predicted, and rewrite PLAN."""
    from wpk.search.parallel_measure import summary_line

    summary = tune_plan(str(plan), trials=trials, budget=budget, parallel=parallel_measure)
    stderr(f"tuned {summary['path']} on {summary['gpu']}: {summary['measured']} measured, "
           f"{summary['changed']} choices changed, {summary['left_predicted']} still predicted")
    if summary.get("parallel_measure"):
        stderr(summary_line(summary["parallel_measure"]))
