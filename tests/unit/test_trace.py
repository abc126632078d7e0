"""`wpk run --profile`: one timed run as a Trace Event Format document (Perfetto,
chrome://tracing), checked against the format's rules (tests/trace_format.py)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.trace_format import check_trace
from wpk.runtime import CallTiming, Session, example_feeds
from wpk.trace import trace_document

from .plan_helpers import tiny_plan


@pytest.fixture
def session(rng):
    _, plan = tiny_plan(rng)
    return Session(plan)


def test_a_run_becomes_one_slice_per_step_inside_the_run(session):
    feeds = example_feeds(session)
    timings = session.timeline(feeds)
    document = trace_document(session.plan, timings, name="tiny.wpk")
    assert check_trace(document) == []
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    run, steps = slices[0], slices[1:]
    assert run["name"] == "run" and run["args"] == {"calls": 3, "steps": 3}
    assert [s["name"] for s in steps] == ["MatMul", "Relu", "Add"]
    assert steps[0]["args"] == {"node": "mm", "op": "MatMul", "impl": "planfile_test.matmul",
                                "kind": "library", "inputs": ["2x8 float32", "8x5 float32"],
                                "outputs": ["2x5 float32"]}
    starts = [s["ts"] for s in steps]
    assert starts == sorted(starts) and all(s["dur"] > 0 for s in steps)
    names = {e["name"]: e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M"}
    assert names == {"process_name": "wpk plan tiny.wpk", "thread_name": "steps"}
    assert session.run(feeds)["y"].tolist() == session.run(feeds)["y"].tolist()


@pytest.mark.parametrize("impl, name", [("ort", "onnxruntime region (2 steps)"),
                                        ("dsl.cpu", "generated kernels (2 steps)")])
def test_a_region_or_a_chain_is_one_slice_listing_its_members(session, impl, name):
    """A call of two steps: an onnxruntime region when its steps join regions, else a
    native chain of generated kernels (wpk.kernels.cpu.native_chain)."""
    steps = [dataclasses.replace(step, impl=impl) for step in session.plan.steps]
    timings = [CallTiming(tuple(steps[:2]), 10.0, 10.000_5), CallTiming((steps[2],), 10.000_5,
                                                                         10.000_6)]
    document = trace_document(session.plan, timings)
    assert check_trace(document) == []
    region = next(e for e in document["traceEvents"] if e["name"].endswith("(2 steps)"))
    assert region["name"] == name
    assert region["dur"] == pytest.approx(500.0)
    assert [m["node"] for m in region["args"]["members"]] == ["mm", "relu"]
    assert region["args"]["first"] == "mm" and region["args"]["last"] == "relu"


def test_a_chain_timed_step_by_step_nests_a_slice_per_step_inside_its_own(session):
    """A native chain's per-step times (`CallTiming.step_ends_s`) become nested slices,
    each named and described like a single step's, ending where the next begins."""
    steps = [dataclasses.replace(step, impl="dsl.cpu") for step in session.plan.steps]
    timing = CallTiming(tuple(steps), 5.0, 5.000_6, (5.000_1, 5.000_45, 5.000_6))
    document = trace_document(session.plan, [timing])
    assert check_trace(document) == []
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert [s["name"] for s in slices] == ["run", "generated kernels (3 steps)", "MatMul",
                                           "Relu", "Add"]
    chain, members = slices[1], slices[2:]
    assert [m["args"]["node"] for m in members] == ["mm", "relu", "add"]
    assert [m["ts"] for m in members] == pytest.approx([0.0, 100.0, 450.0])
    assert [m["dur"] for m in members] == pytest.approx([100.0, 350.0, 150.0])
    assert sum(m["dur"] for m in members) == pytest.approx(chain["dur"])
    assert CallTiming(tuple(steps), 5.0, 5.000_6).step_spans() == []   # a region's


def test_a_real_chains_trace_has_every_step_nested_inside_it():
    """End to end: a plan on generated kernels runs as one native call whose trace has one
    nested slice per step, in the plan's order, valid for the viewers."""
    from tests import models
    from tests.unit.test_native_chain import _generated_plan

    plan = _generated_plan(models.transformer_encoder())
    chained = Session(plan)
    document = trace_document(plan, chained.timeline(example_feeds(chained)))
    assert check_trace(document) == []
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert slices[1]["name"] == f"generated kernels ({len(plan.steps)} steps)"
    assert [s["args"]["node"] for s in slices[2:]] == [step.node for step in plan.steps]


def test_the_checker_rejects_what_the_format_forbids(session):
    document = trace_document(session.plan, session.timeline(example_feeds(session)))
    broken = {
        "no dur": lambda d: d["traceEvents"][3].pop("dur"),
        "string pid": lambda d: d["traceEvents"][3].update(pid="1"),
        "phase": lambda d: d["traceEvents"][3].update(ph="Q"),
        "overlap": lambda d: d["traceEvents"][5].update(dur=d["traceEvents"][2]["dur"]),
        "nan": lambda d: d["traceEvents"][3].update(ts=float("nan")),
        "metadata": lambda d: d["traceEvents"][0]["args"].pop("name"),
    }
    for what, damage in broken.items():
        bad = copy.deepcopy(document)
        damage(bad)
        assert check_trace(bad), what
