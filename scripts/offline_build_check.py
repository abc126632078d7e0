"""Offline CUDA builds of the onnx wheel's light models, checked (no GPU needed).

    python scripts/offline_build_check.py [--models light_squeezenet light_resnet50]
                                          [--gpus h100 p100] [--out DIR] [--json FILE]

For every model and preset: `wpk build MODEL --gpu PRESET --offline`, then
checks that every generated kernel of the plan is a cubin for the preset's
arch and that every generated candidate passed the emulator, and prints the
build time, the step counts by implementation and the predicted latency.
Exit code 1 when a check fails. Slow (minutes per model): not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnx

from wpk.core.devices import gpu_preset
from wpk.kernels.cuda.offline import cubin_arch
from wpk.pipeline import build

GENERATED = ("dsl.cuda", "dsl.cuda.winograd")   # generated CUDA kernels (implicit GEMM, Winograd)
LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light"


def check_plan(plan, arch: str) -> list[str]:
    """Problems found in an offline plan (empty when every check passes)."""
    problems = []
    for step in plan.manifest["steps"]:
        if step["impl"] not in GENERATED:
            continue
        cubins = [m for m in step["artifacts"] if m.endswith("kernel.cubin")]
        if not cubins:
            problems.append(f"{step['node']}: no cubin")
        elif cubin_arch(plan.kernels[cubins[0]]) != arch:
            problems.append(f"{step['node']}: cubin for {cubin_arch(plan.kernels[cubins[0]])}")
    for entry in plan.report["workloads"]:
        for cand in entry["candidates"]:
            if cand["impl"] in GENERATED and cand["status"] == "ok" \
                    and "emulator" not in cand["message"]:
                problems.append(f"{cand['label']}: not emulator-verified")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["light_squeezenet", "light_resnet50"])
    parser.add_argument("--gpus", nargs="+", default=["h100", "p100"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="wpk-offline-"))
    results, failed = [], False
    for model in args.models:
        for name in args.gpus:
            gpu = gpu_preset(name)
            started = time.perf_counter()
            plan = build(str(LIGHT / f"{model}.onnx"), target="cuda", gpu=name, offline=True,
                         output=str(out / f"{model}_{name}.wpk"), progress=False)
            seconds = time.perf_counter() - started
            problems = check_plan(plan, gpu.arch)
            failed |= bool(problems)
            impls = Counter(step["impl"] for step in plan.manifest["steps"])
            rejected = sum(1 for w in plan.report["workloads"] for c in w["candidates"]
                           if c["impl"] in GENERATED and c["status"] != "ok")
            result = {"model": model, "gpu": name, "arch": gpu.arch, "build_s": seconds,
                      "steps": dict(impls), "rejected_generated": rejected,
                      "predicted_latency_s": plan.report["totals"]["latency_s"],
                      "problems": problems}
            results.append(result)
            print(f"{model} {name} ({gpu.arch}): built in {seconds:.1f} s, steps {dict(impls)}, "
                  f"{rejected} generated candidates rejected, predicted latency "
                  f"{1e3 * result['predicted_latency_s']:.3f} ms, "
                  f"{'OK' if not problems else 'FAILED: ' + '; '.join(problems[:5])}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
