"""Corpus models written as paddle2onnx emits PaddleOCR/PaddleClas networks.

What sets these graphs apart from torch's exports:

- inputs declared with `dim_value: -1` (batch, and height/width where the
  Paddle model takes any size), opset 11 or 13;
- every scalar is a `Constant` node; BatchNormalization is kept, not folded;
- HardSwish spelled `x * Clip(x + 3, 0, 6) / 6` (Add, Clip, Mul, Div),
  HardSigmoid with Paddle's slope 0.2 and offset 0.5;
- squeeze-excite pooling as GlobalAveragePool; Linear as MatMul + Add;
- nearest upsampling as Resize(X, roi, scales) with asymmetric coordinates;
- LayerNorm spelled ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add;
- reshapes with Paddle's `0` (copy this dim) and shapes built at run time
  with Shape -> Gather -> Unsqueeze -> Concat.

Each builder takes a `size` ("ci" or "bench") and returns an `onnx.ModelProto`
whose input is "x".
"""

from __future__ import annotations

import math

import onnx

from tests.corpus.graph_writer import UNKNOWN_DIM, GraphWriter

PRODUCER = "PaddlePaddle"


class PaddleWriter(GraphWriter):
    """Paddle's layers as paddle2onnx spells them."""

    def conv(self, x: str, c_in: int, c_out: int, kernel: int,
             stride: int | tuple[int, int] = 1, groups: int = 1, bias: bool = False) -> str:
        w = self.weight("conv2d.w", (c_out, c_in // groups, kernel, kernel),
                        c_in // groups * kernel * kernel)
        inputs = [x, w] + ([self.uniform("conv2d.b", c_out, -0.1, 0.1)] if bias else [])
        strides = list(stride) if isinstance(stride, tuple) else [stride, stride]
        pad = kernel // 2
        return self.op("Conv", inputs, kernel_shape=[kernel, kernel], strides=strides,
                       pads=[pad] * 4, group=groups, dilations=[1, 1])

    def batch_norm(self, x: str, channels: int) -> str:
        return self.op("BatchNormalization",
                       [x, self.uniform("batch_norm.w", channels, 0.5, 1.5),
                        self.uniform("batch_norm.b", channels, -0.2, 0.2),
                        self.uniform("batch_norm.mean", channels, -0.2, 0.2),
                        self.uniform("batch_norm.var", channels, 0.5, 2.0)],
                       epsilon=1e-5, momentum=0.9)

    def hard_swish(self, x: str) -> str:
        shifted = self.op("Add", [x, self.constant(3.0)])
        return self.op("Div", [self.op("Mul", [x, self.clip(shifted, 0.0, 6.0)]),
                               self.constant(6.0)])

    def act(self, x: str, kind: str | None) -> str:
        if kind == "hardswish":
            return self.hard_swish(x)
        if kind == "relu":
            return self.op("Relu", [x])
        return x

    def conv_bn(self, x: str, c_in: int, c_out: int, kernel: int,
                stride: int | tuple[int, int] = 1, groups: int = 1,
                act: str | None = None) -> str:
        return self.act(self.batch_norm(self.conv(x, c_in, c_out, kernel, stride, groups),
                                        c_out), act)

    def squeeze_excite(self, x: str, channels: int) -> str:
        gate = self.op("GlobalAveragePool", [x])
        gate = self.op("Relu", [self.conv(gate, channels, channels // 4, 1, bias=True)])
        gate = self.conv(gate, channels // 4, channels, 1, bias=True)
        return self.op("Mul", [x, self.op("HardSigmoid", [gate], alpha=0.2, beta=0.5)])

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        y = self.op("MatMul", [x, self.weight("linear.w", (n_in, n_out), n_in)])
        return self.op("Add", [y, self.uniform("linear.b", n_out, -0.1, 0.1)])

    def layer_norm(self, x: str, dim: int, eps: float = 1e-6) -> str:
        mean = self.reduce_mean(x, [-1])
        centered = self.op("Sub", [x, mean])
        variance = self.reduce_mean(self.op("Pow", [centered, self.constant(2.0)]), [-1])
        std = self.op("Sqrt", [self.op("Add", [variance, self.constant(eps)])])
        normed = self.op("Div", [centered, std])
        scaled = self.op("Mul", [normed, self.uniform("layer_norm.w", dim, 0.8, 1.2)])
        return self.op("Add", [scaled, self.uniform("layer_norm.b", dim, -0.1, 0.1)])

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", [self.op("Mul", [x, self.constant(1 / math.sqrt(2.0))])])
        half = self.op("Mul", [x, self.constant(0.5)])
        return self.op("Mul", [half, self.op("Add", [erf, self.constant(1.0)])])

    def upsample(self, x: str, factor: int) -> str:
        roi = self.constant([], dtype="float32")
        scales = self.constant([1.0, 1.0, float(factor), float(factor)])
        return self.op("Resize", [x, roi, scales], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _block_stack(w: PaddleWriter, x: str, channels: int,
                 blocks) -> tuple[str, int, list[tuple[str, int]]]:
    """MobileNetV3 inverted residuals; returns the output, its channels and the
    (tensor, channels) fed to each stride-2 block (the features before each downsampling)."""
    features = []
    for kernel, expanded, c_out, se, act, stride in blocks:
        if stride == 2:
            features.append((x, channels))
        h = w.conv_bn(x, channels, expanded, 1, act=act) if expanded != channels else x
        h = w.conv_bn(h, expanded, expanded, kernel, stride, groups=expanded, act=act)
        if se:
            h = w.squeeze_excite(h, expanded)
        h = w.conv_bn(h, expanded, c_out, 1)
        x = w.op("Add", [x, h]) if stride == 1 and channels == c_out else h
        channels = c_out
    return x, channels, features


# (kernel, expanded, out, squeeze-excite, activation, stride) per size.
_MOBILENET_BLOCKS = {
    "ci": ((3, 16, 16, True, "relu", 2), (3, 48, 24, False, "relu", 2),
           (5, 64, 24, True, "hardswish", 1), (5, 96, 32, True, "hardswish", 2)),
    "bench": ((3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2),
              (3, 88, 24, False, "relu", 1), (5, 96, 40, True, "hardswish", 2),
              (5, 240, 40, True, "hardswish", 1), (5, 240, 40, True, "hardswish", 1),
              (5, 120, 48, True, "hardswish", 1), (5, 144, 48, True, "hardswish", 1),
              (5, 288, 96, True, "hardswish", 2), (5, 576, 96, True, "hardswish", 1),
              (5, 576, 96, True, "hardswish", 1)),
}


def mobilenetv3(size: str = "ci", seed: int = 10) -> onnx.ModelProto:
    """PaddleClas MobileNetV3-small: [-1, 3, S, S] image -> [-1, classes] softmax, opset 11."""
    image, classes, last, head = (64, 10, 192, 128) if size == "ci" else (224, 1000, 576, 1280)
    w = PaddleWriter(seed, opset=11, constant_nodes=True)
    x = w.conv_bn("x", 3, 16, 3, 2, act="hardswish")
    x, channels, _ = _block_stack(w, x, 16, _MOBILENET_BLOCKS[size])
    x = w.conv_bn(x, channels, last, 1, act="hardswish")
    x = w.op("GlobalAveragePool", [x])
    x = w.hard_swish(w.conv(x, last, head, 1, bias=True))
    x = w.op("Flatten", [x], axis=1)
    probs = w.op("Softmax", [w.linear(x, head, classes)], axis=-1)
    return w.model("mobilenetv3_paddle", {"x": [UNKNOWN_DIM, 3, image, image]},
                   {probs: [UNKNOWN_DIM, classes]}, PRODUCER)


def dbnet(size: str = "ci", seed: int = 11) -> onnx.ModelProto:
    """PP-OCR DB detector: MobileNetV3 backbone, DBFPN, DBHead; [-1, 3, -1, -1], opset 11."""
    if size == "ci":
        blocks = ((3, 16, 16, False, "relu", 2), (3, 32, 24, False, "relu", 2),
                  (5, 48, 32, True, "hardswish", 2), (5, 64, 48, True, "hardswish", 2),
                  (5, 96, 48, True, "hardswish", 1))
        fpn = 32
    else:
        blocks = ((3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2),
                  (3, 72, 24, False, "relu", 1), (5, 72, 40, True, "relu", 2),
                  (5, 120, 40, True, "relu", 1), (3, 240, 80, False, "hardswish", 2),
                  (3, 200, 80, False, "hardswish", 1), (3, 480, 112, True, "hardswish", 1),
                  (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1))
        fpn = 96
    w = PaddleWriter(seed, opset=11, constant_nodes=True)
    x = w.conv_bn("x", 3, 16, 3, 2, act="hardswish")
    x, channels, features = _block_stack(w, x, 16, blocks)
    # Features at strides 4, 8, 16 (inputs of the last three downsamplings) and 32 (the end).
    features = features[-3:] + [(x, channels)]
    laterals = [w.conv(f, c, fpn, 1) for f, c in features]
    for level in range(3, 0, -1):
        laterals[level - 1] = w.op("Add", [laterals[level - 1], w.upsample(laterals[level], 2)])
    smoothed = [w.conv(p, fpn, fpn // 4, 3) for p in laterals]
    merged = [w.upsample(p, 2 ** level) if level else p for level, p in enumerate(smoothed)]
    fused = w.op("Concat", merged[::-1], axis=1)
    quarter = fpn // 4
    h = w.conv_bn(fused, fpn, quarter, 3, act="relu")
    h = w.op("ConvTranspose", [h, w.weight("conv2d_transpose.w", (quarter, quarter, 2, 2),
                                           quarter),
                               w.uniform("conv2d_transpose.b", quarter, -0.1, 0.1)],
             kernel_shape=[2, 2], strides=[2, 2])
    h = w.op("Relu", [w.batch_norm(h, quarter)])
    h = w.op("ConvTranspose", [h, w.weight("conv2d_transpose.w", (quarter, 1, 2, 2), quarter),
                               w.uniform("conv2d_transpose.b", 1, -0.1, 0.1)],
             kernel_shape=[2, 2], strides=[2, 2])
    maps = w.op("Sigmoid", [h])
    return w.model("dbnet_paddle", {"x": [UNKNOWN_DIM, 3, UNKNOWN_DIM, UNKNOWN_DIM]},
                   {maps: [UNKNOWN_DIM, 1, UNKNOWN_DIM, UNKNOWN_DIM]}, PRODUCER)


def _attention(w: PaddleWriter, x: str, dim: int, heads: int) -> str:
    """SVTR's attention: qkv Linear, reshape (0, -1, 3, heads, d), transpose, q*scale @ k^T."""
    head_dim = dim // heads
    qkv = w.op("Reshape", [w.linear(x, dim, 3 * dim), w.ints([0, -1, 3, heads, head_dim])])
    qkv = w.op("Transpose", [qkv], perm=[2, 0, 3, 1, 4])
    q, k, v = (w.squeeze(w.op("Slice", [qkv, w.ints([i]), w.ints([i + 1]), w.ints([0])]), [0])
               for i in range(3))
    q = w.op("Mul", [q, w.constant(head_dim ** -0.5)])
    scores = w.op("MatMul", [q, w.op("Transpose", [k], perm=[0, 1, 3, 2])])
    context = w.op("MatMul", [w.op("Softmax", [scores], axis=-1), v])
    context = w.op("Reshape", [w.op("Transpose", [context], perm=[0, 2, 1, 3]),
                               w.ints([0, -1, dim])])
    return w.linear(context, dim, dim)


def svtr(size: str = "ci", seed: int = 12) -> onnx.ModelProto:
    """PP-OCRv3-style recognizer: depthwise conv backbone to H=1 after an SVTR neck (global
    mixing blocks on the H x W tokens), CTC head; [-1, 3, H, -1] -> [-1, -1, classes], opset 13."""
    height, dim, depth, heads, classes = ((32, 32, 1, 2, 20) if size == "ci"
                                          else (48, 64, 2, 8, 97))
    w = PaddleWriter(seed, opset=13, constant_nodes=True)
    x = w.conv_bn("x", 3, 16, 3, 2, act="hardswish")
    channels = 16
    for c_out, stride in ((32, 1), (64, 2), (64, 1), (128, (2, 1)), (128, 1)):
        x = w.conv_bn(x, channels, channels, 3, stride, groups=channels, act="hardswish")
        x = w.conv_bn(x, channels, c_out, 1, act="hardswish")
        channels = c_out
    x = w.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])       # H/16, W/8
    shortcut = x
    h = w.conv_bn(x, channels, channels // 8, 3, act="hardswish")
    h = w.conv_bn(h, channels // 8, dim, 1, act="hardswish")
    height_dim, width_dim = w.dim_of(h, 2), w.dim_of(h, 3)
    tokens = w.op("Transpose", [w.op("Reshape", [h, w.ints([0, dim, -1])])], perm=[0, 2, 1])
    for _ in range(depth):
        tokens = w.op("Add", [tokens, _attention(w, w.layer_norm(tokens, dim), dim, heads)])
        hidden = w.gelu(w.linear(w.layer_norm(tokens, dim), dim, 2 * dim))
        tokens = w.op("Add", [tokens, w.linear(hidden, 2 * dim, dim)])
    tokens = w.layer_norm(tokens, dim)
    grid = w.run_time_shape([0, height_dim, width_dim, dim])
    h = w.op("Transpose", [w.op("Reshape", [tokens, grid])], perm=[0, 3, 1, 2])
    h = w.conv_bn(h, dim, channels, 1, act="hardswish")
    h = w.op("Concat", [shortcut, h], axis=1)
    h = w.conv_bn(h, 2 * channels, channels // 8, 3, act="hardswish")
    h = w.conv_bn(h, channels // 8, dim, 1, act="hardswish")
    h = w.op("MaxPool", [h], kernel_shape=[height // 16, 1], strides=[height // 16, 1])
    sequence = w.op("Transpose", [w.squeeze(h, [2])], perm=[0, 2, 1])      # [B, W/8, C]
    probs = w.op("Softmax", [w.linear(sequence, dim, classes)], axis=2)
    return w.model("svtr_paddle", {"x": [UNKNOWN_DIM, 3, height, UNKNOWN_DIM]},
                   {probs: [UNKNOWN_DIM, UNKNOWN_DIM, classes]}, PRODUCER)
