"""CPU kernel figures: onnxruntime per-call overhead, numpy conv vs onnxruntime, and a chain
of one-node sessions vs the same chain as one onnxruntime model.

Not a test: prints medians, alternating the contenders (A B A B) as DESIGN.md's
performance method asks. Timings on a shared machine are noisy; ratios hold better.
On a loaded machine, `--threads 1 --cpu-time` (with OPENBLAS_NUM_THREADS=1 in the
environment) compares the work each contender does rather than wall time.
    python scripts/bench_cpu_kernels.py [--threads N] [--cpu-time]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.node_model import build_node_model
from wpk.kernels.cpu.ort_node import (
    cpu_threads,
    create_session,
    session_options,
    set_cpu_threads,
)
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference

spec = TensorSpec


_CLOCK = [time.perf_counter]


def _median_time(call, repeat: int, rounds: int = 7) -> list[float]:
    clock = _CLOCK[0]
    times = []
    for _ in range(rounds):
        start = clock()
        for _ in range(repeat):
            call()
        times.append((clock() - start) / repeat)
    return times


def compare(workload: Workload, labels: list[str], rounds: int = 7, repeat: int = 10) -> dict:
    """Median seconds per call of each candidate (by label), alternating between them."""
    inputs = random_inputs(workload, np.random.default_rng(0))
    consts = {i: inputs[i] for i in workload.const_inputs}
    outputs = [np.empty(s.shape, s.dtype) for s in workload.outputs]
    found = {c.label: c for c in registry.candidates(workload)}
    calls = {}
    for label in labels:
        kernel = found[label].implementation.prepare(workload, consts, found[label].config)
        calls[label] = (lambda k=kernel: k(inputs, outputs))
        calls[label]()
    times = {label: [] for label in labels}
    for _ in range(rounds):
        for label in labels:
            times[label] += _median_time(calls[label], repeat, rounds=1)
    return {label: statistics.median(t) for label, t in times.items()}


def raw_session_run(workload: Workload, repeat: int = 500) -> float:
    """Seconds per plain `InferenceSession.run` of the same node plus a copy to the output."""
    model = build_node_model(workload, {})
    session = create_session(model.model.SerializeToString(), workload.label)
    x = random_inputs(workload, np.random.default_rng(0))[0]
    out = np.empty(workload.outputs[0].shape, np.float32)

    def call():
        np.copyto(out, session.run(None, {"in0": x})[0])

    call()
    return statistics.median(_median_time(call, repeat))


def conv_chain(layers: int = 20, channels: int = 64, size: int = 28) -> dict:
    """`layers` Conv3x3+Relu as one-node sessions (each config) vs one whole ORT model."""
    rng = np.random.default_rng(0)
    shape = (1, channels, size, size)
    weights = [rng.uniform(-1, 1, (channels, channels, 3, 3)).astype(np.float32) / 24
               for _ in range(layers)]
    biases = [rng.uniform(-0.1, 0.1, channels).astype(np.float32) for _ in range(layers)]
    nodes, inits = [], []
    for i in range(layers):
        inits += [numpy_helper.from_array(weights[i], f"w{i}"),
                  numpy_helper.from_array(biases[i], f"b{i}")]
        nodes += [helper.make_node("Conv", [f"t{i}", f"w{i}", f"b{i}"], [f"c{i}"],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"t{i + 1}"])]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(f"t{layers}", TensorProto.FLOAT, list(shape))],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    whole = ort.InferenceSession(model.SerializeToString(), session_options(),
                                 providers=["CPUExecutionProvider"])
    workload = Workload("Conv", (spec(shape), spec((channels, channels, 3, 3)),
                                 spec((channels,))), (spec(shape),),
                        attrs=(("pads", (1, 1, 1, 1)),),
                        epilogue=(EpilogueStep("relu"),), const_inputs=(1, 2))
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    buffers = [np.empty(shape, np.float32) for _ in range(2)]
    calls = {"whole model": lambda: whole.run(None, {"t0": x})}
    for config in ({}, {"optimization": "extended"}):
        kernels = [registry.get("ort").prepare(workload, {1: w, 2: b}, config)
                   for w, b in zip(weights, biases)]

        def plan(kernels=kernels):
            source = x
            for i, kernel in enumerate(kernels):
                kernel([source, None, None], [buffers[i % 2]])
                source = buffers[i % 2]

        calls[f"{layers} sessions {config or 'all'}"] = plan
    times = {k: [] for k in calls}
    for _ in range(15):
        for name, call in calls.items():
            times[name] += _median_time(call, 3, rounds=1)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["whole model"]
    return {k: {"ms": round(v * 1e3, 3), "vs whole": round(v / base, 3)} for k, v in med.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall time")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    if args.cpu_time:
        _CLOCK[0] = time.process_time
    results = {"threads": cpu_threads(), "clock": "cpu" if args.cpu_time else "wall"}
    tiny = Workload("Relu", (spec((1, 16)),), (spec((1, 16)),))
    per_call = compare(tiny, ["ort"], repeat=2000)["ort"]
    results["ort kernel per call, Relu 1x16 (us)"] = per_call * 1e6
    results["raw session.run, Relu 1x16 (us)"] = raw_session_run(tiny) * 1e6
    mid = Workload("Relu", (spec((1, 64, 56, 56)),), (spec((1, 64, 56, 56)),))
    results["Relu 1x64x56x56 (us)"] = {k: round(v * 1e6, 1) for k, v in compare(
        mid, ["ort", "numpy.elementwise"], repeat=200).items()}
    results["raw session.run + copy, Relu 1x64x56x56 (us)"] = raw_session_run(mid) * 1e6
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        conv = Workload("Conv", (spec((1, c, hw, hw)), spec((c, c, 3, 3)), spec((c,)),
                                 spec((1, c, hw, hw))), (spec((1, c, hw, hw)),),
                        attrs=(("pads", (1, 1, 1, 1)),),
                        epilogue=(EpilogueStep("add", operand=3), EpilogueStep("relu")),
                        const_inputs=(1, 2))
        med = compare(conv, ["numpy.conv[strategy=im2col]", "ort", "ort[optimization=extended]"])
        results[f"conv3x3 {c}x{hw}x{hw} +add+relu (ms)"] = {
            k: round(v * 1e3, 3) for k, v in med.items()} | {
            "numpy/ort": round(med["numpy.conv[strategy=im2col]"] / med["ort"], 2)}
    results["conv chain 20 x (3x3 64x28x28 + relu)"] = conv_chain()
    big = Workload("Conv", (spec((1, 256, 56, 56)), spec((256, 256, 3, 3)), spec((256,))),
                   (spec((1, 256, 56, 56)),), attrs=(("pads", (1, 1, 1, 1)),))
    inputs = random_inputs(big, np.random.default_rng(0))
    start = time.perf_counter()
    reference(big, inputs)
    results["reference conv 1x256x56x56 3x3 (s)"] = round(time.perf_counter() - start, 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
