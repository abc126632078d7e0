"""Benchmark (not a test): what one tiny step costs, wpk's runtime against onnxruntime's
executor per node (issue 11, "one thread pool, no per-step wake-up": measure first).

A chain of N Softmax nodes on a small tensor (an op no pass fuses with its neighbour),
so the arithmetic is small and the time is mostly the per-node (per-step) overhead:

- onnxruntime, the whole chain in one session, default options (threads spin) and
  with spinning off: time per run / N;
- wpk's plan of the chain (untuned: onnxruntime kernels, merged into one region) and
  the same plan step by step (no region merging): time per run / N;
- generated kernels (`dsl.cpu`, default schedules: the Softmax's runs on the calling
  thread, an Add's is an OpenMP parallel loop) called N times in a row as the runtime
  calls a step, under wpk's OpenMP policy (`OMP_WAIT_POLICY=passive`:
  idle threads sleep, so every step wakes them) and under libgomp's default (threads
  spin a while after each step): each variant in a fresh process, since libgomp reads
  the policy once;
- the price of spinning: an onnxruntime MatMul run right after a generated OpenMP
  step, under each policy.

    python scripts/bench_step_overhead.py [--steps 200] [--size 256] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROUNDS = 15


def chain_model(steps: int, size: int):
    """x -> Softmax -> Softmax -> ... (`steps` nodes) on a [1, size] float tensor."""
    from onnx import TensorProto, helper

    nodes, inits, value = [], [], "x"
    for i in range(steps):
        nodes.append(helper.make_node("Softmax", [value], [f"y{i}"], name=f"softmax{i}",
                                      axis=-1))
        value = f"y{i}"
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT,
                                                             [1, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def per_call(run, calls: int) -> float:
    """Median over ROUNDS of the seconds per call of `run` (after a warm-up)."""
    for _ in range(20):
        run()
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def onnxruntime_rows(model, steps: int, feeds: dict) -> dict[str, float]:
    import onnxruntime as ort

    rows = {}
    for spin in ("1", "0"):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        label = "onnxruntime, one session" + (" (default: spinning)" if spin == "1"
                                              else " (spinning off)")
        rows[label] = per_call(lambda s=session: s.run(None, feeds), 20) / steps
    return rows


def wpk_rows(model, steps: int, feeds: dict) -> dict[str, float]:
    import wpk
    from wpk.runtime import Session

    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    rows = {}
    for merge in (True, False):
        session = Session(plan, merge_regions=merge)
        label = ("wpk plan, onnxruntime steps merged into a region" if merge
                 else "wpk plan, onnxruntime steps one session each")
        rows[label] = per_call(lambda s=session: s.run(feeds), 20) / steps
    return rows


def generated_row(op: str, size: int, steps: int) -> float:
    """Seconds per call of the op's generated kernel (Softmax: serial; Add: an OpenMP
    parallel loop), called `steps` times per run."""
    from wpk.core.workload import TensorSpec, Workload
    from wpk.kernels.generated import DSL_CPU, default_config

    spec = TensorSpec((1, size), "float32")
    if op == "Softmax":
        workload = Workload("Softmax", (spec,), (spec,), (("axis", -1),))
    else:
        workload = Workload("Add", (spec, spec), (spec,))
    kernel = DSL_CPU.prepare(workload, {}, default_config(workload))
    inputs = [np.ones((1, size), np.float32) for _ in workload.inputs]
    outputs = [np.ones((1, size), np.float32)]

    def run():
        for _ in range(steps):
            kernel(inputs, outputs)

    return per_call(run, 1) / steps


def neighbour_row(size: int) -> float:
    """Seconds of an onnxruntime MatMul (about 0.1-0.3 ms on 2 threads, spinning off as in
    wpk's regions) run right after a generated OpenMP kernel: what the kernel's idle
    threads cost the next step when they spin instead of sleeping."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from wpk.core.workload import TensorSpec, Workload
    from wpk.kernels.generated import DSL_CPU, default_config

    spec = TensorSpec((1, size), "float32")
    workload = Workload("Add", (spec, spec), (spec,))
    kernel = DSL_CPU.prepare(workload, {}, default_config(workload))
    inputs = [np.ones((1, size), np.float32) for _ in range(2)]
    outputs = [np.ones((1, size), np.float32)]
    w = numpy_helper.from_array(np.ones((256, 256), np.float32) * 1e-3, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])],
                              [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((256, 256), np.float32)}
    times = []
    for _ in range(200):
        kernel(inputs, outputs)
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def generated_rows(size: int, steps: int) -> dict[str, float]:
    rows = {}
    for op in ("Softmax", "Add"):
        for policy in ("passive", ""):  # "": libgomp's default (wpk sets passive when unset)
            env = {**os.environ, "OMP_WAIT_POLICY": policy}
            done = subprocess.run([sys.executable, __file__, "--generated-only", op, "--size",
                                   str(size), "--steps", str(steps)], env=env,
                                  capture_output=True, text=True, check=True)
            what = "serial" if op == "Softmax" else "OpenMP"
            label = (f"generated {op} ({what}), " +
                     ("OMP_WAIT_POLICY=passive (wpk's default)" if policy
                      else "libgomp's default wait policy"))
            rows[label] = float(done.stdout.strip().splitlines()[-1])
    for policy in ("passive", ""):
        env = {**os.environ, "OMP_WAIT_POLICY": policy}
        done = subprocess.run([sys.executable, __file__, "--neighbour-only", "--size",
                               str(size)], env=env, capture_output=True, text=True, check=True)
        label = ("onnxruntime MatMul 256^3 right after a generated OpenMP step, " +
                 ("OMP_WAIT_POLICY=passive" if policy else "libgomp's default wait policy"))
        rows[label] = float(done.stdout.strip().splitlines()[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--output")
    parser.add_argument("--generated-only", choices=("Softmax", "Add"), help=argparse.SUPPRESS)
    parser.add_argument("--neighbour-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.neighbour_only:
        print(neighbour_row(args.size))
        return
    if args.generated_only:
        print(generated_row(args.generated_only, args.size, args.steps))
        return
    model = chain_model(args.steps, args.size)
    feeds = {"x": np.ones((1, args.size), np.float32)}
    rows = {**onnxruntime_rows(model, args.steps, feeds), **wpk_rows(model, args.steps, feeds),
            **generated_rows(args.size, args.steps)}
    reference = rows["onnxruntime, one session (default: spinning)"]
    print(f"| per step ({args.steps} Softmaxes of {args.size} floats, load "
          f"{os.getloadavg()[0]:.1f}) | us | vs onnxruntime per node |")
    print("(the last two rows: a whole step's time, not an overhead)")
    print("| --- | ---: | ---: |")
    for label, seconds in rows.items():
        print(f"| {label} | {seconds * 1e6:.2f} | {seconds / reference:.2f}x |")
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"steps": args.steps, "size": args.size, "seconds_per_step": rows,
                       "load_average": os.getloadavg()}, handle, indent=2)


if __name__ == "__main__":
    main()
