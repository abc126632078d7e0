"""The main job on a bundled model: build, run, check and report, through the CLI.

    python scripts/demo.py [--model light_resnet50] [--weights random|shipped] [--workdir DIR]

Takes a model shipped in the onnx wheel (`onnx/backend/test/data/light/`),
runs `wpk build --cpu`, `wpk run` on seeded random inputs, compares the
outputs with onnxruntime (ORT_ENABLE_ALL) on the same inputs, and prints the
per-operator benchmark report (`wpk report`). Exits non-zero if any step
fails or the relative L2 error exceeds 1e-4.

The light models ship every weight as `ConstantOfShape(0.02)`: all channels are equal
and ResNet-50's softmax is 0.001 everywhere whatever the input, so a comparison of the
shipped model proves little. By default (`--weights random`) the demo builds a copy
with seeded random weights and calibrated BatchNorm instead (`tests/models.py
randomize_light_weights`, as the accuracy tests do), written next to the plan.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wpk(*args: str) -> None:
    """Run the wpk CLI, echoing the command; stop on failure."""
    command = [sys.executable, "-m", "wpk.cli", *args]
    print("$ wpk " + " ".join(args), flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        sys.exit(result.returncode)


def onnxruntime_outputs(model_path: str, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # the light models carry an unused initializer
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def random_weights_copy(model: str, path: str) -> str:
    """`model` with seeded random weights and calibrated BatchNorm, saved at `path`."""
    sys.path.insert(0, ROOT)   # tests.models
    from tests.models import randomize_light_weights

    onnx.save(randomize_light_weights(onnx.load(model)), path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="light_resnet50",
                        help="name of a model in onnx/backend/test/data/light")
    parser.add_argument("--weights", choices=("random", "shipped"), default="random",
                        help="seeded random weights (default) or the file's own")
    parser.add_argument("--workdir", help="where to write plan, inputs and outputs")
    args = parser.parse_args(argv)
    model = os.path.join(LIGHT, f"{args.model}.onnx")
    if not os.path.exists(model):
        known = sorted(name[:-5] for name in os.listdir(LIGHT) if name.endswith(".onnx"))
        print(f"error: no model {args.model!r} in {LIGHT} (hint: one of {', '.join(known)})",
              file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="wpk-demo-")
    os.makedirs(workdir, exist_ok=True)
    if args.weights == "random":
        model = random_weights_copy(model, os.path.join(workdir, "model.onnx"))
    names = ("model.wpk", "x.npz", "y.npz")
    plan, inputs, outputs = (os.path.join(workdir, name) for name in names)

    graph_inputs = onnx.load(model, load_external_data=False).graph
    initializers = {i.name for i in graph_inputs.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for value in graph_inputs.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.random(shape, dtype=np.float32)
    np.savez(inputs, **feeds)

    wpk("build", model, "--cpu", "-o", plan)
    wpk("run", plan, "--inputs", inputs, "--output", outputs, "--warmup", "3", "--repeat", "20")
    expected = onnxruntime_outputs(model, feeds)
    with np.load(outputs) as got:
        worst = 0.0
        for name, ref in expected.items():
            diff = np.linalg.norm(got[name].astype(np.float64) - ref)
            worst = max(worst, float(diff / max(np.linalg.norm(ref), 1e-30)))
            print(f"{name}: onnxruntime's values spread {float(np.std(ref)):.3g} (std)")
    print(f"relative L2 error vs onnxruntime: {worst:.2e}")
    wpk("report", plan)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
