"""The HTML report's summary, table, reasons and charts, on a report document in the shape
`wpk.plans.report` documents (hand-made, so every case is there: a region choice, a fast
winner next to a slow numpy candidate, a tuned workload, the end-to-end comparison)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from xml.etree import ElementTree

import pytest

from wpk.commands.charts import LinearAxis, LogAxis, running_best
from wpk.commands.render import reason_tag, reason_text, runner_up_ratio
from wpk.commands.render_html import render_html, share_groups
from wpk.plans.report import choice_reason, next_best, onnxruntime_time

SVG = "{http://www.w3.org/2000/svg}"


def candidate(label, kind, median_s, status="ok", onnxruntime=False, message=""):
    return {"label": label, "impl": label.split("[")[0], "kind": kind, "status": status,
            "median_s": median_s, "spread_s": [median_s, median_s], "rel_l2_error": 1e-7,
            "message": message, "onnxruntime": onnxruntime}


def workload(key, label, op, chosen, candidates, count=1, reason=None, share=0.0):
    chosen_entry = next(c for c in candidates if c["label"] == chosen)
    return {"key": key, "label": label, "op": op, "nodes": [f"{key}_{i}" for i in range(count)],
            "count": count, "chosen": chosen, "chosen_impl": chosen_entry["impl"],
            "chosen_kind": chosen_entry["kind"], "median_s": chosen_entry["median_s"],
            "spread_s": chosen_entry["spread_s"],
            "latency_s": chosen_entry["median_s"] * count, "share": share,
            "fallback": chosen_entry["kind"] == "fallback", "reason": reason,
            "candidates": candidates}


@pytest.fixture
def report():
    conv = workload("conv", "Conv 1x3x8x8 * 8x3x3x3 -> 1x8x8x8 +relu", "Conv", "dsl.cpu[t=4]", [
        candidate("dsl.cpu[t=4]", "generated", 5e-6),
        candidate("ort", "vendor", 8e-6, onnxruntime=True),
        candidate("numpy.conv", "library", 5e-3),
    ], count=2, reason={"rule": "fastest", "verified": 3, "runner_up": "ort"})
    flatten = workload("flat", "Flatten 1x8x1x1 -> 1x8", "Flatten", "ort", [
        candidate("ort", "vendor", 7e-6, onnxruntime=True),
        candidate("numpy.reshape", "library", 2e-6),
    ], reason={"rule": "region", "verified": 2, "faster": "numpy.reshape", "over_s": 5e-6,
               "credit_s": 20e-6, "runner_up": "numpy.reshape"})
    gather = workload("gath", "Gather 4x4 -> 2x4", "Gather", "ort.fallback", [
        candidate("ort.fallback", "fallback", 3e-6, onnxruntime=True),
        candidate("numpy.gather", "library", None, status="wrong_answer",
                  message="relative L2 error 0.5"),
    ], reason={"rule": "only_verified", "verified": 1})
    workloads = [conv, flatten, gather]
    total = sum(w["latency_s"] for w in workloads)
    for entry in workloads:
        entry["share"] = entry["latency_s"] / total
    return {
        "report_version": 1, "model": "m.onnx", "target": "cpu",
        "device": {"kind": "cpu", "machine": "x86_64", "cores": 2}, "build_time_s": 3.0,
        "totals": {"latency_s": total, "workloads": 3, "nodes": 4, "fallback_nodes": 1,
                   "candidates": 7, "verified": 6},
        "passes": {"ops_before": {"Conv": 1}, "ops_after": {"Conv": 1}},
        "workloads": workloads,
        "partition": {"winner": "wpk", "ratio": 0.8, "wpk_median_s": 20e-6,
                      "onnxruntime_median_s": 25e-6, "method": "5 alternating blocks"},
        "search": {"search": "ga", "measured": 6, "reused": 0, "records": 6, "tuned": [{
            "key": "conv", "label": conv["label"], "tuner": "ga", "trials": 6,
            "stopped": "trials", "stopped_text": "reached --trials 6",
            "history": [9e-6, None, 7e-6, 8e-6, 5e-6, 6e-6], "best_s": 5e-6,
            "final_s": 5.2e-6, "reference_s": 8e-6}]},
    }


class Page(HTMLParser):
    """Collects the headings, the workloads table's rows and the cards of a page."""

    def __init__(self, text):
        super().__init__()
        self.headings, self.rows, self.cards, self._tag, self._row = [], [], [], None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h2", "h3"):
            self._tag = tag
            self.headings.append("")
        if tag == "tr" and (attrs.get("id") or "").startswith("row-"):
            self._row = []
            self.rows.append(self._row)
        if tag == "td" and self._row is not None:
            self._row.append(attrs.get("data-v"))
        if tag == "section" and "card" in (attrs.get("class") or ""):
            self.cards.append(attrs["id"])

    def handle_endtag(self, tag):
        if tag == self._tag:
            self._tag = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._tag:
            self.headings[-1] += data


def card_svg(page: str, key: str, index: int = 0) -> ElementTree.Element:
    """The index-th chart of the workload's card."""
    card = re.search(rf'<section class="card" id="w-{key}">(.*?)</section>', page, re.S).group(1)
    return ElementTree.fromstring(re.findall(r"<svg.*?</svg>", card, re.S)[index])


def test_the_page_opens_with_the_summary_then_the_table_then_the_cards(report):
    page = Page(render_html(report))
    order = [h for h in page.headings if h in (
        "Summary", "End to end on this machine", "Latency share by operator type",
        "Latency share by implementation kind",
        "Chosen vs onnxruntime per workload (log scale)", "Workloads")]
    assert order == ["Summary", "End to end on this machine", "Latency share by operator type",
                     "Latency share by implementation kind",
                     "Chosen vs onnxruntime per workload (log scale)", "Workloads"]
    assert page.headings.index("Workloads") < page.headings.index(
        "Every workload: its candidates and why one was chosen")
    assert page.cards == ["w-conv", "w-flat", "w-gath"]          # largest share first
    assert len(page.rows) == 3 and all(len(row) == 13 for row in page.rows)
    medians = [float(row[7]) for row in page.rows]
    assert medians == [5e-6, 7e-6, 3e-6]                       # sortable values


def test_end_to_end_chart_shows_both_measurements(report):
    page = render_html(report)
    chart = re.search(r"End to end on this machine</h3>(<svg.*?</svg>)", page, re.S).group(1)
    texts = [t.text for t in ElementTree.fromstring(chart).iter(f"{SVG}text")]
    assert "20 us" in texts and "25 us" in texts
    assert "wpk / onnxruntime = 0.80x on this machine" in page
    del report["partition"]
    assert "Not measured end to end: this build did not compare" in render_html(report)


def test_shares_group_by_operator_type_and_implementation_kind(report):
    kinds = {name: share for name, share, _, _ in share_groups(report, "chosen_kind")}
    assert set(kinds) == {"generated", "vendor", "fallback"}
    assert kinds["generated"] == pytest.approx(10 / 20)      # 2 nodes x 5 us of 20 us
    assert sum(kinds.values()) == pytest.approx(1.0)
    ops = [name for name, *_ in share_groups(report, "op")]
    assert ops == ["Conv", "Flatten", "Gather"]


def test_reasons_are_given_for_every_choice(report):
    conv, flatten, gather = report["workloads"]
    assert reason_text(conv) == "fastest of 3 verified candidates"
    assert reason_text(flatten) == ("keeps the onnxruntime region whole (+5 us over "
                                    "numpy.reshape, within the 20 us credit of a step inside "
                                    "a region)")
    assert reason_tag(flatten) == "region +5 us"
    assert reason_text(gather) == "only verified candidate (of 2)"
    page = render_html(report)
    for entry in (conv, flatten, gather):
        assert f"why: {reason_text(entry)}" in page
    flatten["predicted"] = True
    assert reason_text(flatten).startswith("predicted: keeps the onnxruntime region whole")


def test_a_report_without_reasons_is_explained_by_its_times(report):
    conv, flatten, _ = report["workloads"]
    for entry in report["workloads"]:
        entry.pop("reason")
    assert choice_reason(conv) == {"rule": "fastest", "verified": 3}
    old = choice_reason(flatten)
    assert old["rule"] == "not_recorded" and old["faster"] == "numpy.reshape"
    assert "predates recorded reasons" in reason_text(flatten)


def test_vs_next_compares_with_the_fastest_other_candidate(report):
    conv, flatten, gather = report["workloads"]
    assert runner_up_ratio(conv) == pytest.approx(8e-6 / 5e-6)
    assert next_best(flatten)["label"] == "numpy.reshape"
    assert runner_up_ratio(flatten) == pytest.approx(2 / 7)   # slower: kept the region
    assert runner_up_ratio(gather) is None
    assert onnxruntime_time(conv) == 8e-6 and onnxruntime_time(gather) == 3e-6


def test_a_fast_winner_stays_visible_next_to_a_slow_candidate(report):
    bars = {r.find(f"{SVG}title").text.split(":")[0]: float(r.get("width"))
            for r in card_svg(render_html(report), "conv").iter(f"{SVG}rect")}
    slow, fast = bars["numpy.conv"], bars["dsl.cpu[t=4]"]
    assert slow / fast < 10         # 1000x slower, but on a log axis; linear: 1000
    assert fast > 50


def test_the_tuning_curve_never_rises(report):
    svg = card_svg(render_html(report), "conv", index=1)
    curve = next(p for p in svg.iter(f"{SVG}path") if p.get("class") == "curve")
    heights = [float(v) for v in re.findall(r"V([\d.]+)", curve.get("d"))]
    assert heights and heights == sorted(heights)   # down the page = faster
    dots = [c for c in svg.iter(f"{SVG}circle")]
    assert len(dots) == 5                           # the failed trial is a mark, not a dot
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert "best 5 us" in texts and "vendor 8 us" in texts and "re-measured 5.2 us" in texts
    assert running_best([None, 3.0, 4.0, None, 2.0]) == [None, 3.0, 3.0, 3.0, 2.0]


def test_a_workload_two_families_tuned_has_a_curve_for_each(report):
    first = report["search"]["tuned"][0]
    report["search"]["tuned"] = [dict(first, impl="dsl.cpu"),
                                 dict(first, impl="micro.nchwc", trials=3,
                                      history=[6e-6, 4e-6, 4.5e-6], final_s=4.1e-6)]
    page = render_html(report)
    card = re.search(r'<section class="card" id="w-conv">(.*?)</section>', page, re.S).group(1)
    titles = re.findall(r"<h3>Tuning (.*?): best time vs trials \((.*?)\)</h3>", card)
    assert [(family, text.split(";")[0]) for family, text in titles] == [
        ("dsl.cpu", "ga, 6 trials"), ("micro.nchwc", "ga, 3 trials")]
    micro = card_svg(page, "conv", index=2)
    dots = [c for c in micro.iter(f"{SVG}circle")]
    assert len(dots) == 3                           # the micro-kernels' own three trials
    assert "re-measured 4.1 us" in [t.text for t in micro.iter(f"{SVG}text")]


def test_axes_hold_every_value():
    axis = LogAxis([5e-6, 5e-3])
    assert axis.low < 5e-6 and axis.high >= 5e-3
    assert 0 < axis.fraction(5e-6) < 0.2 and axis.fraction(5e-3) == pytest.approx(1.0)
    assert axis.ticks()[0] >= axis.low and 1e-5 in axis.ticks()
    linear = LinearAxis(6.89e-3)
    assert linear.high >= 6.89e-3 and linear.ticks()[0] == 0 and len(linear.ticks()) <= 6


def test_curve_labels_never_overlap():
    from wpk.commands.charts import spread_labels

    placed = spread_labels([(50.0, "best", "a"), (52.0, "vendor", "b"), (51.0, "final", "c"),
                            (200.0, "low", "d")], top=10.0, bottom=190.0)
    ys = [y for y, _, _ in placed]
    assert all(b - a >= 13.0 for a, b in zip(ys, ys[1:]))
    assert ys[0] == 50.0 and ys[-1] <= 190.0
    assert [text for _, text, _ in placed] == ["best", "final", "vendor", "low"]
