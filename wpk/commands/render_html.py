"""The build report (`wpk.plans.report`) as one self-contained HTML page.

    page = render_html(report)

In order: the summary facts; the summary charts (the plan measured end to end
next to onnxruntime's whole model, from `report["partition"]`; the latency
share by operator type and by implementation kind; chosen vs onnxruntime per
workload on a log scale); a table of the workloads that sorts by any column
(a few lines of inline script; `#sort=COLUMN` or `#sort=-COLUMN` in the
address sorts on load); the graph passes; then one card per workload with
the reason for its choice, every candidate's time on a log scale and, when
it was tuned, the tuning curve (best time vs trials) of each generated family
that tuned it. No network, no external
asset: CSS, SVG and script are inline.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from wpk.commands.charts import KIND_COLORS, OTHER_COLOR, Bar, bar_chart, curve_chart, share_chart
from wpk.commands.render import (
    algorithm_text,
    format_ratio,
    format_time,
    gflops_text,
    plural,
    reason_tag,
    reason_text,
    runner_up_ratio,
    summary_lines,
    wpk_plan_name,
)
from wpk.plans.report import by_share, gflops, onnxruntime_time, runs_on_onnxruntime

TOP_WORKLOADS = 40   # rows of the chosen-vs-onnxruntime chart

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:72em;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin:1.8em 0 .4em}h3{font-size:1em;margin:1.2em 0 .2em}
.facts{background:#f4f6f8;border-radius:6px;padding:.8em 1.2em;line-height:1.5}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:1.5em}
.meta{color:#555;font-size:.9em;line-height:1.5}.fallback{color:#b35900;font-weight:bold}
.why{background:#eef6ee;border-left:3px solid #2e9d5b;padding:.2em .6em;margin:.4em 0}
.note{color:#555;font-size:.85em}
svg.chart{display:block;margin:.3em 0 1em;max-width:100%}
svg text{font-size:12px;font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
svg .tick{fill:#666;font-size:11px}svg .bad{fill:#c0392b}svg .best{fill:#2e9d5b}
svg .grid{stroke:#dde2e8;stroke-width:1}
svg .curve{fill:none;stroke:#2e9d5b;stroke-width:2}svg .trial{fill:#8a97a8}
svg .reference{stroke:#3b7dd8;stroke-dasharray:5 4;stroke-width:1.5}svg .final{fill:#2e9d5b}
svg .reference-note{fill:#3b7dd8}
table{border-collapse:collapse;font-size:.88em}td,th{padding:.25em .7em;text-align:left}
table.workloads tr:nth-child(even){background:#f7f8fa}
table.workloads th{cursor:pointer;user-select:none;border-bottom:2px solid #ccd;
white-space:nowrap}
table.workloads td.num{text-align:right;font-variant-numeric:tabular-nums}
th[aria-sort=ascending]::after{content:" \\25b2"}th[aria-sort=descending]::after{content:" \\25bc"}
.legend span{display:inline-block;margin-right:1.2em}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}
section.card{border-top:1px solid #e3e7eb;margin-top:1.2em}
"""

# Sorts table.workloads by a column on a click on its header (again: the other way), or
# on load by `#sort=NAME` / `#sort=-NAME`; cells sort by their data-v (numbers) or text.
_SCRIPT = """
(function(){
  var table = document.querySelector("table.workloads");
  if (!table) return;
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  function key(row, col) {
    var cell = row.cells[col], v = cell.getAttribute("data-v");
    return v === null ? cell.textContent.toLowerCase() : parseFloat(v);
  }
  function sort(col, descending) {
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    rows.sort(function(a, b) {
      var x = key(a, col), y = key(b, col);
      return (x < y ? -1 : x > y ? 1 : 0) * (descending ? -1 : 1);
    });
    rows.forEach(function(row) { body.appendChild(row); });
    heads.forEach(function(h) { h.removeAttribute("aria-sort"); });
    heads[col].setAttribute("aria-sort", descending ? "descending" : "ascending");
  }
  heads.forEach(function(head, col) {
    head.addEventListener("click", function() {
      sort(col, head.getAttribute("aria-sort") === "ascending");
    });
  });
  var wanted = /sort=(-?)([a-z_]+)/.exec(location.hash);
  if (wanted) {
    var col = heads.findIndex(function(h) { return h.dataset.name === wanted[2]; });
    if (col >= 0) sort(col, wanted[1] === "-");
  }
})();
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def kind_color(kind: str) -> str:
    """The color of an implementation kind (generated, vendor, library, fallback)."""
    return KIND_COLORS.get(kind, OTHER_COLOR)


# ----------------------------------------------------------------------------- summary
def end_to_end_chart(report: Mapping) -> str:
    """The plan measured end to end next to onnxruntime's whole model (linear, from 0),
    with the per-operator estimate; or a sentence saying why there is no measurement."""
    partition = report.get("partition") or {}
    estimate = (report.get("totals") or {}).get("latency_s")
    if "wpk_median_s" not in partition:
        why = partition.get("reason") or "this build did not compare the plan with " \
                                          "onnxruntime's whole model"
        return f'<p class="note">Not measured end to end: {_esc(why)}.</p>'
    wpk_s, ort_s = partition["wpk_median_s"], partition["onnxruntime_median_s"]
    winner = partition.get("winner")
    bars = [Bar(f"{wpk_plan_name(partition)}, measured end to end", wpk_s, "#2e9d5b",
                format_time(wpk_s), chosen=winner == "wpk"),
            Bar("onnxruntime, the whole model in one session", ort_s, kind_color("vendor"),
                format_time(ort_s), chosen=winner == "onnxruntime")]
    if estimate:
        bars.append(Bar("sum of the chosen kernels' medians (each measured alone)", estimate,
                        OTHER_COLOR, format_time(estimate), chosen=False))
    plan = "onnxruntime's whole model" if winner == "onnxruntime" else wpk_plan_name(partition)
    return (bar_chart(bars, log=False, title="end-to-end latency") +
            f'<p class="note">wpk / onnxruntime = {partition["ratio"]:.2f}x on this machine; '
            f'the saved plan is {plan}. {_esc(partition.get("method", ""))}.</p>')


def share_groups(report: Mapping, field: str) -> list[tuple[str, float, float, int]]:
    """(name, share, seconds, nodes) of the latency per value of a workload field ('op',
    'chosen_kind'), largest first."""
    groups: dict[str, list[float]] = {}
    for workload in report.get("workloads", []):
        entry = groups.setdefault(workload[field], [0.0, 0.0, 0])
        entry[0] += workload.get("share") or 0.0
        entry[1] += workload.get("latency_s") or 0.0
        entry[2] += workload["count"]
    return sorted(((k, *v) for k, v in groups.items()), key=lambda g: -g[1])


def share_bars(report: Mapping, field: str, colored: bool) -> list[Bar]:
    """One bar per group of `share_groups`, colored by kind when `colored`."""
    return [Bar(name, share, kind_color(name) if colored else "#3b7dd8",
                f"{100 * share:.1f}%  {format_time(seconds)}  {plural(nodes, 'node')}")
            for name, share, seconds, nodes in share_groups(report, field)]


def versus_bars(workload: Mapping) -> list[Bar]:
    """The chosen kernel's bar, and onnxruntime's kernel's under it unless it is the one
    chosen."""
    chosen, peer = workload["median_s"], onnxruntime_time(workload)
    label = f"{workload['label']}  [{workload['chosen']}]"
    color = kind_color(workload["chosen_kind"])
    if peer is None:
        return [Bar(label, chosen, color, f"{format_time(chosen)} (no onnxruntime kernel)")]
    if peer == chosen and runs_on_onnxruntime(workload["chosen_impl"]):
        return [Bar(label, chosen, color, f"{format_time(chosen)} (onnxruntime's own)")]
    return [Bar(label, chosen, color, f"{format_time(chosen)} ({peer / chosen:.2f}x "
                                      "onnxruntime)"),
            Bar("", peer, OTHER_COLOR, f"onnxruntime {format_time(peer)}", chosen=False)]


def versus_chart(report: Mapping) -> str:
    """Per workload (largest share first) the chosen kernel's time and onnxruntime's own
    kernel's, on one log axis."""
    workloads = [w for w in by_share(report) if w.get("median_s")]
    bars = [bar for w in workloads[:TOP_WORKLOADS] for bar in versus_bars(w)]
    more = len(workloads) - TOP_WORKLOADS
    note = (f'<p class="note">The {TOP_WORKLOADS} largest shares; {more} more in the '
            f'table.</p>' if more > 0 else "")
    return bar_chart(bars, title="chosen vs onnxruntime per workload") + note


def legend() -> str:
    """The colors of the implementation kinds."""
    items = "".join(f'<span><i style="background:{color}"></i>{_esc(kind)}</span>'
                    for kind, color in KIND_COLORS.items())
    return f'<p class="legend note">{items}</p>'


def summary_section(report: Mapping) -> str:
    """The charts that open the page."""
    return (
        "<h2>Summary</h2><h3>End to end on this machine</h3>" + end_to_end_chart(report) +
        "<h3>Latency share by operator type</h3>" +
        share_chart(share_bars(report, "op", False), "latency share by operator type") +
        "<h3>Latency share by implementation kind</h3>" + legend() +
        share_chart(share_bars(report, "chosen_kind", True),
                    "latency share by implementation kind") +
        "<h3>Chosen vs onnxruntime per workload (log scale)</h3>" +
        '<p class="note">Each workload measured alone: its chosen kernel (colored by kind) '
        "and, when another kernel was chosen, onnxruntime's own kernel for it (grey).</p>" +
        versus_chart(report))


# ----------------------------------------------------------------------------- table
_COLUMNS = (("rank", "#"), ("operator", "operator"), ("op", "op"), ("nodes", "nodes"),
            ("chosen", "chosen"), ("kind", "kind"), ("algorithm", "algorithm"),
            ("median", "median"), ("gflops", "GFLOP/s"), ("share", "share"),
            ("vs_ort", "vs onnxruntime"), ("vs_next", "vs next"), ("why", "why"))


def _cell(text: str, value: float | None = None) -> str:
    if value is None:
        return f"<td>{_esc(text)}</td>"
    return f'<td class="num" data-v="{value:.6g}">{_esc(text)}</td>'


def workload_row(rank: int, workload: Mapping) -> str:
    """One row of the workloads table; numeric cells carry their value for sorting."""
    peer = onnxruntime_time(workload)
    chosen = workload.get("median_s")
    vs_ort = peer / chosen if peer and chosen else None
    vs_next = runner_up_ratio(workload)
    cells = [_cell(str(rank), rank), _cell(workload["label"]), _cell(workload["op"]),
             _cell(str(workload["count"]), workload["count"]), _cell(workload["chosen"]),
             _cell(workload["chosen_kind"]), _cell(algorithm_text(workload)),
             _cell(format_time(chosen), chosen or 0.0),
             _cell(gflops_text(workload), gflops(workload) or 0.0),
             _cell(f"{100 * workload['share']:.1f}%", workload["share"]),
             _cell(format_ratio(vs_ort), vs_ort or 0.0),
             _cell(format_ratio(vs_next), vs_next or 0.0), _cell(reason_tag(workload))]
    return f'<tr id="row-{_esc(workload["key"])}">{"".join(cells)}</tr>'


def workloads_table(report: Mapping) -> str:
    """Every workload, largest share first; a click on a header sorts by that column."""
    heads = "".join(f'<th data-name="{name}">{_esc(title)}</th>' for name, title in _COLUMNS)
    rows = "".join(workload_row(rank, w) for rank, w in enumerate(by_share(report), start=1))
    return ("<h2>Workloads</h2><p class=\"note\">Click a header to sort. <i>vs onnxruntime"
            "</i>: onnxruntime's kernel time over the chosen one's; <i>vs next</i>: the "
            "fastest other verified candidate's time over the chosen one's (below 1.00x the "
            "chosen is slower, see <i>why</i>).</p>"
            f'<table class="workloads"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody>'
            "</table>")


def passes_table(passes: Mapping) -> str:
    """Op counts before and after the graph passes, and each pass's or rule's hits."""
    before, after = passes.get("ops_before") or {}, passes.get("ops_after") or {}
    if not (before or after):
        return ""
    rows = "".join(f"<tr><td>{_esc(op)}</td><td>{before.get(op, 0)}</td>"
                   f"<td>{after.get(op, 0)}</td></tr>" for op in sorted({*before, *after}))
    hits = {**(passes.get("passes") or {}), **(passes.get("rules") or {})}
    hit_rows = "".join(f"<tr><td>{_esc(name)}</td><td>{count}</td></tr>"
                       for name, count in hits.items() if count)
    hit_table = (f"<table><tr><th>pass / rule</th><th>hits</th></tr>{hit_rows}</table>"
                 if hit_rows else "")
    return ('<h2>Graph passes</h2><div class="grid2"><table><tr><th>op</th><th>before</th>'
            f"<th>after</th></tr>{rows}</table>{hit_table}</div>")


# ----------------------------------------------------------------------------- cards
def candidates_chart(workload: Mapping) -> str:
    """Every candidate's median on a log axis, fastest first; failures say why."""
    candidates = sorted(workload["candidates"],
                        key=lambda c: (c["median_s"] is None, c["median_s"] or 0.0))
    bars = []
    for cand in candidates:
        chosen = cand["label"] == workload["chosen"]
        if cand["status"] == "ok" and cand["median_s"]:
            note = (format_time(cand["median_s"]) + (f"  {cand['algorithm']}" if
                    cand.get("algorithm") and cand["algorithm"] != cand["impl"] else "") +
                    ("  \u25c0 chosen" if chosen else ""))
            bars.append(Bar(cand["label"], cand["median_s"], kind_color(cand["kind"]), note,
                            chosen=chosen))
        else:
            bars.append(Bar(cand["label"], None, note=f"{cand['status']}: "
                                                      f"{cand.get('message') or ''}",
                            chosen=False))
    return bar_chart(bars, title=f"candidates of {workload['label']}")


def tuning_curve(tuned: Mapping | None) -> str:
    """One search's tuning curve (a generated family on the workload), when it kept its
    history."""
    if not tuned or not tuned.get("history"):
        return ""
    stopped = _esc(tuned.get("stopped_text") or tuned.get("stopped") or "")
    family = f"{tuned['impl']}: " if tuned.get("impl") else ""
    return (f"<h3>Tuning {_esc(family)}best time vs trials ({_esc(tuned.get('tuner', ''))}, "
            f"{plural(tuned.get('trials', 0), 'trial')}; {stopped})</h3>" +
            curve_chart(tuned["history"], tuned.get("reference_s"), tuned.get("final_s"),
                        title=f"tuning curve of {tuned.get('label', '')}"
                              + (f" ({tuned['impl']})" if tuned.get("impl") else "")))


def workload_card(workload: Mapping, tuned: Sequence[Mapping] = ()) -> str:
    """One workload: its nodes, the choice and why, its candidates, one tuning curve per
    generated family that tuned it."""
    nodes = ", ".join(workload["nodes"][:8]) + (" \u2026" if len(workload["nodes"]) > 8
                                               else "")
    fallback = ' <span class="fallback">fallback</span>' if workload["fallback"] else ""
    curves = "".join(tuning_curve(search) for search in tuned)
    return (
        f'<section class="card" id="w-{_esc(workload["key"])}">'
        f'<h3>{_esc(workload["label"])}{fallback}</h3>'
        f'<div class="meta">{plural(workload["count"], "node")}: {_esc(nodes)}<br>'
        f'chosen <b>{_esc(workload["chosen"])}</b> ({_esc(workload["chosen_kind"])}, '
        f'algorithm {_esc(algorithm_text(workload))}), '
        f'{format_time(workload["median_s"])} per call ({_esc(gflops_text(workload))} '
        f'GFLOP/s), {100 * workload["share"]:.1f}% of the estimated latency</div>'
        f'<div class="why">why: {_esc(reason_text(workload))}</div>'
        f'{candidates_chart(workload)}{curves}</section>')


def tuned_by_key(report: Mapping) -> dict[str, list[Mapping]]:
    """The search summary's entries by workload key: one per generated family that tuned
    the workload, in the order they ran."""
    found: dict[str, list[Mapping]] = {}
    for search in (report.get("search") or {}).get("tuned", []):
        found.setdefault(search["key"], []).append(search)
    return found


def cards(report: Mapping, order: Sequence[Mapping]) -> str:
    """The workload cards, in `order`, each with the tuning curves of its searches."""
    tuned = tuned_by_key(report)
    return "<h2>Every workload: its candidates and why one was chosen</h2>" + "".join(
        workload_card(w, tuned.get(w["key"], ())) for w in order)


def render_html(report: Mapping) -> str:
    """The self-contained page (see the module docstring)."""
    facts = "<br>".join(_esc(line) for line in summary_lines(report))
    title = _esc(f"wpk report: {report.get('model') or 'model'}")
    body = (f'<h1>{title}</h1><div class="facts">{facts}</div>{summary_section(report)}'
            f'{workloads_table(report)}{passes_table(report.get("passes") or {})}'
            f"{cards(report, by_share(report))}")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title><style>{_CSS}</style></head><body>{body}"
            f"<script>{_SCRIPT}</script></body></html>\n")
