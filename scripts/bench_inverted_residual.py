"""Benchmark (not a test): the fused inverted-residual kernel vs onnxruntime's separate nodes.

Every distinct expansion-6 block of MobileNet-v2 (batch 1, 224x224: channels,
sizes and strides of the real network, ReLU6, the residual where the network
has it) as a blocked `InvertedResidual` workload. onnxruntime runs the block's
three MLAS NCHWc Conv nodes (expand + ReLU6, depthwise 3x3 + ReLU6, project
[+ residual]) on the same blocked buffers in one session with its default
options (all graph optimizations, spinning threads) and `--threads` intra-op
threads; the fused kernel runs with as many OpenMP threads, its schedule the
fastest of a few configs measured briefly (the default first), as a tuned
build would pick. Both are checked against the float64 reference first. Then
they alternate in blocks (a pause after onnxruntime's, whose threads spin);
the medians give the ratio (> 1: the fused kernel is faster). Goal (issue 11):
median >= 1.3x.

    python scripts/bench_inverted_residual.py [--threads 1 2] [--rounds 7] [--json FILE]
    python scripts/bench_inverted_residual.py --markdown FILE    # the README tables of a run

Figures on a shared machine are noisy; ratios hold better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

GOAL = 1.3
# (input channels, output channels, input size, stride, residual) of MobileNet-v2's
# expansion-6 blocks at 224x224 (one row per distinct block)
BLOCKS = ((16, 24, 112, 2, False), (24, 24, 56, 1, True), (24, 32, 56, 2, False),
          (32, 32, 28, 1, True), (32, 64, 28, 2, False), (64, 64, 14, 1, True),
          (64, 96, 14, 1, False), (96, 96, 14, 1, True), (96, 160, 14, 2, False),
          (160, 160, 7, 1, True), (160, 320, 7, 1, False))


def _setup(block, rng):
    from wpk.kernels import nchwc_format as fmt
    from wpk.kernels.cpu.inverted_residual_spec import block_workload

    cin, cout, size, stride, residual = block
    workload = block_workload(1, cin, 6 * cin, cout, size, size, 3, stride, residual=residual,
                              block=fmt.host_block_size())
    x = fmt.block(rng.standard_normal((1, cin, size, size)).astype(np.float32),
                  fmt.host_block_size())
    consts = {i: (rng.standard_normal(workload.inputs[i].shape) * 0.3).astype(np.float32)
              for i in range(1, 7)}
    return workload, [x, *(consts[i] for i in range(1, 7))], consts


def _per_call(call, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat


def _repeat_for(call, target_s: float = 0.05) -> int:
    return max(3, int(target_s / max(_per_call(call, 3), 1e-7)))


def candidate_configs(workload) -> list[dict]:
    """The default config and a few neighbours (pixel tile, channel tiles, strip rows)."""
    from wpk.kernels.cpu.microkernels.ir_space import BlockSpace, block_geometry

    space = BlockSpace(block_geometry(workload))
    base = space.default_config()
    found = [base]
    for change in ({"px1": 6, "kv1": 4}, {"px2": 6, "kv2": 4}, {"px1": 4, "px2": 4},
                   {"kv1": 2, "px1": 8}, {"kv2": 2, "px2": 8},
                   {"rt": max(1, base["rt"] // 2)}, {"rt": base["rt"] * 2}):
        config = {**base, **change}
        if space.validate(config) is None and config not in found:
            found.append(config)
    return found


def _fused_call(workload, arrays, consts, out):
    from wpk.kernels.cpu.microkernels.inverted_residual import MICRO_INVERTED_RESIDUAL

    best = None
    for config in candidate_configs(workload):
        kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config)

        def call(k=kernel):
            k(arrays, [out])

        call()
        seconds = min(_per_call(call, _repeat_for(call, 0.02)) for _ in range(3))
        if best is None or seconds < best[0]:
            best = (seconds, config, call)
    return best[1], best[2]


def _ort_call(workload, arrays, consts, out, threads: int):
    from bench_dsl_cpu import ort_session

    from wpk.kernels.cpu.microkernels.inverted_residual import separate_model

    session = ort_session(separate_model(workload, consts), threads, spinning=True,
                          optimize=True)
    # MLAS reads the blocked (N, Cb, H, W, b) buffer as its 4-d NCHWc tensor (N, Cb*b, H, W)
    feed = {"x": arrays[0].reshape(arrays[0].shape[0], -1, *arrays[0].shape[2:4])}
    return lambda: np.copyto(out, session.run(None, feed)[0].reshape(out.shape))


def _error(call, out: np.ndarray, expected: np.ndarray) -> float:
    out.fill(np.nan)
    call()
    return float(np.linalg.norm(out - expected) / np.linalg.norm(expected))


def measure(block, threads: int, rounds: int) -> dict:
    """One row: both verified, then alternated in blocks; medians and the ratio."""
    from wpk.kernels.cpu.microkernels.ir_space import block_geometry
    from wpk.kernels.reference import reference

    workload, arrays, consts = _setup(block, np.random.default_rng(sum(block[:3])))
    expected = reference(workload, arrays)[0]
    out = np.empty(workload.outputs[0].shape, np.float32)
    config, fused = _fused_call(workload, arrays, consts, out)
    ort_run = _ort_call(workload, arrays, consts, out, threads)
    errors = {"fused": _error(fused, out, expected), "onnxruntime": _error(ort_run, out, expected)}
    if max(errors.values()) > 1e-4:
        raise SystemExit(f"error: block {block}: wrong result {errors}")
    repeat = _repeat_for(ort_run)
    times = {"onnxruntime": [], "fused": []}
    for _ in range(rounds):
        times["onnxruntime"].append(_per_call(ort_run, repeat))
        time.sleep(0.05)   # let onnxruntime's spinning threads stop
        times["fused"].append(_per_call(fused, repeat))
    medians = {k: statistics.median(v) for k, v in times.items()}
    cin, cout, size, stride, residual = block
    flops = block_geometry(workload).flops
    return {"cin": cin, "expanded": 6 * cin, "cout": cout, "size": size, "stride": stride,
            "residual": residual, "threads": threads, "config": config, "errors": errors,
            "gflops": {k: flops / v / 1e9 for k, v in medians.items()},
            "median_s": medians, "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
            "speedup": medians["onnxruntime"] / medians["fused"]}


def table(rows: list[dict]) -> str:
    """The rows as text, with the median ratio per thread count against the goal."""
    lines = [f"{'thr':>3} {'block':>18} {'size':>4} {'s':>1} {'res':>3} {'ort ms':>8} "
             f"{'fused ms':>8} {'ort GF/s':>8} {'fused GF/s':>10} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r['threads']:>3} {r['cin']:>5}>{r['expanded']:>5}>{r['cout']:>5} "
                     f"{r['size']:>4} {r['stride']:>1} {'yes' if r['residual'] else 'no':>3} "
                     f"{r['median_s']['onnxruntime'] * 1e3:>8.3f} "
                     f"{r['median_s']['fused'] * 1e3:>8.3f} {r['gflops']['onnxruntime']:>8.1f} "
                     f"{r['gflops']['fused']:>10.1f} {r['speedup']:>5.2f}x")
    for threads in sorted({r["threads"] for r in rows}):
        ratios = [r["speedup"] for r in rows if r["threads"] == threads]
        lines.append(f"{threads} thread(s): median {statistics.median(ratios):.2f}x (min "
                     f"{min(ratios):.2f}x, max {max(ratios):.2f}x); goal >= {GOAL}x")
    return "\n".join(lines)


def _summary(rows: list[dict], threads: int) -> str:
    ratios = [r["speedup"] for r in rows if r["threads"] == threads]
    median = statistics.median(ratios)
    return (f"{median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}): "
            f"{'met' if median >= GOAL else 'not met'}")


def markdown(rows: list[dict]) -> str:
    """The README's tables: the goal per thread count, then one row per block."""
    threads = sorted({r["threads"] for r in rows})
    lines = ["| goal | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads)
             + " |", "| --- |" + " --- |" * len(threads),
             f"| MobileNet-v2's expansion-6 blocks (n={len(rows) // len(threads)}), median >= "
             f"{GOAL}x onnxruntime's separate nodes | "
             + " | ".join(_summary(rows, t) for t in threads) + " |", ""]
    head = "| block (in > expanded > out) | input | stride | residual |"
    rule = "| --- | ---: | ---: | --- |"
    for t in threads:
        head += f" {t} thr: ort ms | fused ms | fused GFLOP/s | speed-up |"
        rule += " ---: | ---: | ---: | ---: |"
    lines += [head, rule]
    for r in (r for r in rows if r["threads"] == threads[0]):
        line = (f"| {r['cin']} > {r['expanded']} > {r['cout']} | {r['size']}x{r['size']} | "
                f"{r['stride']} | {'yes' if r['residual'] else 'no'} |")
        for t in threads:
            m = next(x for x in rows if x["threads"] == t and (x["cin"], x["cout"], x["size"],
                     x["stride"]) == (r["cin"], r["cout"], r["size"], r["stride"]))
            line += (f" {m['median_s']['onnxruntime'] * 1e3:.3f} | "
                     f"{m['median_s']['fused'] * 1e3:.3f} | {m['gflops']['fused']:.0f} | "
                     f"{m['speedup']:.2f}x |")
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--limit", type=int, default=len(BLOCKS), help="first N blocks only")
    parser.add_argument("--json", help="write the rows and the machine here")
    parser.add_argument("--markdown", metavar="JSON",
                        help="print the README tables of an earlier --json file and stop")
    args = parser.parse_args(argv)
    if args.markdown:
        try:
            with open(args.markdown) as f:
                print(markdown(json.load(f)["rows"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {args.markdown}: not a result file of this script ({exc})\n"
                  "hint: pass the file an earlier run wrote with --json", file=sys.stderr)
            return 2
        return 0
    if min(*args.threads, args.rounds, args.limit) < 1:
        print("error: --threads, --rounds and --limit must be positive\n"
              "hint: --threads 1 2 --rounds 7", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from wpk.core.devices import cpu_fingerprint
    from wpk.dsl import build

    rows = []
    for threads in args.threads:
        build._openmp_defaults()
        import ctypes.util
        gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
        gomp.omp_set_num_threads(threads)   # the fused kernel's OpenMP team
        rows += [measure(block, threads, args.rounds) for block in BLOCKS[: args.limit]]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu_fingerprint(), "goal": GOAL, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
