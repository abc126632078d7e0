#!/usr/bin/env python
"""Export Keras' application models to ONNX with tf2onnx, as a TensorFlow user would, for
`bench_e2e.py --models FILE.onnx` (the survey of real tf2onnx graphs in the README).

TensorFlow is no dependency of wpk (it pins its own numpy); install it in a virtual
environment of its own and run this script with that environment's Python:

    python -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu tf2onnx
    /tmp/tf/bin/python scripts/export_keras_models.py --out /tmp/keras
    python scripts/bench_e2e.py --ort-spinning --block 3 --rounds 10 \\
        --models $(ls /tmp/keras/*.onnx | paste -sd,)

Each model is built with `weights=None` (seeded random initial weights, no download),
saved as a TensorFlow SavedModel and converted by `python -m tf2onnx.convert
--saved-model` at opset 17, the batch dimension left open. Keras 3's ConvNeXt does not
convert (tf2onnx leaves Erfc and nested calls as TensorFlow ops), so it is not offered.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from model_exports import export_main

# Keras application name -> constructor keyword arguments (beyond weights=None)
MODELS = {
    "mobilenet_v2": ("MobileNetV2", {}),
    "mobilenet_v3_large": ("MobileNetV3Large", {"input_shape": (224, 224, 3)}),
    "efficientnet_b0": ("EfficientNetB0", {}),
    "efficientnet_v2_b0": ("EfficientNetV2B0", {}),
    "resnet50": ("ResNet50", {}),
    "densenet121": ("DenseNet121", {}),
    "inception_v3": ("InceptionV3", {}),
    "xception": ("Xception", {}),
    "nasnet_mobile": ("NASNetMobile", {}),
}


def export(name: str, out: Path, workdir: Path) -> Path:
    """SavedModel of Keras application `name`, converted by tf2onnx to OUT/name.onnx."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    constructor, kwargs = MODELS[name]
    model = getattr(tf.keras.applications, constructor)(weights=None, **kwargs)
    saved = workdir / name
    model.export(str(saved), format="tf_saved_model")
    target = out / f"{name}.onnx"
    done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(saved),
                           "--opset", "17", "--output", str(target)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tf2onnx failed on {name}: {done.stderr.strip()[-500:]}")
    return target


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="wpk-keras-") as workdir:
        return export_main(argv, __doc__.split("\n\n")[0], MODELS, ("tensorflow", "tf2onnx"),
                           "python -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu "
                           "tf2onnx, then run this script with /tmp/tf/bin/python",
                           lambda name, out: export(name, out, Path(workdir)),
                           {"TF_CPP_MIN_LOG_LEVEL": "2"})


if __name__ == "__main__":
    sys.exit(main())
