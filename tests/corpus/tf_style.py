"""Corpus models written as tf2onnx emits Keras networks.

What sets these graphs apart from torch's and paddle2onnx's exports:

- NHWC image inputs `[-1, H, W, 3]` (batch `dim_value: -1`), a Transpose to
  NCHW at the entrance and Transposes back to NHWC before reshapes; opset 13;
- constants as initializers (`const_fold_opt__N`), BatchNorm folded into Conv
  biases; TF's "same" padding of a stride-2 conv on an even size is
  asymmetric (`pads` [0, 0, 1, 1]);
- run-time shapes as TF computes them: Shape -> Cast(int32) -> Slice ->
  Concat -> Cast(int64) -> Reshape/Expand, and Keras' UpSampling2D as Resize
  with `sizes` computed from the input's Shape;
- SiLU as Sigmoid + Mul, GELU in its tanh form (Pow, Tanh), Keras'
  LayerNormalization as moments and a reciprocal: ReduceMean, Sub, Mul,
  ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul, Mul, Sub, Add;
- Split with sizes as input, Squeeze/Unsqueeze with axes as inputs.

Models: `vit` (ViT-tiny), `yolo` (YOLOv8-style), `convnext` (ConvNeXt stages,
a Transpose pair around every convolution since Keras works in NHWC), `kerasvit` (a ViT of
Keras' MultiHeadAttention and Dense layers, which tf2onnx writes as Einsum nodes). Each
builder takes a `size` ("ci" or "bench") and returns an `onnx.ModelProto`
whose input is "x".
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from tests.corpus.graph_writer import UNKNOWN_DIM, GraphWriter

PRODUCER = "tf2onnx"
OPSET = 13


class KerasWriter(GraphWriter):
    """Keras layers as tf2onnx spells them (NCHW inside, after the entrance Transpose)."""

    def __init__(self, seed: int):
        super().__init__(seed, opset=OPSET, constant_nodes=False)

    def conv(self, x: str, c_in: int, c_out: int, kernel: int, stride: int = 1,
             groups: int = 1, size: int | None = None) -> str:
        """Conv with bias (BatchNorm folded); TF "same" padding, asymmetric when stride 2
        and the input `size` is even."""
        w = self.weight("conv2d/kernel", (c_out, c_in // groups, kernel, kernel),
                        c_in // groups * kernel * kernel)
        b = self.uniform("conv2d/bias", c_out, -0.1, 0.1)
        total = max(kernel - stride, 0) if size is None or size % stride == 0 \
            else max(kernel - size % stride, 0)
        before, after = total // 2, total - total // 2
        return self.op("Conv", [x, w, b], kernel_shape=[kernel, kernel],
                       strides=[stride, stride], pads=[before, before, after, after],
                       group=groups, dilations=[1, 1])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def dense(self, x: str, n_in: int, n_out: int) -> str:
        y = self.op("MatMul", [x, self.weight("dense/kernel", (n_in, n_out), n_in)])
        return self.op("Add", [y, self.uniform("dense/bias", n_out, -0.1, 0.1)])

    def layer_norm(self, x: str, dim: int, eps: float = 1e-6) -> str:
        """Keras LayerNormalization: x * inv + (beta - mean * inv), inv = gamma/sqrt(var + eps)."""
        mean = self.reduce_mean(x, [-1])
        diff = self.op("Sub", [x, mean])
        variance = self.reduce_mean(self.op("Mul", [diff, diff]), [-1])
        inverse = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [
            variance, self.constant(eps)])])])
        inverse = self.op("Mul", [inverse, self.uniform("layer_norm/gamma", dim, 0.8, 1.2)])
        shift = self.op("Sub", [self.uniform("layer_norm/beta", dim, -0.1, 0.1),
                                self.op("Mul", [mean, inverse])])
        return self.op("Add", [self.op("Mul", [x, inverse]), shift])

    def gelu_tanh(self, x: str) -> str:
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        cube = self.op("Mul", [self.op("Pow", [x, self.constant(3.0)]),
                               self.constant(0.044715)])
        inner = self.op("Mul", [self.op("Add", [x, cube]),
                                self.constant(math.sqrt(2.0 / math.pi))])
        gate = self.op("Add", [self.op("Tanh", [inner]), self.constant(1.0)])
        return self.op("Mul", [self.op("Mul", [x, self.constant(0.5)]), gate])

    def batch_of(self, x: str) -> str:
        """The run-time batch size as TF reads it: Shape -> Cast(int32) -> Slice [0:1]."""
        shape = self.op("Cast", [self.op("Shape", [x])], to=TensorProto.INT32)
        return self.op("Slice", [shape, self.constant([0], np.int32),
                                 self.constant([1], np.int32), self.constant([0], np.int32)])

    def shape_with_batch(self, batch: str, rest: list[int]) -> str:
        """[batch, *rest] as int64, concatenated in int32 and cast back as tf2onnx does."""
        joined = self.op("Concat", [batch, self.constant(rest, np.int32)], axis=0)
        return self.op("Cast", [joined], to=TensorProto.INT64)

    def to_nhwc_tokens(self, x: str, batch: str, channels: int) -> str:
        """NCHW -> NHWC Transpose -> Reshape [batch, -1, channels]."""
        nhwc = self.op("Transpose", [x], perm=[0, 2, 3, 1])
        return self.op("Reshape", [nhwc, self.shape_with_batch(batch, [-1, channels])])

    def patch_tokens(self, dim: int, patch: int) -> tuple[str, str]:
        """A ViT's entrance: the NHWC input "x" to NCHW, a patch conv, tokens
        [batch, -1, dim]; (the tokens, the run-time batch size)."""
        x = self.op("Transpose", ["x"], perm=[0, 3, 1, 2])
        batch = self.batch_of("x")
        patches = self.op("Conv", [x, self.weight("patch_embed/kernel", (dim, 3, patch, patch),
                                                  3 * patch * patch),
                                   self.uniform("patch_embed/bias", dim, -0.1, 0.1)],
                          kernel_shape=[patch, patch], strides=[patch, patch])
        return self.to_nhwc_tokens(patches, batch, dim), batch

    def upsample2x(self, x: str) -> str:
        """Keras UpSampling2D: Resize to sizes = Shape[2:4] * 2 computed at run time."""
        shape = self.op("Shape", [x])
        spatial = self.op("Slice", [shape, self.ints([2]), self.ints([4]), self.ints([0])])
        leading = self.op("Slice", [shape, self.ints([0]), self.ints([2]), self.ints([0])])
        sizes = self.op("Concat", [leading, self.op("Mul", [spatial, self.ints([2, 2])])],
                        axis=0)
        empty = self.constant([], np.float32)
        return self.op("Resize", [x, empty, empty, sizes], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def vit(size: str = "ci", seed: int = 20) -> onnx.ModelProto:
    """Keras ViT-tiny: NHWC [-1, S, S, 3] -> [-1, classes] softmax, opset 13."""
    if size == "ci":
        image, patch, dim, depth, heads, classes = 32, 8, 32, 2, 2, 10
    else:
        image, patch, dim, depth, heads, classes = 224, 16, 192, 12, 3, 1000
    tokens = (image // patch) ** 2
    head_dim = dim // heads
    w = KerasWriter(seed)
    h, batch = w.patch_tokens(dim, patch)
    cls = w.op("Expand", [w.initializer("cls_token", w.rng.standard_normal((1, 1, dim))
                                        .astype(np.float32) * 0.02),
                          w.shape_with_batch(batch, [1, dim])])
    h = w.op("Concat", [cls, h], axis=1)
    h = w.op("Add", [h, w.initializer("pos_embed", w.rng.standard_normal((1, tokens + 1, dim))
                                      .astype(np.float32) * 0.02)])
    split_heads = w.shape_with_batch(batch, [-1, heads, head_dim])
    merge_heads = w.shape_with_batch(batch, [-1, dim])
    for _ in range(depth):
        y = w.layer_norm(h, dim)
        q, k, v = (w.op("Transpose", [w.op("Reshape", [w.dense(y, dim, dim), split_heads])],
                        perm=perm)
                   for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]))
        scores = w.op("Mul", [w.op("MatMul", [q, k]), w.constant(head_dim ** -0.5)])
        context = w.op("MatMul", [w.op("Softmax", [scores], axis=-1), v])
        context = w.op("Reshape", [w.op("Transpose", [context], perm=[0, 2, 1, 3]),
                                   merge_heads])
        h = w.op("Add", [h, w.dense(context, dim, dim)])
        y = w.gelu_tanh(w.dense(w.layer_norm(h, dim), dim, 4 * dim))
        h = w.op("Add", [h, w.dense(y, 4 * dim, dim)])
    h = w.layer_norm(h, dim)
    first = w.squeeze(w.op("Slice", [h, w.ints([0]), w.ints([1]), w.ints([1])]), [1])
    probs = w.op("Softmax", [w.dense(first, dim, classes)], axis=-1)
    return w.model("vit_tf", {"x": [UNKNOWN_DIM, image, image, 3]},
                   {probs: [UNKNOWN_DIM, classes]}, PRODUCER)


def kerasvit(size: str = "ci", seed: int = 23) -> onnx.ModelProto:
    """Keras ViT built from `layers.MultiHeadAttention` and `layers.Dense` (keras.io's ViT
    example, a global-average head): NHWC [-1, S, S, 3] -> [-1, classes] softmax, opset 13.

    tf2onnx writes the attention's EinsumDense projections and scores as Einsum nodes
    ("abc,cde->abde", "aecd,abcd->acbe", "acbe,aecd->abcd", "abcd,cde->abe") and a Dense
    on tokens (`tf.tensordot`) as Einsum "ABC,CD->ABD"; GELU in its exact (erf) form."""
    if size == "ci":
        image, patch, dim, depth, heads, classes = 32, 8, 32, 2, 2, 10
    else:
        image, patch, dim, depth, heads, classes = 224, 16, 192, 12, 3, 1000
    key_dim = dim // heads
    w = KerasWriter(seed)

    def dense(x: str, n_in: int, n_out: int) -> str:
        y = w.op("Einsum", [x, w.weight("dense/kernel", (n_in, n_out), n_in)],
                 equation="ABC,CD->ABD")
        return w.op("Add", [y, w.uniform("dense/bias", n_out, -0.1, 0.1)])

    def einsum_dense(x: str, equation: str, kernel: tuple[int, ...], fan_in: int,
                     bias: tuple[int, ...]) -> str:
        y = w.op("Einsum", [x, w.weight("einsum_dense/kernel", kernel, fan_in)],
                 equation=equation)
        return w.op("Add", [y, w.uniform("einsum_dense/bias", bias, -0.1, 0.1)])

    def gelu(x: str) -> str:
        erf = w.op("Erf", [w.op("Mul", [x, w.constant(1.0 / math.sqrt(2.0))])])
        return w.op("Mul", [w.op("Mul", [x, w.constant(0.5)]),
                            w.op("Add", [erf, w.constant(1.0)])])

    h = dense(w.patch_tokens(dim, patch)[0], dim, dim)
    h = w.op("Add", [h, w.initializer("position_embedding", w.rng.standard_normal(
        (1, (image // patch) ** 2, dim)).astype(np.float32) * 0.02)])
    for _ in range(depth):
        y = w.layer_norm(h, dim)
        q, k, v = (einsum_dense(y, "abc,cde->abde", (dim, heads, key_dim), dim,
                                (heads, key_dim)) for _ in range(3))
        q = w.op("Mul", [q, w.constant(key_dim ** -0.5)])
        scores = w.op("Einsum", [k, q], equation="aecd,abcd->acbe")
        probs = w.op("Softmax", [scores], axis=-1)
        context = w.op("Einsum", [probs, v], equation="acbe,aecd->abcd")
        h = w.op("Add", [h, einsum_dense(context, "abcd,cde->abe", (heads, key_dim, dim),
                                         dim, (dim,))])
        y = gelu(dense(w.layer_norm(h, dim), dim, 2 * dim))
        h = w.op("Add", [h, dense(y, 2 * dim, dim)])
    pooled = w.reduce_mean(w.layer_norm(h, dim), [1], keepdims=0)
    probs = w.op("Softmax", [w.dense(pooled, dim, classes)], axis=-1)
    return w.model("kerasvit_tf", {"x": [UNKNOWN_DIM, image, image, 3]},
                   {probs: [UNKNOWN_DIM, classes]}, PRODUCER)


def _c2f(w: KerasWriter, x: str, c_in: int, c_out: int, shortcut: bool) -> str:
    """YOLOv8's C2f with one bottleneck: 1x1 conv, Split in two, two 3x3 convs, Concat, 1x1."""
    hidden = c_out // 2
    first, second = w.split(w.silu(w.conv(x, c_in, 2 * hidden, 1)), [hidden, hidden], axis=1)
    body = w.silu(w.conv(w.silu(w.conv(second, hidden, hidden, 3)), hidden, hidden, 3))
    if shortcut:
        body = w.op("Add", [second, body])
    merged = w.op("Concat", [first, second, body], axis=1)
    return w.silu(w.conv(merged, 3 * hidden, c_out, 1))


def yolo(size: str = "ci", seed: int = 21) -> onnx.ModelProto:
    """Keras YOLOv8-style detector: NHWC [-1, S, S, 3] -> [-1, anchors, 4 + classes], opset 13."""
    image, width, classes = (64, 4, 8) if size == "ci" else (320, 16, 80)
    c = [width, width * 2, width * 4, width * 8, width * 16]
    w = KerasWriter(seed)
    batch = w.batch_of("x")
    x = w.op("Transpose", ["x"], perm=[0, 3, 1, 2])
    side = image

    def down(t: str, c_in: int, c_out: int) -> str:
        nonlocal side
        out = w.silu(w.conv(t, c_in, c_out, 3, 2, size=side))
        side //= 2
        return out

    x = _c2f(w, down(down(x, 3, c[0]), c[0], c[1]), c[1], c[1], True)
    p3 = _c2f(w, down(x, c[1], c[2]), c[2], c[2], True)
    p4 = _c2f(w, down(p3, c[2], c[3]), c[3], c[3], True)
    p5 = _c2f(w, down(p4, c[3], c[4]), c[4], c[4], True)
    pooled = [w.silu(w.conv(p5, c[4], c[4] // 2, 1))]
    for _ in range(3):
        pooled.append(w.op("MaxPool", [pooled[-1]], kernel_shape=[5, 5], strides=[1, 1],
                           pads=[2, 2, 2, 2]))
    p5 = w.silu(w.conv(w.op("Concat", pooled, axis=1), 2 * c[4], c[4], 1))
    n4 = _c2f(w, w.op("Concat", [w.upsample2x(p5), p4], axis=1), c[4] + c[3], c[3], False)
    n3 = _c2f(w, w.op("Concat", [w.upsample2x(n4), p3], axis=1), c[3] + c[2], c[2], False)
    n4 = _c2f(w, w.op("Concat", [w.silu(w.conv(n3, c[2], c[2], 3, 2, size=image // 8)), n4],
                      axis=1), c[2] + c[3], c[3], False)
    n5 = _c2f(w, w.op("Concat", [w.silu(w.conv(n4, c[3], c[3], 3, 2, size=image // 16)), p5],
                      axis=1), c[3] + c[4], c[4], False)
    box, cls = max(16, c[2] // 4), max(c[2], classes)
    levels = []
    for feature, channels in ((n3, c[2]), (n4, c[3]), (n5, c[4])):
        boxes = w.conv(w.silu(w.conv(feature, channels, box, 3)), box, 4, 1)
        scores = w.conv(w.silu(w.conv(feature, channels, cls, 3)), cls, classes, 1)
        levels.append(w.to_nhwc_tokens(w.op("Concat", [boxes, scores], axis=1), batch,
                                       4 + classes))
    boxes, scores = w.split(w.op("Concat", levels, axis=1), [4, classes], axis=-1)
    detections = w.op("Concat", [boxes, w.op("Sigmoid", [scores])], axis=-1)
    anchors = sum((image // s) ** 2 for s in (8, 16, 32))
    return w.model("yolo_tf", {"x": [UNKNOWN_DIM, image, image, 3]},
                   {detections: [UNKNOWN_DIM, anchors, 4 + classes]}, PRODUCER)


def convnext(size: str = "ci", seed: int = 22) -> onnx.ModelProto:
    """Keras ConvNeXt stages: NHWC [-1, S, S, 3] -> [-1, classes] softmax, opset 13.

    Keras keeps NHWC throughout, so every convolution sits between a Transpose to
    NCHW and one back, and LayerNorm, Dense and GELU (erf form) work on NHWC.
    """
    image, dims, depths, classes = ((32, (16, 32), (1, 1), 10) if size == "ci"
                                    else (224, (96, 192), (3, 3), 1000))
    w = KerasWriter(seed)

    def nchw_conv(x: str, c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1,
                  pad: int = 0) -> str:
        weight = w.weight("conv2d/kernel", (c_out, c_in // groups, kernel, kernel),
                          c_in // groups * kernel * kernel)
        bias = w.uniform("conv2d/bias", c_out, -0.1, 0.1)
        y = w.op("Conv", [w.op("Transpose", [x], perm=[0, 3, 1, 2]), weight, bias],
                 kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
                 group=groups, dilations=[1, 1])
        return w.op("Transpose", [y], perm=[0, 2, 3, 1])

    def gelu(x: str) -> str:
        erf = w.op("Erf", [w.op("Div", [x, w.constant(math.sqrt(2.0))])])
        return w.op("Mul", [w.op("Mul", [x, w.constant(0.5)]),
                            w.op("Add", [erf, w.constant(1.0)])])

    x = w.layer_norm(nchw_conv("x", 3, dims[0], 4, 4), dims[0])
    for index, (dim, depth) in enumerate(zip(dims, depths)):
        if index:
            x = nchw_conv(w.layer_norm(x, dims[index - 1]), dims[index - 1], dim, 2, 2)
        for _ in range(depth):
            y = w.layer_norm(nchw_conv(x, dim, dim, 7, 1, groups=dim, pad=3), dim)
            y = w.dense(gelu(w.dense(y, dim, 4 * dim)), 4 * dim, dim)
            x = w.op("Add", [x, w.op("Mul", [y, w.uniform("layer_scale/gamma", dim,
                                                          0.1, 0.5)])])
    pooled = w.layer_norm(w.reduce_mean(x, [1, 2], keepdims=0), dims[-1])
    probs = w.op("Softmax", [w.dense(pooled, dims[-1], classes)], axis=-1)
    return w.model("convnext_tf", {"x": [UNKNOWN_DIM, image, image, 3]},
                   {probs: [UNKNOWN_DIM, classes]}, PRODUCER)
