"""Fused attention (`attention.c`) vs onnxruntime running the same unfused nodes.

For seq 64/128/256/512 x d_model 256/512/768 (heads = d_model / 64, batch 1,
K given untransposed as exporters of BERT write it, a [B,1,1,S] padding mask
(the last fifth of the keys at -1e4) unless --no-mask, or with --causal a [1,1,S,S]
causal mask of -inf): onnxruntime runs Transpose, MatMul, Mul, Add, Softmax,
MatMul in one session with its default options (all graph optimizations,
spinning threads) and `--threads` intra-op threads, called with its inputs and output
bound (`run_with_iobinding`: no copies, its cheapest call from Python); the fused kernel
runs with as many OpenMP threads, called as a plan calls it (its native form through the
chain driver: no Python wrapper). Each kernel is checked against the float64
reference first; the fused kernel's schedule is the fastest of its configs
(`attention_configs`, measured briefly, as the planner would). Then the two
alternate in blocks (each after a wait until no thread spins: onnxruntime's do after
its runs) and the
medians of the blocks give the ratio; the issue's goal is >= 1.5x.

    python scripts/bench_attention.py [--threads 2] [--rounds 9] [--no-mask | --causal] [--json F]
    python scripts/bench_attention.py --combine RUN1.json RUN2.json ...

`--combine` reads runs written by `--json` and prints each shape's median speedup over
them, and on how many shapes that median meets the goal: one run's rows move with the
machine's noise, the median of several less.

Not a test: figures on a shared machine are noisy; ratios hold better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling kernel_timing
from kernel_timing import (  # noqa: E402
    alternate_with_onnxruntime,
    machine_fields,
    per_call,
    print_combined,
    repeat_for,
    speedups_by,
)

GOAL = 1.5
SEQS = (64, 128, 256, 512)
D_MODELS = (256, 512, 768)
HEAD_DIM = 64


def _workload(seq: int, d_model: int, mask: bool | str):
    """`mask`: falsy for none, "causal" for a [1, 1, S, S] causal mask, else a [1, 1, 1, S]
    padding mask."""
    from wpk.core.workload import TensorSpec, Workload

    heads = d_model // HEAD_DIM
    qkv = TensorSpec((1, heads, seq, HEAD_DIM))
    mask_shape = (1, 1, seq, seq) if mask == "causal" else (1, 1, 1, seq)
    inputs = (qkv, qkv, qkv) + ((TensorSpec(mask_shape),) if mask else ())
    return Workload("Attention", inputs, (qkv,), (("k_transposed", 0),
                                                   ("scale", 1 / HEAD_DIM ** 0.5)),
                    domain="wpk", opset=17)


def _inputs(workload, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = [rng.standard_normal(s.shape).astype(np.float32) for s in workload.inputs[:3]]
    shape = workload.inputs[3].shape if len(workload.inputs) > 3 else None
    if shape and shape[-2] > 1:   # causal: each query sees the keys up to its own
        arrays.append(np.triu(np.full(shape, -np.inf, np.float32), 1))
    elif shape:   # the last fifth of the keys padded away, as BERT does
        mask = np.zeros(shape, np.float32)
        mask[..., int(mask.shape[-1] * 0.8):] = -10000.0
        arrays.append(mask)
    return arrays


def _ort_call(workload, arrays, out, threads: int):
    import onnxruntime as ort

    from wpk.kernels.cpu.attention import attention_model
    from wpk.kernels.cpu.node_model import input_name

    model, feeds = attention_model(workload, {})
    options = ort.SessionOptions()   # onnxruntime's defaults, as its users run it
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()   # onnxruntime's cheapest call: no copies in or out
    for i in feeds:
        binding.bind_cpu_input(input_name(i), arrays[i])
    binding.bind_output(session.get_outputs()[0].name, "cpu", 0, np.float32, list(out.shape),
                        out.ctypes.data)
    return lambda: session.run_with_iobinding(binding)


def _fused_call(workload, arrays, out, rounds: int = 3):
    """The fastest config's call, as a plan runs the step: its native form through the
    chain driver (`native_chain`), not the Python wrapper. The configs take turns, round
    by round, so a noisy stretch of the machine does not decide alone."""
    from wpk.kernels.cpu.attention import ATTENTION_C, attention_configs
    from wpk.kernels.cpu.native_chain import chain_kernel, native_call

    calls = []
    for config in attention_configs(workload):
        kernel = ATTENTION_C.prepare(workload, {}, config)
        chain = chain_kernel([native_call(kernel, arrays, [out])], keep=[kernel])

        def call(c=chain):
            c(arrays, [out])

        call()
        calls.append((config, call, repeat_for(call, 0.02)))
    seconds = [float("inf")] * len(calls)
    for _ in range(rounds):
        seconds = [min(s, per_call(call, repeat)) for s, (_, call, repeat) in zip(seconds, calls)]
    config, call, _ = calls[seconds.index(min(seconds))]
    return config, call


def _error(call, out: np.ndarray, expected: np.ndarray) -> float:
    out.fill(np.nan)
    call()
    return float(np.linalg.norm(out - expected) / np.linalg.norm(expected))


def measure(seq: int, d_model: int, threads: int, rounds: int, mask: bool) -> dict:
    """One row: both kernels verified, then alternated in blocks; medians and the ratio."""
    from wpk.kernels.cpu.attention_spec import attention_formula

    workload = _workload(seq, d_model, mask)
    arrays = _inputs(workload, np.random.default_rng(seq * 1000 + d_model))
    expected = attention_formula(workload, arrays)[0]
    out = np.empty(workload.outputs[0].shape, np.float32)
    config, fused = _fused_call(workload, arrays, out)
    ort_run = _ort_call(workload, arrays, out, threads)
    errors = {"fused": _error(fused, out, expected), "onnxruntime": _error(ort_run, out, expected)}
    if max(errors.values()) > 1e-4:
        raise SystemExit(f"error: seq {seq} d_model {d_model}: wrong result {errors}")
    times = alternate_with_onnxruntime(ort_run, {"fused": fused}, rounds)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"seq": seq, "d_model": d_model, "heads": d_model // HEAD_DIM, "mask": mask,
            "config": config, "errors": errors, "median_s": medians,
            "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
            "speedup": medians["onnxruntime"] / medians["fused"]}


def _table(rows: list[dict]) -> str:
    lines = [f"{'seq':>4} {'d_model':>7} {'heads':>5} {'ort ms':>8} {'fused ms':>8} "
             f"{'speedup':>7}  config"]
    for r in rows:
        cfg = ",".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(f"{r['seq']:>4} {r['d_model']:>7} {r['heads']:>5} "
                     f"{r['median_s']['onnxruntime'] * 1e3:>8.3f} "
                     f"{r['median_s']['fused'] * 1e3:>8.3f} {r['speedup']:>6.2f}x  {cfg}")
    speedups = [r["speedup"] for r in rows]
    met = sum(s >= GOAL for s in speedups)
    lines.append(f"median speedup {statistics.median(speedups):.2f}x (min {min(speedups):.2f}x,"
                 f" max {max(speedups):.2f}x); goal >= {GOAL}x met in {met}/{len(rows)} rows")
    return "\n".join(lines)


def combined(runs: list[dict]) -> str:
    """Each shape's speedups over `runs` (results of `--json`) and their median; how many
    shapes' medians meet the goal."""
    shapes = speedups_by(runs, lambda row: (row["seq"], row["d_model"], str(row["mask"])))
    lines = [f"{'seq':>4} {'d_model':>7} {'mask':>6}  speedups ({len(runs)} runs) -> median"]
    medians = []
    for (seq, d_model, mask), found in shapes.items():
        medians.append(statistics.median(found))
        lines.append(f"{seq:>4} {d_model:>7} {mask:>6}  {' '.join(f'{x:.2f}' for x in found)}"
                     f" -> {medians[-1]:.2f}")
    lines.append(f"median of the shapes' medians {statistics.median(medians):.2f}x; goal >= "
                 f"{GOAL}x met by {sum(m >= GOAL for m in medians)}/{len(medians)} shapes' "
                 f"medians")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-mask", action="store_true")
    parser.add_argument("--causal", action="store_true",
                        help="a [1, 1, S, S] causal mask instead of BERT's padding mask")
    parser.add_argument("--seqs", type=int, nargs="+", default=list(SEQS))
    parser.add_argument("--d-models", type=int, nargs="+", default=list(D_MODELS))
    parser.add_argument("--json", help="write the rows and the machine here")
    parser.add_argument("--combine", nargs="+", metavar="RUN.json",
                        help="summarize runs written by --json instead of measuring")
    args = parser.parse_args(argv)
    if args.combine:
        return print_combined(args.combine, combined)
    if min(args.threads, args.rounds, *args.seqs, *args.d_models) < 1 or any(
            d % HEAD_DIM for d in args.d_models):
        print(f"error: --threads, --rounds and the sizes must be positive, d_model a multiple "
              f"of {HEAD_DIM} (hint: --seqs 64 128 --d-models 256 768)", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read when libgomp loads, below

    mask = "causal" if args.causal else not args.no_mask
    rows = [measure(s, d, args.threads, args.rounds, mask)
            for d in args.d_models for s in args.seqs]
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**machine_fields(), "threads": args.threads, "goal": GOAL,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
