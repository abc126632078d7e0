"""A plan and onnxruntime through the machine's quiet and contended phases.

On a shared machine (a VM's cores share their hosts with other guests) latency is not
one figure: whole stretches of seconds run slower, for every engine at once. This
script runs a CPU plan and onnxruntime (the original model, its default options,
spinning threads) in alternating blocks for `--seconds`, as `bench_e2e.py --block`
does, each plan run timed per step (`Session.timeline`). onnxruntime gauges the
machine: the rounds where its block ran fastest (the quickest fifth) are the quiet
phase, those where it ran slowest the contended one. It prints both engines' medians
and the wpk/onnxruntime ratio in each phase and overall, and the plan's steps that
lose the most time in the contended phase: where a ratio moves from one run of a
benchmark to the next, and which kernels a busy neighbour hurts most.

    python scripts/machine_phases.py PLAN.wpk MODEL.onnx [--seconds 60] [--block 10]
                                     [--threads N] [--top 12] [--json F]

Not a test: the phases are the machine's, not wpk's; another run meets others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling bench_e2e
from bench_e2e import BLOCK_PAUSE_S, ort_session  # noqa: E402

GONE = "error: {path}: {why} (hint: {hint})"


def plan_run_steps(session, feeds) -> tuple[float, dict[str, float]]:
    """One timed run of the plan: its seconds and each timed unit's (the name of its
    first step: a step, a native chain's step, an onnxruntime region)."""
    start = time.perf_counter()
    calls = session.timeline(feeds)
    total = time.perf_counter() - start
    units = {}
    for call in calls:
        spans = [((step,), begin, end) for step, begin, end in call.step_spans()]
        for steps, begin, end in spans or [(call.steps, call.start_s, call.end_s)]:
            units[f"{steps[0].node} ({steps[0].op} / {steps[0].impl})"] = end - begin
    return total, units


def ort_run(ort, feeds):
    """A function of no arguments: one timed onnxruntime run, as `plan_run_steps` gives."""
    names = [o.name for o in ort.get_outputs()]

    def run() -> tuple[float, dict[str, float]]:
        start = time.perf_counter()
        ort.run(names, feeds)
        return time.perf_counter() - start, {}
    return run


def timed_block(run, block: int) -> list[tuple[float, dict[str, float]]]:
    """`block` runs after a BLOCK_PAUSE_S pause (the other engine's spinning threads go
    back to sleep) and one untimed run."""
    time.sleep(BLOCK_PAUSE_S)
    run()
    return [run() for _ in range(block)]


def rounds_of_blocks(session, ort, feeds, seconds: float, block: int) -> list[dict]:
    """Alternating blocks (the order swapped every round) until `seconds` have passed (two
    rounds at least): per round the medians of both blocks and of each of the plan's units."""
    engines = {"wpk": lambda: plan_run_steps(session, feeds), "onnxruntime": ort_run(ort, feeds)}
    rounds, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds or len(rounds) < 2:
        result = {}
        for engine in list(engines)[::1 if len(rounds) % 2 == 0 else -1]:
            runs = timed_block(engines[engine], block)
            result[engine] = statistics.median(total for total, _ in runs)
            if engine == "wpk":
                result["units"] = {unit: statistics.median(units[unit] for _, units in runs)
                                   for unit in runs[0][1]}
        rounds.append(result)
    return rounds


def phases(rounds: list[dict]) -> dict:
    """The quiet and contended fifths of the rounds (by onnxruntime's block median, at
    least one round each) and all of them: per phase the rounds, both engines' medians,
    the ratio and the plan's unit medians."""
    ordered = sorted(rounds, key=lambda r: r["onnxruntime"])
    fifth = max(1, len(ordered) // 5)
    found = {}
    for phase, members in (("quiet", ordered[:fifth]), ("contended", ordered[-fifth:]),
                           ("all", ordered)):
        wpk = statistics.median(r["wpk"] for r in members)
        ort = statistics.median(r["onnxruntime"] for r in members)
        units = {unit: statistics.median(r["units"][unit] for r in members)
                 for unit in members[0]["units"]}
        found[phase] = {"rounds": len(members), "wpk_s": wpk, "onnxruntime_s": ort,
                        "ratio": wpk / ort, "units_s": units}
    return found


def report(found: dict, top: int) -> str:
    """Each phase's line, then the `top` units that lose the most in the contended one."""
    lines = [f"{'phase':>10} {'rounds':>6} {'wpk ms':>8} {'ort ms':>8} {'wpk/ort':>8}"]
    for phase in ("quiet", "contended", "all"):
        p = found[phase]
        lines.append(f"{phase:>10} {p['rounds']:6d} {p['wpk_s'] * 1e3:8.2f} "
                     f"{p['onnxruntime_s'] * 1e3:8.2f} {p['ratio']:7.2f}x")
    quiet, busy = found["quiet"], found["contended"]
    lines.append(f"contended / quiet: wpk {busy['wpk_s'] / quiet['wpk_s']:.2f}x, onnxruntime "
                 f"{busy['onnxruntime_s'] / quiet['onnxruntime_s']:.2f}x")
    lines.append(f"{'quiet us':>9} {'busy us':>9} {'lost us':>8} {'busy/q':>7}  step")
    units = sorted(quiet["units_s"], key=lambda u: quiet["units_s"][u] - busy["units_s"][u])
    for unit in units[:top]:
        q, b = quiet["units_s"][unit], busy["units_s"][unit]
        lines.append(f"{q * 1e6:9.0f} {b * 1e6:9.0f} {(b - q) * 1e6:+8.0f} "
                     f"{b / q if q else float('nan'):6.2f}x  {unit}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("model", help="the ONNX model the plan was built from")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--block", type=int, default=10, help="timed runs per block")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="onnxruntime's intra-op threads (default: all cores)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", help="write the phases (and every unit's medians) here")
    args = parser.parse_args(argv)
    if min(args.block, args.threads, args.top) < 1 or args.seconds <= 0:
        print("error: --seconds, --block, --threads and --top must be positive (hint: "
              "--seconds 60 --block 10)", file=sys.stderr)
        return 2
    import onnx
    from google.protobuf.message import DecodeError

    from wpk.core.errors import WpkError
    from wpk.runtime import Session, example_feeds

    try:
        session = Session.load(args.plan)
    except (OSError, WpkError) as exc:
        print(GONE.format(path=args.plan, why=str(exc).splitlines()[0],
                          hint="build one with `wpk build MODEL.onnx`"), file=sys.stderr)
        return 2
    try:
        model = onnx.load(args.model)
    except (OSError, DecodeError) as exc:
        print(GONE.format(path=args.model, why=str(exc).splitlines()[0] or "not an ONNX model",
                          hint="pass the ONNX model the plan was built from"), file=sys.stderr)
        return 2
    feeds = example_feeds(session, seed=0)
    try:
        ort = ort_session(model, args.threads, spinning=True)
        ort.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        print(GONE.format(path=args.model, why=str(exc).strip().splitlines()[0],
                          hint="pass the ONNX model the plan was built from"), file=sys.stderr)
        return 2
    found = phases(rounds_of_blocks(session, ort, feeds, args.seconds, args.block))
    print(report(found, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plan": args.plan, "model": args.model, "seconds": args.seconds,
                       "block": args.block, "threads": args.threads, "phases": found}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
