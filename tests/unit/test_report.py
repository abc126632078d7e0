"""Reports: per-workload data, shares, and the table/JSON/HTML renderings."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import time
from xml.etree import ElementTree

import numpy as np
import pytest
from rich.console import Console

from wpk.commands.render import (
    format_time,
    reason_text,
    render_json,
    render_summary,
    render_table,
    summary_lines,
)
from wpk.commands.render_html import render_html
from wpk.kernels import registry
from wpk.kernels.registry import FALLBACK, Candidate, Implementation
from wpk.plans.buffers import plan_graph_buffers
from wpk.plans.progress import progress_bar, wants_progress
from wpk.plans.report import make_report

from .plan_helpers import TEST_TARGET, tiny_choices


class SlowRelu(Implementation):
    """Correct, but a Python loop that also sleeps 2 ms: always slower than numpy."""

    name = "report_test.slow <relu>"

    def unsupported_reason(self, workload):
        return None if workload.op == "Relu" else "Relu only"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):
            time.sleep(0.002)
            flat_in, flat_out = inputs[0].reshape(-1), outputs[0].reshape(-1)
            for i in range(flat_in.size):
                flat_out[i] = flat_in[i] if flat_in[i] > 0 else 0.0
        return kernel


class BrokenAdd(Implementation):
    name = "report_test.broken_add"
    kind = FALLBACK

    def unsupported_reason(self, workload):
        return None if workload.op == "Add" else "Add only"

    def prepare(self, workload, consts, config):
        raise RuntimeError("cannot build")


@pytest.fixture
def report(rng):
    _, _, choices = tiny_choices(rng, extra=[SlowRelu(), BrokenAdd()])
    buffers = plan_graph_buffers([(["x"], ["t"]), (["t"], ["r"]), (["r", "t"], ["y"])],
                                 {n: 40 for n in "xtry"}, ["x"], ["y"], [])
    passes = {"ops_before": {"MatMul": 1, "Relu": 2}, "ops_after": {"MatMul": 1},
              "rules": {"gemm_relu": 2}}
    return make_report(choices, target="cpu", model="tiny.onnx", device={"kind": "cpu"},
                       pass_report=passes, build_time_s=1.5, buffers=buffers)


def test_report_holds_every_candidate_and_the_shares(report):
    workloads = {w["op"]: w for w in report["workloads"]}
    assert [w["op"] for w in report["workloads"]] == ["MatMul", "Relu", "Add"]
    relu = workloads["Relu"]
    assert relu["chosen_impl"] == "planfile_test.relu"
    statuses = {c["impl"]: c["status"] for c in relu["candidates"]}
    assert statuses == {"planfile_test.relu": "ok", "report_test.slow <relu>": "ok"}
    add = workloads["Add"]
    broken = next(c for c in add["candidates"] if c["impl"] == "report_test.broken_add")
    assert broken["status"] == "compile_error" and "cannot build" in broken["message"]
    assert broken["median_s"] is None and not add["fallback"]
    assert sum(w["share"] for w in report["workloads"]) == pytest.approx(1.0)
    total = report["totals"]["latency_s"]
    assert total == pytest.approx(sum(w["median_s"] * w["count"] for w in report["workloads"]))
    assert report["totals"]["candidates"] == 5 and report["totals"]["verified"] == 4
    assert report["totals"]["arena_bytes"] <= report["totals"]["no_reuse_bytes"]
    assert json.loads(render_json(report)) == report


def test_table_lists_workloads_by_share(report):
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_table(report))
    text = console.file.getvalue()
    assert "model tiny.onnx on cpu" in text and "built in 1.5 s" in text
    for workload in report["workloads"]:
        assert workload["label"] in text
    relu_row = next(line for line in text.splitlines() if "Relu" in line)
    assert "2/2" in relu_row and re.search(r"\d\.\d\dx", relu_row)  # vs next: a ratio
    assert "fastest" in relu_row                                     # why


def test_summary_shows_the_costliest_workloads(report):
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_summary(report, top=1))
    text = console.file.getvalue()
    top = max(report["workloads"], key=lambda w: w["share"])
    assert top["label"] in text and "estimated latency" in text
    assert sum(w["label"] in text for w in report["workloads"]) == 1


def test_html_is_self_contained_and_marks_the_chosen(report):
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>")
    for external in ("src=", "href=", "<link", "@import", "url("):
        assert external not in page
    assert page.count("http") == page.count('xmlns="http://www.w3.org/2000/svg"')
    assert page.count("\u25c0 chosen</text>") == 3   # one per workload card
    assert "report_test.slow &lt;relu&gt;" in page  # escaped
    assert "compile_error: RuntimeError: cannot build" in page
    assert "<td>Relu</td><td>2</td><td>0</td>" in page
    assert "<td>gemm_relu</td><td>2</td>" in page
    assert page.count("why: fastest of 2 verified candidates") == 1  # Relu
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        ElementTree.fromstring(svg)  # every chart is well-formed SVG


def test_format_time():
    assert [format_time(t) for t in (2.0, 0.0015, 3e-6, 5e-9, None)] == \
        ["2 s", "1.5 ms", "3 us", "5 ns", "-"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_only_on_a_terminal():
    pipe = io.StringIO()
    with progress_bar(True, stream=pipe) as on_progress:
        on_progress(0, 2, "Conv")
    assert pipe.getvalue() == "" and not wants_progress(True, pipe)
    assert not wants_progress(False, Terminal())
    terminal = Terminal()
    with progress_bar(True, description="tuning", stream=terminal) as on_progress:
        for done in range(3):
            on_progress(done, 2, "Conv 1x3x8x8")
    assert "tuning" in terminal.getvalue()


class FallbackAdd(BrokenAdd):
    name = "report_test.fallback_add"

    def prepare(self, workload, consts, config):
        return lambda inputs, outputs: np.add(inputs[0], inputs[1], out=outputs[0])


def test_a_fallback_is_marked(rng):
    _, _, choices = tiny_choices(rng)
    add = next(c for c in choices if c.workload.op == "Add")
    choices.choices[add.workload.key] = dataclasses.replace(
        add, candidate=Candidate(FallbackAdd(), {}))
    report = make_report(choices)
    assert report["totals"]["fallback_nodes"] == 1
    assert [w["op"] for w in report["workloads"] if w["fallback"]] == ["Add"]
    assert render_html(report).count('<span class="fallback">fallback</span>') == 1


def test_a_workload_verified_within_onnxruntimes_error_is_noted(rng):
    """A choice verified within twice onnxruntime's own error (`loosened_tolerance`) carries
    that tolerance into the report, its reason and the summary; the others carry none."""
    _, _, choices = tiny_choices(rng)
    matmul = next(c for c in choices if c.workload.op == "MatMul")
    choices.choices[matmul.workload.key] = dataclasses.replace(matmul, tolerance=7e-4)
    report = make_report(choices)
    assert [w.get("tolerance") for w in report["workloads"]] == [7e-4, None, None]
    assert "verified within 0.0007 relative L2, twice onnxruntime's own error" in \
        reason_text(report["workloads"][0])
    assert "verified within" not in reason_text(report["workloads"][1])
    notes = [line for line in summary_lines(report) if line.startswith("note:")]
    assert len(notes) == 1 and "1 workload verified within twice onnxruntime's own " \
        "error" in notes[0] and matmul.workload.label in notes[0]
    assert not [line for line in summary_lines(make_report(tiny_choices(rng)[2]))
                if "onnxruntime's own error" in line]


class TiledMatMul(Implementation):
    """A MatMul whose algorithm is a knob of its config (as Winograd's tile is); registered
    (reports find implementations by name) under the tests' own target."""

    name = "report_test.tiled_matmul"
    target = TEST_TARGET

    def unsupported_reason(self, workload):
        return None if workload.op == "MatMul" else "MatMul only"

    def algorithm(self, workload, config):
        return f"tiled m={config.get('tile', 2)}"

    def prepare(self, workload, consts, config):
        return lambda inputs, outputs: np.matmul(inputs[0], inputs[1], out=outputs[0])


def test_every_workload_shows_its_algorithm_and_gflops(rng):
    if TiledMatMul.name not in registry._REGISTRY:
        registry.register(TiledMatMul())
    _, _, choices = tiny_choices(rng, extra=[registry.get(TiledMatMul.name)])
    report = make_report(choices)
    by_op = {w["op"]: w for w in report["workloads"]}
    matmul = by_op["MatMul"]                          # x[2, 8] @ w[8, 5]
    assert matmul["flops"] == 2 * 2 * 5 * 8
    assert matmul["gflops"] == pytest.approx(matmul["flops"] / matmul["median_s"] / 1e9)
    algorithms = {c["impl"]: c["algorithm"] for c in matmul["candidates"]}
    assert algorithms == {"planfile_test.matmul": "planfile_test.matmul",   # the default
                          "report_test.tiled_matmul": "tiled m=2"}
    assert matmul["algorithm"] == algorithms[matmul["chosen_impl"]]
    assert by_op["Relu"]["flops"] is None and by_op["Relu"]["gflops"] is None
    console = Console(file=io.StringIO(), width=220, color_system=None)
    console.print(render_table(report))
    text = console.file.getvalue()
    assert "algorithm" in text and "GFLOP/s" in text
    matmul_row = next(line for line in text.splitlines() if line.lstrip().startswith("MatMul"))
    assert matmul["algorithm"] in matmul_row and f"{matmul['gflops']:.3g}" in matmul_row
    relu_row = next(line for line in text.splitlines() if line.lstrip().startswith("Relu"))
    assert " - " in relu_row                          # no FLOP count: '-'
    page = render_html(report)
    assert '<th data-name="algorithm">algorithm</th>' in page
    assert '<th data-name="gflops">GFLOP/s</th>' in page
    assert f"<td>{matmul['algorithm']}</td>" in page
    assert "tiled m=2" in page                        # the candidate's bar note


def test_a_report_without_algorithms_or_flops_renders_dashes(report):
    old = json.loads(json.dumps(report))
    for workload in old["workloads"]:
        for field in ("algorithm", "flops", "gflops"):
            workload.pop(field)
    console = Console(file=io.StringIO(), width=220, color_system=None)
    console.print(render_table(old))
    matmul_row = next(line for line in console.file.getvalue().splitlines()
                      if line.lstrip().startswith("MatMul"))
    assert matmul_row.count(" - ") >= 2               # algorithm and GFLOP/s unknown
    assert "(-, algorithm -)" not in render_html(old) and "algorithm -)" in render_html(old)
