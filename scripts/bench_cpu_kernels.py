"""Per-call overhead of the onnxruntime single-node kernel, and numpy conv vs onnxruntime.

Not a test: prints medians (alternating A B A B, as DESIGN.md's performance method asks).
    python scripts/bench_cpu_kernels.py
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from wpk.kernels import registry
from wpk.kernels.cpu.node_model import build_node_model
from wpk.kernels.cpu.ort_node import create_session
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.workload import EpilogueStep, TensorSpec, Workload


def _time_call(kernel, inputs, outputs, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        kernel(inputs, outputs)
    return (time.perf_counter() - start) / repeat


def compare(workload: Workload, names: list[str], rounds: int = 7, repeat: int = 10) -> dict:
    """Median seconds per call of each named implementation, alternating between them."""
    rng = np.random.default_rng(0)
    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    outputs = [np.empty(s.shape, s.dtype) for s in workload.outputs]
    kernels = {}
    for name in names:
        impl = registry.get(name)
        config = impl.configs(workload)[0]
        kernels[name] = impl.prepare(workload, consts, config)
        kernels[name](inputs, outputs)
    times = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            times[name].append(_time_call(kernels[name], inputs, outputs, repeat))
    return {name: statistics.median(t) for name, t in times.items()}


def _raw_session_run(workload: Workload, repeat: int = 500) -> float:
    """Seconds per plain `InferenceSession.run` of the same node plus a copy to the output."""
    model = build_node_model(workload, {})
    session = create_session(model.model.SerializeToString(), workload.label)
    x = random_inputs(workload, np.random.default_rng(0))[0]
    out = np.empty(workload.outputs[0].shape, np.float32)

    def call(inputs, outputs):
        np.copyto(outputs[0], session.run(None, {"in0": inputs[0]})[0])

    call([x], [out])
    return statistics.median(_time_call(call, [x], [out], repeat) for _ in range(5))


def main() -> None:
    spec = TensorSpec
    results = {}
    tiny = Workload("Relu", (spec((1, 16)),), (spec((1, 16)),))
    results["ort per-call, Relu 1x16 (us)"] = compare(tiny, ["ort"], repeat=2000)["ort"] * 1e6
    results["raw session.run, Relu 1x16 (us)"] = _raw_session_run(tiny) * 1e6
    mid = Workload("Relu", (spec((1, 64, 56, 56)),), (spec((1, 64, 56, 56)),))
    results["Relu 1x64x56x56 (us)"] = {k: round(v * 1e6, 1) for k, v in compare(
        mid, ["ort", "numpy.formula"], repeat=200).items()}
    results["raw session.run + copy, Relu 1x64x56x56 (us)"] = _raw_session_run(mid) * 1e6
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        conv = Workload("Conv", (spec((1, c, hw, hw)), spec((c, c, 3, 3)), spec((c,)),
                                 spec((1, c, hw, hw))), (spec((1, c, hw, hw)),),
                        attrs=(("pads", (1, 1, 1, 1)),),
                        epilogue=(EpilogueStep("add", operand=3), EpilogueStep("relu")),
                        const_inputs=(1, 2))
        med = compare(conv, ["numpy.conv", "ort"])
        results[f"conv3x3 {c}x{hw}x{hw} +add+relu (ms)"] = {
            k: round(v * 1e3, 3) for k, v in med.items()} | {
            "numpy/ort": round(med["numpy.conv"] / med["ort"], 2)}
    big = Workload("Conv", (spec((1, 256, 56, 56)), spec((256, 256, 3, 3)), spec((256,))),
                   (spec((1, 256, 56, 56)),), attrs=(("pads", (1, 1, 1, 1)),))
    inputs = random_inputs(big, np.random.default_rng(0))
    start = time.perf_counter()
    reference(big, inputs)
    results["reference conv 1x256x56x56 3x3 (s)"] = round(time.perf_counter() - start, 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
