"""LSTM and GRU: `recurrent.c` vs onnxruntime's kernels on the same node.

Shapes from the models that use them: a CRNN text recognizer's bidirectional LSTM and GRU
(80 columns, 256 wide), a speech model's unidirectional GRU (200 frames, 512 wide), a
GRU with `linear_before_reset` 0 (TensorFlow's and Keras' default), a batch of 8 short
sequences, a small bidirectional LSTM. onnxruntime runs the single node in one session
with its default options (all graph optimizations, spinning threads) and `--threads`
intra-op threads, the way its users run it; recurrent.c runs with as many OpenMP threads,
its faster config (`par` 1 or 0) picked briefly as the planner would. Both are checked
against the float64 reference (onnx.reference in float64) first, on inputs drawn as the
build draws them (`wpk.kernels.random_inputs`). Then they alternate in blocks (each after a
wait until no thread spins: onnxruntime's do after its runs) and the medians of the blocks
give the ratio.

    python scripts/bench_recurrent.py [--threads 2] [--rounds 9] [--json F]

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
from kernel_timing import alternate_with_onnxruntime, per_call, repeat_for  # noqa: E402

# name: (op, seq, batch, input, hidden, direction, linear_before_reset)
CASES = {
    "crnn_bilstm": ("LSTM", 80, 1, 256, 256, "bidirectional", 0),
    "crnn_bigru": ("GRU", 80, 1, 512, 256, "bidirectional", 1),
    "speech_gru": ("GRU", 200, 1, 80, 512, "forward", 1),
    "gru_reset_first": ("GRU", 80, 1, 256, 256, "forward", 0),
    "lstm_batch8": ("LSTM", 50, 8, 128, 128, "forward", 0),
    "small_bilstm": ("LSTM", 32, 1, 64, 64, "bidirectional", 0),
}


def _workload(op: str, seq: int, batch: int, inputs: int, hidden: int, direction: str,
              lbr: int):
    """The node as torch exports it: W, R, B constant, initial states given, every output."""
    from wpk.core.workload import TensorSpec as T
    from wpk.core.workload import Workload

    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    state = T((dirs, batch, hidden))
    specs = (T((seq, batch, inputs)), T((dirs, gates * hidden, inputs)),
             T((dirs, gates * hidden, hidden)), T((dirs, 2 * gates * hidden)), None, state)
    specs += (state,) if op == "LSTM" else ()
    outputs = (T((seq, dirs, batch, hidden)), state) + ((state,) if op == "LSTM" else ())
    attrs = (("hidden_size", hidden), ("direction", direction))
    attrs += (("linear_before_reset", lbr),) if op == "GRU" else ()
    return Workload(op, specs, outputs, attrs, (), "", (1, 2, 3))


def _ort_call(workload, arrays, outs, threads: int):
    import onnxruntime as ort

    from wpk.kernels.cpu.node_model import build_node_model, input_name, output_name

    node = build_node_model(workload, {}, with_epilogue=False)
    options = ort.SessionOptions()   # onnxruntime's defaults, as its users run it
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(node.model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [output_name(j) for j in range(len(outs))]
    feeds = {input_name(i): a for i, a in enumerate(arrays) if a is not None}

    def call():
        for out, value in zip(outs, session.run(names, feeds)):
            np.copyto(out, value)
    return call


def _wpk_call(workload, arrays, outs, rounds: int = 3):
    from wpk.kernels.cpu.recurrent_native import RECURRENT_C

    best = None
    for config in RECURRENT_C.configs(workload):
        kernel = RECURRENT_C.prepare(workload, {i: arrays[i] for i in workload.const_inputs},
                                     config)

        def call(k=kernel):
            k(arrays, outs)

        call()
        repeat = repeat_for(call, 0.02)
        seconds = min(per_call(call, repeat) for _ in range(rounds))
        if best is None or seconds < best[0]:
            best = (seconds, config, call)
    return best[1], best[2]


def _error(call, outs, expected) -> float:
    for out in outs:
        out.fill(np.nan)
    call()
    return max(float(np.linalg.norm(o - e) / np.linalg.norm(e)) for o, e in zip(outs, expected))


def measure(name: str, threads: int, rounds: int) -> dict:
    """One row: both kernels verified, then alternated in blocks; medians and the ratio."""
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    workload = _workload(*CASES[name])
    arrays = random_inputs(workload, np.random.default_rng(len(name)))
    expected = reference(workload, arrays)
    outs = [np.empty(s.shape, np.float32) for s in workload.outputs]
    config, wpk_run = _wpk_call(workload, arrays, outs)
    ort_run = _ort_call(workload, arrays, outs, threads)
    errors = {"recurrent.c": _error(wpk_run, outs, expected),
              "onnxruntime": _error(ort_run, outs, expected)}
    if max(errors.values()) > 1e-4:
        raise SystemExit(f"error: {name}: wrong result {errors}")
    times = alternate_with_onnxruntime(ort_run, {"recurrent.c": wpk_run}, rounds)
    medians = {k: statistics.median(v) for k, v in times.items()}
    op, seq, batch, inputs, hidden, direction, lbr = CASES[name]
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    flops = 2 * dirs * seq * batch * gates * hidden * (inputs + hidden)
    return {"case": name, "shape": CASES[name], "config": config, "errors": errors,
            "median_s": medians, "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
            "gflops": {k: flops / v / 1e9 for k, v in medians.items()},
            "speedup": medians["onnxruntime"] / medians["recurrent.c"]}


def _table(rows: list[dict]) -> str:
    lines = [f"{'case':<16} {'ort ms':>8} {'wpk ms':>8} {'wpk GFLOP/s':>11} {'speedup':>7}  config"]
    for r in rows:
        lines.append(f"{r['case']:<16} {r['median_s']['onnxruntime'] * 1e3:>8.3f} "
                     f"{r['median_s']['recurrent.c'] * 1e3:>8.3f} "
                     f"{r['gflops']['recurrent.c']:>11.1f} {r['speedup']:>6.2f}x  {r['config']}")
    speedups = [r["speedup"] for r in rows]
    lines.append(f"median speedup {statistics.median(speedups):.2f}x (min {min(speedups):.2f}x, "
                 f"max {max(speedups):.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--json", help="write the rows and the machine here")
    args = parser.parse_args(argv)
    if min(args.threads, args.rounds) < 1:
        print("error: --threads and --rounds must be positive (hint: --threads 2 --rounds 9)",
              file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read when libgomp loads, below
    from wpk.core.devices import cpu_fingerprint

    rows = [measure(name, args.threads, args.rounds) for name in args.cases]
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu_fingerprint(), "threads": args.threads, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
