"""Benchmark (not a test): Winograd convs (`micro.winograd`) vs onnxruntime's MLAS NCHWc conv.

ResNet-50's 4 distinct 3x3 stride-1 convolutions (64@56, 128@28, 256@14,
512@7; batch 1, from the ONNX wheel's light_resnet50.onnx) as blocked
`wpk.nchwc` Conv workloads with bias and ReLU fused, for each thread count:

- error: the relative L2 error against the float64 reference of F(2x2,3x3)
  and F(4x4,3x3) (default configs) and of the direct micro-kernel, next to the
  bound Winograd is verified with (`winograd_space.error_bound`);
- time: the best of the two default configs (what an untuned build measures:
  the planner keeps the faster), the best of a small grid of configs (tile size
  m x tiles per round x register tile, `--grid 0` to skip), the direct
  micro-kernel's default, and onnxruntime's `com.microsoft.nchwc` Conv on the
  same blocked buffers (with and without its spinning pool; the better is the
  reference), alternating per round with a 0.2 s pause before each contender,
  the first one rotating; the median over rounds, as GFLOP/s of the direct
  algorithm's flops ("effective": Winograd's can pass the peak), % of the
  measured fp32 FMA peak (`cpu_peak.py`) of the multiplies Winograd's GEMM
  really does, and the ratio to onnxruntime (> 1: wpk is faster).

Goal (issue 10 item 4): >= 1.3x onnxruntime on at least 3 of the 4 convs.

    python scripts/bench_winograd.py [--threads 1,2] [--rounds 7] [--grid 10]
        [--output benchmarks/results/winograd.json] [--markdown]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep (bench_dsl_cpu)
import numpy as np  # noqa: E402
from bench_dsl_cpu import resnet50_convs, timeit  # noqa: E402
from bench_microkernels import nchwc_workload, ort_kernel  # noqa: E402
from cpu_peak import measure_peak  # noqa: E402

GOAL_RATIO, GOAL_COUNT = 1.3, 3
GRID = [{"m": m, "tb": tb} for m in (4, 2) for tb in (16, 32, 64, 128, 512)]


def set_omp_threads(threads: int) -> None:
    """The OpenMP threads of the generated kernels' parallel regions (called from this
    thread), without a new process: libgomp's omp_set_num_threads."""
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    ctypes.CDLL(name).omp_set_num_threads(threads)


def stride1_3x3() -> list:
    """ResNet-50's distinct 3x3 stride-1 convs."""
    return [s for s in resnet50_convs() if s.r == s.s == 3 and s.stride == 1]


def relative_error(kernel, workload, inputs, reference) -> float:
    """The kernel's relative L2 error against `reference` (poisoned output first)."""
    from wpk.core.numerics import relative_l2

    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [out])
    return relative_l2(out, reference)


def candidates(workload, consts, grid: int) -> dict:
    """name -> (config, kernel) of the Winograd defaults, the grid and the direct default."""
    from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC
    from wpk.kernels.cpu.microkernels.space import conv_geometry
    from wpk.kernels.cpu.microkernels.winograd import MICRO_WINOGRAD
    from wpk.kernels.cpu.microkernels.winograd_space import config_reason, default_config

    g = conv_geometry(workload)
    found = {f"wino_m{c['m']}": (c, MICRO_WINOGRAD.prepare(workload, consts, c))
             for c in MICRO_WINOGRAD.configs(workload)}
    for extra in GRID[:grid]:
        config = dict(default_config(g, m=extra["m"]), **extra)
        if config_reason(g, config) is None and config not in [c for c, _ in found.values()]:
            found[f"grid {extra}"] = (config, MICRO_WINOGRAD.prepare(workload, consts, config))
    direct = MICRO_NCHWC.configs(workload)[0]
    found["direct"] = (direct, MICRO_NCHWC.prepare(workload, consts, direct))
    return found


def errors(shape, rng) -> dict:
    """Relative L2 errors vs float64 of both tile sizes and the direct kernel, the bounds."""
    from wpk.kernels.cpu.microkernels.space import conv_geometry
    from wpk.kernels.cpu.microkernels.winograd_space import error_bound
    from wpk.kernels.nchwc_format import host_block_size
    from wpk.kernels.nchwc_reference import nchwc_reference
    from wpk.kernels.random_inputs import random_inputs

    workload = nchwc_workload(shape, host_block_size())
    inputs = random_inputs(workload, rng)
    consts = {1: inputs[1], 2: inputs[2]}
    reference = nchwc_reference(workload, inputs)[0]
    found = candidates(workload, consts, 0)
    g = conv_geometry(workload)
    return {"m2": relative_error(found["wino_m2"][1], workload, inputs, reference),
            "m4": relative_error(found["wino_m4"][1], workload, inputs, reference),
            "direct": relative_error(found["direct"][1], workload, inputs, reference),
            "bound_m2": error_bound(g, 2), "bound_m4": error_bound(g, 4)}


def gemm_flops(shape, config: dict) -> int:
    """Flops of the batched GEMM of F(m, 3) on `shape` (real channels, whole tiles)."""
    m = int(config["m"])
    oh, ow = shape.out_hw
    return 2 * (m + 2) ** 2 * -(-oh // m) * -(-ow // m) * shape.c * shape.k


def bench_shape(shape, threads: int, peak: float, args, rng) -> dict:
    """Time the contenders of one conv on `threads` threads (see the module docstring)."""
    from wpk.kernels.cpu.microkernels.space import conv_geometry
    from wpk.kernels.cpu.microkernels.winograd_space import error_bound
    from wpk.kernels.nchwc_format import host_block_size
    from wpk.kernels.nchwc_reference import nchwc_reference
    from wpk.kernels.random_inputs import random_inputs

    set_omp_threads(threads)
    workload = nchwc_workload(shape, host_block_size())
    inputs = random_inputs(workload, rng)
    consts = {1: inputs[1], 2: inputs[2]}
    reference = nchwc_reference(workload, inputs)[0]
    g = conv_geometry(workload)
    out = np.empty(workload.outputs[0].shape, np.float32)
    found = candidates(workload, consts, args.grid)
    quick = {}
    for name, (config, kernel) in found.items():
        err = relative_error(kernel, workload, inputs, reference)
        limit = error_bound(g, config["m"]) if "m" in config else 1e-5
        if not err <= limit:
            raise SystemExit(f"{shape.label()} {name} {config}: wrong answer "
                             f"(relative L2 {err:.2e} > {limit:.2e})")
        # the fastest of 9 calls picks the grid's best: load only ever slows a call down
        quick[name] = timeit(lambda k=kernel: k(inputs, [out]), 9, min)
    untuned = min(("wino_m2", "wino_m4"), key=quick.get)
    tuned = min((n for n in quick if n != "direct"), key=quick.get)
    x = inputs[0]
    ort_spin = ort_kernel(workload, consts, threads, True)
    ort_passive = ort_kernel(workload, consts, threads, False)
    runs = {"winograd": lambda: found[tuned][1](inputs, [out]),
            "winograd_default": lambda: found[untuned][1](inputs, [out]),
            "direct": lambda: found["direct"][1](inputs, [out]),
            "ort_no_spin": lambda: ort_passive(x, out), "ort": lambda: ort_spin(x, out)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(0.2)   # a spinning pool goes idle before the next contender
            times[name].append(timeit(runs[name], args.repeat))
    med = {k: statistics.median(v) for k, v in times.items()}
    ort_s = min(med["ort"], med["ort_no_spin"])
    return {"label": shape.label(), "threads": threads, "flops": shape.flops,
            "tuned_config": found[tuned][0], "default_config": found[untuned][0],
            "configs_tried": len(found) - 1, "seconds": med,
            "gflops": {k: shape.flops / v / 1e9 for k, v in med.items()},
            "peak_gflops": peak,
            "gemm_percent_of_peak": 100 * gemm_flops(shape, found[tuned][0])
            / med["winograd"] / 1e9 / peak,
            "ratio_to_ort": ort_s / med["winograd"],
            "default_ratio_to_ort": ort_s / med["winograd_default"],
            "direct_ratio_to_ort": ort_s / med["direct"]}


def summarize(rows: list[dict]) -> dict:
    """Per thread count: how many convs are >= GOAL_RATIO x onnxruntime (tuned, default)."""
    summary = {}
    for threads in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == threads]
        met = sum(r["ratio_to_ort"] >= GOAL_RATIO for r in mine)
        met_default = sum(r["default_ratio_to_ort"] >= GOAL_RATIO for r in mine)
        summary[str(threads)] = {"convs": len(mine), "at_goal_tuned": met,
                                 "at_goal_default": met_default,
                                 "goal": f">= {GOAL_RATIO}x on >= {GOAL_COUNT}",
                                 "met": met >= GOAL_COUNT}
    return summary


def markdown_times(result: dict) -> str:
    """The README's rows of the time table (its header is in the README)."""
    lines = []
    for r in result["rows"]:
        g, c = r["gflops"], r["tuned_config"]
        ort_g = max(g["ort"], g["ort_no_spin"])
        lines.append(f"| {r['label']} | {r['threads']} | {g['winograd']:.0f} (m{c['m']}, "
                     f"tb{c['tb']}) | **{r['ratio_to_ort']:.2f}x** | "
                     f"{g['winograd_default']:.0f} (m{r['default_config']['m']}) | "
                     f"{r['default_ratio_to_ort']:.2f}x | {r['gemm_percent_of_peak']:.0f}% | "
                     f"{g['direct']:.0f} | {ort_g:.0f} |")
    return "\n".join(lines)


def markdown_errors(result: dict) -> str:
    """The README's rows of the error table (its header is in the README)."""
    return "\n".join(f"| {label} | {e['m2']:.1e} | {e['m4']:.1e} | {e['direct']:.1e} | "
                     f"{e['bound_m2']:.1e} | {e['bound_m4']:.1e} |"
                     for label, e in result["errors"].items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed per round")
    parser.add_argument("--grid", type=int, default=len(GRID),
                        help=f"grid configs tried besides the defaults (0 to {len(GRID)})")
    parser.add_argument("--peak", type=float, default=None,
                        help="one thread's fp32 GFLOP/s peak (default: measured by cpu_peak.py)")
    parser.add_argument("--limit", type=int, default=None, help="first N convs (smoke run)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true", help="print the README tables")
    args = parser.parse_args(argv)
    shapes = stride1_3x3()[:args.limit]
    rng = np.random.default_rng(0)
    errs = {s.label(): errors(s, rng) for s in shapes}
    for label, e in errs.items():
        print(f"{label:32s} relative L2 vs float64: m2 {e['m2']:.1e} m4 {e['m4']:.1e} "
              f"direct {e['direct']:.1e} (bounds {e['bound_m2']:.1e}, {e['bound_m4']:.1e})")
    rows, peaks = [], {}
    for threads in (int(t) for t in args.threads.split(",")):
        peaks[threads] = args.peak * threads if args.peak else measure_peak(threads)["gflops"]
        print(f"fp32 FMA peak: {peaks[threads]:.1f} GFLOP/s on {threads} threads")
        for shape in shapes:
            row = bench_shape(shape, threads, peaks[threads], args, rng)
            rows.append(row)
            print(f"{row['label']:32s} {threads}t winograd {row['gflops']['winograd']:6.1f} "
                  f"GFLOP/s {row['ratio_to_ort']:.2f}x ort (untuned "
                  f"{row['default_ratio_to_ort']:.2f}x, direct {row['direct_ratio_to_ort']:.2f}x)"
                  f" {row['tuned_config']} GEMM at {row['gemm_percent_of_peak']:.0f}% of peak",
                  flush=True)
    summary = summarize(rows)
    for threads, s in summary.items():
        print(f"{threads} thread(s): {s['at_goal_tuned']}/{s['convs']} convs >= {GOAL_RATIO}x "
              f"onnxruntime (untuned {s['at_goal_default']}) -> goal "
              f"{'met' if s['met'] else 'not met'}")
    import onnxruntime

    from wpk.kernels.cpu.microkernels.isa import host_isa

    result = {"benchmark": "bench_winograd", "rounds": args.rounds, "grid": args.grid,
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpu_count": os.cpu_count(), "isa": host_isa().name,
                          "load_average": os.getloadavg()},
              "versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__},
              "peak_gflops": peaks, "errors": errs, "rows": rows, "summary": summary}
    if args.markdown:
        print(markdown_errors(result))
        print(markdown_times(result))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
