"""`wpk op`: one operator tuned and benchmarked, every candidate side by side."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from wpk.commands.op import op_command, operator_model, parse_attr
from wpk.core.errors import OptionError


def test_attribute_text_is_parsed():
    assert parse_attr("1,1") == [1, 1]
    assert parse_attr("2") == 2
    assert parse_attr("0.5") == 0.5
    assert parse_attr("0.5,1") == [0.5, 1.0]
    assert parse_attr("SAME_UPPER") == "SAME_UPPER"


def test_bad_shapes_are_an_option_error():
    with pytest.raises(OptionError, match="ONNX rejects"):
        operator_model("MatMul", {"A": (2, 3), "B": (4, 5)}, {})
    with pytest.raises(OptionError, match="give the input shapes"):
        operator_model("Relu", {}, {})


def test_op_report_lists_generated_and_vendor_candidates():
    text = op_command("Conv", {"X": (1, 8, 10, 10), "W": (8, 1, 3, 3)},
                      {"pads": "1,1,1,1", "group": "8"}, search="random", trials=2,
                      as_json=True)
    report = json.loads(text)
    (workload,) = report["workloads"]
    kinds = {c["kind"] for c in workload["candidates"]}
    assert {"generated", "vendor"} <= kinds
    assert report["search"]["tuned"][0]["trials"] == 2
    load = report["machine_load"]   # others' share of the cores while it was measured
    assert 0.0 <= load["others_share"] <= 1.0 and load["cores"] >= 1
    tuned = report["search"]["tuned"][0]
    assert len(tuned["history"]) == 2 and tuned["stopped_text"] == "reached its trial limit (2)"
    console = Console(width=80, record=True)   # a narrow terminal: names wrap, never cut
    console.print(op_command("Relu", {"X": (4, 33)}, {}, search="random", trials=2))
    rendered = console.export_text()
    assert "dsl.cpu[" in rendered and "vs vendor" in rendered   # the config is shown
    assert "\u2026" not in rendered and "(trials)" not in rendered
    words = " ".join(rendered.split())   # the summary wraps where its timings' widths say
    assert "2 trials" in words and "reached its trial limit (2)" in words
    rows = [line[:38] for line in rendered.splitlines()]
    generated = "".join("".join(r.split()) for r in rows[next(
        i for i, r in enumerate(rows) if "dsl.cpu[" in r):])
    # the label is printed whole, wrapped but never cut: name, every knob, the bracket
    # (a second run cannot tell which: its trials may time the other way round)
    label = re.search(r"dsl\.cpu\[[^\]]*\]", generated)
    assert label and set(re.findall(r"(\w+)=\w+", label.group())) == {"parallel", "vector"}
