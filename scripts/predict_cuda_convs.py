"""PREDICTED (analytical model, no GPU) times of wpk's generated CUDA kernels for the
distinct ResNet-50 convolutions at batch 1 (float32): the schedule the CUDA conv template
preferred before the register-tiled implicit GEMM (one output channel tile per thread,
`tile_x=1, fuse_yx=0, split_c=1`) against the best of the first `--count` configs of its
current preferred order (what `preferred_configs` and a short search try first).

    python scripts/predict_cuda_convs.py [--gpu h100] [--count 3] [--json FILE]

Every config is compiled for the preset with nvcc (ptxas registers and spills shown) and
predicted by `wpk.kernels.cuda.analytic.predict_generated` with the on-chip work counted
from its loop IR (`wpk.kernels.cuda.traffic`). The "cudnn*" column is the model's
placeholder for cuDNN (roofline at an ASSUMED efficiency), not a cuDNN measurement.
Nothing here is measured: a GPU run (scripts/bench_gpu.py) decides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def resnet_conv_workloads() -> list[tuple[object, int]]:
    """Distinct Conv workloads of ResNet-50 (batch 1) after wpk's passes, with counts."""
    import onnx

    from wpk.frontend import load_model
    from wpk.passes import optimize
    from wpk.workloads import distinct, extract_workloads

    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_resnet50.onnx")
    graph, _ = optimize(load_model(path), "cuda")
    groups = distinct(extract_workloads(graph))
    return [(items[0].workload, len(items)) for items in groups.values()
            if items[0].workload.op == "Conv"]


def old_preferred(template) -> dict | None:
    """The first valid config of the CUDA conv template's order before the 2-D tiles."""
    legacy = [p for p in template.space().points()
              if p["tile_x"] == 1 and p["fuse_yx"] == 0 and p["split_c"] == 1]
    legacy.sort(key=lambda p: (p["threads_x"] * p["threads_y"] not in (64, 128, 256),
                               p["tile_k"] != 4, p["cache_input"], p["cache_weight"]))
    return next((p for p in legacy[:400] if template.validate(p) is None), None)


def predict(workload, config: dict, gpu) -> dict:
    """Compile `config` with nvcc, count its work, predict it: a row of the table."""
    from wpk.kernels.cuda.analytic import predict_generated
    from wpk.kernels.cuda.generated import build_for
    from wpk.kernels.cuda.traffic import kernel_work

    built = build_for(workload, dict(config, gpu=gpu.name))
    usage = built.binary.kernels
    work = {k.name: kernel_work(k) for k in built.func.kernels}
    pred = predict_generated(workload, gpu, built.launches, usage, work)
    return {"config": {k: v for k, v in config.items() if k != "gpu"},
            "predicted_us": pred.seconds * 1e6,
            "registers": max(u.registers for u in usage.values()),
            "spills": any(u.spills for u in usage.values()),
            "grid": [list(item.launch.grid) for item in built.launches]}


def label(workload) -> str:
    x, w = workload.inputs[0].shape, workload.inputs[1].shape
    y = workload.outputs[0].shape
    stride = dict(workload.attrs).get("strides", (1, 1))[0]
    return f"{w[2]}x{w[3]}/s{stride} {x[1]}->{y[1]} @{y[2]}x{y[3]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    from wpk.core.devices import gpu_preset
    from wpk.kernels.cuda.analytic import predict_vendor
    from wpk.kernels.cuda.generated import cuda_template, preferred_configs

    gpu = gpu_preset(args.gpu)
    rows = []
    print(f"PREDICTED by the analytical model for {gpu.name} (no GPU measurement)\n")
    print("| conv (batch 1) | n | old us* | new us* | old/new | cudnn us* | new config "
          "| regs | spills |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, count in resnet_conv_workloads():
        template = cuda_template(workload, gpu)
        old = predict(workload, old_preferred(template), gpu)
        new = [predict(workload, c, gpu) for c in preferred_configs(workload, gpu, args.count)]
        best = min(new, key=lambda r: r["predicted_us"])
        vendor = predict_vendor(workload, gpu, "cudnn").seconds * 1e6
        knobs = best["config"]
        short = (f"{knobs['tile_k']}x{knobs['tile_x']} bk{knobs['block_k']} "
                 f"t{knobs['threads_x']}x{knobs['threads_y']} c{knobs['tile_c']} "
                 f"f{knobs['fuse_yx']} s{knobs['split_c']}")
        print(f"| {label(workload)} | {count} | {old['predicted_us']:.1f} | "
              f"{best['predicted_us']:.1f} | {old['predicted_us'] / best['predicted_us']:.1f} "
              f"| {vendor:.1f} | {short} | {best['registers']} | {best['spills']} |",
              flush=True)
        rows.append({"workload": label(workload), "count": count, "old": old, "new": new,
                     "cudnn_placeholder_us": vendor})
    print("\n* predicted, not measured; cudnn = roofline at the model's assumed efficiency")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"gpu": gpu.name, "predicted": True, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
