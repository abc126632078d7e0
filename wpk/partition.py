"""The end-to-end check: a plan is never slower than onnxruntime running the model.

    plan, summary = choose_partition(per_op_plan, whole_model, options, regions=kept_plan)

The planner picks per operator; nothing there checks the whole. An op that
falls back, a pattern the passes do not know, or a boundary between steps can
make the per-operator plan slower than running the model in onnxruntime, which
fuses inside its graph and pays no call per node; a generated kernel a little
faster than onnxruntime's on its own can split a region and lose more at its
boundaries than it saved. So the partitions are measured end to end, on the
machine the plan is built on, as users run them (wpk's plans as `wpk.load`
gives them; onnxruntime with its default options, spinning threads included):
wpk's per-operator plan, the same plan with every step outside onnxruntime's
regions given back to its fastest region-joining candidate (when it has such
steps: `wpk.plans.planner.within_regions`), the same plan on generated kernels
where they are close (`on_generated_kernels`), after a search the plan of the
candidates an untuned build offers (`untuned_choices`: a tuned plan is never
kept when the untuned one runs faster) and the tuned plan with the untuned candidates of
the workloads whose steps ran faster inside runs (`wpk.in_run`), and onnxruntime's whole
model.

0. onnxruntime's whole model is not a contender when onnxruntime failed verification
   on one of the plan's workloads (`onnxruntime_failures`: it computes those nodes in
   the whole model too) or cannot load or run the model; the plan stays, and the
   summary says why;
1. the per-operator plan and the whole model run once on the same random
   inputs; their outputs must agree (relative L2 within `tolerance`; integers and
   booleans equal), else the per-operator plan (verified operator by operator against the float64
   reference) is kept and the summary says why. A quantized model (`quantized`: it holds
   QuantizeLinear nodes or onnxruntime's quantized ops) is the exception: every rounding
   to the integer grid is a boundary where two correct implementations that sum in other
   orders may land on neighbouring steps, and deep in a network one such flip spreads to
   thousands of elements (a QDQ MobileNet-v3 at 224x224: one element of 68992 after its
   fourth block, 2507 of 47040 eight blocks later, 0.025-0.03 relative L2 at the logits,
   between any two of onnxruntime's integer run, its nodes run as written and wpk's
   plan). So there the plan is compared with onnxruntime running the nodes as written
   (graph optimizations off) and must lie within twice onnxruntime's own spread, the
   difference between that run and its default one (`literal_outputs`); onnxruntime's
   default run, what its users get, stays a contender, and the summary gives the
   differences. A plan with workloads verified within twice onnxruntime's own error
   (onnxruntime's kernel misses the float64 reference on those nodes too,
   `wpk.plans.planner.loosened_tolerance`) must agree with onnxruntime within the
   loosest of those tolerances (`agreement_tolerance`): there wpk's kernel and
   onnxruntime's sum in other orders on an ill-conditioned node, which onnxruntime's two
   runs do not (a Swin whose qkv bias is divided by the product: the plan 2.2e-4 from
   onnxruntime's default run and 3.0e-4 from its nodes as written, those two 7.9e-5
   apart; the node's tolerance 0.02);
2. they are timed in blocks, the order rotating from round to round (before each block
   a wait until the process's threads are idle, `wpk.core.idle`: onnxruntime's spin for
   45-65 ms after a run, longer than the fixed 50 ms pause this used to be, so wpk's
   blocks after onnxruntime's shared the cores with a spinning thread; and each block's
   first run untimed), medians over all blocks;
3. the fastest of wpk's plans is wpk's; when its median is at least `margin` below
   onnxruntime's whole model's, it is timed again against the whole model alone
   (`confirm_blocks` rounds of the two: picking the fastest of several noisy plans
   flatters the one picked, and with two contenders each round's blocks lie closer in
   time, so a slow stretch of the machine lands on both; when its ratio and its rounds
   disagree, as many rounds again), and that confirmation decides, round by round: its
   time against onnxruntime's is its block's median over onnxruntime's block's in the
   same round, the median over the rounds (`paired_ratio`; a change of the machine's
   speed between rounds lands on both blocks of a round, while medians pooled over
   confirmations at different speeds can disagree with every one of them: a SqueezeNet
   build read 1.01x, 0.90x and 0.88x in three confirmations, 1.006x pooled, and was ahead
   in 19 of their 24 rounds). Among all of wpk's plans (item 2) a round holds up to
   six blocks, its two far apart: there the medians over all blocks stay;
4. wpk's plan is kept only when it runs at least `margin` below onnxruntime's whole
   model's time and it was the faster of the two in at least `win_share` of the
   rounds (each round's two block medians compared). onnxruntime's whole model wins ties:
   a plan measured within the margin, or far ahead in some rounds but not round after round,
   could be slower on the next run (on the 2-core VM plans kept at 2-5% faster in their
   build ran 1.02-1.08x onnxruntime's latency in a later benchmark), and onnxruntime's
   whole model is onnxruntime's latency by construction.

The summary (`report["partition"]`) gives the times, the ratio, the winner
(`winner`: wpk or onnxruntime; `plan`: which of wpk's) and why, and for every
wpk step outside onnxruntime's regions (`boundaries`) what it saves against
the best candidate onnxruntime runs in a region, next to what leaving the
region costs (about one session call).

When the confirmation's ratio and the first stage's differ by more than `unsteady` (10%),
the machine's speed changed while the check ran (a shared VM's slow stretch: on the 2-core
VM a DeepLab build read 0.87x among all plans, then 1.05x alone). The confirmation then
runs again after a `settle_s` pause, up to `remeasure` more times or until two consecutive
confirmations agree, and all of them decide together (pooled blocks, the same rule): one
stretch of a changing machine no longer decides alone. `confirmations` lists each one's
ratio; `unsteady` says the last two still disagree, and `wpk report` then says a quieter
build may choose otherwise.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from wpk.core.idle import wait_until_idle
from wpk.core.numerics import relative_l2
from wpk.kernels import registry
from wpk.plans.planfile import Plan
from wpk.plans.report import loosened_workloads
from wpk.runtime import Session, example_feeds

WPK, ONNXRUNTIME = "wpk", "onnxruntime"
REGIONS = "wpk-regions"  # the contender name of the per-operator plan kept within regions
ONE_POOL = "wpk-one-pool"  # ... and of the plan given to generated kernels where they can
UNTUNED = "wpk-untuned"  # a tuned build's plan of the candidates an untuned build offers
MIXED = "wpk-mixed"  # ... and the tuned plan with the untuned steps that ran faster in runs
PER_OPERATOR = "per-operator"
PLAN_NAMES = {WPK: PER_OPERATOR, REGIONS: "within regions", ONE_POOL: "generated kernels",
              UNTUNED: "untuned", MIXED: "faster in runs", ONNXRUNTIME: "onnxruntime"}


@dataclass(frozen=True)
class PartitionOptions:
    """How the end-to-end comparison is measured and decided."""

    blocks: int = 8            # alternating blocks per contender (VM noise: 5 flipped)
    runs: int = 6              # timed runs per block (after one untimed)
    idle_s: float = 1.0        # before each block: wait at most this long for a spinning
                               # peer's threads to stop (`wait_until_idle`)
    margin: float = 0.02       # wpk's plan must be this much faster to replace onnxruntime
    win_share: float = 0.75    # ... and the faster in this share of the rounds
    tolerance: float = 1e-4    # relative L2 between the two plans' outputs
    max_seconds: float = 20.0  # stop adding blocks after this long (each stage)
    confirm_blocks: int = 8    # rounds of wpk's fastest plan against the whole model alone
    unsteady: float = 0.10     # stages whose ratios differ by more: the machine's speed changed
    remeasure: int = 2         # ... then up to this many more confirmations, all deciding
    settle_s: float = 1.0      # the pause before each of them
    call_s: float = 20e-6      # what a step outside onnxruntime's regions costs: a call


def _time_block(session: Session, feeds: dict, runs: int, idle_s: float) -> list[float]:
    wait_until_idle(idle_s)
    session.run(feeds)  # untimed: caches and thread pools warm after the wait
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    return times


def measure_blocks(sessions: dict[str, Session], feeds: dict,
                   options: PartitionOptions) -> dict[str, list[float]]:
    """Run times of every session in blocks, the order rotating from one round to the next
    (see the module docstring)."""
    names = list(sessions)
    times: dict[str, list[float]] = {name: [] for name in names}
    started = time.monotonic()
    for index in range(options.blocks):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name] += _time_block(sessions[name], feeds, options.runs, options.idle_s)
        if time.monotonic() - started > options.max_seconds:
            break
    return times


def confirm(plan: Session, whole_model: Session, feeds: dict,
            options: PartitionOptions) -> dict[str, list[float]]:
    """The times of `confirm_blocks` rounds of wpk's plan against onnxruntime's whole model
    alone; when the ratio passes the margin but the plan did not win `win_share` of the
    rounds (the two disagree: a slow stretch of the machine on some of its blocks), as many
    rounds again, all of them then deciding by the same rule."""
    pair = {WPK: plan, ONNXRUNTIME: whole_model}
    stage = replace(options, blocks=options.confirm_blocks)
    times = measure_blocks(pair, feeds, stage)
    winner, ratio, _, _ = decide(times, options.margin, options.runs, options.win_share,
                                 paired=True)
    if winner == ONNXRUNTIME and ratio <= 1 - options.margin:   # lost on rounds alone
        more = measure_blocks(pair, feeds, stage)
        times = {name: times[name] + more[name] for name in pair}
    return times


def disagree(first: float, second: float, unsteady: float) -> bool:
    """Whether two stages' ratios differ by more than the fraction `unsteady` (either way)."""
    return abs(math.log(second / first)) > math.log1p(unsteady)


def steady_confirmation(plan: Session, whole_model: Session, feeds: dict,
                        options: PartitionOptions, selection_ratio: float
                        ) -> tuple[dict[str, list[float]], list[float], bool]:
    """The pooled times of one or more `confirm`s, each one's ratio, and whether the last
    two stages still disagree: while a confirmation disagrees with the stage before it
    (see `disagree`), another one after a `settle_s` pause, up to `remeasure` more."""
    pooled: dict[str, list[float]] = {WPK: [], ONNXRUNTIME: []}
    stages = [selection_ratio]
    for attempt in range(1 + options.remeasure):
        if attempt:
            if not disagree(stages[-2], stages[-1], options.unsteady):
                break
            time.sleep(options.settle_s)
        times = confirm(plan, whole_model, feeds, options)
        stages.append(paired_ratio(times, options.runs))
        pooled = {name: pooled[name] + times[name] for name in pooled}
    return pooled, stages[1:], disagree(stages[-2], stages[-1], options.unsteady)


def agreement(ours: dict, theirs: dict) -> float:
    """The largest relative L2 difference between two runs' outputs (by name): inf where an
    output's shape differs, or a non-float output (integers, booleans) is not equal."""
    return max((_difference(np.asarray(ours[name]), np.asarray(theirs[name])) for name in ours),
               default=0.0)


def agreement_tolerance(report: Mapping, tolerance: float) -> float:
    """How far the plan's outputs may lie from onnxruntime's: `tolerance`, or the loosest
    tolerance a workload of the plan was verified within when onnxruntime's own kernel
    missed the default one there (the report's `tolerance`; module docstring, step 1)."""
    return max([tolerance, *(w["tolerance"] for w in loosened_workloads(report))])


def literal_outputs(whole_model: Plan, feeds: dict) -> dict:
    """The outputs of onnxruntime running the whole model's nodes as written: graph
    optimizations off, no fusion into quantized integer kernels."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = next(iter(whole_model.kernels.values()))
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {i.name: feeds[i.name]
                                              for i in session.get_inputs()})))


def _difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    if ours.shape != theirs.shape:
        return float("inf")
    if ours.dtype.kind in "fcV":  # V: ml_dtypes' bfloat16, float8...
        return relative_l2(ours.astype(np.float64), theirs.astype(np.float64))
    return 0.0 if np.array_equal(ours, theirs) else float("inf")


def onnxruntime_failures(report: dict) -> list[str]:
    """The workloads of a per-operator plan that onnxruntime was measured on and failed
    (wrong answer, error), with no onnxruntime candidate verified: onnxruntime's whole
    model computes those nodes too, so it cannot stand in for the plan."""
    failed = []
    for entry in report.get("workloads", []):
        ort = [c for c in entry["candidates"] if _runs_onnxruntime(c["impl"])]
        if ort and not any(c["status"] == "ok" for c in ort):
            failed.append(f"{entry['label']} ({ort[0]['impl']}: {ort[0]['status']})")
    return failed


def _runs_onnxruntime(name: str) -> bool:
    try:
        return registry.get(name).onnxruntime
    except KeyError:
        return False


def paired_ratio(times: dict[str, list[float]], runs: int | None = None) -> float:
    """wpk's time over onnxruntime's in the median round (`round_ratios`; `runs` None: one
    round of all the times, the ratio of the two medians)."""
    per_round = round_ratios(times, runs or len(times[WPK]))
    return statistics.median(per_round) if per_round else \
        statistics.median(times[WPK]) / statistics.median(times[ONNXRUNTIME])


def round_ratios(times: dict[str, list[float]], runs: int) -> list[float]:
    """wpk's block median over onnxruntime's, round by round (blocks of `runs` times, in
    the order `measure_blocks` appends them)."""
    rounds = min(len(times[WPK]), len(times[ONNXRUNTIME])) // max(runs, 1)
    return [statistics.median(times[WPK][k * runs:(k + 1) * runs])
            / statistics.median(times[ONNXRUNTIME][k * runs:(k + 1) * runs])
            for k in range(rounds)]


def decide(times: dict[str, list[float]], margin: float, runs: int | None = None,
           win_share: float = 0.75, paired: bool = False) -> tuple[str, float, int, int]:
    """(winner, ratio, rounds wpk won, rounds): wpk only when the ratio (wpk's median over
    onnxruntime's; `paired`: wpk's time over onnxruntime's in the median round,
    `paired_ratio`) is at least `margin` below 1 and wpk won at least `win_share` of the
    rounds of `runs` times each (default: one round of all); a round is won when wpk was
    faster in it (with a negative margin: no more than |margin| slower). Ties go to
    onnxruntime's whole model."""
    per_round = round_ratios(times, runs or len(times[WPK]))
    ratio = statistics.median(per_round) if paired and per_round else \
        statistics.median(times[WPK]) / statistics.median(times[ONNXRUNTIME])
    per_round = per_round or [ratio]
    won = sum(r < 1 - min(margin, 0.0) for r in per_round)
    keep = ratio <= 1 - margin and won >= win_share * len(per_round)
    return (WPK if keep else ONNXRUNTIME), ratio, won, len(per_round)


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _kept(per_op: Plan, reason: str) -> tuple[Plan, dict]:
    """The per-operator plan, with the summary of why onnxruntime was not compared."""
    return per_op, {"compared": [WPK], "winner": WPK, "plan": PER_OPERATOR,
                    "reason": reason + "; the verified plan stays"}


def choose_partition(per_op: Plan, whole_model: Plan, options: PartitionOptions | None = None,
                     regions: Plan | None = None, one_pool: Plan | None = None,
                     untuned: Plan | None = None, mixed: Plan | None = None,
                     quantized: bool = False) -> tuple[Plan, dict]:
    """The fastest of wpk's per-operator plan, the same plan with its steps outside
    onnxruntime's regions given back to onnxruntime (`regions`, when there are such steps:
    `wpk.plans.planner.within_regions`), the same plan with its onnxruntime steps given to
    generated kernels where they are close (`one_pool`:
    `wpk.plans.planner.on_generated_kernels`), a tuned build's plan of the candidates an
    untuned build offers (`untuned`: `wpk.plans.planner.untuned_choices`, on generated
    kernels where close), the tuned plan with the untuned candidates of the workloads whose
    steps ran faster inside runs (`mixed`: `wpk.in_run.tuned_and_untuned_mix`) and
    onnxruntime's whole model, with the summary of the comparison (see the module
    docstring; `quantized`: the model quantizes, step 1)."""
    options = options or PartitionOptions()
    failed = onnxruntime_failures(per_op.report)
    if failed:
        return _kept(per_op, f"onnxruntime failed verification on {', '.join(failed[:3])}"
                     + (f" and {len(failed) - 3} more" if len(failed) > 3 else ""))
    plans = {WPK: per_op, REGIONS: regions, ONE_POOL: one_pool, UNTUNED: untuned,
             MIXED: mixed}
    sessions = {name: Session(plan) for name, plan in plans.items() if plan is not None}
    feeds = example_feeds(sessions[WPK], seed=0)
    literal = spread = None
    try:
        sessions[ONNXRUNTIME] = Session(whole_model)
        ours, theirs = sessions[WPK].run(feeds), sessions[ONNXRUNTIME].run(feeds)
        difference = agreement(ours, theirs)
        if quantized and not difference <= options.tolerance:
            as_written = literal_outputs(whole_model, feeds)
            literal, spread = agreement(ours, as_written), agreement(theirs, as_written)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped errors
        return _kept(per_op, f"onnxruntime cannot run the whole model ({_first_line(exc)})")
    summary = {"compared": list(sessions), "rel_l2_between": difference,
               "boundaries": boundaries(per_op.report, options.call_s),
               "method": f"{options.blocks} blocks of {options.runs} runs per contender, "
                         f"in rotating order, a wait until no thread spins and one untimed "
                         f"run before each; onnxruntime with its default options"}
    if literal is not None:
        summary.update(rel_l2_literal=literal, rel_l2_onnxruntime_spread=spread)
    tolerance = agreement_tolerance(per_op.report, options.tolerance)
    if tolerance > options.tolerance:
        summary["agreement_tolerance"] = tolerance
    if not difference <= tolerance and not (
            literal is not None and literal <= max(tolerance, 2 * spread)):
        summary.update(winner=WPK, plan=PER_OPERATOR,
                       reason=f"onnxruntime's outputs differ from the plan's by "
                              f"{difference:.2g} relative L2 (> {tolerance:g})"
                              + ("" if literal is None else
                                 f", {literal:.2g} from its nodes as written, which differ "
                                 f"from its default run by {spread:.2g}")
                              + "; the verified plan stays")
        return per_op, summary
    times = measure_blocks(sessions, feeds, options)
    medians = {name: statistics.median(found) for name, found in times.items()}
    variant = min((name for name in medians if name != ONNXRUNTIME), key=medians.get)
    decisive = {WPK: times[variant], ONNXRUNTIME: times[ONNXRUNTIME]}
    selection_ratio = medians[variant] / medians[ONNXRUNTIME]
    confirmed = selection_ratio <= 1 - options.margin and options.confirm_blocks > 0
    confirmations: list[float] = []
    unsteady = False
    if confirmed:
        decisive, confirmations, unsteady = steady_confirmation(
            sessions[variant], sessions[ONNXRUNTIME], feeds, options, selection_ratio)
        summary["method"] += (f"; wpk's fastest plan then again against onnxruntime alone, "
                              f"{options.confirm_blocks} rounds (twice that when the ratio "
                              f"and the rounds disagree; up to {options.remeasure} more "
                              f"confirmations while one disagrees with the stage before it "
                              f"by more than {options.unsteady:.0%}), which decide")
    winner, ratio, won, rounds = decide(decisive, options.margin, options.runs,
                                        options.win_share, paired=confirmed)
    summary.update(winner=winner, ratio=ratio, plan=PLAN_NAMES[variant],
                   rounds_won=won, rounds=rounds, selection_ratio=selection_ratio,
                   confirmed=confirmed, paired=confirmed, confirmations=confirmations,
                   unsteady=unsteady,
                   wpk_median_s=statistics.median(decisive[WPK]),
                   onnxruntime_median_s=statistics.median(decisive[ONNXRUNTIME]),
                   medians_s={PLAN_NAMES.get(name, name): t for name, t in medians.items()},
                   runs=len(times[WPK]))
    in_rounds = f"faster in {won} of {rounds} rounds"
    if winner == ONNXRUNTIME:
        why = f"not {options.margin:.0%} faster" if ratio > 1 - options.margin else \
            f"faster in only {won} of {rounds} rounds"
        summary["reason"] = (f"wpk's plan runs at {ratio:.2f}x onnxruntime's latency, {why}: "
                             "the plan is onnxruntime's whole model")
        return whole_model, summary
    summary["reason"] = _kept_reason(variant, medians, ratio, options.margin, in_rounds)
    return plans[variant], summary


def _kept_reason(variant: str, medians: dict[str, float], ratio: float, margin: float,
                 in_rounds: str) -> str:
    """Why wpk's plan `variant` (the fastest of wpk's contenders) was kept."""
    at = f"at {ratio:.2f}x onnxruntime's latency, {in_rounds}"
    if variant == REGIONS:
        return (f"wpk's plan with its steps outside onnxruntime's regions given back to them "
                f"runs {medians[WPK] / medians[REGIONS]:.2f}x faster than with them, {at}")
    if variant == UNTUNED:
        tuned = min(medians[name] for name in medians
                    if name not in (UNTUNED, MIXED, ONNXRUNTIME))
        return (f"the plan of the candidates an untuned build offers runs "
                f"{tuned / medians[UNTUNED]:.2f}x faster than the tuned plan's best form end "
                f"to end, {at}")
    if variant == MIXED:
        others = min(medians[name] for name in medians if name not in (MIXED, ONNXRUNTIME))
        return (f"the tuned plan with the untuned candidates of the workloads whose steps ran "
                f"faster inside runs runs {others / medians[MIXED]:.2f}x faster than wpk's "
                f"other plans end to end, {at}")
    if variant == ONE_POOL:
        return (f"wpk's plan with its onnxruntime steps given to generated kernels (one thread "
                f"pool) runs {medians[WPK] / medians[ONE_POOL]:.2f}x faster than the "
                f"per-operator plan, {at}")
    return (f"wpk's per-operator plan runs at {ratio:.2f}x onnxruntime's latency (kept: at "
            f"least {margin:.0%} faster, and {in_rounds})")
