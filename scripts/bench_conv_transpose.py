"""Benchmark (not a test): every CPU kernel of the ConvTransposes users' decoders make
against onnxruntime's.

Text detectors' and U-Nets' 2x2 stride-2 upsamplers, DCGAN/pix2pix/CenterNet's 4x4
stride-2 pad-1 ones (a DCGAN's small 1x1, 4x4 and 8x8 inputs among them), a segmentation
decoder's 3x3 stride 2 with output padding: every
candidate the registry offers (`convtranspose.c`, numpy's formula, onnxruntime's node)
verified against the float64 reference, then timed in interleaved rounds as
`bench_resize.py` does (its `bench_workload`, arguments and JSON); the median over
rounds, the fastest call and onnxruntime's median over each contender's (> 1: faster
than onnxruntime), with each contender's GFLOP/s.

    python scripts/bench_conv_transpose.py [--rounds 9] [--repeat 5] [--output FILE.json]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep
import numpy as np  # noqa: E402
from bench_resize import bench_workload, parse_args, write_results  # noqa: E402

from wpk.core.workload import TensorSpec, Workload  # noqa: E402
from wpk.kernels.flops import workload_flops  # noqa: E402


def conv_transpose(label: str, in_shape, out_channels: int, kernel: int, stride: int,
                   pad: int = 0, output_padding: int = 0) -> tuple[str, Workload]:
    """A square ConvTranspose with bias; the output size by the spec's formula."""
    n, c, h, w = in_shape
    oh, ow = ((d - 1) * stride - 2 * pad + kernel + output_padding for d in (h, w))
    attrs = {"kernel_shape": (kernel, kernel), "strides": (stride, stride),
             "pads": (pad,) * 4}
    if output_padding:
        attrs["output_padding"] = (output_padding,) * 2
    inputs = (TensorSpec(tuple(in_shape)), TensorSpec((c, out_channels, kernel, kernel)),
              TensorSpec((out_channels,)))
    return label, Workload("ConvTranspose", inputs, (TensorSpec((n, out_channels, oh, ow)),),
                           tuple(sorted(attrs.items())), const_inputs=(1, 2))


WORKLOADS = [
    conv_transpose("DBNet head 2x2 s2", (1, 24, 80, 80), 24, 2, 2),
    conv_transpose("DBNet head 2x2 s2, 1 channel out", (1, 24, 160, 160), 1, 2, 2),
    conv_transpose("U-Net up 2x2 s2, 256 -> 128", (1, 256, 28, 28), 128, 2, 2),
    # a 64x64 DCGAN generator's layers (its first, 1x1 -> 4x4 stride 1, too)
    conv_transpose("DCGAN first 4x4 s1, 100 -> 512", (1, 100, 1, 1), 512, 4, 1),
    conv_transpose("DCGAN 4x4 s2 p1, 4x4 in, 512 -> 256", (1, 512, 4, 4), 256, 4, 2, 1),
    conv_transpose("DCGAN 4x4 s2 p1, 8x8 in, 256 -> 128", (1, 256, 8, 8), 128, 4, 2, 1),
    conv_transpose("DCGAN 4x4 s2 p1, 256 -> 128", (1, 256, 16, 16), 128, 4, 2, 1),
    conv_transpose("DCGAN 4x4 s2 p1, 64 -> 3", (1, 64, 32, 32), 3, 4, 2, 1),
    conv_transpose("CenterNet 4x4 s2 p1, 256 -> 256", (1, 256, 32, 32), 256, 4, 2, 1),
    conv_transpose("decoder 3x3 s2 p1 op1, 64 -> 32", (1, 64, 80, 80), 32, 3, 2, 1, 1),
]


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    rng = np.random.default_rng(0)
    rows = []
    for label, workload in WORKLOADS:
        row = bench_workload(label, workload, args, rng)
        flops = workload_flops(workload)
        row["gflops"] = {n: flops / t / 1e6 for n, t in row["median_ms"].items()}
        rows.append(row)
        cells = "  ".join(f"{n} {t:.3f} ms {row['gflops'][n]:.0f} GFLOP/s "
                          f"({row['ort_over'][n]:.2f}x)" for n, t in row["median_ms"].items())
        print(f"{label:34s} {row['in']} -> {row['out'][1:]}: {cells}", flush=True)
    write_results(args, "bench_conv_transpose", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
