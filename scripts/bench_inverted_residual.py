"""Benchmark (not a test): the fused inverted-residual kernel vs onnxruntime's separate nodes.

Every distinct block of a network (`--net`, batch 1, 224x224: channels, sizes,
kernels and strides of the real network, the residual where it has it) as a
blocked `InvertedResidual` workload: `mobilenetv2` its expansion-6 blocks
(ReLU6), `mobilenetv3` MobileNetV3-small's (ReLU or HardSwish, squeeze-excite
gates with ReLU and HardSigmoid, the first of expansion 1), `efficientnet`
EfficientNet-B0's (SiLU, gates with SiLU and Sigmoid, the first of expansion
1). onnxruntime runs the block's separate steps (MLAS NCHWc Convs with their
fused activations, a HardSwish or SiLU node, the gate's pool, convs and
multiply) on the same blocked buffers in one session with its default
options (all graph optimizations, spinning threads) and `--threads` intra-op
threads; the fused kernel runs with as many OpenMP threads, its schedule the
fastest of a few configs measured briefly (the default first), as a tuned
build would pick. Both are checked against the float64 reference first. Then
they alternate in blocks (each after a wait until no thread spins: onnxruntime's do
after its runs);
the medians give the ratio (> 1: the fused kernel is faster). Goal (issue 11):
median >= 1.3x on MobileNet-v2's blocks (the other nets: no goal, the ratio shown).

    python scripts/bench_inverted_residual.py [--net mobilenetv3] [--threads 1 2]
                                              [--rounds 7] [--json FILE]
    python scripts/bench_inverted_residual.py --markdown FILE    # the README tables of a run
    python scripts/bench_inverted_residual.py --combine F1 F2 ...  # each block's median over runs

Figures on a shared machine are noisy; ratios hold better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep (bench_dsl_cpu)
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling kernel_timing
from kernel_timing import (  # noqa: E402
    alternate_with_onnxruntime,
    machine_fields,
    per_call,
    print_combined,
    repeat_for,
    speedups_by,
)

GOAL = 1.3
RELU6 = ("clip", (("max", 6.0), ("min", 0.0)))
RELU, HSWISH, SILU = ("relu", ()), ("hard_swish", ()), ("silu", ())
V3_GATE = (RELU, ("hard_sigmoid", (("alpha", 1 / 6), ("beta", 0.5))))
B0_GATE = (SILU, ("sigmoid", ()))


def _block(cin, expanded, cout, size, stride, residual, k=3, act=RELU6, squeezed=0,
           gate=V3_GATE) -> dict:
    return {"cin": cin, "expanded": expanded, "cout": cout, "size": size, "stride": stride,
            "residual": residual, "k": k, "act": act, "squeezed": squeezed, "gate": gate}


# One row per distinct block of each network at 224x224
NETS = {
    "mobilenetv2": [_block(cin, 6 * cin, cout, size, stride, residual)
                    for cin, cout, size, stride, residual in (
                        (16, 24, 112, 2, False), (24, 24, 56, 1, True), (24, 32, 56, 2, False),
                        (32, 32, 28, 1, True), (32, 64, 28, 2, False), (64, 64, 14, 1, True),
                        (64, 96, 14, 1, False), (96, 96, 14, 1, True), (96, 160, 14, 2, False),
                        (160, 160, 7, 1, True), (160, 320, 7, 1, False))],
    "mobilenetv3": [  # MobileNetV3-small (tests/corpus/torch_nets.py's list)
        _block(16, 16, 16, 112, 2, False, act=RELU, squeezed=8),
        _block(16, 72, 24, 56, 2, False, act=RELU), _block(24, 88, 24, 28, 1, True, act=RELU),
        _block(24, 96, 40, 28, 2, False, 5, HSWISH, 24),
        _block(40, 240, 40, 14, 1, True, 5, HSWISH, 64),
        _block(40, 120, 48, 14, 1, False, 5, HSWISH, 32),
        _block(48, 144, 48, 14, 1, True, 5, HSWISH, 40),
        _block(48, 288, 96, 14, 2, False, 5, HSWISH, 72),
        _block(96, 576, 96, 7, 1, True, 5, HSWISH, 144)],
    "efficientnet": [  # EfficientNet-B0 (gate: a quarter of the block's input channels)
        _block(cin, e, cout, size, stride, residual, k, SILU, max(1, cin // 4), B0_GATE)
        for cin, e, cout, size, stride, residual, k in (
            (32, 32, 16, 112, 1, False, 3), (16, 96, 24, 112, 2, False, 3),
            (24, 144, 24, 56, 1, True, 3), (24, 144, 40, 56, 2, False, 5),
            (40, 240, 40, 28, 1, True, 5), (40, 240, 80, 28, 2, False, 3),
            (80, 480, 80, 14, 1, True, 3), (80, 480, 112, 14, 1, False, 5),
            (112, 672, 112, 14, 1, True, 5), (112, 672, 192, 14, 2, False, 5),
            (192, 1152, 192, 7, 1, True, 5), (192, 1152, 320, 7, 1, False, 3))],
}


def _setup(block, rng):
    from wpk.kernels import nchwc_format as fmt
    from wpk.kernels.cpu.inverted_residual_spec import block_workload

    cin, size = block["cin"], block["size"]
    workload = block_workload(1, cin, block["expanded"], block["cout"], size, size, block["k"],
                              block["stride"], block["act"], block["residual"],
                              fmt.host_block_size(), squeezed=block["squeezed"],
                              gate_acts=block["gate"], expand=block["expanded"] != cin)
    x = fmt.block(rng.standard_normal((1, cin, size, size)).astype(np.float32),
                  fmt.host_block_size())
    count = len(workload.inputs)
    consts = {i: (rng.standard_normal(workload.inputs[i].shape) * 0.3).astype(np.float32)
              for i in range(1, count) if workload.inputs[i] is not None}
    return workload, [x, *(consts.get(i) for i in range(1, count))], consts


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
        seconds = min(per_call(call, repeat_for(call, 0.02)) for _ in range(3))
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


def _without_gate(block, config, threads: int):
    """The fused kernel of the same block without its gate (run with the gated block's
    config): what the gate's second phase and the stored depthwise output cost."""
    from wpk.kernels.cpu.microkernels.inverted_residual import MICRO_INVERTED_RESIDUAL

    workload, arrays, consts = _setup({**block, "squeezed": 0}, np.random.default_rng(0))
    out = np.empty(workload.outputs[0].shape, np.float32)
    kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config)
    return lambda: kernel(arrays, [out])


def _error(call, out: np.ndarray, expected: np.ndarray) -> float:
    out.fill(np.nan)
    call()
    return float(np.linalg.norm(out - expected) / np.linalg.norm(expected))


def measure(block, threads: int, rounds: int) -> dict:
    """One row: both verified, then alternated in blocks; medians and the ratio."""
    from wpk.kernels.cpu.microkernels.ir_space import block_geometry
    from wpk.kernels.reference import reference

    workload, arrays, consts = _setup(block, np.random.default_rng(
        block["cin"] + block["cout"] + block["size"]))
    expected = reference(workload, arrays)[0]
    out = np.empty(workload.outputs[0].shape, np.float32)
    config, fused = _fused_call(workload, arrays, consts, out)
    ort_run = _ort_call(workload, arrays, consts, out, threads)
    errors = {"fused": _error(fused, out, expected), "onnxruntime": _error(ort_run, out, expected)}
    if max(errors.values()) > 1e-4:
        raise SystemExit(f"error: block {block}: wrong result {errors}\n"
                         "hint: run tests/unit/test_inverted_residual*.py")
    ungated = _without_gate(block, config, threads) if block.get("squeezed") else None
    own = {"fused": fused, **({"fused_without_gate": ungated} if ungated else {})}
    times = alternate_with_onnxruntime(ort_run, own, rounds)
    medians = {k: statistics.median(v) for k, v in times.items()}
    flops = block_geometry(workload).flops
    return {**block, "threads": threads, "config": config, "errors": errors,
            "gflops": {k: flops / v / 1e9 for k, v in medians.items() if k != "fused_without_gate"},
            "median_s": medians, "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
            "speedup": medians["onnxruntime"] / medians["fused"]}


def _key(row: dict) -> tuple:
    return (row["cin"], row["expanded"], row["cout"], row["size"], row["stride"],
            row.get("k", 3))


def _extras(row: dict) -> str:
    """The kernel, activation and gate columns of a row."""
    k = row.get("k", 3)
    act = (row.get("act") or RELU6)[0]
    gate = "-"
    if row.get("squeezed"):
        cost = row["median_s"]["fused"] / row["median_s"]["fused_without_gate"]
        gate = f"SE {row['squeezed']} ({cost:.2f}x)"
    return f"{k}x{k} | {act} | {gate}"


def table(rows: list[dict]) -> str:
    """The rows as text, with the median ratio per thread count against the goal."""
    lines = [f"{'thr':>3} {'block':>18} {'size':>4} {'s':>1} {'res':>3} {'k':>1} {'se':>4} "
             f"{'ort ms':>8} "
             f"{'fused ms':>8} {'ort GF/s':>8} {'fused GF/s':>10} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r['threads']:>3} {r['cin']:>5}>{r['expanded']:>5}>{r['cout']:>5} "
                     f"{r['size']:>4} {r['stride']:>1} {'yes' if r['residual'] else 'no':>3} "
                     f"{r.get('k', 3):>1} {r.get('squeezed', 0):>4} "
                     f"{r['median_s']['onnxruntime'] * 1e3:>8.3f} "
                     f"{r['median_s']['fused'] * 1e3:>8.3f} {r['gflops']['onnxruntime']:>8.1f} "
                     f"{r['gflops']['fused']:>10.1f} {r['speedup']:>5.2f}x")
    for threads in sorted({r["threads"] for r in rows}):
        ratios = [r["speedup"] for r in rows if r["threads"] == threads]
        lines.append(f"{threads} thread(s): median {statistics.median(ratios):.2f}x (min "
                     f"{min(ratios):.2f}x, max {max(ratios):.2f}x); goal (MobileNet-v2) >= {GOAL}x")
    return "\n".join(lines)


def _summary(rows: list[dict], threads: int) -> str:
    ratios = [r["speedup"] for r in rows if r["threads"] == threads]
    median = statistics.median(ratios)
    return (f"{median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}): "
            f"{'met' if median >= GOAL else 'not met'}")


def markdown(rows: list[dict], net: str = "mobilenetv2") -> str:
    """The README's tables: the goal (MobileNet-v2) or the median ratio per thread count,
    then one row per block."""
    threads = sorted({r["threads"] for r in rows})
    count = len(rows) // len(threads)
    if net == "mobilenetv2":
        title = (f"MobileNet-v2's expansion-6 blocks (n={count}), median >= {GOAL}x "
                 "onnxruntime's separate nodes")
        summaries = [_summary(rows, t) for t in threads]
    else:
        title = f"{net}'s blocks (n={count}): median ratio to onnxruntime's separate steps"
        summaries = [_summary(rows, t).split(":")[0] for t in threads]
    lines = ["| goal | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads)
             + " |", "| --- |" + " --- |" * len(threads),
             f"| {title} | " + " | ".join(summaries) + " |", ""]
    head = ("| block (in > expanded > out) | input | stride | residual | kernel | act | "
            "gate (fused time / same block ungated) |")
    rule = "| --- | ---: | ---: | --- | --- | --- | --- |"
    for t in threads:
        head += f" {t} thr: ort ms | fused ms | fused GFLOP/s | speed-up |"
        rule += " ---: | ---: | ---: | ---: |"
    lines += [head, rule]
    for r in (r for r in rows if r["threads"] == threads[0]):
        line = (f"| {r['cin']} > {r['expanded']} > {r['cout']} | {r['size']}x{r['size']} | "
                f"{r['stride']} | {'yes' if r['residual'] else 'no'} | {_extras(r)} |")
        for t in threads:
            m = next(x for x in rows if x["threads"] == t and _key(x) == _key(r))
            line += (f" {m['median_s']['onnxruntime'] * 1e3:.3f} | "
                     f"{m['median_s']['fused'] * 1e3:.3f} | {m['gflops']['fused']:.0f} | "
                     f"{m['speedup']:.2f}x |")
        lines.append(line)
    return "\n".join(lines)


def combined(runs: list[dict]) -> str:
    """Each block's speedups over `runs` (results of `--json`, one thread count or several)
    and their median; per thread count the median of the blocks' medians against the goal:
    one run's rows move with the machine's noise, the median of several less."""
    blocks = speedups_by(runs, lambda row: (row["threads"], *_key(row)))
    lines = [f"{'thr':>3} {'block':>18} {'size':>4} {'s':>1} {'k':>1}  speedups "
             f"({len(runs)} runs) -> median"]
    medians: dict[int, list[float]] = {}
    for (threads, cin, expanded, cout, size, stride, k), found in blocks.items():
        medians.setdefault(threads, []).append(statistics.median(found))
        lines.append(f"{threads:>3} {cin:>5}>{expanded:>5}>{cout:>5} {size:>4} {stride:>1} "
                     f"{k:>1}  {' '.join(f'{x:.2f}' for x in found)} -> "
                     f"{medians[threads][-1]:.2f}")
    for threads, found in sorted(medians.items()):
        median = statistics.median(found)
        lines.append(f"{threads} thread(s): median of the blocks' medians {median:.2f}x (min "
                     f"{min(found):.2f}x); goal (MobileNet-v2) >= {GOAL}x "
                     f"{'met' if median >= GOAL else 'not met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), default="mobilenetv2",
                        help="whose blocks: MobileNet-v2's (default), MobileNetV3-small's, "
                             "EfficientNet-B0's")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--limit", type=int, default=100, help="first N blocks only")
    parser.add_argument("--json", help="write the rows and the machine here")
    parser.add_argument("--markdown", metavar="JSON",
                        help="print the README tables of an earlier --json file and stop")
    parser.add_argument("--combine", nargs="+", metavar="RUN.json",
                        help="summarize runs written by --json instead of measuring")
    args = parser.parse_args(argv)
    if args.combine:
        return print_combined(args.combine, combined)
    if args.markdown:
        try:
            with open(args.markdown) as f:
                result = json.load(f)
            print(markdown(result["rows"], result.get("net", "mobilenetv2")))
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
    from wpk.dsl import build

    rows = []
    for threads in args.threads:
        build.openmp_defaults()
        import ctypes.util
        gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
        gomp.omp_set_num_threads(threads)   # the fused kernel's OpenMP team
        rows += [measure(block, threads, args.rounds) for block in NETS[args.net][: args.limit]]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**machine_fields(), "net": args.net, "goal": GOAL,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
