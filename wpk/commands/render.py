"""Rendering a build report (`wpk.plans.report`) as a table, JSON or an HTML page.

`render_table(report)` gives a rich renderable (summary line and one row per
workload, largest share first); `render_summary(report)` a short one for the
end of a build; `render_json(report)` the JSON text;
`render_html(report)` a self-contained page (inline CSS and SVG, no external
assets) with a summary and, per workload, a bar chart of every candidate's
median time, the chosen one marked, and its share of the total latency.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from wpk.plans.report import by_share
from wpk.search.parallel_measure import summary_line


def format_time(seconds: float | None) -> str:
    """Seconds in a readable unit (ns, us, ms, s); '-' when not measured."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def runner_up_ratio(workload: Mapping) -> float | None:
    """How many times faster the chosen candidate is than the next verified one."""
    times = sorted(c["median_s"] for c in workload["candidates"]
                   if c["status"] == "ok" and c["median_s"])
    if len(times) < 2 or not workload.get("median_s"):
        return None
    return times[1] / workload["median_s"]


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
    lines += partition_lines(report)
    return lines


def partition_lines(report: Mapping) -> list[str]:
    """What the end-to-end comparison with onnxruntime's whole model decided."""
    partition = report.get("partition") or {}
    if not partition:
        return []
    if "wpk_median_s" not in partition:
        return [f"end to end: {partition.get('reason', '')}"]
    plan = ("onnxruntime runs the whole model" if partition["winner"] == "onnxruntime"
            else "wpk's per-operator plan")
    return [f"end to end: wpk's plan {format_time(partition['wpk_median_s'])}, onnxruntime "
            f"{format_time(partition['onnxruntime_median_s'])} "
            f"({partition['ratio']:.2f}x): the plan is {plan}"]


def search_lines(report: Mapping) -> list[str]:
    """What the schedule search and the parallel measurement did (when they ran)."""
    lines = []
    search = report.get("search") or {}
    if search:
        what = "predicted" if search.get("predicted") else "measured"
        tuned = [t for t in search.get("tuned", []) if t.get("trials")]
        lines.append(f"search {search.get('search')}: {len(tuned)} workloads tuned, "
                     f"{search.get('measured', 0)} {what}, {search.get('reused', 0)} reused "
                     f"from {search.get('records', 0)} records")
    parallel = report.get("parallel_measure")
    if parallel:
        lines.append(summary_line(parallel))
    return lines


def render_summary(report: Mapping, top: int = 5) -> Group:
    """A short rich renderable for the end of a build: summary and the costliest workloads."""
    table = Table(show_header=True, header_style="bold", box=None)
    for column, justify in (("operator", "left"), ("chosen", "left"), ("median", "right"),
                            ("share", "right")):
        table.add_column(column, justify=justify)
    for workload in by_share(report)[:top]:
        chosen = workload["chosen"] + (" (fallback)" if workload["fallback"] else "")
        table.add_row(workload["label"], chosen, format_time(workload["median_s"]),
                      f"{100 * workload['share']:.1f}%")
    return Group(Text("\n".join(summary_lines(report))), table)


def render_table(report: Mapping) -> Group:
    """A rich renderable: summary, then one row per workload (largest share first)."""
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for column, justify, width in (("operator", "left", 18), ("n", "right", None),
                                   ("chosen", "left", 10), ("median", "right", None),
                                   ("share", "right", None), ("vs next", "right", None),
                                   ("ok", "right", None)):
        table.add_column(column, justify=justify, min_width=width)
    for workload in by_share(report):
        ratio = runner_up_ratio(workload)
        ok = sum(1 for c in workload["candidates"] if c["status"] == "ok")
        chosen = Text(workload["chosen"])
        chosen.append(f" {workload['chosen_kind']}",
                      style="bold yellow" if workload["fallback"] else "dim")
        table.add_row(workload["label"], str(workload["count"]), chosen,
                      format_time(workload["median_s"]), f"{100 * workload['share']:.1f}%",
                      f"{ratio:.2f}x" if ratio else "-",
                      f"{ok}/{len(workload['candidates'])}")
    return Group(Text("\n".join(summary_lines(report))), table)


def render_json(report: Mapping) -> str:
    """The report as indented JSON text."""
    return json.dumps(report, indent=2, allow_nan=False)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:70em;
color:#222}
h1{font-size:1.5em}h2{font-size:1.1em;margin:1.6em 0 .3em}
.summary{background:#f4f6f8;border-radius:6px;padding:.8em 1.2em;line-height:1.5}
.meta{color:#555;font-size:.9em}.fallback{color:#b35900;font-weight:bold}
.share{display:inline-block;width:12em;height:.8em;background:#e3e7eb;border-radius:3px;
vertical-align:middle}.share span{display:block;height:100%;background:#3b7dd8;
border-radius:3px}
svg text{font-size:12px;font-family:ui-monospace,monospace}
table{border-collapse:collapse;font-size:.9em}td,th{padding:.2em .8em;text-align:left}
"""


def _bar_chart(workload: Mapping) -> str:
    candidates = sorted(workload["candidates"],
                        key=lambda c: (c["median_s"] is None, c["median_s"] or 0.0))
    longest = max((c["median_s"] or 0.0 for c in candidates), default=0.0) or 1.0
    row, label_width, bar_width = 22, 330, 420
    height = row * len(candidates) + 6
    parts = [f'<svg width="{label_width + bar_width + 170}" height="{height}" '
             f'role="img" xmlns="http://www.w3.org/2000/svg">']
    for index, cand in enumerate(candidates):
        y = 4 + index * row
        chosen = cand["label"] == workload["chosen"]
        name = html.escape(cand["label"] if len(cand["label"]) <= 46
                           else cand["label"][:45] + "\u2026")
        weight = ' font-weight="bold"' if chosen else ""
        parts.append(f'<text x="0" y="{y + 14}"{weight}>{name}</text>')
        if cand["status"] == "ok" and cand["median_s"]:
            width = max(1.0, bar_width * cand["median_s"] / longest)
            color = "#2e9d5b" if chosen else "#9aa8b8"
            tip = html.escape(f"{cand['label']}: {format_time(cand['median_s'])}")
            parts.append(f'<rect x="{label_width}" y="{y + 3}" width="{width:.1f}" height="14" '
                         f'fill="{color}"><title>{tip}</title></rect>')
            note = format_time(cand["median_s"]) + ("  \u25c0 chosen" if chosen else "")
            parts.append(f'<text x="{label_width + width + 6:.1f}" y="{y + 14}"{weight}>'
                         f'{html.escape(note)}</text>')
        else:
            why = html.escape(f"{cand['status']}: {cand.get('message') or ''}"[:80])
            parts.append(f'<text x="{label_width}" y="{y + 14}" fill="#c0392b">{why}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _passes_table(passes: Mapping) -> str:
    before, after = passes.get("ops_before") or {}, passes.get("ops_after") or {}
    if not (before or after):
        return ""
    rows = "".join(f"<tr><td>{html.escape(op)}</td><td>{before.get(op, 0)}</td>"
                   f"<td>{after.get(op, 0)}</td></tr>" for op in sorted({*before, *after}))
    hits = {**(passes.get("passes") or {}), **(passes.get("rules") or {})}
    hit_rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{count}</td></tr>"
                       for name, count in hits.items() if count)
    hit_table = (f"<table><tr><th>pass / rule</th><th>hits</th></tr>{hit_rows}</table>"
                 if hit_rows else "")
    return ("<h2>Graph passes</h2><table><tr><th>op</th><th>before</th><th>after</th></tr>"
            f"{rows}</table>{hit_table}")


def render_html(report: Mapping) -> str:
    """A self-contained HTML page: summary, then per workload a chart of its candidates."""
    summary = "<br>".join(html.escape(line) for line in summary_lines(report))
    sections = []
    for workload in by_share(report):
        nodes = ", ".join(workload["nodes"][:8]) + (" \u2026" if len(workload["nodes"]) > 8
                                                   else "")
        fallback = ' <span class="fallback">fallback</span>' if workload["fallback"] else ""
        share = 100 * workload["share"]
        sections.append(
            f'<section><h2>{html.escape(workload["label"])}{fallback}</h2>'
            f'<div class="meta">{workload["count"]} node(s): {html.escape(nodes)}<br>'
            f'chosen <b>{html.escape(workload["chosen"])}</b> '
            f'({html.escape(workload["chosen_kind"])}), '
            f'{format_time(workload["median_s"])} per call, '
            f'<span class="share"><span style="width:{share:.1f}%"></span></span> '
            f'{share:.1f}% of the total latency</div>{_bar_chart(workload)}</section>')
    passes = _passes_table(report.get("passes") or {})
    title = html.escape(f"wpk report: {report.get('model') or 'model'}")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}'
            f"</title><style>{_CSS}</style></head><body><h1>{title}</h1>"
            f'<div class="summary">{summary}</div>{passes}{"".join(sections)}</body></html>\n')
