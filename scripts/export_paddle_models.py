#!/usr/bin/env python
"""Export PaddlePaddle's vision models to ONNX with paddle2onnx, as a Paddle user would, for
`bench_e2e.py --models FILE.onnx` (the survey of real paddle2onnx graphs in the README).

PaddlePaddle is no dependency of wpk (it pins its own numpy and protobuf); install it in a
virtual environment of its own and run this script with that environment's Python:

    python -m venv /tmp/pd && /tmp/pd/bin/pip install paddlepaddle paddle2onnx
    /tmp/pd/bin/python scripts/export_paddle_models.py --out /tmp/paddle
    python scripts/bench_e2e.py --ort-spinning --block 3 --rounds 10 \\
        --models $(ls /tmp/paddle/*.onnx | paste -sd,)

Each model of `paddle.vision.models` is built with `pretrained=False` (seeded random
initial weights, no download), put in eval mode and exported by `paddle.onnx.export`
(paddle2onnx) at opset 17 with input `x` of shape (batch, 3, size, size), the batch left
open.
"""

from __future__ import annotations

import sys
from pathlib import Path

from model_exports import export_main

# model name -> (constructor in paddle.vision.models, image size)
MODELS = {
    "mobilenet_v1": ("mobilenet_v1", 224),
    "mobilenet_v2": ("mobilenet_v2", 224),
    "mobilenet_v3_large": ("mobilenet_v3_large", 224),
    "shufflenet_v2": ("shufflenet_v2_x1_0", 224),
    "resnet50": ("resnet50", 224),
    "resnext50": ("resnext50_32x4d", 224),
    "densenet121": ("densenet121", 224),
    "googlenet": ("googlenet", 224),
    "inception_v3": ("inception_v3", 299),
    "squeezenet": ("squeezenet1_1", 224),
}


def export(name: str, out: Path) -> Path:
    """Paddle vision model `name` exported by paddle2onnx to OUT/name.onnx."""
    import paddle

    paddle.seed(0)
    constructor, size = MODELS[name]
    model = getattr(paddle.vision.models, constructor)(pretrained=False)
    model.eval()
    spec = [paddle.static.InputSpec([None, 3, size, size], "float32", "x")]
    target = out / name
    try:
        paddle.onnx.export(model, str(target), input_spec=spec, opset_version=17)
    except Exception as exc:  # noqa: BLE001 - paddle2onnx raises many types
        raise RuntimeError(f"paddle2onnx failed on {name}: {exc}") from exc
    return target.with_suffix(".onnx")


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__.split("\n\n")[0], MODELS, ("paddle", "paddle2onnx"),
                       "python -m venv /tmp/pd && /tmp/pd/bin/pip install paddlepaddle "
                       "paddle2onnx, then run this script with /tmp/pd/bin/python",
                       export, {"GLOG_minloglevel": "2"})


if __name__ == "__main__":
    sys.exit(main())
