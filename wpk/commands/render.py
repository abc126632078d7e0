"""Rendering a build report (`wpk.plans.report`) as text: a table, a summary, JSON.

`render_table(report)` gives a rich renderable (summary lines and one row per
workload, largest share first, with why each candidate was chosen);
`render_summary(report)` a short one for the end of a build;
`render_json(report)` the JSON text. The HTML page is
`wpk.commands.render_html`; both share the wording here (`summary_lines`,
`reason_text`, `format_time`, `algorithm_text`, `gflops_text`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from wpk.core.machine_load import BUSY_SHARE
from wpk.plans.report import by_share, choice_reason, gflops, loosened_workloads, next_best
from wpk.search.parallel_measure import summary_line
from wpk.search.recorded import CONTENDED


def format_time(seconds: float | None) -> str:
    """Seconds in a readable unit (ns, us, ms, s); '-' when not measured."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_gflops(value: float | None) -> str:
    """GFLOP/s with one decimal (three significant digits under 1); '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def gflops_text(workload: Mapping) -> str:
    """The workload's GFLOP/s cell ('-' for an op without a FLOP count or an old report)."""
    return format_gflops(gflops(workload))


def algorithm_text(workload: Mapping) -> str:
    """The chosen implementation's algorithm ('-' in a report that predates algorithms)."""
    return workload.get("algorithm") or "-"


def plural(count: int, noun: str) -> str:
    """'1 workload', '3 workloads'."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def format_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def runner_up_ratio(workload: Mapping) -> float | None:
    """The fastest other verified candidate's time over the chosen one's: above 1 the
    chosen is that much faster, below 1 it is slower (a choice that keeps a region whole)."""
    other = next_best(workload)
    if other is None or not workload.get("median_s"):
        return None
    return other["median_s"] / workload["median_s"]


def format_ratio(ratio: float | None) -> str:
    """'2.50x' ('-' for None); two decimals, so 0.996 reads 1.00x."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def reason_text(workload: Mapping) -> str:
    """Why the workload's candidate was chosen, in words (see `choice_reason`)."""
    reason = choice_reason(workload)
    rule, verified = reason["rule"], reason.get("verified", 0)
    if rule == "region" and reason.get("end_to_end"):
        text = (f"keeps the onnxruntime region whole (+{format_time(reason['over_s'])} over "
                f"{reason['faster']} alone, which lost end to end)")
    elif rule == "region":
        text = (f"keeps the onnxruntime region whole (+{format_time(reason['over_s'])} over "
                f"{reason['faster']}, within the {format_time(reason['credit_s'])} "
                "credit of a step inside a region)")
    elif rule == "one-pool":
        text = (f"generated kernel, so one thread pool runs the plan "
                f"(+{format_time(reason['over_s'])} over {reason['faster']} alone, which "
                "lost end to end)")
    elif rule == "untuned":
        text = (f"an untuned build's candidate (+{format_time(reason['over_s'])} over the "
                f"tuned {reason['faster']} alone; the tuned plan lost end to end)")
    elif rule == "in-run":
        text = (f"an untuned build's candidate, faster inside runs "
                f"({format_time(reason.get('in_run_s'))} against "
                f"{format_time(reason.get('passed_over_in_run_s'))} of the tuned "
                f"{reason['faster']}, which was {format_time(reason['over_s'])} faster alone)")
    elif rule == "in-place":
        sliced = workload.get("op") in ("ChannelSlice", "Slice", "Gather")
        what = "its output stays inside its input" if sliced else "its inputs are written in place"
        over = reason["over_s"]
        alone = (f"+{format_time(over)} over {reason['faster']} timed alone, copying them"
                 if over > 0 else f"faster than {reason['faster']} timed alone too")
        text = f"copies nothing where {what} ({alone})"
    elif rule == "only_verified":
        text = f"only verified candidate (of {len(workload['candidates'])})"
    elif rule == "timed_alone":
        text = (f"fastest timed alone ({reason['faster']} was "
                f"{format_time(reason['over_s'])} faster, timed concurrently)")
    elif rule == "not_recorded":
        text = (f"not the fastest (+{format_time(reason['over_s'])} over {reason['faster']}); "
                "this report predates recorded reasons")
    else:
        text = f"fastest of {verified} verified candidates"
    text += loosened_text(workload)
    return f"predicted: {text}, by the analytical model" if workload.get("predicted") else text


def loosened_text(workload: Mapping) -> str:
    """'' or, for a workload verified within twice onnxruntime's own error, what it was
    verified within (`wpk.plans.planner.loosened_tolerance`)."""
    if workload.get("tolerance") is None:
        return ""
    return (f"; verified within {workload['tolerance']:.2g} relative L2, twice onnxruntime's "
            "own error: its kernel misses the default tolerance on this node too")


def reason_tag(workload: Mapping) -> str:
    """A table cell's short form of `reason_text`: fastest, region +5 us, only, ..."""
    reason = choice_reason(workload)
    tag = {"region": f"region +{format_time(reason.get('over_s'))}",
           "one-pool": f"one pool +{format_time(reason.get('over_s'))}",
           "untuned": f"untuned +{format_time(reason.get('over_s'))}",
           "in-run": f"faster in runs +{format_time(reason.get('over_s'))}",
           "in-place": "in place",
           "only_verified": "only verified", "timed_alone": "timed alone",
           "not_recorded": "not recorded"}.get(reason["rule"], "fastest")
    return f"{tag} (predicted)" if workload.get("predicted") else tag


def summary_lines(report: Mapping) -> list[str]:
    """The summary at the top of every rendering."""
    totals = report.get("totals", {})
    device = report.get("device", {})
    where = report.get("target", "?")
    if device.get("kind") == "cpu":
        where += f" ({device.get('machine', '?')}, {device.get('cores', '?')} cores)"
    elif device.get("name"):
        where += f" ({device['name']})"
    predicted = report.get("predicted") or {}
    lines = [f"NOTE: {predicted['statement']}"] if predicted.get("statement") else []
    lines += [
        f"model {report.get('model') or '?'} on {where}",
        f"{totals.get('nodes', 0)} nodes, {totals.get('workloads', 0)} distinct workloads, "
        f"{totals.get('verified', 0)}/{totals.get('candidates', 0)} candidates verified, "
        f"{totals.get('fallback_nodes', 0)} fallback nodes",
        f"estimated latency {format_time(totals.get('latency_s'))} (sum of chosen medians)",
    ]
    if totals.get("arena_bytes") is not None:
        lines.append(f"memory {format_bytes(totals['arena_bytes'])} arena vs "
                     f"{format_bytes(totals.get('no_reuse_bytes'))} without reuse")
    if report.get("build_time_s") is not None:
        lines.append(f"built in {report['build_time_s']:.1f} s")
    lines += search_lines(report)
    lines += machine_load_lines(report)
    lines += loosened_lines(report)
    lines += partition_lines(report)
    lines += tail_lines(report)
    return lines


def machine_load_lines(report: Mapping) -> list[str]:
    """A CPU build during which other processes used `BUSY_SHARE` of its cores or more
    (`report["machine_load"]`, `wpk.core.machine_load`): its timings, and the choices made
    on them, may not hold on the idle machine."""
    load = report.get("machine_load") or {}
    share = load.get("others_share")
    if report.get("target") != "cpu" or share is None or share < BUSY_SHARE:
        return []
    return [f"warning: other processes used {100 * share:.0f}% of the "
            f"{plural(load.get('cores', 0), 'core')} while these timings were taken: they, "
            "and the choices made on them, may not hold on an idle machine (hint: build "
            "again when it is idle; generated kernels lose most on a busy machine)"]


def loosened_lines(report: Mapping) -> list[str]:
    """The workloads verified within twice onnxruntime's own error, not the default
    tolerance (`wpk.plans.planner.loosened_tolerance`)."""
    loosened = loosened_workloads(report)
    if not loosened:
        return []
    names = ", ".join(f"{w['label']} ({w['tolerance']:.2g})" for w in loosened[:3])
    more = f" and {len(loosened) - 3} more" if len(loosened) > 3 else ""
    return [f"note: {plural(len(loosened), 'workload')} verified within twice onnxruntime's "
            f"own error, not the default tolerance: onnxruntime's kernels miss it on them "
            f"too, their results are that sensitive to float32 rounding: {names}{more}"]


def tail_lines(report: Mapping) -> list[str]:
    """The nodes that run in onnxruntime after the plan, their shapes depending on the
    input values (`wpk.value_tail`); the figures above are the plan's, without them."""
    tail = report.get("tail") or {}
    if not tail:
        return []
    ops = ", ".join(f"{op} {count}" for op, count in (tail.get("ops") or {}).items())
    return [f"tail: {tail.get('text', '')} ({ops}); the figures above leave the tail out"]


def wpk_plan_name(partition: Mapping) -> str:
    """Which of wpk's plans the end-to-end comparison measured as wpk's (`wpk.partition`)."""
    if partition.get("plan") == "within regions":
        return "wpk's plan with its steps outside onnxruntime's regions given back to them"
    if partition.get("plan") == "generated kernels":
        return "wpk's plan with its onnxruntime steps given to generated kernels (one pool)"
    if partition.get("plan") == "faster in runs":
        taken = partition.get("from_untuned") or 0
        count = f" ({taken} workload{'s' if taken > 1 else ''})" if taken else ""
        return ("the tuned plan with an untuned build's candidates where their steps ran "
                f"faster inside runs{count}")
    if partition.get("plan") == "untuned":
        return "the plan of an untuned build's candidates (the tuned plan lost end to end)"
    return "wpk's per-operator plan"


def partition_lines(report: Mapping) -> list[str]:
    """What the end-to-end comparison with onnxruntime's whole model decided."""
    partition = report.get("partition") or {}
    if not partition:
        return []
    if "wpk_median_s" not in partition:
        return [f"end to end: {partition.get('reason', '')}"]
    plan = ("onnxruntime runs the whole model" if partition["winner"] == "onnxruntime"
            else wpk_plan_name(partition))
    rounds = (f", faster in {partition['rounds_won']} of {partition['rounds']} rounds"
              if "rounds" in partition else "")   # plans built before 2026-11-27 lack it
    confirmations = partition.get("confirmations") or []  # plans before 2026-11-30 lack it
    if partition.get("confirmed"):
        rounds += (f" of the {_confirmation_words(len(confirmations))} against onnxruntime "
                   f"alone; {partition['selection_ratio']:.2f}x among all of wpk's plans")
    paired = " round by round" if partition.get("paired") else ""  # plans since 2026-12-02
    lines = [f"end to end: wpk's plan {format_time(partition['wpk_median_s'])}, onnxruntime "
             f"{format_time(partition['onnxruntime_median_s'])} "
             f"({partition['ratio']:.2f}x{paired}{rounds}): the plan is {plan}"]
    if partition.get("rel_l2_literal") is not None:
        lines.append(f"note: a quantized model: onnxruntime's integer kernels differ from the "
                     f"plan by {partition['rel_l2_between']:.2g} relative L2, its nodes as "
                     f"written (graph optimizations off) by {partition['rel_l2_literal']:.2g},"
                     f" the two runs of onnxruntime from each other by "
                     f"{partition['rel_l2_onnxruntime_spread']:.2g} (rounding to the integer "
                     "grid: neighbouring steps, spread through the layers)")
    if len(confirmations) > 1:
        lines.append("note: the machine's speed changed while the check ran, so it confirmed "
                     f"{len(confirmations)} times ("
                     + ", ".join(f"{r:.2f}x" for r in confirmations)
                     + "), all of them deciding")
    if partition.get("unsteady"):
        stages = [partition["selection_ratio"]] + confirmations
        last = stages[-2:] if len(stages) > 1 else [stages[0], partition["ratio"]]
        lines.append(f"note: the check's last two stages still disagree ({last[0]:.2f}x, "
                     f"{last[1]:.2f}x): the machine's speed changed while it ran; a build on "
                     "a quieter machine may choose otherwise")
    return lines


def _confirmation_words(count: int) -> str:
    return "confirmation" if count <= 1 else f"{count} confirmations"


def search_lines(report: Mapping) -> list[str]:
    """What the schedule search and the parallel measurement did (when they ran)."""
    lines = []
    search = report.get("search") or {}
    if search:
        what = "predictions" if search.get("predicted") else "measurements"
        tuned = {t["key"] for t in search.get("tuned", []) if t.get("trials")}  # per workload
        lines.append(f"search {search.get('search')}: {plural(len(tuned), 'workload')} tuned; "
                     f"{search.get('measured', 0)} new {what}, {search.get('reused', 0)} "
                     f"answered by the tuning records (which now hold "
                     f"{search.get('records', 0)})")
    contended = search.get("contended") or []
    if contended:
        lines.append(f"warning: the last pass of {plural(len(contended), 'workload')} ran at "
                     f"least {CONTENDED:g}x slower than the search measured the same "
                     "candidates, also when measured again: something else was using the "
                     "cores, and its choices may be wrong (hint: rebuild on a quiet machine; "
                     "those measurements are taken again then)")
    parallel = report.get("parallel_measure")
    if parallel:
        lines.append(summary_line(parallel))
    return lines


def render_summary(report: Mapping, top: int = 5) -> Group:
    """A short rich renderable for the end of a build: summary and the costliest workloads."""
    table = Table(show_header=True, header_style="bold", box=None)
    for column, justify in (("operator", "left"), ("chosen", "left"), ("algorithm", "left"),
                            ("median", "right"), ("GFLOP/s", "right"), ("share", "right")):
        table.add_column(column, justify=justify)
    for workload in by_share(report)[:top]:
        chosen = workload["chosen"] + (" (fallback)" if workload["fallback"] else "")
        table.add_row(workload["label"], chosen, algorithm_text(workload),
                      format_time(workload["median_s"]), gflops_text(workload),
                      f"{100 * workload['share']:.1f}%")
    return Group(Text("\n".join(summary_lines(report))), table)


def render_table(report: Mapping) -> Group:
    """A rich renderable: summary, then one row per workload (largest share first)."""
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for column, justify, width in (("operator", "left", 18), ("n", "right", None),
                                   ("chosen", "left", 10), ("algorithm", "left", None),
                                   ("median", "right", None), ("GFLOP/s", "right", None),
                                   ("share", "right", None), ("vs next", "right", None),
                                   ("why", "left", None), ("ok", "right", None)):
        table.add_column(column, justify=justify, min_width=width, overflow="fold")
    for workload in by_share(report):
        ratio = runner_up_ratio(workload)  # the fastest other candidate / the chosen
        ok = sum(1 for c in workload["candidates"] if c["status"] == "ok")
        chosen = Text(workload["chosen"])
        chosen.append(f" {workload['chosen_kind']}",
                      style="bold yellow" if workload["fallback"] else "dim")
        table.add_row(workload["label"], str(workload["count"]), chosen,
                      algorithm_text(workload), format_time(workload["median_s"]),
                      gflops_text(workload), f"{100 * workload['share']:.1f}%",
                      format_ratio(ratio), reason_tag(workload),
                      f"{ok}/{len(workload['candidates'])}")
    return Group(Text("\n".join(summary_lines(report))), table)


def render_json(report: Mapping) -> str:
    """The report as indented JSON text."""
    return json.dumps(report, indent=2, allow_nan=False)
