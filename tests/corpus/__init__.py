"""The real-exporter corpus: twenty-three architectures as torch, paddle2onnx and tf2onnx emit them.

Users judge wpk on models exported by torch (TorchScript and dynamo
exporters), paddle2onnx and tf2onnx, so later optimisations are measured on
graphs in those exporters' spellings:

| architecture | torchscript | dynamo | paddle | tf |
| --- | --- | --- | --- | --- |
| mobilenetv3 (HardSwish, HardSigmoid, squeeze-excite) | x | x | x | |
| dbnet (text detector: FPN, Resize, ConvTranspose) | x | x | x | |
| svtr (text recognizer: conv stem + transformer) | x | x | x | |
| vit (ViT-tiny) | x | x | | x |
| convnext (depthwise 7x7, LayerNorm, GELU) | x | x | | x |
| yolo (SiLU, Split, Concat, Resize) | x | x | | x |
| yolopost (yolo and its post-processing: score filter, top-k; shapes set by values) | x | x | | |
| resnext (grouped 3x3 convs, 4 to 32 channels per group) | x | x | | |
| speech (wav2vec2-style 1-d conv encoder, GELU, dilated TCN, BatchNorm) | x | x | | |
| deeplab (DeepLabV3 segmenter: dilated stages, ASPP, bilinear Resize) | x | x | | |
| espcn (super-resolution: Tanh, PixelShuffle as DepthToSpace, clamp) | x | x | | |
| torchenc (`nn.TransformerEncoder` with a key padding mask, erf GELU) | x | x | | |
| gpt (GPT-2-style causal blocks: masked_fill with -inf, tanh GELU) | x | x | | |
| crnn (CRNN text recognizer: conv stack, bidirectional LSTM and GRU) | x | x | | |
| llama (LLaMA decoder: RMSNorm, rotary embeddings, grouped-query causal SDPA, SwiGLU) | x | x | | |
| maxvit (MaxViT: MBConv, window and grid attention as einsum, relative bias) | x | x | | |
| kerasvit (ViT of Keras' MultiHeadAttention and Dense layers: Einsum nodes) | | | | x |
| shufflenet (ShuffleNet-v2: channel split, Concat, Reshape-Transpose-Reshape shuffle) | x | x | | |
| regnet (RegNet-Y-400MF: grouped 3x3 convs in groups of 8, squeeze-excite) | x | x | | |
| unet (diffusion UNet: GroupNorm, SiLU, ConvTranspose, nearest Upsample, skip Concat) | x | x | | |
| swin (Swin-T's first stage: windows shifted by `torch.roll`, masked, relative bias) | x | x | | |
| clip (CLIP's text encoder: QuickGELU as x * sigmoid(1.702 x), additive causal mask) | x | x | | |
| cspdarknet (YOLOv4's backbone: Mish after every conv, CSP split and Concat) | x | x | | |

and three post-training quantized models, the torchscript export quantized by onnxruntime's
`quantize_static` (`quantized.py`): mobilenetv3 and resnext in its default QDQ format
(`_qdq`), mobilenetv3 in its QOperator format (`_qop`: QLinearConv, QLinearAdd, ...).

Names are `<architecture>_<exporter>`; every model has one float input "x".
Each comes in two sizes: "ci" (small, built in about a second) and "bench"
(the real model's scale at a typical input size, for scripts/bench_e2e.py).
torch modules live in `torch_nets.py`, the exporters' calls in
`torch_export.py`, the hand-written graphs in `paddle_style.py` and
`tf_style.py`. Building is deterministic: the same name and size give the same
bytes.

    model = build_model("yolo_dynamo", "ci")
    feeds = random_feeds("yolo_dynamo", "ci", seed=0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

ARCHITECTURES = ("mobilenetv3", "dbnet", "svtr", "vit", "convnext", "yolo", "yolopost",
                 "resnext", "speech", "deeplab", "espcn", "torchenc", "gpt", "crnn", "llama",
                 "maxvit", "shufflenet", "regnet", "unet", "swin", "clip", "cspdarknet")
TORCH_EXPORTERS = ("torchscript", "dynamo")
SIZES = ("ci", "bench")
TORCH_SEED = 0
QUANTIZED_FORMATS = ("qdq", "qop")
# The quantized entries (architecture, format): `quantized.py`
QUANTIZED = (("mobilenetv3", "qdq"), ("resnext", "qdq"), ("mobilenetv3", "qop"))

# Input shapes of the hand-written models (NCHW for paddle, NHWC for tf), per size.
_HANDWRITTEN_INPUTS = {
    ("mobilenetv3", "paddle"): {"ci": (1, 3, 64, 64), "bench": (1, 3, 224, 224)},
    ("dbnet", "paddle"): {"ci": (1, 3, 64, 64), "bench": (1, 3, 320, 320)},
    ("svtr", "paddle"): {"ci": (1, 3, 32, 64), "bench": (1, 3, 48, 192)},
    ("vit", "tf"): {"ci": (1, 32, 32, 3), "bench": (1, 224, 224, 3)},
    ("convnext", "tf"): {"ci": (1, 32, 32, 3), "bench": (1, 224, 224, 3)},
    ("yolo", "tf"): {"ci": (1, 64, 64, 3), "bench": (1, 320, 320, 3)},
    ("kerasvit", "tf"): {"ci": (1, 32, 32, 3), "bench": (1, 224, 224, 3)},
}


@dataclass(frozen=True)
class CorpusModel:
    """One corpus entry: an architecture as one exporter writes it."""

    architecture: str
    exporter: str   # torchscript | dynamo | paddle | tf

    @property
    def name(self) -> str:
        return f"{self.architecture}_{self.exporter}"

    @property
    def needs(self) -> tuple[str, ...]:
        """Python packages needed to build it (beyond onnx and numpy)."""
        return {"torchscript": ("torch",), "dynamo": ("torch", "onnxscript"),
                "qdq": ("torch",), "qop": ("torch",)}.get(self.exporter, ())

    @property
    def quantized(self) -> bool:
        """Whether it is a quantized model (`quantized.py`)."""
        return self.exporter in QUANTIZED_FORMATS

    def input_shape(self, size: str) -> tuple[int, ...]:
        """The concrete shape of input "x" at `size` (the model may declare dims unknown)."""
        if self.exporter in TORCH_EXPORTERS or self.quantized:
            from tests.corpus.torch_nets import SIZES as NET_SIZES

            return NET_SIZES[size][self.architecture].input_shape
        return _HANDWRITTEN_INPUTS[(self.architecture, self.exporter)][size]

    def build(self, size: str = "ci") -> onnx.ModelProto:
        """Export or write the model at `size`."""
        if size not in SIZES:
            raise ValueError(f"unknown corpus size {size!r}; known: {', '.join(SIZES)}")
        return _builder(self)(size)


def _builder(entry: CorpusModel) -> Callable[[str], onnx.ModelProto]:
    if entry.quantized:
        from tests.corpus.quantized import quantized

        return lambda size: quantized(entry.architecture, entry.exporter, size)
    if entry.exporter in TORCH_EXPORTERS:
        def export(size: str) -> onnx.ModelProto:
            from tests.corpus import torch_export
            from tests.corpus.torch_nets import make_network

            network, shape = make_network(entry.architecture, size, TORCH_SEED)
            exporter = (torch_export.export_torchscript if entry.exporter == "torchscript"
                        else torch_export.export_dynamo)
            return exporter(network, shape)
        return export
    if entry.exporter == "paddle":
        from tests.corpus import paddle_style as module
    else:
        from tests.corpus import tf_style as module
    return getattr(module, entry.architecture)


CORPUS: dict[str, CorpusModel] = {
    entry.name: entry for entry in (
        [CorpusModel(arch, exporter) for arch in ARCHITECTURES for exporter in TORCH_EXPORTERS]
        + [CorpusModel(arch, exporter) for arch, exporter in _HANDWRITTEN_INPUTS]
        + [CorpusModel(arch, exporter) for arch, exporter in QUANTIZED])}


def corpus_model(name: str) -> CorpusModel:
    """The entry called `name`; ValueError listing the known names otherwise."""
    if name not in CORPUS:
        raise ValueError(f"unknown corpus model {name!r}; known: {', '.join(CORPUS)}")
    return CORPUS[name]


def build_model(name: str, size: str = "ci") -> onnx.ModelProto:
    """The corpus model `name` at `size` ("ci" or "bench") as an onnx.ModelProto."""
    return corpus_model(name).build(size)


def input_shapes(name: str, size: str = "ci") -> dict[str, tuple[int, ...]]:
    """{"x": shape} for `wpk.build(..., input_shapes=...)`; the exporters leave dims open."""
    return {"x": corpus_model(name).input_shape(size)}


def random_feeds(name: str, size: str = "ci", seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 input "x" of the model's shape at `size`."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(corpus_model(name).input_shape(size)).astype(np.float32)}


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict, optimized: bool = True
                        ) -> dict[str, np.ndarray]:
    """onnxruntime's outputs with all its graph optimizations (its default) or none."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = (onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
                                        if optimized else
                                        onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))
