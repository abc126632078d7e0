"""`wpk run`: warm-up and timed runs summarized like trtexec, and `--profile` writing a
trace of one run of a real plan (onnxruntime regions included)."""

from __future__ import annotations

import json
import re

import onnx
import pytest

import wpk
from tests.models import tiny_conv_gemm
from tests.trace_format import check_trace
from wpk.cli import main
from wpk.commands.run import latency_summary, percentile
from wpk.plans.planfile import read_plan


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model = folder / "tiny.onnx"
    onnx.save(tiny_conv_gemm(), str(model))
    path = folder / "tiny.wpk"
    wpk.build(str(model), target="cpu", output=str(path), progress=False, partition=False,
              warmup=1, repeats=3, min_time=0.0)
    return path


def test_percentiles_are_measured_times_by_nearest_rank():
    times = [float(t) for t in range(1, 101)]          # 1 .. 100
    assert [percentile(times, p) for p in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0
    summary = latency_summary([0.004, 0.001, 0.002, 0.003])
    assert summary["min"] == 0.001 and summary["max"] == 0.004 and summary["p50"] == 0.002
    assert summary["mean"] == pytest.approx(0.0025)
    assert summary["throughput"] == pytest.approx(4 / 0.01)


def test_run_prints_percentiles_and_writes_a_trace(plan_path, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["run", str(plan_path), "--repeat", "20", "--warmup", "2",
                 "--profile", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "latency over 20 run(s) after 2 warm-up run(s), in ms:" in out
    values = {k: float(v) for k, v in re.findall(r"(min|mean|median|max|p\d\d) ([\d.]+)", out)}
    assert values["min"] <= values["p50"] <= values["p90"] <= values["p99"] <= values["max"]
    assert re.search(r"throughput [\d.]+ runs/s", out)
    document = json.loads(trace.read_text())
    assert check_trace(document) == []
    slices = [e for e in document["traceEvents"]
              if e["ph"] == "X" and e["name"] != "run" and e["cat"] == "wpk"]   # the calls
    nodes = [m["node"] for s in slices for m in s["args"].get("members", [s["args"]])]
    steps = read_plan(str(plan_path)).steps
    assert nodes == [step.node for step in steps]
    slowest = re.findall(r"^ +([\d.]+) ms +([\d.]+)%  (\S+) (\S+) ", out, re.M)
    assert 1 <= len(slowest) <= 5 and "slowest steps of the profiled run (" in out
    assert [float(ms) for ms, *_ in slowest] == sorted((float(ms) for ms, *_ in slowest),
                                                      reverse=True)
    assert all(node in {step.node for step in steps} or op == "onnxruntime"
               for _, _, op, node in slowest)
    # several steps in one call: an onnxruntime region or a chain of generated kernels
    # (which of them the measured plan has depends on the timings)
    calls = [s for s in slices if "members" in s["args"]]
    assert all(s["name"].startswith(("onnxruntime region", "generated kernels"))
               for s in calls)


def test_run_help_states_the_defaults(capsys):
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--repeat INTEGER RANGE Timed runs" in text and "[default: 100" in text
    assert "[default: 10;" in text or "[default: 10]" in text
    assert "p50/p90/p95/p99" in text and "--profile" in text
