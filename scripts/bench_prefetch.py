"""Benchmark (not a test): what the micro-kernels' prefetch knob (`pf`) buys.

Every distinct convolution of ResNet-50 (`micro.nchwc`: 1x1, 3x3, the stride-2
convs, the 7x7 stem; bias and ReLU fused) and the MatMuls of a BERT-base layer,
a ViT-tiny and ConvNeXt's pointwise MLP (`micro.gemm`): each kernel is built
at its default config (what an untuned build offers, `pf` 0) and at every other
`pf` of its space (a conv: input blocks ahead; a GEMM: rows of B ahead), every
variant verified against the float64 reference, then all are timed in rounds,
interleaved, the first rotating (`bench_resize.interleaved_times`); `--repeat`
back-to-back calls per variant and round, the median over rounds reported with the
ratio default / variant (> 1: the prefetch made the kernel faster). The tuners search
`pf` with the other knobs; this shows how much it can move a kernel on the machine at
hand.

    python scripts/bench_prefetch.py [--rounds 9] [--repeat 5] [--only conv|gemm]
        [--output FILE.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep (bench_resize)
import numpy as np  # noqa: E402
from bench_resize import interleaved_times, write_results  # noqa: E402

from wpk.core.numerics import relative_l2  # noqa: E402
from wpk.kernels.random_inputs import random_inputs  # noqa: E402
from wpk.kernels.reference import reference  # noqa: E402

# GEMM models whose products are timed (bench_micro_gemm.MODELS names)
GEMM_MODELS = ("bert_base_layer", "vit_tiny", "convnext_stage1")


def conv_cases() -> list[tuple[str, object, object]]:
    """(label, workload, its micro-kernel family: `template`, `implementation`) of
    ResNet-50's distinct convs."""
    from bench_dsl_cpu import resnet50_convs
    from bench_microkernels import group_of, nchwc_workload

    from wpk.kernels import nchwc_format as fmt
    from wpk.kernels.cpu.microkernels.kernel import MicroKernels

    block = fmt.host_block_size()
    cases = []
    for shape in resnet50_convs():
        label = (f"{group_of(shape)} {shape.c}x{shape.h}x{shape.w} -> {shape.k} "
                 f"k{shape.r} s{shape.stride}")
        cases.append((label, nchwc_workload(shape, block), MicroKernels()))
    return cases


def gemm_cases() -> list[tuple[str, object, object]]:
    """(label, workload, family) of the transformers' and ConvNeXt's MatMuls."""
    from bench_micro_gemm import products, workload

    from wpk.kernels.cpu.microkernels.gemm import GemmKernels

    return [(f"{p.model} {p.role} {p.label}", workload(p), GemmKernels())
            for model in GEMM_MODELS for p in products(model)]


def variants(family, workload) -> dict[int, dict]:
    """pf -> config: the default and the default at every other pf of the space."""
    template = family.template(workload)
    default = template.default_config()
    found = {0: default}
    for pf in template.space()["pf"]:
        config = dict(default, pf=pf)
        if pf and template.validate(config) is None:
            found[pf] = config
    return found


def bench_case(label: str, workload, family, args, rng) -> dict:
    """Verify every pf variant of one kernel, then time them interleaved."""
    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    expected = reference(workload, inputs)[0]
    kernels, errors = {}, {}
    for pf, config in variants(family, workload).items():
        kernel = family.implementation.prepare(workload, consts, config)
        out = [np.full(workload.outputs[0].shape, np.nan, np.float32)]
        kernel(inputs, out)
        errors[pf] = relative_l2(out[0], expected)
        if not errors[pf] < 1e-4:
            raise SystemExit(f"error: {label} pf {pf}: relative L2 {errors[pf]:.2e} "
                             "against the float64 reference")
        kernels[pf] = (kernel, out)
    median, _ = interleaved_times(
        {pf: (lambda k=kernel, o=out: k(inputs, o)) for pf, (kernel, out) in kernels.items()},
        args.rounds, args.repeat)
    return {"label": label, "median_us": {str(pf): t * 1e6 for pf, t in median.items()},
            "speedup": {str(pf): median[0] / t for pf, t in median.items() if pf},
            "relative_l2": {str(pf): e for pf, e in errors.items()}}


def summarize(rows: list[dict]) -> dict:
    """Per pf: the median, lowest and highest speedup over the kernels."""
    by_pf: dict[str, list[float]] = {}
    for row in rows:
        for pf, s in row["speedup"].items():
            by_pf.setdefault(pf, []).append(s)
    return {pf: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for pf, v in by_pf.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=5, help="calls per variant and round")
    parser.add_argument("--only", choices=("conv", "gemm"), default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N kernels of each kind")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    report = {}
    for kind, cases in (("conv", conv_cases), ("gemm", gemm_cases)):
        if args.only not in (None, kind):
            continue
        rows = []
        for label, workload, family in cases()[: args.limit]:
            row = bench_case(label, workload, family, args, rng)
            rows.append(row)
            cells = "  ".join(f"pf {pf}: {s:.3f}x" for pf, s in row["speedup"].items())
            print(f"{label:52s} {row['median_us']['0']:9.1f} us  {cells}", flush=True)
        summary = summarize(rows)
        for pf, s in summary.items():
            print(f"{kind} pf {pf}: median {s['median']:.3f}x ({s['min']:.3f}-{s['max']:.3f})")
        report[kind] = {"rows": rows, "summary": summary}
    write_results(args, "bench_prefetch", [report])
    return 0


if __name__ == "__main__":
    sys.exit(main())
