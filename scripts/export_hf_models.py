#!/usr/bin/env python
"""Export Hugging Face transformers to ONNX with `torch.onnx.export`, as a PyTorch user
would, for `bench_e2e.py --models FILE.onnx` (the survey of real exports in the README).

transformers is no dependency of wpk; install it in a virtual environment that sees this
Python's torch (the CPU build wpk's dev extra pins) and run this script with it:

    python -m venv --system-site-packages /tmp/hf && /tmp/hf/bin/pip install transformers
    /tmp/hf/bin/python scripts/export_hf_models.py --out /tmp/hfm
    python scripts/bench_e2e.py --ort-spinning --block 3 --rounds 10 \\
        --models $(ls /tmp/hfm/*.onnx | paste -sd,)

Each model is built from its configuration (seeded random weights, no download; BERT, GPT-2
and ViT cut to 4 layers, DistilBERT's own 6), put in eval mode and exported by the
TorchScript exporter at opset 17: text models take `input_ids` and `attention_mask` of
shape (1, 128), ViT `pixel_values` (1, 3, 224, 224). Their attention is torch's
`scaled_dot_product_attention`, which the exporter writes with a boolean mask and a NaN
guard on the probabilities.
"""

from __future__ import annotations

import sys
from pathlib import Path

from model_exports import export_main

SEQUENCE, IMAGE = 128, 224

# model name -> (config class, model class, config keyword arguments, input kind)
MODELS = {
    "bert4": ("BertConfig", "BertModel", {"num_hidden_layers": 4}, "text"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", {}, "text"),
    "gpt2_4": ("GPT2Config", "GPT2Model", {"n_layer": 4}, "text"),
    "vit4": ("ViTConfig", "ViTModel", {"num_hidden_layers": 4}, "image"),
}


def export(name: str, out: Path) -> Path:
    """Transformer `name` exported by torch.onnx to OUT/name.onnx."""
    import torch
    import transformers

    torch.manual_seed(0)
    config_class, model_class, kwargs, kind = MODELS[name]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    model.eval()

    class LastHidden(torch.nn.Module):
        """The model's last hidden state from positional inputs."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            if kind == "image":
                return self.model(pixel_values=inputs[0]).last_hidden_state
            return self.model(input_ids=inputs[0], attention_mask=inputs[1]).last_hidden_state

    if kind == "image":
        args, names = (torch.randn(1, 3, IMAGE, IMAGE),), ["pixel_values"]
    else:
        args = (torch.randint(0, 1000, (1, SEQUENCE)), torch.ones(1, SEQUENCE, dtype=torch.long))
        names = ["input_ids", "attention_mask"]
    target = out / f"{name}.onnx"
    try:
        torch.onnx.export(LastHidden(), args, str(target), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False)
    except Exception as exc:  # noqa: BLE001 - the exporter raises many types
        raise RuntimeError(f"torch.onnx.export failed on {name}: {exc}") from exc
    return target


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__.split("\n\n")[0], MODELS, ("torch", "transformers"),
                       "python -m venv --system-site-packages /tmp/hf && /tmp/hf/bin/pip "
                       "install transformers, then run this script with /tmp/hf/bin/python",
                       export)


if __name__ == "__main__":
    sys.exit(main())
