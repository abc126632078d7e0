"""A checker of the Trace Event Format (the JSON that chrome://tracing and Perfetto read),
after its specification ("Trace Event Format", the JSON Object Format):

- the document is an object with a `traceEvents` array; `displayTimeUnit` is "ms" or
  "ns"; `otherData` is an object;
- every event is an object with a string `ph` of a known phase, integer `pid` and `tid`,
  and `args`, when present, an object;
- duration events need a `name` and a number `ts`; a complete event ("X") a number
  `dur` >= 0; "B"/"E" pairs match on their thread;
- metadata events ("M") name one of the metadata kinds and carry `args.name` (or
  `args.sort_index`);
- complete events on one thread nest: each starts after the enclosing one starts and
  ends before it ends (viewers draw overlapping ones wrongly);
- the text is strict JSON (no NaN or Infinity).

`check_trace(document)` returns the list of problems (empty when valid).
"""

from __future__ import annotations

import json
import math
from numbers import Real

PHASES = set("BEXiIbneCsftPOND") | {"M", "R", "c", "(", ")", "V", "v"}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name",
            "thread_sort_index"}
EPSILON_US = 1e-6


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def check_event(index: int, event) -> list[str]:
    """The problems of one event."""
    where = f"event {index}"
    if not isinstance(event, dict):
        return [f"{where}: not an object"]
    problems = []
    phase = event.get("ph")
    if phase not in PHASES:
        problems.append(f"{where}: unknown phase {phase!r}")
    for key in ("pid", "tid"):
        if not isinstance(event.get(key), int) or isinstance(event.get(key), bool):
            problems.append(f"{where}: '{key}' is not an integer")
    if "args" in event and not isinstance(event["args"], dict):
        problems.append(f"{where}: 'args' is not an object")
    if phase in ("B", "E", "X", "i", "I"):
        if phase != "E" and not isinstance(event.get("name"), str):
            problems.append(f"{where}: no string 'name'")
        if not _number(event.get("ts")):
            problems.append(f"{where}: 'ts' is not a finite number")
    if phase == "X" and not (_number(event.get("dur")) and event["dur"] >= 0):
        problems.append(f"{where}: complete event without a 'dur' >= 0")
    if phase == "M":
        args = event.get("args") or {}
        if event.get("name") not in METADATA:
            problems.append(f"{where}: unknown metadata {event.get('name')!r}")
        elif event["name"].endswith("_name") and not isinstance(args.get("name"), str):
            problems.append(f"{where}: metadata without a string args.name")
    return problems


def check_nesting(events: list[dict]) -> list[str]:
    """Complete events on each thread nest; B/E events pair up."""
    problems = []
    threads: dict[tuple, list[dict]] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") in ("X", "B", "E"):
            threads.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    for thread, found in threads.items():
        complete = sorted((e for e in found if e["ph"] == "X"),
                          key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for event in complete:
            while stack and event["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPSILON_US:
                stack.pop()
            end = event["ts"] + event["dur"]
            if stack and end > stack[-1]["ts"] + stack[-1]["dur"] + EPSILON_US:
                problems.append(f"thread {thread}: '{event['name']}' overlaps "
                                f"'{stack[-1]['name']}' without nesting in it")
            stack.append(event)
        depth = 0
        for event in sorted((e for e in found if e["ph"] in "BE"), key=lambda e: e["ts"]):
            depth += 1 if event["ph"] == "B" else -1
            if depth < 0:
                problems.append(f"thread {thread}: an 'E' event without its 'B'")
                depth = 0
        if depth:
            problems.append(f"thread {thread}: {depth} 'B' event(s) never end")
    return problems


def check_trace(document) -> list[str]:
    """Every problem of a trace document (see the module docstring)."""
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return [f"not strict JSON: {exc}"]
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["not an object with a 'traceEvents' array"]
    problems = []
    if document.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append("displayTimeUnit is neither 'ms' nor 'ns'")
    if not isinstance(document.get("otherData", {}), dict):
        problems.append("otherData is not an object")
    events = document["traceEvents"]
    for index, event in enumerate(events):
        problems += check_event(index, event)
    return problems + (check_nesting(events) if not problems else [])
