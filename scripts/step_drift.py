"""Each step of a CPU plan alone and inside a run: where per-operator times stop adding up.

The planner times every candidate alone, its weights and inputs hot in the caches; in a
run the steps before it have streamed their own weights through the caches, and a
step's weights may come from memory. This script runs the plan's steps both ways on one
input: alone (`Session.profile`, each step repeated) and inside whole runs
(`Session.timeline`, the medians over `--runs` runs; steps inside a native chain are
timed where they end, an onnxruntime region as one call against its steps' sum), and
prints both totals and the steps that take the most extra time inside a run.

    python scripts/step_drift.py PLAN.wpk [--runs 20] [--top 15] [--json F]

Not a test: one machine's figures; a shared machine adds its own noise to both columns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

GONE = "error: {path}: {why} (hint: build one with `wpk build MODEL.onnx`)"


def alone_and_in_run(session, feeds, runs: int, repeats: int) -> list[dict]:
    """Per timed unit, in execution order: a step, or an onnxruntime region (its call is
    timed whole): nodes, what (op / impl, or the region), alone_s (the median of
    `repeats` calls of each step alone, summed over the unit) and in_run_s (the median
    over `runs` timed runs)."""
    alone = {row["node"]: row for row in session.profile(feeds, repeats=repeats)}
    in_run: dict[tuple[str, ...], list[float]] = {}
    for _ in range(runs):
        for call in session.timeline(feeds):
            spans = [((step,), start, end) for step, start, end in call.step_spans()]
            for steps, start, end in spans or [(call.steps, call.start_s, call.end_s)]:
                in_run.setdefault(tuple(s.node for s in steps), []).append(end - start)
    return [{"nodes": list(nodes), "what": _what([alone[n] for n in nodes]),
             "alone_s": sum(alone[n]["median_s"] for n in nodes),
             "in_run_s": statistics.median(times)} for nodes, times in in_run.items()]


def _what(rows: list[dict]) -> str:
    if len(rows) == 1:
        return f"{rows[0]['op']} / {rows[0]['impl']}"
    return f"a region of {len(rows)} steps ({rows[0]['node']} .. {rows[-1]['node']})"


def table(rows: list[dict], top: int) -> str:
    """Both totals and the `top` units that take the most extra time inside a run."""
    alone = sum(r["alone_s"] for r in rows)
    in_run = sum(r["in_run_s"] for r in rows)
    lines = [f"{sum(len(r['nodes']) for r in rows)} steps in {len(rows)} timed units: alone "
             f"{alone * 1e3:.2f} ms, inside runs {in_run * 1e3:.2f} ms "
             f"({in_run / alone:.2f}x)",
             f"{'node':>10} {'alone us':>9} {'in run us':>9} {'extra us':>9}  what"]
    for r in sorted(rows, key=lambda r: r["alone_s"] - r["in_run_s"])[:top]:
        lines.append(f"{r['nodes'][0]:>10} {r['alone_s'] * 1e6:9.0f} {r['in_run_s'] * 1e6:9.0f} "
                     f"{(r['in_run_s'] - r['alone_s']) * 1e6:+9.0f}  {r['what']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20, help="calls of each step alone")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", help="write every step's row here")
    args = parser.parse_args(argv)
    if min(args.runs, args.repeats, args.top) < 1:
        print("error: --runs, --repeats and --top must be positive (hint: --runs 20)",
              file=sys.stderr)
        return 2
    from wpk.core.errors import WpkError
    from wpk.runtime import Session, example_feeds

    try:
        session = Session.load(args.plan)
    except (OSError, WpkError) as exc:
        print(GONE.format(path=args.plan, why=str(exc).splitlines()[0]), file=sys.stderr)
        return 2
    rows = alone_and_in_run(session, example_feeds(session, seed=0), args.runs, args.repeats)
    print(table(rows, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plan": args.plan, "runs": args.runs, "repeats": args.repeats,
                       "steps": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
