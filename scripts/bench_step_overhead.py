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
  calls a step (one ctypes call each), and the same N steps as one native chain (what
  the runtime runs for consecutive generated steps, `wpk.kernels.cpu.native_chain`):
  under wpk's OpenMP policy (`OMP_WAIT_POLICY=passive` with a short
  `GOMP_SPINCOUNT`, `wpk.dsl.build`), with no spin at all (passive alone: every step
  wakes the threads) and under libgomp's default (threads spin for milliseconds after
  each step): each variant in a fresh process, since libgomp reads the policy once;
- the price of spinning: an onnxruntime MatMul run right after a generated OpenMP
  step, under each policy;
- two thread pools in one plan: an onnxruntime step (a Softmax over 64 x 4096 floats,
  parallel in onnxruntime) alternating with a generated OpenMP Add of 2^18 floats, per
  pair, next to each alone, with onnxruntime's threads as wpk's regions have them (a
  pool per session, no spinning), spinning during a run, and one global onnxruntime
  pool shared by every session (its workers spin: the Python API sets only its sizes),
  each in a fresh process (the global pool is the process's).

Goal (issue 11): a plan step of a tiny generated kernel costs no more than
onnxruntime's executor per node.

    python scripts/bench_step_overhead.py [--steps 200] [--size 256] [--only-mixed]
        [--output FILE.json]
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


def chain_model(steps: int, size: int, op: str = "Softmax"):
    """x -> Softmax -> Softmax -> ... (`steps` nodes) on a [1, size] float tensor; with op
    "Add", y = Add(x, x) each."""
    from onnx import TensorProto, helper

    nodes, inits, value = [], [], "x"
    for i in range(steps):
        inputs = [value] if op == "Softmax" else [value, value]
        attributes = {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, inputs, [f"y{i}"], name=f"{op}{i}", **attributes))
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


def onnxruntime_rows(steps: int, size: int, feeds: dict) -> dict[str, float]:
    """onnxruntime's time per node of a chain of Softmaxes and of Adds, with its default
    options (threads spin) and spinning off."""
    import onnxruntime as ort

    rows = {}
    for op in ("Softmax", "Add"):
        model = chain_model(steps, size, op)
        for spin in ("1", "0"):
            options = ort.SessionOptions()
            options.add_session_config_entry("session.intra_op.allow_spinning", spin)
            session = ort.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            label = f"onnxruntime {op}, one session" + (" (default: spinning)" if spin == "1"
                                                        else " (spinning off)")
            rows[label] = per_call(lambda s=session: s.run(None, feeds), 20) / steps
    return rows


def wpk_rows(model, steps: int, feeds: dict) -> dict[str, float]:
    import wpk
    from wpk.kernels.generated import DSL_CPU, default_config
    from wpk.runtime import Session

    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    rows = {}
    for merge in (True, False):
        session = Session(plan, merge_regions=merge)
        label = ("wpk plan of Softmaxes, onnxruntime steps merged into a region" if merge
                 else "wpk plan of Softmaxes, onnxruntime steps one session each")
        rows[label] = per_call(lambda s=session: s.run(feeds), 20) / steps
    for step in plan.manifest["steps"]:   # the same plan on generated kernels
        workload = plan.workloads[step["workload_key"]]
        step.update(impl=DSL_CPU.name, config=default_config(workload), kind=DSL_CPU.kind)
    for merge in (True, False):
        session = Session(plan, merge_regions=merge)
        label = ("wpk plan of Softmaxes, generated kernels, one native chain" if merge
                 else "wpk plan of Softmaxes, generated kernels, one call per step")
        rows[label] = per_call(lambda s=session: s.run(feeds), 20) / steps
    return rows


def generated_row(op: str, size: int, steps: int, chained: bool) -> float:
    """Seconds per call of the op's generated kernel (Softmax: serial; Add: an OpenMP
    parallel loop), called `steps` times per run, one by one or as one native chain."""
    from wpk.core.workload import TensorSpec, Workload
    from wpk.kernels.cpu.native_chain import chain_kernel, native_call
    from wpk.kernels.generated import DSL_CPU, default_config

    spec = TensorSpec((1, size), "float32")
    if op == "Softmax":
        workload = Workload("Softmax", (spec,), (spec,), (("axis", -1),))
    else:
        workload = Workload("Add", (spec, spec), (spec,))
    buffers = [np.ones((1, size), np.float32) for _ in range(steps + 1)]
    # one prepared kernel per step on its own buffers, as a plan binds them
    calls = [(DSL_CPU.prepare(workload, {}, default_config(workload)),
              [buffers[i]] * len(workload.inputs), [buffers[i + 1]]) for i in range(steps)]
    if chained:
        chain = chain_kernel([native_call(*call) for call in calls],
                             keep=[call[0] for call in calls])

        def run():
            chain([], [])
    else:
        def run():
            for kernel, inputs, outputs in calls:
                kernel(inputs, outputs)

    return per_call(run, 1) / steps


NEIGHBOUR_SIZE = 1 << 18   # floats of the Add before the MatMul: enough for OpenMP threads


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


MIXED_POOLS = {  # --mixed-only value -> label
    "per-session": "a pool per session, no spinning (wpk's regions)",
    "per-session-spin": "a pool per session, spinning during a run",
    "global": "one global onnxruntime pool (spinning)",
}
MIXED_SHAPE = (64, 4096)
MIXED_PAIRS = 20


def mixed_row(pool: str) -> tuple[float, float, float]:
    """Seconds per pair of (onnxruntime Softmax step, generated OpenMP Add step) under
    `pool`, and per step of each alone: MIXED_PAIRS sessions of one node, as a plan with
    that many onnxruntime regions has them."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.capi import _pybind_state as ort_capi

    from wpk.core.workload import TensorSpec, Workload
    from wpk.kernels.cpu.ort_node import cpu_threads, session_options
    from wpk.kernels.generated import DSL_CPU, default_config

    if pool == "global":
        ort.set_default_logger_severity(3)   # "thread counts ignored" for every session
        ort_capi.set_global_thread_pool_sizes(cpu_threads(), 1)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, MIXED_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, MIXED_SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x, y = np.random.rand(*MIXED_SHAPE).astype(np.float32), np.empty(MIXED_SHAPE, np.float32)
    steps = []
    for _ in range(MIXED_PAIRS):
        options = session_options(optimization="disabled",
                                  spin_during_run=pool == "per-session-spin")
        if pool == "global":
            options.use_per_session_threads = False
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, np.float32, list(MIXED_SHAPE), y.ctypes.data)
        steps.append((session, binding))
    spec = TensorSpec((1, NEIGHBOUR_SIZE), "float32")
    workload = Workload("Add", (spec, spec), (spec,))
    kernel = DSL_CPU.prepare(workload, {}, default_config(workload))
    a, out = [np.ones((1, NEIGHBOUR_SIZE), np.float32)] * 2, [np.empty((1, NEIGHBOUR_SIZE),
                                                                       np.float32)]

    def pairs():
        for session, binding in steps:
            session.run_with_iobinding(binding)
            kernel(a, out)

    def onnxruntime_only():
        for session, binding in steps:
            session.run_with_iobinding(binding)

    def generated_only():
        for _ in steps:
            kernel(a, out)

    return tuple(per_call(run, 5) / MIXED_PAIRS
                 for run in (pairs, onnxruntime_only, generated_only))


def mixed_rows() -> dict[str, float]:
    """Per pair and per step alone, under each of `MIXED_POOLS` (a process each)."""
    rows = {}
    for pool, label in MIXED_POOLS.items():
        done = subprocess.run([sys.executable, __file__, "--mixed-only", pool],
                              capture_output=True, text=True, check=True)
        pair, alone_ort, alone_generated = (float(v) for v in
                                            done.stdout.strip().splitlines()[-1].split())
        rows[f"mixed: onnxruntime Softmax + generated Add, per pair, {label}"] = pair
        rows[f"mixed: the onnxruntime Softmax step alone, {label}"] = alone_ort
        rows[f"mixed: the generated Add step alone, {label}"] = alone_generated
        rows[f"mixed: excess per pair (the pair minus both alone), {label}"] = \
            pair - alone_ort - alone_generated
    return rows


POLICIES = {  # label -> environment of the measuring process
    "wpk's default (passive, short spin)": {},
    "passive, no spin": {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "0"},
    "passive, 15x the spin": {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "30000"},
    # set but empty: wpk leaves the policy alone, libgomp reads it as unset (its default)
    "libgomp's default wait policy": {"OMP_WAIT_POLICY": ""},
}


def _child(arguments: list[str], policy: dict) -> float:
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}, **policy}
    done = subprocess.run([sys.executable, __file__, *arguments], env=env,
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def generated_rows(size: int, steps: int) -> dict[str, float]:
    rows = {}
    for op in ("Softmax", "Add"):
        what = "serial" if op == "Softmax" else "a parallel loop, serial when this small"
        for chained in (False, True):
            how = "one native chain" if chained else "one call per step"
            for label, policy in POLICIES.items():
                arguments = ["--generated-only", op, "--size", str(size), "--steps",
                             str(steps)] + (["--chained"] if chained else [])
                rows[f"generated {op} ({what}), {how}, {label}"] = _child(arguments, policy)
    for label, policy in POLICIES.items():
        label = (f"onnxruntime MatMul 256^3 right after a generated OpenMP Add of "
                 f"{NEIGHBOUR_SIZE} floats, {label}")
        rows[label] = _child(["--neighbour-only", "--size", str(NEIGHBOUR_SIZE)], policy)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--output")
    parser.add_argument("--generated-only", choices=("Softmax", "Add"), help=argparse.SUPPRESS)
    parser.add_argument("--neighbour-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chained", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mixed-only", choices=tuple(MIXED_POOLS), help=argparse.SUPPRESS)
    parser.add_argument("--only-mixed", action="store_true",
                        help="only the two-pool rows (an onnxruntime step and a generated one)")
    args = parser.parse_args()
    if args.mixed_only:
        print(*mixed_row(args.mixed_only))
        return
    if args.neighbour_only:
        print(neighbour_row(args.size))
        return
    if args.generated_only:
        print(generated_row(args.generated_only, args.size, args.steps, args.chained))
        return
    model = chain_model(args.steps, args.size)
    feeds = {"x": np.ones((1, args.size), np.float32)}
    rows = {**onnxruntime_rows(args.steps, args.size, feeds)}
    if not args.only_mixed:
        rows.update(wpk_rows(model, args.steps, feeds))
        rows.update(generated_rows(args.size, args.steps))
    rows.update(mixed_rows())
    print(f"| per step ({args.steps} steps on {args.size} floats, load "
          f"{os.getloadavg()[0]:.1f}) | us | vs onnxruntime per node of the same op |")
    print("(the MatMul rows: a whole step's time, not an overhead)")
    print("| --- | ---: | ---: |")
    for label, seconds in rows.items():
        if label.startswith("mixed:"):   # other sizes: no per-node reference
            print(f"| {label} | {seconds * 1e6:.2f} | |")
            continue
        op = "Add" if " Add" in label else "Softmax"
        reference = rows[f"onnxruntime {op}, one session (default: spinning)"]
        print(f"| {label} | {seconds * 1e6:.2f} | {seconds / reference:.2f}x |")
    if args.output:
        write_result(args.output, args.steps, args.size, rows)


def write_result(path: str, steps: int, size: int, rows: dict[str, float]) -> None:
    """The run's JSON: its sizes, every row's seconds per step, the load average and the
    machine (its ISA fingerprint, CPU model and any flags hidden by `avx2_only.sh`)."""
    from kernel_timing import machine_fields

    with open(path, "w") as handle:
        json.dump({**machine_fields(), "steps": steps, "size": size,
                   "seconds_per_step": rows, "load_average": os.getloadavg()}, handle, indent=2)


if __name__ == "__main__":
    main()
