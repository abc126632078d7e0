"""Benchmark (not a test): two schedule choices of the CPU conv kernels, against onnxruntime.

1. Winograd rounds (`micro.winograd`, knob `local`): the three phases of every round
   shared by the threads (0) or each round on one thread in its own scratch (1), the
   default config of each tile size m otherwise, on ResNet-50's four 3x3 stride-1 convs
   and ESPCN's two 3x3 convs at 160x160;
2. dilated convs on the direct micro-kernel (`micro.nchwc`, its default config, whose
   edge columns are cut where a filter tap enters or leaves the image), on DeepLab's ASPP
   convs (256 -> 128 channels, rates 6-18 at 32x32 and 12-36 at 64x64).

Every conv is a blocked `wpk.nchwc` workload with bias and ReLU; onnxruntime runs its
`com.microsoft.nchwc` Conv on the same buffers, with and without its spinning pool (the
faster is the reference). Contenders alternate per round, a 0.2 s pause before each; the
median over rounds of each round's median of `--repeat` calls, in microseconds, and
onnxruntime's time over each (> 1: wpk is faster).

    python scripts/bench_conv_schedules.py [--threads 2] [--rounds 5] [--repeat 5]
        [--output benchmarks/results/conv-schedules.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_dsl_cpu import timeit  # noqa: E402
from bench_microkernels import ort_kernel  # noqa: E402
from bench_winograd import set_omp_threads, stride1_3x3  # noqa: E402


@dataclass(frozen=True)
class Conv:
    """A 3x3 'same' conv of a blocked input: channels, side, dilation, where it is from."""

    c: int
    k: int
    side: int
    dilation: int
    source: str

    @property
    def label(self) -> str:
        rate = f" d{self.dilation}" if self.dilation > 1 else ""
        return f"{self.source} {self.c}x{self.side}x{self.side}->{self.k} 3x3{rate}"


def winograd_convs() -> list[Conv]:
    resnet = [Conv(s.c, s.k, s.h, 1, "resnet50") for s in stride1_3x3()]
    return resnet + [Conv(64, 32, 160, 1, "espcn"), Conv(32, 27, 160, 1, "espcn")]


def dilated_convs() -> list[Conv]:
    return [Conv(256, 128, side, d, "aspp") for side, rates in ((32, (6, 12, 18)),
                                                                (64, (12, 24, 36)))
            for d in rates]


def workload(conv: Conv, block: int):
    """The blocked Conv workload (bias and ReLU fused)."""
    from wpk.core.workload import EpilogueStep, TensorSpec, Workload

    d = conv.dilation
    x = TensorSpec((1, -(-conv.c // block), conv.side, conv.side, block))
    y = TensorSpec((1, -(-conv.k // block), conv.side, conv.side, block))
    attrs = {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (d,) * 4,
             "dilations": (d, d), "group": 1, "block": block, "channels": conv.k}
    return Workload("Conv", (x, TensorSpec((conv.k, conv.c, 3, 3)), TensorSpec((conv.k,))),
                    (y,), tuple(sorted(attrs.items())), (EpilogueStep("relu"),), "wpk.nchwc",
                    (1, 2))


def contenders(conv: Conv, work, consts) -> dict:
    """name -> kernel(inputs, outputs) of the wpk schedules compared on `conv`."""
    from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC
    from wpk.kernels.cpu.microkernels.space import conv_geometry
    from wpk.kernels.cpu.microkernels.winograd import MICRO_WINOGRAD
    from wpk.kernels.cpu.microkernels.winograd_space import config_reason, default_config

    if conv.dilation > 1:
        return {"direct": MICRO_NCHWC.prepare(work, consts, MICRO_NCHWC.configs(work)[0])}
    g, found = conv_geometry(work), {}
    for m in (2, 4):
        for local in (False, True):   # each with the tiles per round of its own kind
            config = default_config(g, m=m, local=local)
            if config_reason(g, config) is None:
                found[f"m{m} {'local' if local else 'shared'}"] = MICRO_WINOGRAD.prepare(
                    work, consts, config)
    return found


def bench(conv: Conv, threads: int, rounds: int, repeat: int, rng) -> dict:
    from wpk.kernels.nchwc_format import host_block_size
    from wpk.kernels.random_inputs import random_inputs

    work = workload(conv, host_block_size())
    inputs = random_inputs(work, rng)
    consts = {1: inputs[1], 2: inputs[2]}
    out = np.empty(work.outputs[0].shape, np.float32)
    calls = {name: (lambda k=kernel: k(inputs, [out]))
             for name, kernel in contenders(conv, work, consts).items()}
    for spinning in (False, True):
        ort = ort_kernel(work, consts, threads, spinning)
        calls[f"onnxruntime{' spinning' if spinning else ''}"] = \
            lambda ort=ort: ort(inputs[0], out)
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(0.2)
            times[name].append(timeit(calls[name], repeat))
    us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    us["onnxruntime"] = min(us.pop("onnxruntime"), us.pop("onnxruntime spinning"))
    return {"conv": conv.label, "us": {k: round(v, 1) for k, v in us.items()},
            "onnxruntime_over": {k: round(us["onnxruntime"] / v, 3) for k, v in us.items()
                                 if k != "onnxruntime"}}


def markdown(rows: list[dict]) -> str:
    names = sorted({k for row in rows for k in row["us"] if k != "onnxruntime"})
    lines = ["| conv | " + " | ".join(f"{n} us" for n in names) + " | onnxruntime us |",
             "|---|" + "---|" * (len(names) + 1)]
    for row in rows:
        cells = [f"{row['us'][n]:.0f} ({row['onnxruntime_over'][n]:.2f}x)" if n in row["us"]
                 else "" for n in names]
        lines.append(f"| {row['conv']} | " + " | ".join(cells)
                     + f" | {row['us']['onnxruntime']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed per round")
    parser.add_argument("--limit", type=int, default=None, help="first N convs of each part")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    set_omp_threads(args.threads)
    rng = np.random.default_rng(0)
    parts = {"winograd rounds": winograd_convs()[:args.limit],
             "dilated direct": dilated_convs()[:args.limit]}
    result = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "rounds": args.rounds, "repeat": args.repeat, "parts": {}}
    for part, convs in parts.items():
        rows = []
        for conv in convs:
            rows.append(bench(conv, args.threads, args.rounds, args.repeat, rng))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        result["parts"][part] = rows
        if args.markdown:
            print(f"\n{part}\n\n{markdown(rows)}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
