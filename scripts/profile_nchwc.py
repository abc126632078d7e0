"""Per-node time of a CNN in the NCHWc blocked layout vs onnxruntime's whole model.

    python scripts/profile_nchwc.py [--model light_resnet50] [--rounds 7] [--runs 10] [--top 8]
                                    [--threads N]

Builds the graph through wpk's pass pipeline twice, with and without the
NCHWc layout pass, prepares one kernel per node (onnxruntime's MLAS NCHWc
kernels for the `wpk.nchwc` ops, onnxruntime single-node kernels for the
rest) on preallocated buffers, and times, alternating in every round:
onnxruntime on the whole model (ORT_ENABLE_ALL, same intra-op thread count),
the blocked node sequence and the NCHW node sequence. Prints the median
whole-model time, the sum of per-node medians and the median time of a whole
node-by-node run (Python dispatch included) of each layout, and the ratios.
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
            found = {c.implementation.name: c for c in registry.candidates(workload, "cpu")}
            candidate = found.get("ort.nchwc") or found.get("ort") or next(iter(found.values()))
            consts = {i: graph.constants[n] for i, n in enumerate(node.inputs)
                      if n in graph.constants}
            kernel = candidate.implementation.prepare(workload, consts, candidate.config)
            ins = [self.values[i] if i else None for i in node.inputs]
            outs = [self.values[o] for o in node.outputs]
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

    def node_sum(self) -> float:
        return float(sum(np.median(t) for t in self.times))


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
    sequences = {"nchwc": NodeSequence(optimized(graph, True), feeds),
                 "nchw": NodeSequence(optimized(graph, False), feeds)}
    ort_times: list[float] = []
    for _ in range(2):  # warm-up
        whole.run(None, feeds)
        for seq in sequences.values():
            seq.run()
    for seq in sequences.values():
        seq.times = [[] for _ in seq.steps]
        seq.totals = []
    for _ in range(args.rounds):
        for _ in range(args.runs):
            t0 = time.perf_counter()
            whole.run(None, feeds)
            ort_times.append(time.perf_counter() - t0)
        for seq in sequences.values():
            for _ in range(args.runs):
                seq.run()

    ort_ms = 1e3 * float(np.median(ort_times))
    print(f"model {args.model}, {threads} threads, {args.rounds} rounds x {args.runs} runs "
          "(alternating)")
    print(f"onnxruntime whole model (ORT_ENABLE_ALL): {ort_ms:8.2f} ms")
    for name, seq in sequences.items():
        node_ms = 1e3 * seq.node_sum()
        run_ms = 1e3 * float(np.median(seq.totals))
        print(f"wpk {name:5s} {len(seq.steps):4d} nodes: sum of per-node medians "
              f"{node_ms:8.2f} ms ({node_ms / ort_ms:.2f}x ORT), whole node-by-node run "
              f"{run_ms:8.2f} ms ({run_ms / ort_ms:.2f}x ORT)")
    blocked = sequences["nchwc"]
    order = sorted(range(len(blocked.steps)), key=lambda i: -np.median(blocked.times[i]))
    print(f"slowest {args.top} blocked nodes:")
    for i in order[:args.top]:
        print(f"  {1e3 * np.median(blocked.times[i]):7.3f} ms  {blocked.steps[i][1]}")


if __name__ == "__main__":
    main()
