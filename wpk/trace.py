"""A timed run of a plan as a Chrome / Perfetto trace (the Trace Event Format's JSON).

    timings = session.timeline(feeds)                  # wpk.runtime.Session
    document = trace_document(session.plan, timings, name="model.wpk")
    json.dump(document, open("trace.json", "w"))       # open in ui.perfetto.dev or
                                                       # chrome://tracing

The document is the format's JSON Object form: `traceEvents` and
`displayTimeUnit`, with `otherData` saying what ran. Every call of the run is
one complete event (`"ph": "X"`, `ts` and `dur` in microseconds from the
start of the run) on one thread, nested in a slice `run` spanning them all:
a single step's slice is named by its op and carries in `args` its node,
op, implementation, kind and input and output shapes; a call that ran
several steps as one onnxruntime session is one slice, `onnxruntime region
(N steps)`, and one that ran consecutive generated kernels as one native call
`generated kernels (N steps)`, whose `args.members` list each member node the same way.
A native chain times each of its steps as they run inside it, so its slice holds one
nested slice per step (category `wpk.chain_step`), named and described like a single
step's. A plan with a value-dependent tail (`wpk.value_tail`) adds one slice after the
plan's calls, `onnxruntime tail (N nodes)`, for the tail's onnxruntime call (`tail`: its
start and end). Metadata events name the process and the thread. `slowest_steps` lists
the longest steps of a timed run (what `wpk run --profile` prints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wpk.core.version import __version__
from wpk.core.workload import TensorSpec
from wpk.plans.planfile import Plan, Step
from wpk.runtime import CallTiming, step_joins_regions

PID, TID = 1, 1
CATEGORY = "wpk"
CHAIN_STEP = "wpk.chain_step"   # the category of a native chain's nested step slices


def shape_text(spec: TensorSpec | None) -> str:
    """'1x3x224x224 float32' ('' for an absent optional input)."""
    if spec is None:
        return ""
    return "x".join(str(d) for d in spec.shape) + f" {spec.dtype}"


def step_args(plan: Plan, step: Step, workloads: Mapping) -> dict:
    """What a slice says about one plan step: node, op, implementation, kind, shapes."""
    workload = workloads[step.workload_key]
    return {"node": step.node, "op": step.op, "impl": step.impl, "kind": step.kind,
            "inputs": [shape_text(spec) for spec in workload.inputs],
            "outputs": [shape_text(spec) for spec in workload.outputs]}


def call_event(plan: Plan, timing: CallTiming, origin_s: float, workloads: Mapping) -> dict:
    """The complete event of one call (a step, an onnxruntime region or a chain of
    generated kernels)."""
    members = [step_args(plan, step, workloads) for step in timing.steps]
    if len(members) == 1:
        name, args = timing.steps[0].op, members[0]
    else:
        what = "onnxruntime region" if step_joins_regions(timing.steps[0]) else "generated kernels"
        name = f"{what} ({len(members)} steps)"
        args = {"steps": len(members), "first": members[0]["node"],
                "last": members[-1]["node"], "members": members}
    return _slice(name, timing.start_s, timing.end_s, origin_s, args)


def member_events(plan: Plan, timing: CallTiming, origin_s: float,
                  workloads: Mapping) -> list[dict]:
    """The nested slices of a native chain's steps (none for a call that does not time its
    steps)."""
    return [_slice(step.op, start, end, origin_s, step_args(plan, step, workloads),
                   CHAIN_STEP)
            for step, start, end in timing.step_spans()]


def _slice(name: str, start_s: float, end_s: float, origin_s: float, args: dict,
           category: str = CATEGORY) -> dict:
    """A complete event; its ends rounded on the run's time line, so nested slices stay
    inside their parent."""
    ts = _us(start_s - origin_s)
    return {"name": name, "cat": category, "ph": "X", "pid": PID, "tid": TID, "ts": ts,
            "dur": max(0.0, round(_us(end_s - origin_s) - ts, 3)), "args": args}


def slowest_steps(timings: Sequence[CallTiming], count: int = 5) -> list[tuple[str, float]]:
    """The `count` longest parts of a timed run, longest first, as (what, seconds): each
    step of a native chain and each single step named 'op node (impl)', an onnxruntime
    region as a whole."""
    parts = []
    for timing in timings:
        spans = timing.step_spans()
        if not spans and len(timing.steps) == 1:
            spans = [(timing.steps[0], timing.start_s, timing.end_s)]
        if spans:
            parts += [(f"{s.op} {s.node} ({s.impl})", end - start) for s, start, end in spans]
        else:
            parts.append((f"onnxruntime region {timing.steps[0].node}..{timing.steps[-1].node}"
                          f" ({len(timing.steps)} steps)", timing.end_s - timing.start_s))
    return sorted(parts, key=lambda part: -part[1])[:count]


def _us(seconds: float) -> float:
    return round(max(0.0, seconds) * 1e6, 3)


def metadata_events(name: str) -> list[dict]:
    """The process and thread names the viewers show."""
    return [{"name": "process_name", "ph": "M", "pid": PID, "tid": TID,
             "args": {"name": f"wpk plan {name}"}},
            {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID,
             "args": {"name": "steps"}}]


def tail_event(plan: Plan, span: tuple[float, float], origin_s: float) -> dict:
    """The slice of a value-dependent tail's onnxruntime call (`span`: its start and end),
    with the ops it ran from the plan's report."""
    report = plan.report.get("tail") or {}
    nodes = report.get("nodes")
    name = "onnxruntime tail" + (f" ({nodes} nodes)" if nodes else "")
    return _slice(name, span[0], span[1], origin_s, {"nodes": nodes, "ops": report.get("ops"),
                                                     "impl": "onnxruntime"})


def trace_document(plan: Plan, timings: Sequence[CallTiming], name: str = "plan",
                   tail: tuple[float, float] | None = None) -> dict:
    """The trace of one timed run (see the module docstring); `tail`: the start and end of
    a value-dependent tail's call after it."""
    if not timings:
        raise ValueError("a trace needs at least one timed call")
    origin, workloads = timings[0].start_s, plan.workloads
    calls = [call_event(plan, t, origin, workloads) for t in timings]
    if tail is not None:
        calls.append(tail_event(plan, tail, origin))
    run = {"name": "run", "cat": CATEGORY, "ph": "X", "pid": PID, "tid": TID, "ts": 0.0,
           "dur": max(e["ts"] + e["dur"] for e in calls),   # encloses every call exactly
           "args": {"calls": len(calls), "steps": sum(len(t.steps) for t in timings)}}
    members = [e for t in timings for e in member_events(plan, t, origin, workloads)]
    events = [run, *calls, *members]
    return {"traceEvents": metadata_events(name) + events, "displayTimeUnit": "ms",
            "otherData": {"producer": f"wpk {__version__}", "plan": name,
                          "target": plan.target, "clock": "host, time.perf_counter"}}
