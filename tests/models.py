"""Evaluation models: the nine `light` CNNs of the onnx wheel and four hand-built networks.

The hand-built ones are made with `onnx.helper` (no torch), opset 17, with
weights from a seeded generator, so every build gives the same bytes:

- `mobilenet_v2_like`: inverted-residual blocks (1x1 expand, 3x3 depthwise,
  1x1 project) with BatchNormalization, Relu6 as `Clip(0, 6)` and residual adds.
- `efficientnet_like`: MBConv blocks with SiLU written as `x * Sigmoid(x)` and
  squeeze-and-excitation.
- `transformer_encoder`: one post-norm encoder layer, sequence 64, d_model 256,
  4 heads: MatMul/Add projections, Reshape/Transpose for heads, Softmax,
  LayerNormalization, the erf form of Gelu and residuals.
- `bert_base_layer`: the same layer at BERT-base's sizes (sequence 128,
  d_model 768, 12 heads, FFN 3072).

    python -m tests.models OUTDIR        # writes every hand-built model as OUTDIR/<name>.onnx
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 carries opset 17 and every onnxruntime reads it (onnx 1.23 writes 14 by default,
# which the GPU image's onnxruntime 1.30 refuses)
IR_VERSION = 8
LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


class _GraphBuilder:
    """Accumulates nodes and seeded initializers; names every tensor uniquely."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], base: str | None = None, **attrs) -> str:
        out = self.name(base or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def weight(self, base: str, shape: tuple[int, ...], fan_in: int) -> str:
        """He-initialised weights, so activations keep their scale through deep stacks."""
        scale = math.sqrt(2.0 / fan_in)
        return self.const(base, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def vector(self, base: str, size: int, low: float, high: float) -> str:
        return self.const(base, self.rng.uniform(low, high, size).astype(np.float32))

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="wpk-tests")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model

    # Layers ---------------------------------------------------------------------------

    def conv(self, x: str, c_in: int, c_out: int, kernel: int, stride: int = 1,
             groups: int = 1, bias: bool = False) -> str:
        w = self.weight("w", (c_out, c_in // groups, kernel, kernel), c_in // groups * kernel**2)
        inputs = [x, w] + ([self.vector("b", c_out, -0.1, 0.1)] if bias else [])
        pad = kernel // 2
        return self.op("Conv", inputs, "conv", kernel_shape=[kernel, kernel],
                       strides=[stride, stride], pads=[pad] * 4, group=groups)

    def batch_norm(self, x: str, channels: int) -> str:
        scale = self.vector("bn_scale", channels, 0.5, 1.5)
        bias = self.vector("bn_bias", channels, -0.2, 0.2)
        mean = self.vector("bn_mean", channels, -0.2, 0.2)
        var = self.vector("bn_var", channels, 0.5, 2.0)
        return self.op("BatchNormalization", [x, scale, bias, mean, var], "bn", epsilon=1e-5)

    def relu6(self, x: str) -> str:
        low = self.const("zero", np.array(0.0, np.float32))
        high = self.const("six", np.array(6.0, np.float32))
        return self.op("Clip", [x, low, high], "relu6")

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])], "silu")

    def classifier(self, x: str, channels: int, classes: int) -> str:
        pooled = self.op("GlobalAveragePool", [x], "gap")
        flat = self.op("Flatten", [pooled], "flatten", axis=1)
        w = self.weight("fc_w", (classes, channels), channels)
        return self.op("Gemm", [flat, w, self.vector("fc_b", classes, -0.1, 0.1)], "logits",
                       transB=1)


def _image_input(name: str, size: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3, size, size])


def mobilenet_v2_like(image_size: int = 224, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """A MobileNet-v2-style stack: depthwise convolutions, BatchNormalization, Relu6 (Clip)."""
    g = _GraphBuilder(seed)
    x = g.relu6(g.batch_norm(g.conv("input", 3, 32, 3, stride=2), 32))
    channels = 32
    # (expansion, output channels, repeats, first stride), as in MobileNet v2 (shortened).
    for expansion, c_out, repeats, first_stride in [(1, 16, 1, 1), (6, 24, 2, 2),
                                                     (6, 32, 3, 2), (6, 64, 2, 2),
                                                     (6, 96, 2, 1), (6, 160, 1, 2)]:
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            hidden = channels * expansion
            h = x
            if expansion != 1:
                h = g.relu6(g.batch_norm(g.conv(h, channels, hidden, 1), hidden))
            h = g.relu6(g.batch_norm(g.conv(h, hidden, hidden, 3, stride, groups=hidden), hidden))
            h = g.batch_norm(g.conv(h, hidden, c_out, 1), c_out)
            if stride == 1 and channels == c_out:
                h = g.op("Add", [x, h], "residual")
            x, channels = h, c_out
    x = g.relu6(g.batch_norm(g.conv(x, channels, 640, 1), 640))
    logits = g.classifier(x, 640, classes)
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, classes])
    return g.model("mobilenet_v2_like", [_image_input("input", image_size)], [out])


def efficientnet_like(image_size: int = 224, classes: int = 1000, seed: int = 1) -> onnx.ModelProto:
    """An EfficientNet-style stack: MBConv blocks with SiLU (x*sigmoid(x)) and squeeze-excite."""
    g = _GraphBuilder(seed)
    x = g.silu(g.batch_norm(g.conv("input", 3, 32, 3, stride=2), 32))
    channels = 32
    # (expansion, kernel, output channels, repeats, first stride), EfficientNet-B0 (shortened).
    for expansion, kernel, c_out, repeats, first_stride in [(1, 3, 16, 1, 1), (6, 3, 24, 2, 2),
                                                             (6, 5, 40, 2, 2), (6, 3, 80, 2, 2),
                                                             (6, 5, 112, 1, 1)]:
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            hidden = channels * expansion
            h = x
            if expansion != 1:
                h = g.silu(g.batch_norm(g.conv(h, channels, hidden, 1), hidden))
            h = g.silu(g.batch_norm(g.conv(h, hidden, hidden, kernel, stride, groups=hidden),
                                    hidden))
            squeezed = max(1, channels // 4)
            s = g.op("GlobalAveragePool", [h], "se_pool")
            s = g.silu(g.conv(s, hidden, squeezed, 1, bias=True))
            s = g.op("Sigmoid", [g.conv(s, squeezed, hidden, 1, bias=True)], "se_gate")
            h = g.op("Mul", [h, s], "se_scale")
            h = g.batch_norm(g.conv(h, hidden, c_out, 1), c_out)
            if stride == 1 and channels == c_out:
                h = g.op("Add", [x, h], "residual")
            x, channels = h, c_out
    x = g.silu(g.batch_norm(g.conv(x, channels, 640, 1), 640))
    logits = g.classifier(x, 640, classes)
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, classes])
    return g.model("efficientnet_like", [_image_input("input", image_size)], [out])


def transformer_encoder(seq_len: int = 64, d_model: int = 256, heads: int = 4,
                        ffn: int = 1024, seed: int = 2) -> onnx.ModelProto:
    """One post-norm transformer encoder layer (attention + erf-Gelu FFN, LayerNormalization)."""
    g = _GraphBuilder(seed)
    head_dim = d_model // heads

    def linear(x: str, n_in: int, n_out: int) -> str:
        y = g.op("MatMul", [x, g.weight("w", (n_in, n_out), n_in)], "matmul")
        return g.op("Add", [y, g.vector("b", n_out, -0.1, 0.1)], "bias")

    def layer_norm(x: str) -> str:
        scale = g.vector("ln_scale", d_model, 0.8, 1.2)
        bias = g.vector("ln_bias", d_model, -0.1, 0.1)
        return g.op("LayerNormalization", [x, scale, bias], "ln", axis=-1, epsilon=1e-5)

    split_shape = g.const("split_shape", np.array([1, seq_len, heads, head_dim], np.int64))
    merge_shape = g.const("merge_shape", np.array([1, seq_len, d_model], np.int64))

    def heads_of(x: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [x, split_shape], "split")], "heads", perm=perm)

    x = "input"
    q = heads_of(linear(x, d_model, d_model), [0, 2, 1, 3])      # [1, h, s, d]
    k_t = heads_of(linear(x, d_model, d_model), [0, 2, 3, 1])    # [1, h, d, s]
    v = heads_of(linear(x, d_model, d_model), [0, 2, 1, 3])      # [1, h, s, d]
    scores = g.op("MatMul", [q, k_t], "scores")
    scale = g.const("scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    probs = g.op("Softmax", [g.op("Mul", [scores, scale], "scaled")], "probs", axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v], "context")], "merge",
                   perm=[0, 2, 1, 3])
    context = g.op("Reshape", [context, merge_shape], "merged")
    x = layer_norm(g.op("Add", [x, linear(context, d_model, d_model)], "residual"))

    h = linear(x, d_model, ffn)
    sqrt2 = g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    one = g.const("one", np.array(1.0, np.float32))
    half = g.const("half", np.array(0.5, np.float32))
    erf = g.op("Erf", [g.op("Div", [h, sqrt2], "gelu_div")], "gelu_erf")
    inner = g.op("Mul", [h, g.op("Add", [erf, one], "gelu_add")], "gelu_mul")
    gelu = g.op("Mul", [inner, half], "gelu")
    x = layer_norm(g.op("Add", [x, linear(gelu, ffn, d_model)], "residual"))

    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, seq_len, d_model])
    out = helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq_len, d_model])
    return g.model("transformer_encoder", [inp], [out])


def bert_base_layer(seq_len: int = 128, d_model: int = 768, heads: int = 12, ffn: int = 3072,
                    seed: int = 4) -> onnx.ModelProto:
    """One BERT-base-sized encoder layer (sequence 128, d_model 768, 12 heads, FFN 3072,
    erf-Gelu, LayerNormalization, seeded weights): `transformer_encoder`'s layer at
    BERT-base's sizes; smaller sizes give the same structure for tests."""
    model = transformer_encoder(seq_len, d_model, heads, ffn, seed)
    model.graph.name = "bert_base_layer"
    return model


def tiny_conv_gemm(seed: int = 3) -> onnx.ModelProto:
    """Conv(+bias)+Relu, GlobalAveragePool, Flatten, Gemm on a 1x3x8x8 image: the smallest
    model with a convolution, a pooling and a GEMM workload (fast GPU search tests)."""
    rng = np.random.default_rng(seed)

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny_conv_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [const("w1", (8, 3, 3, 3)), const("b1", (8,)), const("fc", (8, 10)),
         const("fcb", (10,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION)


def dcgan_generator(latent: int = 100, width: int = 64, seed: int = 4) -> onnx.ModelProto:
    """A DCGAN generator (64x64 RGB from a latent vector), as torch's nn.ConvTranspose2d
    stack exports it: 4x4 ConvTransposes (the first on the one-pixel latent, then stride 2
    pad 1), each with BatchNormalization and ReLU, Tanh at the end."""
    g = _GraphBuilder(seed)
    x, channels = "z", latent
    for i, c_out in enumerate((8 * width, 4 * width, 2 * width, width, 3)):
        w = g.weight("wt", (channels, c_out, 4, 4), channels * 4)
        first = i == 0
        x = g.op("ConvTranspose", [x, w], "convt", kernel_shape=[4, 4],
                 strides=[1, 1] if first else [2, 2], pads=[0] * 4 if first else [1] * 4)
        x = g.op("Tanh", [x]) if c_out == 3 else g.op("Relu", [g.batch_norm(x, c_out)])
        channels = c_out
    out = helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 64, 64])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, latent, 1, 1])
    return g.model("dcgan_generator", [z], [out])


def espcn_like(image_size: int = 160, scale: int = 3, seed: int = 5) -> onnx.ModelProto:
    """An ESPCN super-resolution network as torch exports it: 5x5 conv to 64 channels and
    3x3 to 32, each with bias and Tanh, a 3x3 conv to 3 x scale^2 channels, PixelShuffle
    (DepthToSpace, CRD) and a clamp to [0, 1]."""
    g = _GraphBuilder(seed)
    x = g.op("Tanh", [g.conv("input", 3, 64, 5, bias=True)])
    x = g.op("Tanh", [g.conv(x, 64, 32, 3, bias=True)])
    x = g.conv(x, 32, 3 * scale * scale, 3, bias=True)
    x = g.op("DepthToSpace", [x], "pixel_shuffle", blocksize=scale, mode="CRD")
    low = g.const("zero", np.array(0.0, np.float32))
    high = g.const("one", np.array(1.0, np.float32))
    x = g.op("Clip", [x, low, high], "clamp")
    size = image_size * scale
    out = helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, size, size])
    return g.model("espcn_like", [_image_input("input", image_size)], [out])


def deeplab_like(image_size: int = 256, classes: int = 21, seed: int = 6) -> onnx.ModelProto:
    """A DeepLabV3-style segmenter as torch exports it: a stride-8 stem of 3x3 convs with
    BatchNorm and ReLU, two 3x3 convs of dilation 2 (the dilated last stage, output stride
    8), ASPP (a 1x1 conv, 3x3 convs of dilation 6, 12 and 18, image pooling upsampled
    bilinearly), a 1x1 projection, the classifier and a bilinear upsample to the input."""
    g = _GraphBuilder(seed)

    def cbr(x: str, c_in: int, c_out: int, kernel: int, stride: int = 1,
            dilation: int = 1) -> str:
        w = g.weight("w", (c_out, c_in, kernel, kernel), c_in * kernel * kernel)
        pad = dilation * (kernel // 2)
        y = g.op("Conv", [x, w], "conv", kernel_shape=[kernel, kernel],
                 strides=[stride, stride], pads=[pad] * 4, dilations=[dilation, dilation])
        return g.op("Relu", [g.batch_norm(y, c_out)])

    def resize_to(x: str, size: int, base: str) -> str:
        """F.interpolate(x, size=(size, size)): the sizes from x's shape, as torch writes it."""
        shape = g.op("Shape", [x], "shape")
        nc = g.op("Gather", [shape, g.const("first", np.array([0, 1], np.int64))], "nc", axis=0)
        tail = g.const("hw", np.array([size, size], np.int64))
        target = g.op("Concat", [nc, tail], "target", axis=0)
        return g.op("Resize", [x, "", "", target], base, mode="linear",
                    coordinate_transformation_mode="half_pixel")

    x = cbr("input", 3, 32, 3, 2)
    x = cbr(x, 32, 64, 3, 2)
    x = cbr(x, 64, 128, 3, 2)
    x = cbr(x, 128, 256, 3, dilation=2)
    x = cbr(x, 256, 256, 3, dilation=2)
    side = image_size // 8
    branches = [cbr(x, 256, 128, 1)] + [cbr(x, 256, 128, 3, dilation=d) for d in (6, 12, 18)]
    pooled = cbr(g.op("GlobalAveragePool", [x], "image_pool"), 256, 128, 1)
    branches.append(resize_to(pooled, side, "pool_upsample"))
    x = cbr(g.op("Concat", branches, "aspp", axis=1), 5 * 128, 128, 1)
    logits = g.op("Conv", [x, g.weight("cls_w", (classes, 128, 1, 1), 128),
                           g.vector("cls_b", classes, -0.1, 0.1)], "classifier")
    y = resize_to(logits, image_size, "upsample")
    out = helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, classes, image_size,
                                                               image_size])
    return g.model("deeplab_like", [_image_input("input", image_size)], [out])


BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mobilenet_v2_like": mobilenet_v2_like,
    "efficientnet_like": efficientnet_like,
    "transformer_encoder": transformer_encoder,
    "bert_base_layer": bert_base_layer,
    "dcgan_generator": dcgan_generator,
    "espcn_like": espcn_like,
    "deeplab_like": deeplab_like,
}
ALL_MODELS = tuple(f"light_{n}" for n in LIGHT_MODELS) + tuple(BUILDERS)


def light_model_path(name: str) -> Path:
    """Path of a `light` model in the onnx wheel (`resnet50` or `light_resnet50`)."""
    stem = name if name.startswith("light_") else f"light_{name}"
    return LIGHT_DIR / f"{stem}.onnx"


def load_model(name: str, random_weights: bool = True) -> onnx.ModelProto:
    """A model by name: `light_<arch>` from the onnx wheel or one of `BUILDERS`.

    The `light` models generate every weight as `ConstantOfShape(0.02)`, so all
    channels are equal and the softmax output is uniform whatever the input;
    with `random_weights` (default) those weights become seeded random
    initializers (see `randomize_light_weights`), which makes outputs depend on
    every channel. `random_weights=False` gives the file as shipped.
    """
    if name in BUILDERS:
        return BUILDERS[name]()
    path = light_model_path(name)
    if not path.exists():
        known = ", ".join(ALL_MODELS)
        raise ValueError(f"unknown model {name!r}; known: {known}")
    if not random_weights:
        return onnx.load(str(path))
    return onnx.load_from_string(_randomized_light_model(name))


@functools.lru_cache(maxsize=2)
def _randomized_light_model(name: str) -> bytes:
    """The serialized `randomize_light_weights` of a light model, kept for the next call in
    this process: drawing VGG-19's 143 million weights takes 6-7 s, parsing them 0.3 s, and
    a test and the build it asks for (`tests.built_plans`) both load the model."""
    return randomize_light_weights(onnx.load(str(light_model_path(name)))).SerializeToString()


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...],
                   uses: list[tuple[onnx.NodeProto, int]]) -> np.ndarray:
    """A plausible value for a weight, by how it is used (BN variance > 0, He-scaled kernels)."""
    node, index = uses[0] if uses else (None, -1)
    op = node.op_type if node is not None else ""
    if op == "BatchNormalization":
        if index in (1, 4):      # scale, variance
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
    if op in ("Conv", "Gemm", "MatMul") and index == 1 and len(shape) >= 2:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        fan_in = shape[0] if op == "MatMul" or (op == "Gemm" and not trans_b) \
            else int(np.prod(shape[1:]))
        return rng.standard_normal(shape, np.float32) * np.float32(math.sqrt(2.0 / fan_in))
    return rng.uniform(-0.1, 0.1, shape).astype(np.float32)


# Scale of the layer feeding a Softmax, so that random logits (std ~1) do not saturate it.
CLASSIFIER_GAIN = 0.2


def _classifier_weights(graph: onnx.GraphProto) -> set[str]:
    """Weight names of the Conv/Gemm layers whose output (reshaped) feeds a Softmax."""
    producers = {out: node for node in graph.node for out in node.output}
    found = set()
    for node in graph.node:
        if node.op_type != "Softmax":
            continue
        source = producers.get(node.input[0])
        while source is not None and source.op_type in ("Reshape", "Flatten", "Dropout",
                                                        "Identity", "Squeeze"):
            source = producers.get(source.input[0])
        if source is not None and source.op_type in ("Conv", "Gemm", "MatMul"):
            weight = source.input[1]
            while weight in producers and producers[weight].op_type in ("Reshape", "Transpose"):
                weight = producers[weight].input[0]
            found.add(weight)
    return found


def randomize_light_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace every `ConstantOfShape` of a constant shape with a seeded random initializer."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, index))
    classifier_weights = _classifier_weights(graph)
    kept, new_weights, used_shapes = [], [], set()
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in constants:
            shape = tuple(int(d) for d in constants[node.input[0]])
            value = _random_weight(rng, shape, uses.get(node.output[0], []))
            if node.output[0] in classifier_weights:
                value *= CLASSIFIER_GAIN
            new_weights.append(numpy_helper.from_array(value, node.output[0]))
            used_shapes.add(node.input[0])
        else:
            kept.append(node)
    still_used = {name for node in kept for name in node.input}
    dropped = used_shapes - still_used
    del graph.node[:]
    graph.node.extend(kept)
    remaining = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(remaining + new_weights)
    inputs = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(inputs)
    if out.ir_version < 4:  # initializers must also be graph inputs before IR 4
        graph.input.extend(helper.make_tensor_value_info(
            t.name, t.data_type, list(t.dims)) for t in new_weights)
    return calibrate_batch_norms(out, seed=seed + 1000)


def calibrate_batch_norms(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Set each BatchNormalization's mean/variance to the statistics of its input.

    Random weights make activations drift layer after layer, unless the
    normalizations really normalize (as after training). With batch 1, a
    BatchNormalization whose statistics equal those of its input is an
    InstanceNormalization; so one onnxruntime run of the model with every
    BatchNormalization replaced by InstanceNormalization, on a seeded random
    input, yields the statistics every BatchNormalization sees once calibrated.
    """
    import onnxruntime

    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for node in probe.graph.node:
        if node.op_type == "BatchNormalization":
            eps = [a for a in node.attribute if a.name == "epsilon"]
            x, scale, bias = node.input[:3]
            node.CopyFrom(helper.make_node("InstanceNormalization", [x, scale, bias],
                                           [node.output[0]], name=node.name))
            node.attribute.extend(eps)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n.input[0]) for n in bns)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    stats = session.run(None, random_inputs(model, seed))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = {t.name: t for t in out.graph.initializer}
    for node, value in zip(bns, stats):
        axes = (0,) + tuple(range(2, value.ndim))
        mean, var = value.mean(axis=axes), value.var(axis=axes)
        for name, array in ((node.input[3], mean), (node.input[4], var)):
            if name in weights:
                weights[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
    return out


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old IR versions list weights as inputs)."""
    weights = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random feeds for every real graph input (unknown dims are 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model_inputs(model):
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in tensor.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def write_models(out_dir: str | Path, names: list[str] | None = None) -> list[Path]:
    """Write hand-built models as `<out_dir>/<name>.onnx`; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or list(BUILDERS):
        path = out / f"{name}.onnx"
        onnx.save(load_model(name), str(path))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m tests.models OUTDIR [NAME ...]\n\nmodels: " + ", ".join(BUILDERS))
        return 0 if args else 2
    for path in write_models(args[0], args[1:] or None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
