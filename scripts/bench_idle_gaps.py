"""Benchmark (not a test): a run's latency after the process sat idle, wpk against onnxruntime.

A benchmark loop runs back to back; a service waits between requests. On a VM a core that
idles is slow to come back (its vCPU is descheduled), so a run that follows a gap can cost
more than one that follows a run, and how much depends on what the engine's threads do in
the gap: onnxruntime's intra-op threads spin for tens of milliseconds after a run at its
default options; wpk's OpenMP threads spin as long where the plan runs only generated
kernels, and briefly before they sleep where an onnxruntime step or BLAS shares the cores
(`GOMP_SPINCOUNT`, `wpk.runtime.openmp_spin_count`).

For each gap (seconds of `time.sleep` before every timed run) each engine runs `--runs`
times after `--warmup` untimed runs; the median and the fastest are kept. Each engine
runs in a process of its own (one engine's threads spinning after its runs would slow the
other's), wpk once under its own OpenMP policy and once per `--spin` count given (the
user's `GOMP_SPINCOUNT`, libgomp reads it once per process; 30000 is the brief spin).

    python scripts/bench_idle_gaps.py --model mobilenet_v2_like [--plan P.wpk]
        [--gaps 0,0.005,0.02,0.05,0.2,0.5] [--spin 3000000] [--json F]

Without `--plan` the model is built untuned (`--search none`). The models are those of
`tests/models.py`, by name.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]   # tests.models, kernel_timing
GAPS = (0.0, 0.005, 0.02, 0.05, 0.2, 0.5)


def time_after_gaps(run, gaps: list[float], runs: int, warmup: int) -> list[dict]:
    """Median and fastest ms of `run()` after each gap of idle seconds."""
    for _ in range(warmup):
        run()
    rows = []
    for gap in gaps:
        times = []
        for _ in range(runs):
            if gap:
                time.sleep(gap)
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        rows.append({"gap_ms": gap * 1e3, "median_ms": statistics.median(times) * 1e3,
                     "min_ms": min(times) * 1e3})
    return rows


def child(args) -> None:
    """One engine in this process; prints its rows as JSON."""
    from tests import models

    model = models.load_model(args.model)
    feeds = models.random_inputs(model, seed=0)
    if args.engine == "wpk":
        import wpk

        session = wpk.load(args.plan)

        def run():
            return session.run(feeds)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])

        def run():
            return session.run(None, feeds)
    gaps = [float(g) for g in args.gaps.split(",")]
    print(json.dumps(time_after_gaps(run, gaps, args.runs, args.warmup)))


def child_env(base_env: dict, spin: int | None) -> dict:
    """A child's environment: `base_env` (the user's, taken before a build in this process
    set wpk's OpenMP policy here), with `GOMP_SPINCOUNT` = spin where given."""
    env = dict(base_env)
    if spin is not None:
        env.update(OMP_WAIT_POLICY="passive", GOMP_SPINCOUNT=str(spin))
    return env


def measure(args, engine: str, spin: int | None, base_env: dict) -> list[dict]:
    """`child` in a fresh process (`child_env`)."""
    env = child_env(base_env, spin)
    command = [sys.executable, __file__, "--child", "--engine", engine, "--model", args.model,
               "--plan", args.plan, "--gaps", args.gaps, "--runs", str(args.runs),
               "--warmup", str(args.warmup), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_plan(model_name: str, path: str) -> None:
    import wpk
    from tests import models

    wpk.build(models.load_model(model_name), target="cpu", progress=False,
              search="none").save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v2_like")
    parser.add_argument("--plan", default=None, help="a plan of the model (default: built "
                                                     "untuned into a temporary folder)")
    parser.add_argument("--gaps", default=",".join(str(g) for g in GAPS),
                        help="idle seconds before each timed run, comma-separated")
    parser.add_argument("--spin", type=int, action="append", default=[],
                        help="also time wpk under this GOMP_SPINCOUNT (repeatable)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="onnxruntime's intra-op threads")
    parser.add_argument("--rounds", type=int, default=2,
                        help="each engine's process this many times, alternating")
    parser.add_argument("--json", default=None, help="write the rows and the machine here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="wpk", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    base_env = dict(os.environ)   # before a build sets wpk's OpenMP policy in this process
    with tempfile.TemporaryDirectory() as folder:
        if args.plan is None:
            args.plan = os.path.join(folder, f"{args.model}.wpk")
            build_plan(args.model, args.plan)
        variants = [("onnxruntime", "ort", None), ("wpk (its policy for the plan)", "wpk", None)]
        variants += [(f"wpk, GOMP_SPINCOUNT={s}", "wpk", s) for s in args.spin]
        results = {label: [] for label, _, _ in variants}
        for _ in range(args.rounds):
            for label, engine, spin in variants:
                results[label].append(measure(args, engine, spin, base_env))
    gaps = [row["gap_ms"] for row in next(iter(results.values()))[0]]
    print(f"{args.model}: median ms of a run after an idle gap (each process's median, "
          f"{args.rounds} processes an engine)")
    print("| engine | " + " | ".join(f"{g:g} ms" for g in gaps) + " |")
    print("| --- |" + " ---: |" * len(gaps))
    for label, rounds in results.items():
        cells = [" / ".join(f"{r[i]['median_ms']:.2f}" for r in rounds) for i in range(len(gaps))]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        from kernel_timing import machine_fields

        Path(args.json).write_text(json.dumps({
            "benchmark": "idle-gaps", "model": args.model, "runs": args.runs,
            "warmup": args.warmup, "threads": args.threads, "rounds": args.rounds,
            "command": " ".join(sys.argv[1:]), **machine_fields(), "results": results},
            indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
