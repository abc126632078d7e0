#!/usr/bin/env python
"""onnxruntime at its pure defaults (wpk's whole-model step, `ort.model`) against the same
session with the intra-op thread count set to the cores (the end-to-end benchmarks' peer).

Left at its default (0), onnxruntime picks the thread count itself and pins its worker
threads to cores; set explicitly, it does not pin them. This script measures whether that
matters on this machine: both sessions of each model in one process, in blocks, the order
swapping every round (as `bench_e2e.py --block` times wpk and onnxruntime).

    python scripts/bench_ort_threads.py --models light_resnet50,efficientnet_like
    python scripts/bench_ort_threads.py --rounds 16 --block 10 --json out.json

Prints a markdown table (default/set latency ratio per model) and, with --json, writes
every timing and the threads of each session's workers (their CPU affinity).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_e2e as e2e  # noqa: E402
import onnxruntime  # noqa: E402

from wpk.kernels.cpu.ort_node import cpu_threads  # noqa: E402

DEFAULT, SET = "default", "threads set"


def thread_affinities() -> list[str]:
    """The CPU list each thread of this process may run on (Linux)."""
    found = []
    for task in sorted(glob.glob("/proc/self/task/*")):
        with open(f"{task}/status") as handle:
            for line in handle:
                if line.startswith("Cpus_allowed_list"):
                    found.append(line.split(":", 1)[1].strip())
    return found


def sessions(model_bytes: bytes) -> tuple[dict, dict]:
    """({name: session}, {name: the affinities of the threads it added})."""
    made, pinned = {}, {}
    for name, threads in ((DEFAULT, None), (SET, cpu_threads())):
        before = len(thread_affinities())
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        if threads is not None:
            options.intra_op_num_threads = threads
        made[name] = onnxruntime.InferenceSession(model_bytes, options,
                                                  providers=["CPUExecutionProvider"])
        pinned[name] = thread_affinities()[before:]
    return made, pinned


def bench(name: str, rounds: int, block: int) -> dict:
    model, feeds, _ = e2e.load_benchmark_model(name)
    made, workers = sessions(model.SerializeToString())
    calls = [lambda s=session: s.run(None, feeds) for session in made.values()]
    for call in calls:
        for _ in range(3):
            call()
    times = dict(zip(made, e2e.time_swapping(calls, rounds, block)))
    medians = {key: statistics.median(found) for key, found in times.items()}
    return {"model": name, "worker_affinity": workers,
            "default": e2e.summarize(times[DEFAULT]), "threads_set": e2e.summarize(times[SET]),
            "threads": cpu_threads(), "ratio_default_over_set": medians[DEFAULT] / medians[SET]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="light_resnet50,light_squeezenet,efficientnet_like")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = [bench(name, args.rounds, args.block) for name in e2e.model_names(parser,
                                                                               args.models)]
    print("| model | default ms | threads set ms | default/set | default's workers run on |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in results:
        print(f"| {r['model']} | {r['default']['median_ms']:.2f} | "
              f"{r['threads_set']['median_ms']:.2f} | {r['ratio_default_over_set']:.2f} | "
              f"{', '.join(r['worker_affinity'][DEFAULT]) or '-'} |")
    if args.json:
        report = {"benchmark": "ort-threads", "machine": e2e.machine_description(),
                  "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                  "method": f"{args.rounds} rounds, {args.block} runs per session per round "
                            f"(a {e2e.BLOCK_PAUSE_S} s pause and one untimed run first), "
                            "the order swapping every round; medians",
                  "results": results}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
