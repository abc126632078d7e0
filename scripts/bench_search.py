"""Schedule search benchmark: GA, RL (PPO) and random search on ResNet-50 convolutions.

Not a test. For three ResNet-50 convolution workloads on the CPU (one thread),
each tuner searches the DSL conv template's knob space with the same trial budget
under several seeds; a trial compiles a config with `build_cpu`, checks its output
against onnxruntime and times it (warm-up, then the median of repeats; a config
slower than `SLOW_FACTOR` x the onnxruntime time is timed once). The reference time
is onnxruntime's single-node Conv (one intra-op thread) measured in the same run.

A config is compiled and measured once per workload per run and the result is
shared by every tuner and seed (compilations are also cached on disk by the DSL):
the tuners then search the same (noisy) function, and seeds cost little.

Writes `benchmarks/results/search_cpu.json`, `search_cpu.md` (table) and
`search_cpu.png` (best time found versus trials, mean over seeds).

    python scripts/bench_search.py            # 60 trials, 5 seeds (about 20 minutes)
    python scripts/bench_search.py --quick    # 24 trials, 2 seeds, 1 workload
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before any OpenMP runtime loads

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from wpk.dsl.compute import (
    infer_bindings,  # noqa: E402
    specialize,
)
from wpk.kernels.dsl_library import load_operator  # noqa: E402
from wpk.kernels.templates import build_cpu, template_for
from wpk.search.cost_model import CostModelFilter  # noqa: E402
from wpk.search.space import SearchSpace  # noqa: E402
from wpk.search.tuners import make_tuner  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
# (label, C, H=W, K, kernel, pad): ResNet-50 convolutions (batch 1, stride 1).
WORKLOADS = [
    ("res2_3x3_64x56", 64, 56, 64, 3, 1),
    ("res3_1x1_128to512x28", 128, 28, 512, 1, 0),
    ("res4_3x3_256x14", 256, 14, 256, 3, 1),
]
TUNERS = ("ga", "rl", "random")
BATCH = 8
REPEATS = 5
SLOW_FACTOR = 8.0
TOLERANCE = 1e-4


class ConvWorkload:
    """One convolution: DSL operator + bindings, its search space, inputs and ORT time."""

    def __init__(self, label, c, hw, k, r, pad, rng):
        self.label = label
        self.op = load_operator("conv2d")
        self.x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        self.w = rng.standard_normal((k, c, r, r)).astype(np.float32)
        pads = {"pad_t": pad, "pad_l": pad, "pad_b": pad, "pad_r": pad}
        self.bindings = infer_bindings(self.op, {"X": self.x, "Wt": self.w}, pads)
        template = template_for(specialize(self.op, self.bindings), "cpu")
        self.space = SearchSpace.from_template(template, name=label)
        self.session = _ort_conv(self.x.shape, self.w, pad)
        self.expected = self.session.run(None, {"X": self.x})[0]
        self.reference_s = _median_time(lambda: self.session.run(None, {"X": self.x}), 20)
        self.memo: dict[tuple, float | None] = {}
        self.compile_s = 0.0
        self.measure_s = 0.0

    def key(self, config) -> tuple:
        return tuple(config[n] for n in self.space.names)

    def measure_batch(self, configs) -> list[float | None]:
        """Seconds per config (None: failed or wrong); compiles the new ones in parallel."""
        new = [c for c in configs if self.key(c) not in self.memo]
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            kernels = list(pool.map(self._build, new))
        self.compile_s += time.perf_counter() - start
        start = time.perf_counter()
        for config, kernel in zip(new, kernels):
            self.memo[self.key(config)] = self._time(kernel)
        self.measure_s += time.perf_counter() - start
        return [self.memo[self.key(c)] for c in configs]

    def _build(self, config):
        try:
            return build_cpu(self.op, self.bindings, config)
        except Exception as exc:  # noqa: BLE001 - a failed candidate costs one trial
            return exc

    def _time(self, kernel) -> float | None:
        if isinstance(kernel, Exception):
            return None
        out = {"Y": np.full(self.expected.shape, np.nan, np.float32)}
        start = time.perf_counter()
        kernel(self.x, self.w, out=out)
        first = time.perf_counter() - start
        err = np.linalg.norm(out["Y"] - self.expected) / np.linalg.norm(self.expected)
        if not err <= TOLERANCE:
            return None
        if first > SLOW_FACTOR * self.reference_s:
            return first
        return _median_time(lambda: kernel(self.x, self.w, out=out), REPEATS)


def _ort_conv(x_shape, weight, pad):
    k, c, r, s = weight.shape
    node = helper.make_node("Conv", ["X", "W"], ["Y"], pads=[pad] * 4, kernel_shape=[r, s])
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_search(workload: ConvWorkload, tuner_name: str, seed: int, trials: int,
               filters: dict | None = None) -> list[float]:
    """Best seconds found after each trial (inf until the first success). A name ending
    in '+cm' wraps the tuner in the cost-model filter (its report goes to `filters`)."""
    base_name = tuner_name.removesuffix("+cm")
    options = {"reference_time": workload.reference_s} if base_name == "rl" else {}
    tuner = make_tuner(base_name, workload.space, seed, **options)
    if tuner_name.endswith("+cm"):
        tuner = CostModelFilter(tuner, pool_factor=4)
    curve: list[float] = []
    best = math.inf
    while tuner.has_next() and len(curve) < trials:
        configs = tuner.next_batch(min(BATCH, trials - len(curve)))
        if not configs:
            break
        costs = workload.measure_batch(configs)
        tuner.update(configs, costs)
        for cost in costs:
            if cost is not None:
                best = min(best, cost)
            curve.append(best)
    if filters is not None and isinstance(tuner, CostModelFilter):
        report = tuner.report()
        filters.setdefault(tuner_name, []).append(
            {"proposed": report.proposed, "measured": report.measured,
             "skipped": report.skipped})
    return curve


def trials_to_reach(curve: list[float], target: float) -> int | None:
    """First trial (1-based) whose best-so-far is at most `target`."""
    return next((i + 1 for i, v in enumerate(curve) if v <= target), None)


def summarise(label, reference_s, curves: dict[str, list[list[float]]], trials: int) -> dict:
    """Per tuner: mean best-so-far curve, final bests, and trials to reach random's final."""
    random_final = statistics.median(c[-1] for c in curves["random"])
    out = {"reference_s": reference_s, "random_final_median_s": random_final, "tuners": {}}
    for name, runs in curves.items():
        padded = [c + [c[-1]] * (trials - len(c)) for c in runs]
        reach = [trials_to_reach(c, random_final) for c in padded]
        reached = [r for r in reach if r is not None]
        out["tuners"][name] = {
            "mean_curve_s": [statistics.fmean(col) for col in zip(*padded)],
            "curves_s": padded,
            "final_s": [c[-1] for c in padded],
            "trials_to_random_final": reach,
            "median_trials_to_random_final":
                statistics.median(r if r is not None else trials + 1 for r in reach),
            "seeds_reaching": len(reached),
        }
    return out


def write_outputs(results: dict, trials: int, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search_cpu.json").write_text(json.dumps(results, indent=1))
    checkpoints = sorted({t for t in (8, 16, 24, 30, 40, 48, 60, trials) if t <= trials})
    lines = [f"Best time found (ms, mean over {results['seeds']} seeds) vs trials; "
             "onnxruntime Conv (1 thread) as reference. `reach` = median trials to reach "
             "random search's final best (median over seeds), seeds that got there.", ""]
    head = "| workload | tuner | " + " | ".join(f"@{t}" for t in checkpoints) + \
        " | vs ORT | reach |"
    lines += [head, "|" + "---|" * (len(checkpoints) + 4)]
    for label, res in results["workloads"].items():
        for name, tun in res["tuners"].items():
            curve = tun["mean_curve_s"]
            cells = " | ".join(f"{curve[t - 1] * 1e3:.2f}" for t in checkpoints)
            speedup = res["reference_s"] / curve[-1]
            lines.append(f"| {label} (ORT {res['reference_s'] * 1e3:.2f} ms) | {name} | {cells} | "
                         f"{speedup:.2f}x | {tun['median_trials_to_random_final']:g} "
                         f"({tun['seeds_reaching']}/{len(tun['final_s'])}) |")
    table = "\n".join(lines) + "\n"
    (out_dir / "search_cpu.md").write_text(table)
    print(table)
    _plot(results, trials, out_dir / "search_cpu.png")


def _plot(results: dict, trials: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, label in zip(axes[0], names):
        res = results["workloads"][label]
        for name, tun in res["tuners"].items():
            ax.plot(range(1, trials + 1), [v * 1e3 for v in tun["mean_curve_s"]], label=name)
        ax.axhline(res["reference_s"] * 1e3, color="grey", linestyle="--", label="onnxruntime")
        ax.set_title(label)
        ax.set_xlabel("trials")
        ax.set_ylabel("best time found (ms)")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"Schedule search on the CPU: mean over {results['seeds']} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="24 trials, 2 seeds, 1 workload")
    parser.add_argument("--filter", action="store_true",
                        help="also run GA and RL behind the cost-model filter (ga+cm, rl+cm)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    trials, seeds, workloads = args.trials, args.seeds, WORKLOADS
    tuners = TUNERS + (("ga+cm", "rl+cm") if args.filter else ())
    if args.quick:
        trials, seeds, workloads = 24, 2, WORKLOADS[2:]
    rng = np.random.default_rng(0)
    results = {"trials": trials, "seeds": seeds, "batch": BATCH, "threads": 1,
               "machine": {"cpu": platform.processor() or platform.machine(),
                           "cores": os.cpu_count(), "python": platform.python_version()},
               "workloads": {}}
    started = time.perf_counter()
    for spec in workloads:
        workload = ConvWorkload(*spec, rng)
        print(f"{workload.label}: {workload.space} ORT {workload.reference_s * 1e3:.2f} ms",
              flush=True)
        curves = {name: [] for name in tuners}
        filters: dict[str, list] = {}
        for seed in range(seeds):
            for name in tuners:
                curves[name].append(run_search(workload, name, seed, trials, filters))
                print(f"  {name} seed {seed}: best {curves[name][-1][-1] * 1e3:.2f} ms "
                      f"({len(workload.memo)} configs measured, "
                      f"{time.perf_counter() - started:.0f} s)", flush=True)
        summary = summarise(workload.label, workload.reference_s, curves, trials)
        summary.update(configs_measured=len(workload.memo), compile_s=workload.compile_s,
                       measure_s=workload.measure_s, space_size=workload.space.size,
                       filter_reports=filters)
        results["workloads"][workload.label] = summary
        results["wall_s"] = time.perf_counter() - started
        write_outputs(results, trials, args.out)     # after each workload: partial results


if __name__ == "__main__":
    main()
