"""PREDICTED (analytical model, no GPU) times of wpk's fused CUDA kernels against the
unfused steps they replace, for every GPU preset: the attention of the suite's transformer
encoder and BERT-base-sized layers (seq 128 and 512), and the distinct inverted-residual
blocks of the MobileNet-v2-like model (224x224, batch 1).

    python scripts/predict_cuda_fused.py [--gpu h100 --gpu p100 ...] [--count 3]
                                          [--json benchmarks/results/cuda_fused_predicted.json]

For each workload and preset, the first `--count` valid configs of the fused kernel are
compiled for the preset (nvcc, or NVRTC 12 + ptxas for p100/v100), their ptxas usage
checked against the preset, emulator-verified against the float64 reference (sampled
blocks for big grids) and predicted (`wpk.search.predicted.PredictedRunner`, the runner
of `wpk build --offline`); the unfused peer is the model's prediction of the separate
steps (cuBLAS Q K^T, softmax, cuBLAS P V; three cuDNN convs), whose efficiencies are
ASSUMPTIONS of `wpk.kernels.cuda.analytic`. Nothing here is measured: `wpk tune` on
the GPU decides. The machine this runs on only changes how long it takes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def attention_workloads() -> list[tuple[str, object]]:
    """The fused Attention workload of each transformer model (after the CUDA passes)."""
    from models import bert_base_layer, transformer_encoder

    from wpk.frontend import load_model
    from wpk.passes import optimize
    from wpk.workloads import extract_workloads

    found = []
    for name, model in [("transformer_encoder s64 d256", transformer_encoder()),
                        ("bert_base_layer s128 d768", bert_base_layer()),
                        ("bert_base_layer s512 d768", bert_base_layer(seq_len=512))]:
        graph, _ = optimize(load_model(model), "cuda")
        items = [i for i in extract_workloads(graph) if i.workload.op == "Attention"]
        found.append((name, items[0].workload))
    return found


def block_workloads() -> list[tuple[str, object]]:
    """The distinct InvertedResidualNCHW workloads of MobileNet-v2-like (224, batch 1)."""
    from models import mobilenet_v2_like

    from wpk.frontend import load_model
    from wpk.passes import optimize
    from wpk.workloads import distinct, extract_workloads

    graph, _ = optimize(load_model(mobilenet_v2_like()), "cuda")
    found = {}
    for items in distinct(extract_workloads(graph)).values():
        w = items[0].workload
        if w.op == "InvertedResidualNCHW":
            a = dict(w.attrs)
            x, y = w.inputs[0].shape, w.outputs[0].shape
            name = (f"mbv2 {x[1]}->{a['expanded']}->{y[1]} s{a['stride']} "
                    f"@{y[2]}x{y[3]}{' +res' if a['residual'] else ''}")
            found.setdefault(name, w)    # one per shape (keys differ by weights' origin)
    return list(found.items())


def row(name: str, workload, gpu, count: int) -> dict:
    """Every fused config and the unfused peer of one workload on one preset."""
    from wpk.kernels.cuda.fused import FUSED_CUDA, fused_candidates
    from wpk.kernels.flops import workload_flops
    from wpk.search.predicted import PredictedRunner

    runner = PredictedRunner(gpu)
    flops = workload_flops(workload)
    fused, peer = [], None
    for candidate in fused_candidates(workload, gpu, count):
        m = runner.measure(workload, candidate)
        entry = {"impl": m.impl, "config": {k: v for k, v in m.config.items() if k != "gpu"},
                 "status": m.status.value, "predicted_us": m.median_s * 1e6 if m.ok else None,
                 "message": m.message[:200]}
        if candidate.implementation is FUSED_CUDA:
            entry["registers"] = max((u["registers"] for u in m.extra.get("usage", {})
                                      .values()), default=None)
            fused.append(entry)
        else:
            peer = entry
    ok = [f for f in fused if f["predicted_us"]]
    best = min(ok, key=lambda f: f["predicted_us"]) if ok else None
    speedup = peer["predicted_us"] / best["predicted_us"] if best and peer else None
    return {"workload": name, "gpu": gpu.name, "flops": flops, "fused": fused,
            "unfused": peer, "best_fused": best,
            "fused_gflops": flops / best["predicted_us"] / 1e3 if best else None,
            "predicted_speedup": speedup}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="append", default=None,
                        help="preset (repeatable; default every preset)")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--only", choices=("attention", "blocks"), default=None)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    from wpk.core.devices import GPU_PRESETS, gpu_preset

    presets = [gpu_preset(g) for g in (args.gpu or list(GPU_PRESETS))]
    workloads = ([] if args.only == "blocks" else attention_workloads()) + \
        ([] if args.only == "attention" else block_workloads())
    rows, started = [], time.time()
    print("| preset | workload | best fused config | fused us* | unfused us* | "
          "fused GFLOP/s* | speedup* |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for gpu in presets:
        for name, workload in workloads:
            r = row(name, workload, gpu, args.count)
            rows.append(r)
            best, peer = r["best_fused"], r["unfused"]
            print(f"| {gpu.name} | {name} | {best['config'] if best else 'none valid'} | "
                  f"{best['predicted_us']:.1f} | " if best else f"| {gpu.name} | {name} | "
                  "none valid | - | ", end="")
            print(f"{peer['predicted_us']:.1f} | " if peer else "- | ", end="")
            print(f"{r['fused_gflops']:.0f} | {r['predicted_speedup']:.2f}x |"
                  if best and peer else "- | - |", flush=True)
    print("\n* predicted by wpk's analytical model (assumed efficiencies), not measured")
    if args.json:
        doc = {"what": "predicted, not measured (wpk.kernels.cuda.analytic)",
               "command": "python scripts/predict_cuda_fused.py " + " ".join(argv or
                                                                            sys.argv[1:]),
               "host": platform.node(), "seconds": round(time.time() - started, 1),
               "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
