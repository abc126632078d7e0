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


def main() -> None:
    spec = TensorSpec
    results = {}
    tiny = Workload("Relu", (spec((1, 16)),), (spec((1, 16)),))
    results["ort per-call, Relu 1x16 (us)"] = compare(tiny, ["ort"], repeat=2000)["ort"] * 1e6
    mid = Workload("Relu", (spec((1, 64, 56, 56)),), (spec((1, 64, 56, 56)),))
    results["ort Relu 1x64x56x56 (us)"] = compare(mid, ["ort", "numpy.formula"], repeat=200)
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
