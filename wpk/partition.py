"""The end-to-end check: a plan is never slower than onnxruntime running the model.

    plan, summary = choose_partition(per_op_plan, whole_model, options)

The planner picks per operator; nothing there checks the whole. An op that
falls back, a pattern the passes do not know, or a boundary between steps can
make the per-operator plan slower than running the model in onnxruntime, which
fuses inside its graph and pays no call per node. So both are measured end to
end, on the machine the plan is built on, as users run them (wpk's plan as
`wpk.load` gives it; onnxruntime with its default options, spinning threads
included), and the faster is the plan:

1. both run once on the same random inputs; their outputs must agree (relative
   L2 within `tolerance`), else the per-operator plan (verified operator by
   operator against the float64 reference) is kept and the summary says why;
2. they are timed in alternating blocks (a pause before each block, its first
   run untimed, so one engine's spinning threads do not land on the other's
   runs), medians over all blocks;
3. onnxruntime's whole model wins when wpk's median is more than `margin`
   slower; within the margin wpk's plan stays.

The summary (`report["partition"]`) gives both times, the ratio, the winner
and why, and for every wpk step outside onnxruntime's regions (`boundaries`)
what it saves against the best candidate onnxruntime runs in a region, next
to what leaving the region costs (about one session call).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from wpk.core.numerics import relative_l2
from wpk.kernels import registry
from wpk.plans.planfile import Plan
from wpk.runtime import Session, example_feeds

WPK, ONNXRUNTIME = "wpk", "onnxruntime"


@dataclass(frozen=True)
class PartitionOptions:
    """How the end-to-end comparison is measured and decided."""

    blocks: int = 5            # alternating blocks per engine
    runs: int = 6              # timed runs per block (after one untimed)
    pause_s: float = 0.05      # before each block: a spinning peer's threads go to sleep
    margin: float = 0.02       # wpk's plan stays unless onnxruntime is this much faster
    tolerance: float = 1e-4    # relative L2 between the two plans' outputs
    max_seconds: float = 20.0  # stop adding blocks after this long
    call_s: float = 20e-6      # what a step outside onnxruntime's regions costs: a call


def _time_block(session: Session, feeds: dict, runs: int, pause_s: float) -> list[float]:
    time.sleep(pause_s)
    session.run(feeds)  # untimed: caches and thread pools warm after the pause
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    return times


def measure_pair(wpk_session: Session, ort_session: Session, feeds: dict,
                 options: PartitionOptions) -> dict[str, list[float]]:
    """Run times of both sessions in alternating blocks (see the module docstring)."""
    times: dict[str, list[float]] = {WPK: [], ONNXRUNTIME: []}
    started = time.monotonic()
    for index in range(options.blocks):
        order = (WPK, ONNXRUNTIME) if index % 2 == 0 else (ONNXRUNTIME, WPK)
        for name in order:
            session = wpk_session if name == WPK else ort_session
            times[name] += _time_block(session, feeds, options.runs, options.pause_s)
        if time.monotonic() - started > options.max_seconds:
            break
    return times


def agreement(wpk_session: Session, ort_session: Session, feeds: dict) -> float:
    """The largest relative L2 difference between the two sessions' outputs."""
    ours = wpk_session.run(feeds)
    theirs = ort_session.run(feeds)
    return max((relative_l2(np.asarray(ours[name], np.float64),
                            np.asarray(theirs[name], np.float64))
                for name in ours if np.asarray(ours[name]).dtype.kind in "fc"), default=0.0)


def decide(times: dict[str, list[float]], margin: float) -> tuple[str, float]:
    """(winner, wpk median / onnxruntime median)."""
    ratio = statistics.median(times[WPK]) / statistics.median(times[ONNXRUNTIME])
    return (ONNXRUNTIME if ratio > 1 + margin else WPK), ratio


def boundaries(report: dict, call_s: float) -> list[dict]:
    """Every chosen candidate that leaves onnxruntime's regions, with the time it saves over
    the fastest verified candidate that joins them and whether that outweighs `call_s`
    (what a boundary costs: about one session call)."""
    found = []
    for entry in report.get("workloads", []):
        if registry.get(entry["chosen_impl"]).joins_regions:
            continue
        joining = [c for c in entry["candidates"] if c["status"] == "ok"
                   and c["median_s"] is not None and registry.get(c["impl"]).joins_regions]
        best = min(joining, key=lambda c: c["median_s"], default=None)
        saved = None if best is None else best["median_s"] - (entry["median_s"] or 0.0)
        found.append({"workload": entry["label"], "nodes": entry["count"],
                      "chosen": entry["chosen"], "median_s": entry["median_s"],
                      "onnxruntime": None if best is None else best["label"],
                      "onnxruntime_median_s": None if best is None else best["median_s"],
                      "saved_s": saved,
                      "worth_its_boundary": best is None or saved > call_s})
    return found


def choose_partition(per_op: Plan, whole_model: Plan,
                     options: PartitionOptions | None = None) -> tuple[Plan, dict]:
    """The faster of wpk's per-operator plan and onnxruntime's whole model, with the summary
    of the comparison (see the module docstring)."""
    options = options or PartitionOptions()
    wpk_session, ort_session = Session(per_op), Session(whole_model)
    feeds = example_feeds(wpk_session, seed=0)
    difference = agreement(wpk_session, ort_session, feeds)
    summary = {"compared": [WPK, ONNXRUNTIME], "rel_l2_between": difference,
               "boundaries": boundaries(per_op.report, options.call_s),
               "method": f"{options.blocks} alternating blocks of {options.runs} runs per "
                         f"engine, a {options.pause_s:g} s pause and one untimed run before "
                         f"each; onnxruntime with its default options"}
    if not difference <= options.tolerance:
        summary.update(winner=WPK, reason=f"onnxruntime's outputs differ from the plan's by "
                                          f"{difference:.2g} relative L2 (> "
                                          f"{options.tolerance:g}); the verified plan stays")
        return per_op, summary
    times = measure_pair(wpk_session, ort_session, feeds, options)
    winner, ratio = decide(times, options.margin)
    summary.update(winner=winner, ratio=ratio,
                   wpk_median_s=statistics.median(times[WPK]),
                   onnxruntime_median_s=statistics.median(times[ONNXRUNTIME]),
                   runs=len(times[WPK]))
    if winner == ONNXRUNTIME:
        summary["reason"] = (f"onnxruntime runs the whole model {ratio:.2f}x faster than "
                             "wpk's per-operator plan: the plan is onnxruntime's")
        return whole_model, summary
    summary["reason"] = (f"wpk's per-operator plan runs at {ratio:.2f}x onnxruntime's "
                         f"latency (kept within a {options.margin:.0%} margin)")
    return per_op, summary
