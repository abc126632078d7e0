#!/usr/bin/env python
"""Distributed tuning benchmark: trials per minute and best time found against wall time
with 1, 2 and 3 nodes of a local Ray cluster (issue 15).

    python scripts/bench_cluster.py                               # --budget 45, nodes 1,2,3
    python scripts/bench_cluster.py --budget 90 --nodes 1,2,3 --simulate 1,2,3,4,8

Two parts, both written to benchmarks/results/cluster-<date>-<host>.json:

1. Functional: for each N, `wpk build` of a one-convolution model with a seeded
   random search within `--budget` seconds on `--cluster local:N` (N nodes on
   this machine, each measuring one candidate at a time), with a fresh compile
   cache and records file (the search may end sooner, when the best stops
   improving). Reported: trials, trials per minute of search, the best time found
   against the search's wall time, and which node measured what. The nodes of
   a local cluster share this machine's cores, so these figures show that the
   cluster works (every node measures, every record arrives), not what N
   machines gain.
2. Simulated: N independent hosts replaying the 1-node run. Each trial takes
   what it took there (the time between its record and the one before:
   compile and measurement on one node), trials go to the first free host in
   the order the tuner proposed them, in batches of whole rounds of N hosts
   (`TuneOptions.batch_for`, as a cluster build asks for), and the best time
   found at a moment is the best median among the trials done by then
   (reported at a quarter and half of the one-node search time T). Random
   search proposes the same configs whatever the batch size, so this is the
   search N hosts would run, with one host's measured costs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from scripts.bench_e2e import machine_description  # noqa: E402
from wpk.search.driver import TuneOptions  # noqa: E402
from wpk.search.records import SEARCH, read_records  # noqa: E402

GENERATED = "dsl.cpu"
CONV = {"channels": 32, "size": 28, "filters": 32}


def conv_model(channels: int, size: int, filters: int, seed: int = 0) -> onnx.ModelProto:
    """One 3x3 convolution (padding 1) on a 1 x channels x size x size image."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((filters, channels, 3, 3)) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "bench_cluster_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, filters, size, size])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build_on_cluster(model: Path, nodes: int, budget: float, folder: Path) -> dict:
    """`wpk build --cluster local:N` within `budget` seconds; its records and wall time."""
    db = folder / f"nodes-{nodes}.jsonl"
    command = [sys.executable, "-m", "wpk.cli", "build", str(model), "--cpu", "--search",
               "random", "--budget", str(budget), "--db", str(db), "--no-partition", "-q",
               "-o", str(folder / f"nodes-{nodes}.wpk"), "--cluster", f"local:{nodes}"]
    env = dict(os.environ, WPK_CACHE_DIR=str(folder / f"cache-{nodes}"))  # compile afresh
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget * 4 + 300,
                          env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_cluster: the {nodes}-node build failed:\n{done.stderr}")
    return {"nodes": nodes, "wall_s": wall, "records": list(read_records(db)),
            "stderr": done.stderr.strip().splitlines()}


def search_trials(records: list) -> tuple[float, list[tuple[float, float | None]]]:
    """(when the search started, [(seconds since then, median or None) per trial]) of the
    generated kernel's search records, in commit order; the search starts at the record
    before its first trial (the end of the planner's first pass)."""
    first = next(i for i, r in enumerate(records) if r.impl == GENERATED and r.phase == SEARCH)
    start = records[first - 1].timestamp if first else records[0].timestamp
    trials = [(r.timestamp - start, r.median_s if r.ok else None)
              for r in records[first:] if r.impl == GENERATED and r.phase == SEARCH]
    return start, trials


def best_over_time(trials: list[tuple[float, float | None]]) -> list[list[float]]:
    """[seconds, best median so far] at every trial that improved the best."""
    points, best = [], float("inf")
    for at, median in sorted(trials, key=lambda trial: trial[0]):
        if median is not None and median < best:
            best = median
            points.append([round(at, 3), median])
    return points


def functional_row(run: dict) -> dict:
    """Trials, trials per minute, best found against time and nodes of one build."""
    _, trials = search_trials(run["records"])
    span = max(at for at, _ in trials)
    found = [m for _, m in trials if m is not None]
    return {"nodes": run["nodes"], "wall_s": round(run["wall_s"], 2),
            "search_s": round(span, 2), "trials": len(trials),
            "trials_per_min": round(60 * len(trials) / span, 1),
            "best_s": min(found) if found else None,
            "best_over_time": best_over_time(trials),
            "measured_by": dict(Counter(r.extra.get("node", "?") for r in run["records"])),
            "cluster_lines": [line for line in run["stderr"]
                              if line.startswith(("cluster:", "warning: cluster:"))]}


def trial_costs(records: list) -> list[tuple[float, float | None]]:
    """(seconds the trial took on one node, its median or None) in the tuner's order."""
    _, trials = search_trials(records)
    costs, previous = [], 0.0
    for at, median in trials:
        costs.append((at - previous, median))
        previous = at
    return costs


def replay(costs: list[tuple[float, float | None]], hosts: int) -> list[tuple[float, float | None]]:
    """(finish time, median) of every trial on `hosts` independent hosts: batches of whole
    rounds of hosts, each trial to the first free host, a batch ends with its last trial."""
    batch = TuneOptions("random").batch_for(hosts)
    done, clock = [], 0.0
    for first in range(0, len(costs), batch):
        free = [clock] * hosts
        for cost, median in costs[first:first + batch]:
            host = min(range(hosts), key=free.__getitem__)
            free[host] += cost
            done.append((free[host], median))
        clock = max(free)
    return done


def best_by(done: list[tuple[float, float | None]], seconds: float) -> float | None:
    """The best median among the trials done by `seconds`."""
    found = [m for at, m in done if at <= seconds and m is not None]
    return min(found) if found else None


def simulated_row(costs: list[tuple[float, float | None]], hosts: int, target: float,
                  span: float) -> dict:
    """What `hosts` hosts replaying the one-node trials achieve: wall time, trials per
    minute, trials done and best found by a quarter and half of the one-node search time
    `span`, when they reach the one-node run's best, the best found against time."""
    done = replay(costs, hosts)
    end = max(at for at, _ in done)
    reach = min((at for at, m in done if m is not None and m <= target), default=None)
    return {"hosts": hosts, "search_s": round(end, 2),
            "trials_per_min": round(60 * len(done) / end, 1),
            "trials_by_half": sum(1 for at, _ in done if at <= span / 2),
            "best_by_quarter_s": best_by(done, span / 4),
            "best_by_half_s": best_by(done, span / 2),
            "reach_best_s": None if reach is None else round(reach, 2),
            "best_over_time": best_over_time(done)}


def markdown(functional: list[dict], simulated: list[dict]) -> str:
    """The two tables of the README."""
    rows = ["| local nodes (shared 2 cores) | build wall s | search s | trials | trials/min "
            "| best found | measured by |", "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in functional:
        nodes = ", ".join(f"{n.split('/')[-1][:6]}: {c}" for n, c in r["measured_by"].items())
        rows.append(f"| {r['nodes']} | {r['wall_s']:.1f} | {r['search_s']:.1f} | {r['trials']} "
                    f"| {r['trials_per_min']:.1f} | {_us(r['best_s'])} | {nodes} |")
    rows += ["", "| simulated hosts | search s | trials/min | trials by T/2 | best by T/4 "
             "| best by T/2 | reaches 1-host best at s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in simulated:
        reach = "-" if r["reach_best_s"] is None else f"{r['reach_best_s']:.1f}"
        rows.append(f"| {r['hosts']} | {r['search_s']:.1f} | {r['trials_per_min']:.1f} "
                    f"| {r['trials_by_half']} | {_us(r['best_by_quarter_s'])} "
                    f"| {_us(r['best_by_half_s'])} | {reach} |")
    return "\n".join(rows)


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f} us"


def counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        parser.error(f"expected positive integers joined by commas, not '{text}'")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=45.0, help="seconds per build")
    parser.add_argument("--nodes", default="1,2,3", help="local cluster sizes to build on")
    parser.add_argument("--simulate", default="1,2,3,4,8", help="host counts to simulate")
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/"
                                                 "cluster-<date>-<host>.json)")
    args = parser.parse_args(argv)
    nodes, hosts = counts(parser, args.nodes), counts(parser, args.simulate)
    if 1 not in nodes:
        parser.error("--nodes must include 1: the simulation replays the 1-node run")
    load_at_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        folder = Path(tmp)
        model = folder / "conv.onnx"
        onnx.save(conv_model(**CONV), str(model))
        runs = {n: build_on_cluster(model, n, args.budget, folder) for n in nodes}
    functional = [functional_row(runs[n]) for n in nodes]
    costs = trial_costs(runs[1]["records"])
    target = min(m for _, m in costs if m is not None)
    span = sum(cost for cost, _ in costs)   # T: the one-node search time
    simulated = [simulated_row(costs, h, target, span) for h in hosts]
    machine = machine_description()
    machine["load_average_at_start"] = load_at_start
    machine["load_average_at_end"] = list(os.getloadavg())
    report = {"date": datetime.date.today().isoformat(), "machine": machine,
              "command": "python scripts/bench_cluster.py " + " ".join(argv or sys.argv[1:]),
              "model": {"op": "Conv", "kernel": "3x3", **CONV}, "search": "random",
              "budget_s": args.budget, "functional": functional,
              "simulated": {"source": "the 1-node run's trials and their costs",
                            "one_host_search_s": span, "one_host_best_s": target,
                            "rows": simulated}}
    out = args.out or (REPO / "benchmarks" / "results" /
                       f"cluster-{report['date']}-{socket.gethostname()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(functional, simulated))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
