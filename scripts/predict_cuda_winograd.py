"""PREDICTED (analytical model, no GPU) times of wpk's CUDA Winograd kernels
(`dsl.cuda.winograd`, F(2x2,3x3) and F(4x4,3x3)) against its implicit-GEMM kernel
(`dsl.cuda`) and the model's cuDNN placeholder on ResNet-50's distinct 3x3 stride-1
convolutions at batch 1 (float32), for one GPU preset.

    python scripts/predict_cuda_winograd.py [--gpu h100] [--count 3] [--json FILE]

Every config is compiled for the preset (nvcc for sm_75+, NVRTC 12 + ptxas for p100/v100),
its ptxas usage checked against the preset, its loop IR verified in the GPU emulator
against the float64 reference (Winograd within its error bound), and its time predicted by
`wpk.kernels.cuda.analytic.predict_generated` with the on-chip work counted from the loop
IR; the Winograd rows count the three stages' FLOPs and workspace traffic
(`analytic.winograd_work`) instead of the direct convolution's. The implicit GEMM is the
best of its first `--count` preferred configs, each Winograd m its preferred config. The
"cudnn*" column is the model's placeholder (roofline at an ASSUMED efficiency), not a
cuDNN measurement. Nothing here is measured: a GPU run (scripts/bench_gpu.py) decides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from predict_cuda_convs import label, resnet_conv_workloads  # noqa: E402


def is_3x3_stride_1(workload) -> bool:
    """A ResNet conv Winograd computes (3x3 window, stride 1)."""
    from wpk.kernels.cuda.winograd import winograd_reason

    return winograd_reason(workload) is None


def predicted(workload, candidate, runner) -> dict:
    """Compile, check, emulate and predict one candidate: a cell of the table."""
    result = runner.measure(workload, candidate)
    if result.status != "ok":
        return {"config": candidate.config, "status": str(result.status),
                "message": result.message}
    usage = result.extra["usage"]
    return {"config": {k: v for k, v in candidate.config.items() if k != "gpu"},
            "status": "ok", "predicted_us": result.median_s * 1e6,
            "rel_l2_error": result.rel_l2_error,
            "registers": max(u["registers"] for u in usage.values()),
            "spills": any(u["spill_stores"] or u["spill_loads"] for u in usage.values()),
            "model": result.extra["model"]}


def best(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["status"] == "ok"]
    return min(ok, key=lambda r: r["predicted_us"]) if ok else None


def cell(row: dict | None) -> str:
    return f"{row['predicted_us']:.1f}" if row else "rejected"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--count", type=int, default=3,
                        help="implicit-GEMM configs tried (the best is shown)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    from wpk.core.devices import gpu_preset
    from wpk.kernels.cuda.analytic import predict_vendor
    from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs
    from wpk.kernels.cuda.winograd import WINOGRAD_CUDA, preferred_winograd_configs
    from wpk.kernels.registry import Candidate
    from wpk.search.predicted import PredictedRunner

    gpu = gpu_preset(args.gpu)
    runner = PredictedRunner(gpu)
    rows = []
    print(f"PREDICTED by the analytical model for {gpu.name} ({gpu.arch}); no GPU "
          "measurement\n")
    print("| conv (batch 1) | n | implicit GEMM us* | F(2x2,3x3) us* | F(4x4,3x3) us* "
          "| cudnn us* | best / implicit GEMM |")
    print("|---|---|---|---|---|---|---|")
    for workload, count in resnet_conv_workloads():
        if not is_3x3_stride_1(workload):
            continue
        direct = [predicted(workload, Candidate(DSL_CUDA, c), runner)
                  for c in preferred_configs(workload, gpu, args.count)]
        wino = {c["m"]: predicted(workload, Candidate(WINOGRAD_CUDA, c), runner)
                for c in preferred_winograd_configs(workload, gpu, 2)}
        vendor = predict_vendor(workload, gpu, "cudnn").seconds * 1e6
        gemm = best(direct)
        f2, f4 = (wino.get(m) if wino.get(m, {}).get("status") == "ok" else None
                  for m in (2, 4))
        fastest = best([r for r in (f2, f4) if r])
        ratio = (f"{gemm['predicted_us'] / fastest['predicted_us']:.2f}x"
                 if gemm and fastest else "-")
        print(f"| {label(workload)} | {count} | {cell(gemm)} | {cell(f2)} | {cell(f4)} "
              f"| {vendor:.1f} | {ratio} |", flush=True)
        rows.append({"workload": label(workload), "count": count, "implicit_gemm": direct,
                     "winograd": {str(m): r for m, r in wino.items()},
                     "cudnn_placeholder_us": vendor})
    runner.close()
    print("\n* predicted, not measured; cudnn = roofline at the model's assumed efficiency; "
          "best / implicit GEMM > 1: Winograd predicted faster")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"gpu": gpu.name, "arch": gpu.arch, "predicted": True, "rows": rows},
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
