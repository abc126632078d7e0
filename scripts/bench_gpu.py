"""GPU benchmark: wpk against cuDNN, cuBLAS, PyTorch eager and torch.compile, in one run.

    python scripts/bench_gpu.py [--quick] [--out DIR] [--trials N] [--rounds N]

Per operator: the distinct convolution workloads of ResNet-50 at batch 1 (float32, as wpk's
passes leave them: bias, ReLU and residual Add fused), each computed by
  * wpk's generated kernel: the template's first `--trials` valid configs for the GPU's
    preset (its preferred order), the fastest verified one kept (a brief tuning, not GA);
  * cuDNN: every execution plan the heuristics offer, the fastest kept (like cudnnFind);
  * cuBLAS im2col: an im2col kernel and one batched GEMM.
Every candidate is verified against the float64 reference first; then the winners are timed
alternately (A B C, `--rounds` rounds) with CUDA events and L2 flushes; medians and ratios.

End to end: ResNet-50, SqueezeNet and AlexNet (the `light` ONNX models): the wpk plan (built
--offline for the preset, then `wpk tune` on this GPU, loaded as a CUDA-graph session)
against PyTorch eager (cudnn.benchmark on) and torch.compile(mode="max-autotune") on
hand-written equivalent modules (scripts/torch_models.py: same layers and shapes, random
weights; latency does not depend on the weights). TF32 is off in torch, so every contender
computes in float32. Each contender's time is host to host (input copied in, output copied
out, synchronised), alternating contenders in rounds; medians and ratios.

Results are written after every measurement to `gpu-<device>-<date>.json` in `--out` and in
benchmarks/results/, with the device description, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks",
                           "results")
E2E_MODELS = ["squeezenet", "resnet50", "bvlc_alexnet"]


class Results:
    """The JSON document, rewritten after every addition."""

    def __init__(self, paths: list[str], header: dict):
        self.paths, self.data = paths, dict(header, operators=[], end_to_end=[])

    def add(self, section: str, row: dict) -> None:
        self.data[section].append(row)
        self.save()

    def save(self) -> None:
        for path in self.paths:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as handle:
                json.dump(self.data, handle, indent=1, default=str)
            os.replace(path + ".tmp", path)


def resnet_conv_workloads() -> list[tuple[object, int]]:
    """Distinct Conv workloads of ResNet-50 (batch 1) after wpk's passes, with their counts."""
    from torch_models import onnx_path

    from wpk.frontend import load_model
    from wpk.passes import optimize
    from wpk.workloads import distinct, extract_workloads

    graph, _ = optimize(load_model(onnx_path("resnet50")), "cuda")
    groups = distinct(extract_workloads(graph))
    return [(items[0].workload, len(items)) for items in groups.values()
            if items[0].workload.op == "Conv"]


def _flops(workload) -> float:
    out = workload.outputs[0].shape
    w = workload.inputs[1].shape
    return 2.0 * np.prod(out) * np.prod(w[1:])


def best_of(workload, candidates, rng) -> tuple[object, object, list]:
    """(candidate, measurement) of the fastest verified candidate, and every measurement."""
    from wpk.search.measure_cuda import measure_candidate

    measured = [(c, measure_candidate(workload, c, rng=rng, repeats=5, max_repeats=20,
                                      min_time=0.01)) for c in candidates]
    ok = [(c, m) for c, m in measured if m.ok]
    if not ok:
        return None, None, [m for _, m in measured]
    c, m = min(ok, key=lambda pair: pair[1].median_s)
    return c, m, [m for _, m in measured]


def operator_row(workload, count, gpu, trials, rounds, rng) -> dict:
    from wpk.kernels import registry
    from wpk.kernels.cuda.cupy_support import require_cupy
    from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.registry import Candidate
    from wpk.search.measure_cuda import L2Flusher, summarize, time_gpu

    cupy = require_cupy("the GPU benchmark")
    contenders: dict[str, list] = {
        "cudnn": [Candidate(registry.get("cudnn"), c)
                  for c in registry.get("cudnn").configs(workload)],
        "cublas_im2col": [Candidate(registry.get("cublas.im2col"), {})]
        if registry.get("cublas.im2col").unsupported_reason(workload) is None else [],
    }
    try:
        contenders["wpk_generated"] = [Candidate(DSL_CUDA, c)
                                       for c in preferred_configs(workload, gpu, trials)]
    except Exception as exc:
        contenders["wpk_generated"] = []
        print(f"  generated: no configs ({exc})")
    row = {"workload": workload.label, "key": workload.key, "count": count,
           "gflop": _flops(workload) / 1e9, "contenders": {}}
    winners = {}
    for name, candidates in contenders.items():
        best, m, all_ms = best_of(workload, candidates, rng)
        entry = {"tried": len(candidates), "verified": sum(x.ok for x in all_ms)}
        if best is None:
            entry["error"] = "; ".join(sorted({x.message[:160] for x in all_ms})) or "none"
        else:
            entry["config"] = dict(best.config)
            winners[name] = best
        row["contenders"][name] = entry
    host = random_inputs(workload, rng)
    device = [None if a is None else cupy.asarray(a) for a in host]
    consts = {i: device[i] for i in workload.const_inputs if device[i] is not None}
    kernels = {n: c.implementation.prepare(workload, consts, c.config)
               for n, c in winners.items()}
    outputs = [cupy.empty(s.shape, s.dtype) for s in workload.outputs]
    flush = L2Flusher(cupy)
    times: dict[str, list] = {n: [] for n in kernels}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            times[name] += time_gpu(kernel, device, outputs, flush=flush, warmup=1,
                                    repeats=5, max_repeats=5, min_time=0.0)
    for name, values in times.items():
        median, spread = summarize(values)
        row["contenders"][name].update(median_s=median, spread_s=spread,
                                       gflops=row["gflop"] / median)
    base = row["contenders"].get("cudnn", {}).get("median_s")
    for entry in row["contenders"].values():
        if base and entry.get("median_s"):
            entry["speedup_vs_cudnn"] = base / entry["median_s"]
    return row


def wpk_session(name: str, gpu, budget: float, folder: str):
    from torch_models import onnx_path

    import wpk
    from wpk.commands.tune import tune_plan

    path = os.path.join(folder, f"{name}.wpk")
    plan = wpk.build(onnx_path(name), target="cuda", gpu=gpu.name, offline=True,
                     progress=False)
    plan.save(path)
    summary = tune_plan(path, trials=2, budget=budget)
    return wpk.load(path), summary


def end_to_end_row(name: str, gpu, budget: float, rounds: int, runs: int,
                   compile_mode: str | None, folder: str) -> dict:
    import torch
    from torch_models import TORCH_MODELS

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    from torch_models import check_against_onnx

    row: dict = {"model": name, "contenders": {}, "torch_vs_onnx": check_against_onnx(name)}
    started = time.perf_counter()
    session, summary = wpk_session(name, gpu, budget, folder)
    row["wpk_build_and_tune_s"] = time.perf_counter() - started
    row["tune"] = summary
    [meta] = session.get_inputs()
    x = np.random.default_rng(0).standard_normal(meta.shape).astype(np.float32)
    module = TORCH_MODELS[name]().cuda().eval()
    contenders = {"wpk": lambda: session.run({meta.name: x})}

    def torch_call(model):
        def call():
            with torch.no_grad():
                return model(torch.from_numpy(x).cuda(non_blocking=False)).cpu()
        return call

    contenders["torch_eager"] = torch_call(module)
    if compile_mode:
        started = time.perf_counter()
        compiled = torch.compile(module, mode=compile_mode)
        torch_call(compiled)()  # compiles (and autotunes)
        row[f"torch_compile_{compile_mode}_s"] = time.perf_counter() - started
        contenders[f"torch_compile_{compile_mode}"] = torch_call(compiled)
    for call in contenders.values():
        for _ in range(3):
            call()
    times: dict[str, list] = {n: [] for n in contenders}
    for _ in range(rounds):
        for n, call in contenders.items():
            for _ in range(runs):
                t0 = time.perf_counter()
                call()
                times[n].append(time.perf_counter() - t0)
    for n, values in times.items():
        q25, median, q75 = np.percentile(values, [25, 50, 75])
        row["contenders"][n] = {"median_s": float(median), "spread_s": [float(q25), float(q75)]}
    row["wpk_session"] = session_detail(session, {meta.name: x})
    wpk_median = row["contenders"]["wpk"]["median_s"]
    for entry in row["contenders"].values():
        entry["wpk_speedup"] = entry["median_s"] / wpk_median
    return row


def session_detail(session, feeds: dict) -> dict:
    """What explains the plan's time: its CUDA-graph segments (host steps run between them),
    segments whose capture failed, and every step's median alone (CUDA events)."""
    steps = session.profile(feeds)
    return {"segments": [{"device": device, "steps": len(indices)}
                         for device, indices in session.segments],
            "capture_errors": {str(k): v for k, v in session.capture_errors.items()},
            "steps_sum_s": sum(r["median_s"] for r in steps),
            "steps": sorted(steps, key=lambda r: -r["median_s"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="4 convolutions; torch.compile on SqueezeNet only")
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tune-budget", type=float, default=60.0)
    parser.add_argument("--models", nargs="*", default=E2E_MODELS)
    parser.add_argument("--operators", type=int, default=None,
                        help="how many convolution workloads (most frequent first; 0: none)")
    parser.add_argument("--compile-mode", default="max-autotune",
                        help="torch.compile mode ('' to skip torch.compile)")
    args = parser.parse_args(argv)

    from wpk.core.devices import GPU_PRESETS, detect_gpus
    from wpk.core.errors import WpkError
    from wpk.kernels.cuda.cupy_support import device_description

    try:
        device = device_description()
    except WpkError as exc:
        print(f"error: {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return 2
    presets = [g.preset for g in detect_gpus() if g.preset]
    if not presets:
        print(f"no wpk preset for {device['name']}", file=sys.stderr)
        return 2
    gpu = GPU_PRESETS[presets[0]]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    filename = f"gpu-{gpu.name}-{stamp}.json"
    paths = sorted({os.path.join(args.out, filename), os.path.join(RESULTS_DIR, filename)})
    results = Results(paths, {"device": device, "preset": gpu.name, "quick": args.quick,
                              "date": stamp, "method": __doc__})
    rng = np.random.default_rng(0)
    workloads = resnet_conv_workloads()
    count = 4 if args.quick and args.operators is None else args.operators
    if count is not None:
        workloads = sorted(workloads, key=lambda pair: -pair[1])[:count]
    for workload, count in workloads:
        print(f"operator {workload.label} x{count}", flush=True)
        try:
            row = operator_row(workload, count, gpu, args.trials, args.rounds, rng)
        except Exception as exc:
            row = {"workload": workload.label, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}
        print("  " + json.dumps({k: v.get("median_s", v.get("error"))
                                 for k, v in row.get("contenders", {}).items()}), flush=True)
        results.add("operators", row)
    folder = tempfile.mkdtemp(prefix="wpk-bench-plans-")  # plans are big: not in --out
    for index, name in enumerate(args.models):
        mode = args.compile_mode if (not args.quick or index == 0) else ""
        print(f"end to end {name}", flush=True)
        try:
            row = end_to_end_row(name, gpu, args.tune_budget, args.rounds, 10, mode or None,
                                 folder)
        except Exception as exc:
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}
        print("  " + json.dumps({k: v.get("median_s") for k, v in
                                 row.get("contenders", {}).items()} or row.get("error")),
              flush=True)
        results.add("end_to_end", row)
    results.data["goals"] = goals(results.data)
    results.save()
    print(json.dumps(results.data["goals"], indent=1))
    print("results:", ", ".join(paths))
    return 0


def goals(data: dict) -> dict:
    """Issue 5's goals read off the results: the generated kernel beats cuDNN's best engine
    on at least a third of the convolution workloads, and the plan's latency is at most
    0.8x PyTorch eager's on ResNet-50."""
    compared = [row["contenders"] for row in data["operators"]
                if row.get("contenders", {}).get("wpk_generated", {}).get("median_s")
                and row["contenders"].get("cudnn", {}).get("median_s")]
    wins = sum(c["wpk_generated"]["median_s"] < c["cudnn"]["median_s"] for c in compared)
    summary: dict = {"generated_beats_cudnn": f"{wins} of {len(compared)} workloads",
                     "generated_goal_met": bool(compared) and 3 * wins >= len(compared)}
    for row in data["end_to_end"]:
        contenders = row.get("contenders", {})
        if "wpk" in contenders and "torch_eager" in contenders:
            ratio = contenders["wpk"]["median_s"] / contenders["torch_eager"]["median_s"]
            summary[f"{row['model']}_wpk_over_eager"] = round(ratio, 3)
            if row["model"] == "resnet50":
                summary["resnet50_goal_met"] = ratio <= 0.8
    return summary


if __name__ == "__main__":
    sys.exit(main())
