"""Which steps of a GPU plan run on the host: an offline audit, no GPU needed.

    python scripts/audit_gpu_plans.py [--gpu h200] [MODEL ...]

MODEL is a light model's name (`squeezenet`, `bvlc_alexnet`, ...: onnx's bundled
`light_*.onnx`), a corpus model's name (`corpus_dbnet_paddle`, built at the tests' size)
or a path to an .onnx file; none: the nine light models. Each is built `--offline` for the
preset; printed: its predicted latency (sum of the chosen steps' predictions), the
workload with the largest share of it, and its host steps per op (kind `fallback`: an op
with no device kernel, run by numpy between two CUDA graphs, a copy out and back each
time). On an H200, AlexNet's two LRN steps made its plan 4.8x slower than PyTorch eager;
an audit of this kind then found DenseNet-121's 62 BatchNormalizations. Exit code 1 when
any model has a host step or fails to build.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                         # tests.corpus
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # torch_models.onnx_path

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]


def load(name: str):
    """(model, input shapes or None) for a light name, corpus_NAME or a path."""
    if name.startswith("corpus_"):
        from tests import corpus

        short = name[len("corpus_"):]
        return corpus.build_model(short, "ci"), corpus.input_shapes(short, "ci")
    if os.path.exists(name):
        return name, None
    from torch_models import onnx_path

    return onnx_path(name), None


def audit(name: str, gpu: str) -> dict:
    """{'model', 'steps', 'host': {op: count}, 'seconds'} or {'model', 'error'}."""
    import wpk
    from wpk.core.errors import WpkError

    started = time.perf_counter()
    try:
        model, shapes = load(name)
        plan = wpk.build(model, target="cuda", gpu=gpu, offline=True, progress=False,
                         input_shapes=shapes)
    except (WpkError, OSError, ValueError) as exc:
        return {"model": name, "error": f"{type(exc).__name__}: {exc}"}
    host = collections.Counter(s.op for s in plan.steps if s.kind == "fallback")
    report = plan.report
    top = max(report["workloads"], key=lambda w: w["share"], default=None)
    return {"model": name, "steps": len(plan.steps), "host": dict(host),
            "predicted_ms": round(1e3 * report["totals"]["latency_s"], 3),
            "largest": None if top is None else
            f"{top['label']} ({top['chosen']}, {100 * top['share']:.0f}%)",
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200", help="the preset to build for")
    parser.add_argument("models", nargs="*", default=LIGHT)
    args = parser.parse_args(argv)
    status = 0
    for name in args.models:
        row = audit(name, args.gpu)
        if "error" in row:
            print(f"{name}: build failed: {row['error']}", flush=True)
            status = 1
            continue
        host = ", ".join(f"{op} x{n}" for op, n in sorted(row["host"].items())) or "none"
        print(f"{name}: {row['steps']} steps, host steps: {host}, predicted "
              f"{row['predicted_ms']} ms, largest share: {row['largest']} "
              f"({row['seconds']} s)", flush=True)
        status |= bool(row["host"])
    return status


if __name__ == "__main__":
    sys.exit(main())
