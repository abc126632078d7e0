"""Benchmark (not a test): every CPU kernel of interpolating Resizes against onnxruntime's.

The upsamples and downsamples users' models make (segmentation heads and FPNs: bilinear 2x
and 4x, align_corners, pytorch_half_pixel; a bicubic 2x; an antialiased half; and the
blocked linear Upsamples the NCHWc layout makes of whole-number ones between convs): every
candidate the registry offers for the workload (`resize.c` in each `order`, numpy's
formula, onnxruntime's node) is verified against the float64 reference, then timed in
rounds, the contenders interleaved and the first one rotating, `--repeat` back-to-back
calls per contender and round; the median over rounds and the fastest call are reported,
with the ratio of onnxruntime's median to each contender's (> 1: faster than onnxruntime).
Threads: every core for each contender (onnxruntime's intra-op pool, OpenMP's team,
numpy's BLAS); idle BLAS threads sleep at once (OPENBLAS_THREAD_TIMEOUT, as in
bench_microkernels.py): after a BLAS call its spinning threads otherwise take the cores
from the next contender (measured: resize.c 0.48 -> 1.64 ms after numpy's formula ran).

    python scripts/bench_resize.py [--rounds 9] [--repeat 5] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep
import numpy as np  # noqa: E402

from wpk.core.numerics import relative_l2  # noqa: E402
from wpk.core.workload import TensorSpec, Workload  # noqa: E402
from wpk.kernels import registry  # noqa: E402
from wpk.kernels.random_inputs import random_inputs  # noqa: E402
from wpk.kernels.reference import reference  # noqa: E402


def resize(label: str, in_shape, scales, mode: str, transform: str = "half_pixel",
           extra=(), opset: int = 13) -> tuple[str, Workload]:
    """A Resize by `scales` (output lengths floor(length x scale))."""
    out = tuple(int(np.floor(d * s)) for d, s in zip(in_shape, scales))
    attrs = (("coordinate_transformation_mode", transform.encode()),
             ("mode", mode.encode()), *extra)
    workload = Workload("Resize", (TensorSpec(tuple(in_shape)), None, TensorSpec((4,))),
                        (TensorSpec(out),), tuple(sorted(attrs)), const_inputs=(2,),
                        static_inputs=((2, np.array(scales, np.float32)),), opset=opset)
    return label, workload


def blocked(label: str, channels: int, hw: tuple[int, int], factor: int,
            transform: str) -> tuple[str, Workload]:
    """The blocked (NCHWc) linear Upsample the layout pass writes for a whole-number
    Resize between blocked convs, at the host's block size."""
    from wpk.kernels import nchwc_format as fmt

    b = fmt.host_block_size()
    x = TensorSpec(fmt.blocked_shape((1, channels, *hw), b))
    y = TensorSpec(fmt.blocked_shape((1, channels, hw[0] * factor, hw[1] * factor), b))
    attrs = {"block": b, "channels": channels, "mode": "linear", "scales": (factor, factor),
             "coordinate_transformation_mode": transform}
    return label, Workload("Upsample", (x,), (y,), tuple(sorted(attrs.items())),
                           domain="wpk.nchwc")


WORKLOADS = [
    resize("FPN bilinear 2x", (1, 64, 80, 80), [1, 1, 2, 2], "linear"),
    resize("FPN bilinear 2x, 256 ch", (1, 256, 20, 20), [1, 1, 2, 2], "linear"),
    resize("seg head bilinear 4x, align_corners", (1, 32, 64, 64), [1, 1, 4, 4], "linear",
           "align_corners"),
    resize("bilinear 2x, pytorch_half_pixel", (1, 128, 40, 40), [1, 1, 2, 2], "linear",
           "pytorch_half_pixel"),
    resize("bicubic 2x", (1, 64, 80, 80), [1, 1, 2, 2], "cubic"),
    resize("antialiased bilinear half", (1, 32, 160, 160), [1, 1, 0.5, 0.5], "linear",
           extra=(("antialias", 1),), opset=18),
    blocked("blocked FPN bilinear 2x", 64, (80, 80), 2, "half_pixel"),
    blocked("blocked bilinear 2x, 256 ch", 256, (20, 20), 2, "half_pixel"),
    blocked("blocked seg head 4x, align_corners", 32, (64, 64), 4, "align_corners"),
]


def interleaved_times(runs: dict, rounds: int, repeat: int) -> tuple[dict, dict]:
    """({name: median over rounds of the round's median call}, {name: fastest call}) of
    the no-argument callables `runs`, timed in `rounds` rounds, each contender once per
    round (after a warm-up call) for `repeat` back-to-back calls, the first one rotating
    from round to round."""
    names = list(runs)
    medians: dict[str, list[float]] = {n: [] for n in names}
    fastest = dict.fromkeys(names, float("inf"))
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name]()   # warm: caches, a sleeping team
            calls = []
            for _ in range(repeat):
                start = time.perf_counter()
                runs[name]()
                calls.append(time.perf_counter() - start)
            medians[name].append(statistics.median(calls))
            fastest[name] = min(fastest[name], min(calls))
    return {n: statistics.median(v) for n, v in medians.items()}, fastest


def bench_workload(label: str, workload: Workload, args, rng) -> dict:
    inputs = random_inputs(workload, rng)
    (expected,) = reference(workload, inputs)
    consts = {i: inputs[i] for i in workload.const_inputs}
    out = np.empty(workload.outputs[0].shape, np.float32)
    kernels, errors, ort_label = {}, {}, None
    for candidate in registry.candidates(workload):
        if candidate.implementation.onnxruntime:
            ort_label = candidate.label
        kernel = candidate.implementation.prepare(workload, consts, candidate.config)
        out.fill(np.nan)
        kernel(inputs, [out])
        errors[candidate.label] = relative_l2(out, expected)
        if not errors[candidate.label] < 1e-5:
            raise SystemExit(f"{label} {candidate.label}: wrong answer "
                             f"(relative L2 {errors[candidate.label]:.2e})")
        kernels[candidate.label] = kernel
    median, fastest = interleaved_times(
        {name: (lambda k=kernel: k(inputs, [out])) for name, kernel in kernels.items()},
        args.rounds, args.repeat)
    ort = median.get(ort_label)
    return {"label": label, "in": list(workload.inputs[0].shape),
            "out": list(workload.outputs[0].shape), "mode": workload.text_attr("mode", "nearest"),
            "median_ms": {n: 1e3 * t for n, t in median.items()},
            "fastest_ms": {n: 1e3 * t for n, t in fastest.items()},
            "onnxruntime": ort_label,
            "ort_over": {n: ort / t for n, t in median.items()} if ort else None,
            "relative_l2": errors}


def parse_args(description: str, argv=None) -> argparse.Namespace:
    """--rounds, --repeat and --output, as the per-op benchmarks take them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=5, help="calls per contender and round")
    parser.add_argument("--output", type=Path, default=None)
    return parser.parse_args(argv)


def write_results(args: argparse.Namespace, benchmark: str, rows: list[dict]) -> None:
    """The rows, the machine and the versions as JSON at `args.output` (when given)."""
    if not args.output:
        return
    import onnxruntime

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": benchmark, "rounds": args.rounds, "repeat": args.repeat,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
        "versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__},
        "rows": rows}, indent=1))


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    rng = np.random.default_rng(0)
    rows = []
    for label, workload in WORKLOADS:
        row = bench_workload(label, workload, args, rng)
        rows.append(row)
        cells = "  ".join(f"{n} {t:.3f} ms ({row['ort_over'][n]:.2f}x)" if row["ort_over"]
                          else f"{n} {t:.3f} ms" for n, t in row["median_ms"].items())
        print(f"{label:38s} {row['in']} -> {row['out'][2:]}: {cells}", flush=True)
    write_results(args, "bench_resize", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
