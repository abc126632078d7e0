"""Per-node time of a CNN in the NCHWc blocked layout vs onnxruntime's whole model.

    python scripts/profile_nchwc.py [--model light_resnet50] [--rounds 7] [--runs 10] [--top 8]
                                    [--threads N]

Builds the graph through wpk's pass pipeline twice, with and without the
NCHWc layout pass, prepares one kernel per node (onnxruntime's MLAS NCHWc
kernels for the `wpk.nchwc` ops, onnxruntime single-node kernels for the
rest, the faster of their configurations) on preallocated buffers, and
times, alternating in every round: onnxruntime on the whole model
(ORT_ENABLE_ALL, same intra-op thread count, with and without its threads
spinning; wpk's single-node sessions do not spin), the blocked node sequence
and the NCHW node sequence. Prints median and best times of the whole model,
of the sum of per-node times and of a whole node-by-node run (Python
dispatch included) for each layout, and the ratios to onnxruntime. On a
loaded machine the best times are the more telling ones.
Models come from the onnx wheel (`onnx/backend/test/data/light`).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
import onnxruntime as ort

from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.kernels.cpu.ort_node import cpu_threads, set_cpu_threads
from wpk.passes import passes_for
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions
from wpk.workloads import workload_of

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def optimized(graph, blocked: bool):
    """The graph after wpk's cpu pipeline, with the NCHWc pass on or off."""
    graph = graph.copy()
    for graph_pass in passes_for("cpu"):
        if isinstance(graph_pass, NchwcLayout):
            graph_pass = NchwcLayout(NchwcOptions(enabled=blocked))
        graph = graph_pass.run(graph)
    return graph


def fastest(candidates, workload, consts, ins, outs):
    """The prepared kernel of the quickest candidate (onnxruntime configs differ per op)."""
    best, best_time = None, float("inf")
    for candidate in candidates:
        kernel = candidate.implementation.prepare(workload, consts, candidate.config)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            kernel(ins, outs)
            times.append(time.perf_counter() - t0)
        if min(times) < best_time:
            best, best_time = kernel, min(times)
    return best


class NodeSequence:
    """One prepared kernel per node over buffers allocated once."""

    def __init__(self, graph, feeds):
        self.values = dict(graph.constants)
        self.values.update(feeds)
        for name, info in graph.tensors.items():
            if name not in self.values:
                self.values[name] = np.zeros(info.shape, dtype=info.dtype)
        self.steps = []
        for node in graph.nodes:
            workload = workload_of(graph, node)
            found = registry.candidates(workload, "cpu")
            preferred = [c for c in found if c.implementation.name in ("ort.nchwc", "ort")]
            consts = {i: graph.constants[n] for i, n in enumerate(node.inputs)
                      if n in graph.constants}
            ins = [self.values[i] if i else None for i in node.inputs]
            outs = [self.values[o] for o in node.outputs]
            kernel = fastest(preferred or found[:1], workload, consts, ins, outs)
            self.steps.append((f"{node.domain + ':' if node.domain else ''}{node.op}",
                               workload.label, kernel, ins, outs))
        self.times = [[] for _ in self.steps]
        self.totals: list[float] = []

    def run(self) -> None:
        clock = time.perf_counter
        start = clock()
        for (_, _, kernel, ins, outs), times in zip(self.steps, self.times):
            t0 = clock()
            kernel(ins, outs)
            times.append(clock() - t0)
        self.totals.append(clock() - start)

    def node_sum(self, stat=np.median) -> float:
        return float(sum(stat(t) for t in self.times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="light_resnet50")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=8, help="slowest blocked nodes to list")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads of every session (default: usable cores)")
    args = parser.parse_args()
    set_cpu_threads(args.threads)

    path = os.path.join(LIGHT, f"{args.model}.onnx")
    graph = load_model(path)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32)
             for n in graph.inputs}
    threads = cpu_threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    whole = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    whole_nospin = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    sequences = {"nchwc": NodeSequence(optimized(graph, True), feeds),
                 "nchw": NodeSequence(optimized(graph, False), feeds)}
    ort_times: list[float] = []
    nospin_times: list[float] = []
    for _ in range(2):  # warm-up
        whole.run(None, feeds)
        for seq in sequences.values():
            seq.run()
    for seq in sequences.values():
        seq.times = [[] for _ in seq.steps]
        seq.totals = []
    for _ in range(args.rounds):
        for session, times in ((whole, ort_times), (whole_nospin, nospin_times)):
            for _ in range(args.runs):
                t0 = time.perf_counter()
                session.run(None, feeds)
                times.append(time.perf_counter() - t0)
        for seq in sequences.values():
            for _ in range(args.runs):
                seq.run()

    rows = [("onnxruntime whole model, ORT_ENABLE_ALL", ort_times),
            ("onnxruntime whole model, spinning off", nospin_times)]
    for name, seq in sequences.items():
        rows.append((f"wpk {name} ({len(seq.steps)} nodes): sum of per-node times",
                     [seq.node_sum()], [seq.node_sum(np.min)]))
        rows.append((f"wpk {name}: whole node-by-node run", seq.totals))
    ort_median, ort_best = float(np.median(ort_times)), float(np.min(ort_times))
    print(f"model {args.model}, {threads} threads, {args.rounds} rounds x {args.runs} runs, "
          "alternating")
    print(f"{'':52s} {'median ms':>10s} {'best ms':>9s} {'/ORT med':>9s} {'/ORT best':>9s}")
    for label, times, *best in rows:
        median, low = float(np.median(times)), float(np.min(best[0] if best else times))
        print(f"{label:52s} {1e3 * median:10.2f} {1e3 * low:9.2f} {median / ort_median:9.2f} "
              f"{low / ort_best:9.2f}")
    blocked = sequences["nchwc"]
    order = sorted(range(len(blocked.steps)), key=lambda i: -np.median(blocked.times[i]))
    print(f"slowest {args.top} blocked nodes:")
    for i in order[:args.top]:
        print(f"  {1e3 * np.median(blocked.times[i]):7.3f} ms  {blocked.steps[i][1]}")


if __name__ == "__main__":
    main()
