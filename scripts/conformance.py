#!/usr/bin/env python
"""ONNX conformance: ONNX's node test cases through `wpk.backend` and through onnxruntime alone.

    python scripts/conformance.py                       # all ~1,900 node cases
    python scripts/conformance.py --filter test_cast --limit 20 --json out.json

Every case (`onnx.backend.test.case.node.collect_testcases`, no download) is
run by both engines and compared with ONNX's own runner check
(`Runner.assert_similar_outputs`, the case's rtol/atol):

- wpk: `wpk.backend.prepare(model)` then `run` on every data set, with the
  build measuring each candidate once (every candidate is still verified
  against its reference before it is chosen);
- onnxruntime: one `InferenceSession` (CPU provider, default options).

A case is skipped (for both engines) only when no tensor plan can take it: a
sequence, optional or map input or output, or a string tensor. Each engine's
failures are grouped by reason (the error type and the first words of its
message). Prints the counts and writes a JSON result (per-case outcomes,
versions, machine) to `benchmarks/results/conformance-<date>-<host>.json`
unless `--json` names another file.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import signal
import socket
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import onnxruntime  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import wpk  # noqa: E402
import wpk.backend as backend  # noqa: E402
from tests.integration import onnx_cases  # noqa: E402

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# The build measures every candidate once: conformance checks answers, not speed.
BUILD_OPTIONS = {"warmup": 0, "repeats": 1, "min_time": 0.0, "partition": False}
_STRUCTURAL = ("sequence type", "optional type", "map type", "sparse_tensor type",
               "unknown type", "string dtype", "non-tensor input")


class CaseTimeout(Exception):
    """A case ran past `--timeout` seconds."""


def skip_reason(model: onnx.ModelProto, data_sets: list) -> str | None:
    """Why neither engine is asked to run the case (a non-tensor or string value), or None."""
    reason = onnx_cases.skip_reason(model, data_sets)
    return reason if reason in _STRUCTURAL else None


_PLANNER_FAILURES = (("no candidate computed the right answer for: ", "no candidate verified"),
                     ("no implementation supports: ", "no candidate"))


def failure_reason(exc: BaseException) -> str:
    """A short, groupable reason: the error type and its message's first words, numbers and
    names taken out; a planner failure by the op it failed on."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    for prefix, short in _PLANNER_FAILURES:
        if text.startswith(prefix):
            ops = sorted({part.split(" at ")[0].strip() for part in
                          re.split(r"; (?=\w+ at ')", text[len(prefix):])})
            return f"{short}: {', '.join(ops)[:80]}"
    if isinstance(exc, AssertionError):
        return "wrong answer" if "Mismatch" in str(exc) or "Not equal" in str(exc) \
            else "wrong answer (" + _generic(text)[:60] + ")"
    return f"{type(exc).__name__}: {_generic(text)[:90]}".rstrip(": ")


def _generic(text: str) -> str:
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", text)
    return re.sub(r"\d+", "N", text)


def _check(outputs, expected, case) -> None:
    Runner.assert_similar_outputs(list(expected), list(outputs), rtol=case.rtol,
                                  atol=case.atol, model_dir=case.name)


def run_wpk(model, data_sets, case) -> None:
    """Every data set through one `wpk.backend` rep; raises on a failure or a mismatch."""
    rep = backend.prepare(model, "CPU", **BUILD_OPTIONS)
    for inputs, expected in data_sets:
        _check(rep.run(inputs), expected, case)


def run_onnxruntime(model, data_sets, case) -> None:
    """Every data set through one onnxruntime session; raises on a failure or a mismatch."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for inputs, expected in data_sets:
        _check(session.run(None, dict(zip(names, inputs))), expected, case)


ENGINES = {"wpk": run_wpk, "onnxruntime": run_onnxruntime}


def _alarm(signum, frame):
    raise CaseTimeout("ran past the case time limit")


def outcome(engine, model, data_sets, case, timeout: float) -> tuple[str, str]:
    """(passed or failed, reason) of one engine on one case, within `timeout` seconds."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                engine(model, data_sets, case)
    except Exception as exc:  # noqa: BLE001 - every failure is counted by its reason
        return FAILED, failure_reason(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return PASSED, ""


def run_cases(cases, timeout: float, progress: bool = True) -> dict:
    """{case name: {engine: [outcome, reason, seconds]}} for every case."""
    results = {}
    for index, case in enumerate(cases):
        model, data_sets = case.load()
        reason = skip_reason(model, data_sets)
        entry = {}
        for name, engine in ENGINES.items():
            start = time.perf_counter()
            if reason is not None:
                entry[name] = [SKIPPED, reason, 0.0]
                continue
            status, why = outcome(engine, model, data_sets, case, timeout)
            entry[name] = [status, why, round(time.perf_counter() - start, 4)]
        results[case.name] = entry
        if progress:
            print(f"[{index + 1}/{len(cases)}] {case.name}: "
                  + ", ".join(f"{n} {o[0]}" + (f" ({o[1]})" if o[0] == FAILED else "")
                              for n, o in entry.items()), file=sys.stderr, flush=True)
    return results


def summarize(results: dict) -> dict:
    """Per engine: the counts, and skips and failures grouped by reason (most common first)."""
    summary = {}
    for engine in ENGINES:
        counts = collections.Counter(r[engine][0] for r in results.values())
        reasons = {kind: collections.Counter(r[engine][1] for r in results.values()
                                             if r[engine][0] == kind)
                   for kind in (FAILED, SKIPPED)}
        summary[engine] = {"cases": len(results), PASSED: counts[PASSED],
                           FAILED: counts[FAILED], SKIPPED: counts[SKIPPED],
                           "failed_by_reason": dict(reasons[FAILED].most_common()),
                           "skipped_by_reason": dict(reasons[SKIPPED].most_common()),
                           "seconds": round(sum(r[engine][2] for r in results.values()), 1)}
    return summary


def format_summary(summary: dict, top: int = 15) -> str:
    lines = []
    for engine, s in summary.items():
        lines.append(f"{engine}: {s[PASSED]} passed, {s[FAILED]} failed, {s[SKIPPED]} skipped "
                     f"of {s['cases']} node cases ({s['seconds']:.0f} s)")
        for kind in ("skipped", "failed"):
            groups = list(s[f"{kind}_by_reason"].items())
            if groups:
                lines.append(f"  {kind} by reason:")
                lines += [f"    {n:5d}  {reason}" for reason, n in groups[:top]]
                if len(groups) > top:
                    rest = sum(n for _, n in groups[top:])
                    lines.append(f"    {rest:5d}  ({len(groups) - top} other reasons)")
    return "\n".join(lines)


def machine() -> dict:
    return {"host": socket.gethostname(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "wpk": wpk.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}


def default_json_path() -> Path:
    date = datetime.date.today().isoformat()
    return REPO / "benchmarks" / "results" / f"conformance-{date}-{socket.gethostname()}.json"


def select(cases, pattern: str | None, limit: int | None):
    chosen = [c for c in cases if pattern is None or re.search(pattern, c.name)]
    return chosen[:limit] if limit else chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", help="only cases whose name matches this regex")
    parser.add_argument("--limit", type=int, help="at most this many cases (after --filter)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds per case and engine (default 120)")
    parser.add_argument("--json", type=Path, help="result file (default under "
                        "benchmarks/results/)")
    parser.add_argument("--quiet", action="store_true", help="no line per case")
    args = parser.parse_args(argv)
    cases = select(onnx_cases.node_cases(), args.filter, args.limit)
    started = time.perf_counter()
    results = run_cases(cases, args.timeout, progress=not args.quiet)
    summary = summarize(results)
    print(format_summary(summary))
    path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"command": "python scripts/conformance.py " + " ".join(argv or sys.argv[1:]),
                "date": datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds"),
                "machine": machine(), "build_options": BUILD_OPTIONS,
                "seconds": round(time.perf_counter() - started, 1),
                "summary": summary, "cases": results}
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
