#!/usr/bin/env python
"""What a searched CPU build finds in each generated family (`dsl.cpu`, `micro.nchwc`).

Builds a 3x3 + 1x1 convolution pair on C channels and an HxH image (both run as
blocked NCHWc convs) with `--search`, then prints for every tuned workload and
family the trials, the search's best and the re-measured time, the
micro-kernel's default config time, and the candidates the planner compared.

    python scripts/bench_search_families.py                       # C=64, H=28, ga, 16 trials
    python scripts/bench_search_families.py --channels 128 --size 14 --trials 32
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import wpk  # noqa: E402
from wpk.kernels.cpu.microkernels.space import conv_geometry, default_config  # noqa: E402
from wpk.search.records import SEARCH, config_key, read_records  # noqa: E402


def conv_pair(channels: int, size: int, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 + Relu, then Conv 1x1, on a 1 x channels x size x size image."""
    rng = np.random.default_rng(seed)

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32),
                                       name)

    c = channels
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])],
        [const("w1", (c, c, 3, 3)), const("b1", (c,)), const("w2", (c, c, 1, 1)),
         const("b2", (c,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _us(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e6:.1f} us"


def default_time(records: list, key: str) -> float | None:
    """The micro-kernel's default config's best search-phase time of workload `key`."""
    mine = [r for r in records if r.workload_key == key and r.impl == "micro.nchwc"]
    if not mine:
        return None
    default = config_key(default_config(conv_geometry(mine[0].to_workload(), nchw_input=True)))
    times = [r.median_s for r in mine
             if r.phase == SEARCH and r.ok and config_key(r.config) == default]
    return min(times) if times else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--search", default="ga")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        model, db = Path(folder) / "convs.onnx", Path(folder) / "records.jsonl"
        onnx.save(conv_pair(args.channels, args.size, args.seed), str(model))
        started = time.perf_counter()
        plan = wpk.build(str(model), target="cpu", db=str(db), search=args.search,
                         trials=args.trials, seed=args.seed, progress=False, partition=False)
        records = list(read_records(db))
    search = plan.report["search"]
    print(f"build {time.perf_counter() - started:.1f} s, {search['measured']} measured")
    print("| family | workload | trials | search best | re-measured | micro default |")
    print("|---|---|---|---|---|---|")
    for t in search["tuned"]:
        default = default_time(records, t["key"]) if t["impl"] == "micro.nchwc" else None
        print(f"| {t['impl']} | {t['label']} | {t['trials']} | {_us(t['best_s'])} | "
              f"{_us(t['final_s'])} | {_us(default)} |")
    for w in plan.report["workloads"]:
        if w["candidates"] and any(c["impl"] == "micro.nchwc" for c in w["candidates"]):
            print(f"\n{w['label']}: chosen {w['chosen']}")
            timed = sorted((c for c in w["candidates"] if c["median_s"]),
                           key=lambda c: c["median_s"])
            for c in timed:
                print(f"  {c['label']:60s} {c['status']:6s} {_us(c['median_s'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
