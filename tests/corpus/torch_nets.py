"""The corpus networks as torch modules, written from the papers' layer lists.

Six architectures that users bring to wpk, each with a small configuration for
the tests and a larger one for the benchmark (`SIZES`):

- `MobileNetV3Small`: inverted residuals with HardSwish, squeeze-excite as
  `x.mean((2, 3), keepdim=True)` (ReduceMean) and a HardSigmoid gate.
- `TextDetector`: DB-style: a conv backbone with four strides, an FPN whose
  top-down path and merge use nearest `F.interpolate` (Resize), and a
  probability head with two ConvTranspose upsamplings.
- `TextRecognizer`: SVTR/CRNN-style: a conv stem, `flatten(2).transpose(1, 2)`
  into a sequence, transformer blocks whose attention splits heads with
  `reshape(B, N, 3, heads, d).permute(...)` on the runtime batch size, and a
  per-column classifier.
- `VisionTransformer`: ViT-tiny: patch-embedding conv, class token, position
  embedding, pre-norm blocks with `F.scaled_dot_product_attention`, GELU.
- `ConvNeXt`: depthwise 7x7 blocks with permute + LayerNorm + Linear + GELU
  and layer scale, downsampling with the channels-first LayerNorm written out.
- `YoloDetector`: YOLOv8-style: Conv-BN-SiLU, C2f blocks (`chunk(2, 1)` into
  Split, Concat), SPPF max pools, a neck with nearest upsampling and Concat, a
  head that splits box and class channels.

Weights come from `seed_parameters`, a seeded initialisation that keeps
activations of order one through deep stacks and gives BatchNorm layers
non-trivial statistics, so fusions that fold them are really exercised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# -------------------------------------------------------------------- initialisation


def seed_parameters(module: nn.Module, seed: int) -> nn.Module:
    """Give every parameter and BatchNorm statistic a seeded value; returns the module in eval.

    Conv and Linear weights are He-normal (scale sqrt(2 / fan_in)), biases and
    norm shifts small uniform values, norm scales around 1, BatchNorm running
    means and variances near the statistics of unit activations.
    """
    generator = torch.Generator().manual_seed(seed)

    def uniform(shape, low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=generator) * (high - low) + low

    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                weight = layer.weight
                if isinstance(layer, nn.ConvTranspose2d):
                    fan_in = weight.shape[0] * weight[0, 0].numel() // (layer.stride[0]
                                                                          * layer.stride[1])
                else:
                    fan_in = weight[0].numel()
                weight.copy_(torch.randn(weight.shape, generator=generator)
                             * math.sqrt(2.0 / max(1, fan_in)))
                if layer.bias is not None:
                    layer.bias.copy_(uniform(layer.bias.shape, -0.1, 0.1))
            elif isinstance(layer, nn.BatchNorm2d):
                channels = layer.num_features
                layer.weight.copy_(uniform(channels, 0.5, 1.5))
                layer.bias.copy_(uniform(channels, -0.2, 0.2))
                layer.running_mean.copy_(uniform(channels, -0.2, 0.2))
                layer.running_var.copy_(uniform(channels, 0.5, 2.0))
            elif isinstance(layer, (nn.LayerNorm, ChannelsFirstLayerNorm, nn.GroupNorm)):
                layer.weight.copy_(uniform(layer.weight.shape, 0.8, 1.2))
                layer.bias.copy_(uniform(layer.bias.shape, -0.1, 0.1))
        for name, parameter in module.named_parameters(recurse=True):
            if name.endswith(("cls_token", "position_embedding", "bias_table")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
            elif name.endswith("layer_scale"):
                parameter.copy_(uniform(parameter.shape, 0.1, 0.5))
    return module.eval()


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1,
            activation: nn.Module | None = None) -> nn.Sequential:
    """Conv (no bias, same padding) + BatchNorm + an optional activation."""
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2,
                                         groups=groups, bias=False), nn.BatchNorm2d(c_out)]
    if activation is not None:
        layers.append(activation)
    return nn.Sequential(*layers)


# -------------------------------------------------------------------- MobileNetV3-small


class SqueezeExcite(nn.Module):
    """Channel gate: mean over H and W (ReduceMean), 1x1 reduce, ReLU, 1x1 expand, HardSigmoid."""

    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x.mean((2, 3), keepdim=True)
        gate = F.hardsigmoid(self.expand(F.relu(self.reduce(gate))))
        return x * gate


class InvertedResidual(nn.Module):
    """1x1 expand, depthwise kxk, optional squeeze-excite, 1x1 project, residual if shapes match."""

    def __init__(self, c_in: int, hidden: int, c_out: int, kernel: int, stride: int,
                 squeeze_excite: bool, hard_swish: bool):
        super().__init__()
        def act() -> nn.Module:
            return nn.Hardswish() if hard_swish else nn.ReLU()
        layers: list[nn.Module] = []
        if hidden != c_in:
            layers.append(conv_bn(c_in, hidden, 1, activation=act()))
        layers.append(conv_bn(hidden, hidden, kernel, stride, groups=hidden, activation=act()))
        if squeeze_excite:
            layers.append(SqueezeExcite(hidden, _divisible(hidden // 4)))
        layers.append(conv_bn(hidden, c_out, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


def _divisible(value: float, divisor: int = 8) -> int:
    return max(divisor, int(value + divisor / 2) // divisor * divisor)


# MobileNetV3-small: (kernel, expanded, out, squeeze-excite, hard-swish, stride).
MOBILENET_V3_SMALL_BLOCKS = (
    (3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1))


class MobileNetV3Small(nn.Module):
    """MobileNetV3-small classifier; `width` scales every channel count, `blocks` cuts the list."""

    def __init__(self, width: float = 1.0, blocks: int = len(MOBILENET_V3_SMALL_BLOCKS),
                 classes: int = 1000, head: int = 1024):
        super().__init__()
        stem = _divisible(16 * width)
        layers: list[nn.Module] = [conv_bn(3, stem, 3, 2, activation=nn.Hardswish())]
        channels = stem
        for kernel, expanded, c_out, se, hs, stride in MOBILENET_V3_SMALL_BLOCKS[:blocks]:
            hidden, out = _divisible(expanded * width), _divisible(c_out * width)
            layers.append(InvertedResidual(channels, hidden, out, kernel, stride, se, hs))
            channels = out
        last = channels * 6
        layers.append(conv_bn(channels, last, 1, activation=nn.Hardswish()))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(last, head), nn.Hardswish(),
                                        nn.Linear(head, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.features(x).mean((2, 3))
        return self.classifier(pooled)


# -------------------------------------------------------------------- DB text detector


class TextDetector(nn.Module):
    """DB-style detector: conv backbone (strides 4..32), FPN, ConvTranspose probability head."""

    def __init__(self, widths: tuple[int, ...] = (16, 24, 56, 96), fpn: int = 64,
                 blocks_per_stage: int = 1):
        super().__init__()
        self.stem = conv_bn(3, widths[0], 3, 2, activation=nn.ReLU())
        stages, channels = [], widths[0]
        for width in widths:  # strides 4, 8, 16, 32
            layers = [conv_bn(channels, width, 3, 2, activation=nn.ReLU())]
            layers += [conv_bn(width, width, 3, activation=nn.ReLU())
                       for _ in range(blocks_per_stage)]
            stages.append(nn.Sequential(*layers))
            channels = width
        self.stages = nn.ModuleList(stages)
        self.lateral = nn.ModuleList(nn.Conv2d(w, fpn, 1, bias=False) for w in widths)
        quarter = fpn // 4
        self.smooth = nn.ModuleList(nn.Conv2d(fpn, quarter, 3, padding=1, bias=False)
                                    for _ in widths)
        self.head = nn.Sequential(
            conv_bn(fpn, quarter, 3, activation=nn.ReLU()),
            nn.ConvTranspose2d(quarter, quarter, 2, 2), nn.BatchNorm2d(quarter), nn.ReLU(),
            nn.ConvTranspose2d(quarter, 1, 2, 2), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = []
        y = self.stem(x)
        for stage in self.stages:
            y = stage(y)
            features.append(y)
        laterals = [conv(f) for conv, f in zip(self.lateral, features)]
        for level in range(len(laterals) - 1, 0, -1):  # top-down: upsample and add
            laterals[level - 1] = laterals[level - 1] + F.interpolate(
                laterals[level], scale_factor=2.0, mode="nearest")
        merged = [F.interpolate(conv(p), scale_factor=float(2 ** level), mode="nearest")
                  if level else conv(p)
                  for level, (conv, p) in enumerate(zip(self.smooth, laterals))]
        return self.head(torch.cat(merged[::-1], dim=1))


# -------------------------------------------------------------------- SVTR/CRNN recognizer


class Attention(nn.Module):
    """Multi-head self-attention written out (qkv Linear, reshape/permute heads, softmax)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        weights = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, tokens, dim))


class SdpaAttention(nn.Module):
    """Multi-head self-attention through `F.scaled_dot_product_attention` (as timm's ViT)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        context = F.scaled_dot_product_attention(q, k, v)
        return self.proj(context.transpose(1, 2).reshape(batch, tokens, dim))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(LN(x)), x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, sdpa: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = (SdpaAttention if sdpa else Attention)(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TextRecognizer(nn.Module):
    """SVTR/CRNN-style recognizer: conv stem to H/8 x W/4, transformer blocks, column classifier."""

    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 2, classes: int = 97):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, dim // 2, 3, 2, activation=nn.GELU()),
                                  conv_bn(dim // 2, dim, 3, 2, activation=nn.GELU()))
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, 2.0, sdpa=False)
                                      for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.squeeze_height = conv_bn(dim, dim, 3, (2, 1), activation=nn.Hardswish())
        self.classifier = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        batch, channels, height, width = x.shape
        tokens = self.norm(self.blocks(x.flatten(2).transpose(1, 2)))
        x = tokens.transpose(1, 2).reshape(batch, channels, height, width)
        x = self.squeeze_height(x).mean(2)              # [B, C, W]: average the rows left
        logits = self.classifier(x.permute(0, 2, 1))    # [B, W, classes]
        return logits.softmax(-1)


# -------------------------------------------------------------------- ViT-tiny


class VisionTransformer(nn.Module):
    """ViT: patch-embedding conv, class token, position embedding, pre-norm blocks, head."""

    def __init__(self, image: int = 224, patch: int = 16, dim: int = 192, depth: int = 12,
                 heads: int = 3, classes: int = 1000):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position_embedding = nn.Parameter(torch.zeros(1, tokens, dim))
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, 4.0, sdpa=True)
                                      for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(x + self.position_embedding)
        return self.head(self.norm(x)[:, 0])


# -------------------------------------------------------------------- ConvNeXt


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over the channels of NCHW, written out as ConvNeXt's reference code does."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(1, keepdim=True)
        variance = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(variance + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, permute to NHWC, LayerNorm, Linear 4x, GELU, Linear, layer scale, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.expand = nn.Linear(dim, 4 * dim)
        self.project = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(x).permute(0, 2, 3, 1)
        y = self.project(F.gelu(self.expand(self.norm(y))))
        return x + (self.layer_scale * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt stages: patchify stem + channels-first LN, blocks, LN + 2x2 conv downsampling."""

    def __init__(self, dims: tuple[int, ...] = (96, 192), depths: tuple[int, ...] = (3, 3),
                 classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), ChannelsFirstLayerNorm(dims[0])]
        for index, (dim, depth) in enumerate(zip(dims, depths)):
            if index:
                layers += [ChannelsFirstLayerNorm(dims[index - 1]),
                           nn.Conv2d(dims[index - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((2, 3))))


# -------------------------------------------------------------------- YOLO


def conv_silu(c_in: int, c_out: int, kernel: int = 1, stride: int = 1) -> nn.Sequential:
    """YOLO's Conv: conv + BatchNorm + SiLU."""
    return conv_bn(c_in, c_out, kernel, stride, activation=nn.SiLU())


class Bottleneck(nn.Module):
    """Two 3x3 Conv-BN-SiLU with an optional shortcut."""

    def __init__(self, channels: int, shortcut: bool):
        super().__init__()
        self.body = nn.Sequential(conv_silu(channels, channels, 3),
                                  conv_silu(channels, channels, 3))
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.shortcut else self.body(x)


class C2f(nn.Module):
    """1x1 conv, chunk in two (Split), bottlenecks on the last part, concat all, 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, blocks: int, shortcut: bool):
        super().__init__()
        self.hidden = c_out // 2
        self.enter = conv_silu(c_in, 2 * self.hidden)
        self.blocks = nn.ModuleList(Bottleneck(self.hidden, shortcut) for _ in range(blocks))
        self.leave = conv_silu((2 + blocks) * self.hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.enter(x).chunk(2, 1))
        for block in self.blocks:
            parts.append(block(parts[-1]))
        return self.leave(torch.cat(parts, 1))


class SPPF(nn.Module):
    """Three chained 5x5 max pools, concatenated with their input."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.enter = conv_silu(c_in, c_in // 2)
        self.leave = conv_silu(c_in // 2 * 4, c_out)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = [self.enter(x)]
        for _ in range(3):
            pooled.append(self.pool(pooled[-1]))
        return self.leave(torch.cat(pooled, 1))


class YoloDetector(nn.Module):
    """YOLOv8-style detector: backbone with C2f and SPPF, FPN/PAN neck, split box/class head.

    Output [B, 4 + classes, anchors]: raw box distances and class probabilities.
    """

    def __init__(self, width: int = 16, depth: int = 1, classes: int = 80):
        super().__init__()
        w = [width, width * 2, width * 4, width * 8, width * 16]
        self.stem = nn.Sequential(conv_silu(3, w[0], 3, 2), conv_silu(w[0], w[1], 3, 2),
                                  C2f(w[1], w[1], depth, True))
        self.down3 = nn.Sequential(conv_silu(w[1], w[2], 3, 2), C2f(w[2], w[2], depth, True))
        self.down4 = nn.Sequential(conv_silu(w[2], w[3], 3, 2), C2f(w[3], w[3], depth, True))
        self.down5 = nn.Sequential(conv_silu(w[3], w[4], 3, 2), C2f(w[4], w[4], depth, True),
                                   SPPF(w[4], w[4]))
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.top_down4 = C2f(w[4] + w[3], w[3], depth, False)
        self.top_down3 = C2f(w[3] + w[2], w[2], depth, False)
        self.bottom_up4 = nn.Sequential(conv_silu(w[2], w[2], 3, 2))
        self.merge4 = C2f(w[2] + w[3], w[3], depth, False)
        self.bottom_up5 = nn.Sequential(conv_silu(w[3], w[3], 3, 2))
        self.merge5 = C2f(w[3] + w[4], w[4], depth, False)
        self.classes = classes
        box, cls = max(16, w[2] // 4), max(w[2], classes)
        self.box_heads = nn.ModuleList(
            nn.Sequential(conv_silu(c, box, 3), nn.Conv2d(box, 4, 1)) for c in w[2:])
        self.class_heads = nn.ModuleList(
            nn.Sequential(conv_silu(c, cls, 3), nn.Conv2d(cls, classes, 1)) for c in w[2:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.down3(self.stem(x))
        p4 = self.down4(p3)
        p5 = self.down5(p4)
        n4 = self.top_down4(torch.cat([self.up(p5), p4], 1))
        n3 = self.top_down3(torch.cat([self.up(n4), p3], 1))
        n4 = self.merge4(torch.cat([self.bottom_up4(n3), n4], 1))
        n5 = self.merge5(torch.cat([self.bottom_up5(n4), p5], 1))
        levels = []
        for feature, box_head, class_head in zip((n3, n4, n5), self.box_heads, self.class_heads):
            levels.append(torch.cat([box_head(feature), class_head(feature)], 1).flatten(2))
        boxes, scores = torch.cat(levels, 2).split((4, self.classes), 1)
        return torch.cat([boxes, scores.sigmoid()], 1)


class YoloWithPostprocess(nn.Module):
    """The YOLO detector with its post-processing in the graph, as detectors are often
    exported: the anchors whose best class scores over `conf`, then the `max_det` best of
    them. Both steps have value-dependent shapes (NonZero and GatherND for the filter, TopK
    with k = min(max_det, survivors)). Outputs: boxes [N, 4], scores [N], classes [N]."""

    def __init__(self, conf: float = 0.25, max_det: int = 100, **detector):
        super().__init__()
        self.detector = YoloDetector(**detector)
        self.conf, self.max_det = conf, max_det

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        prediction = self.detector(x)[0]                  # [4 + classes, anchors]
        boxes = prediction[:4].transpose(0, 1)
        scores, classes = prediction[4:].max(0)
        keep = scores > self.conf
        boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
        if torch.jit.is_tracing():   # TorchScript traces k as a tensor computed in the graph
            k = torch.clamp(torch.tensor(self.max_det), max=scores.shape[0])
        else:
            k = min(self.max_det, scores.shape[0])
        top, order = scores.topk(k)
        return boxes[order], top, classes[order]


# -------------------------------------------------------------------- ResNeXt


class ResNeXtBlock(nn.Module):
    """1x1 reduce, grouped 3x3 (the cardinality's groups), 1x1 expand, residual, ReLU."""

    def __init__(self, c_in: int, width: int, c_out: int, groups: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c_in, width, 1, activation=nn.ReLU()),
                                  conv_bn(width, width, 3, stride, groups, nn.ReLU()),
                                  conv_bn(width, c_out, 1))
        self.shortcut = (conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out
                         else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNeXt(nn.Module):
    """ResNeXt (default: ResNeXt-50 32x4d): a 7x7 stem and max pool, stages of bottlenecks
    whose 3x3 convs are grouped (4, 8, 16, 32 channels per group), average pool, linear."""

    def __init__(self, widths: tuple[int, ...] = (128, 256, 512, 1024),
                 depths: tuple[int, ...] = (3, 4, 6, 3), cardinality: int = 32,
                 stem: int = 64, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, stem, 7, 2, activation=nn.ReLU()),
                                   nn.MaxPool2d(3, 2, 1)]
        c_in = stem
        for index, (width, depth) in enumerate(zip(widths, depths)):
            for block in range(depth):
                stride = 2 if block == 0 and index > 0 else 1
                layers.append(ResNeXtBlock(c_in, width, 2 * width, cardinality, stride))
                c_in = 2 * width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# -------------------------------------------------------------------- speech


class TemporalBlock(nn.Module):
    """A TCN block: dilated 1-d conv (same length), BatchNorm, ReLU, residual add."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.norm = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.conv(x)))


class SpeechEncoder(nn.Module):
    """A wav2vec2-style feature encoder (default: wav2vec2-base's seven strided 1-d convs
    of 512 channels with GELU, 16 kHz audio to 50 frames a second), then TCN blocks
    (dilated 1-d convs, BatchNorm, ReLU, residual), a max pool over time, a 1x1
    projection and the average over time."""

    def __init__(self, channels: int = 512,
                 layers: tuple[tuple[int, int], ...] = ((10, 5), (3, 2), (3, 2), (3, 2),
                                                        (3, 2), (2, 2), (2, 2)),
                 dilations: tuple[int, ...] = (1, 2, 4), classes: int = 32):
        super().__init__()
        encoder: list[nn.Module] = []
        c_in = 1
        for kernel, stride in layers:
            encoder += [nn.Conv1d(c_in, channels, kernel, stride, bias=False), nn.GELU()]
            c_in = channels
        self.encoder = nn.Sequential(*encoder)
        self.tcn = nn.Sequential(*(TemporalBlock(channels, d) for d in dilations),
                                 nn.MaxPool1d(2), nn.Conv1d(channels, classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tcn(self.encoder(x)).mean(2)


# -------------------------------------------------------------------- torch encoder


class TorchEncoder(nn.Module):
    """A user's own transformer encoder built from torch's modules: `nn.TransformerEncoder`
    (post-norm layers, erf GELU, packed QKV projection, torch's seq-first attention) with a
    key padding mask, the mean over time and a classifier. The corpus feeds one float input,
    so the padding flag is its first feature (frames whose flag exceeds 1 are padding:
    about one in six of random inputs), as a masked feature sequence would carry it."""

    def __init__(self, dim: int = 256, heads: int = 4, ffn: int = 1024, layers: int = 4,
                 classes: int = 10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padding = x[:, :, 0] > 1.0
        return self.head(self.encoder(x, src_key_padding_mask=padding).mean(1))


# -------------------------------------------------------------------- GPT


class CausalBlock(nn.Module):
    """A GPT-2 block as nanoGPT writes it: pre-norm, one QKV Linear split three ways, the
    heads by view and transpose, the causal mask by masked_fill with -inf, tanh GELU."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        attention = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.proj((attention @ v).transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """A GPT-2-style decoder over embedded tokens (the corpus feeds one float input): causal
    blocks, a final LayerNorm and the vocabulary head."""

    def __init__(self, dim: int = 256, heads: int = 4, layers: int = 4, vocab: int = 1000):
        super().__init__()
        self.blocks = nn.Sequential(*(CausalBlock(dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)))


# -------------------------------------------------------------------- LLaMA


class RmsNorm(nn.Module):
    """RMSNorm as LLaMA's reference code writes it: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF transformers' rotary helper: (-x2, x1) of the two halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """A LLaMA decoder layer as HF transformers writes it: RMSNorm, Q/K/V Linears without
    bias, rotary position embeddings (cos/sin tables, rotate_half), grouped-query attention
    (K and V heads repeated), causal `F.scaled_dot_product_attention`, a SwiGLU MLP."""

    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int, positions: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RmsNorm(dim), RmsNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)
        inverse = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(positions).float(), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, count, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)
        q, k = self._heads(self.q(h), self.heads), self._heads(self.k(h), self.kv_heads)
        v = self._heads(self.v(h), self.kv_heads)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(context.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """A LLaMA-style decoder over embedded tokens (the corpus feeds one float input): its
    blocks, a final RMSNorm and the vocabulary head."""

    def __init__(self, dim: int = 512, heads: int = 8, kv_heads: int = 2, ffn: int = 1376,
                 layers: int = 4, vocab: int = 1000, positions: int = 512):
        super().__init__()
        self.blocks = nn.Sequential(*(LlamaBlock(dim, heads, kv_heads, ffn, positions)
                                      for _ in range(layers)))
        self.norm = RmsNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)))


# -------------------------------------------------------------------- DeepLabV3


def conv_bn_relu(c_in: int, c_out: int, kernel: int, stride: int = 1,
                 dilation: int = 1) -> nn.Sequential:
    """Conv (no bias, same padding, optionally dilated) + BatchNorm + ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, dilation * (kernel // 2),
                                   dilation=dilation, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


class Aspp(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 branch, dilated 3x3 branches, image pooling
    upsampled bilinearly, concatenated and projected by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, rates: tuple[int, ...]):
        super().__init__()
        self.branches = nn.ModuleList([conv_bn_relu(c_in, c_out, 1)] +
                                      [conv_bn_relu(c_in, c_out, 3, dilation=r) for r in rates])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), conv_bn_relu(c_in, c_out, 1))
        self.project = conv_bn_relu(c_out * (len(rates) + 2), c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.interpolate(self.pool(x), size=x.shape[-2:], mode="bilinear",
                               align_corners=False)
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], 1))


class DeepLabV3(nn.Module):
    """A DeepLabV3 segmenter at output stride 8 (torchvision's layout, a lighter
    backbone): a stem of stride-2 3x3 convs, then stages of two 3x3 convs whose dilation
    doubles instead of the stride (the atrous last stages), ASPP, the classifier and a
    bilinear upsample to the input's size."""

    def __init__(self, stem: tuple[int, ...] = (32, 64, 128), stages: tuple[int, ...] = (256, 256),
                 dilations: tuple[int, ...] = (2, 4), aspp: int = 128,
                 rates: tuple[int, ...] = (12, 24, 36), classes: int = 21):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for width in stem:
            layers.append(conv_bn_relu(c_in, width, 3, 2))
            c_in = width
        for width, dilation in zip(stages, dilations):
            layers += [conv_bn_relu(c_in, width, 3, dilation=dilation),
                       conv_bn_relu(width, width, 3, dilation=dilation)]
            c_in = width
        self.backbone = nn.Sequential(*layers)
        self.aspp = Aspp(c_in, aspp, rates)
        self.classifier = nn.Conv2d(aspp, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.aspp(self.backbone(x)))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


# -------------------------------------------------------------------- CRNN


class Crnn(nn.Module):
    """A CRNN text recognizer: a VGG-style conv stack whose pools halve the height only
    once the width is the sequence's, the height averaged away, then a bidirectional LSTM
    and a bidirectional GRU over the columns (the two recurrent ops exporters emit) and a
    per-column classifier with log-softmax (CTC's input)."""

    def __init__(self, widths: tuple[int, int, int] = (64, 128, 256), hidden: int = 256,
                 classes: int = 97):
        super().__init__()
        a, b, c = widths
        self.features = nn.Sequential(conv_bn_relu(3, a, 3), nn.MaxPool2d(2),
                                      conv_bn_relu(a, b, 3), nn.MaxPool2d(2),
                                      conv_bn_relu(b, c, 3), conv_bn_relu(c, c, 3),
                                      nn.MaxPool2d((2, 1)), conv_bn_relu(c, c, 3))
        self.lstm = nn.LSTM(c, hidden, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        columns = self.features(x).mean(2).permute(2, 0, 1)   # [width, batch, channels]
        sequence, _ = self.lstm(columns)
        sequence, _ = self.gru(sequence)
        return self.head(sequence).log_softmax(-1)


# -------------------------------------------------------------------- ESPCN


class Espcn(nn.Module):
    """ESPCN super-resolution: 5x5 and 3x3 convs with Tanh, a 3x3 conv to 3 r^2 channels,
    PixelShuffle (DepthToSpace) and a clamp to [0, 1]."""

    def __init__(self, widths: tuple[int, int] = (64, 32), scale: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, widths[0], 5, padding=2), nn.Tanh(),
                                  nn.Conv2d(widths[0], widths[1], 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(widths[1], 3 * scale * scale, 3, padding=1))
        self.shuffle = nn.PixelShuffle(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.shuffle(self.body(x)), 0.0, 1.0)


# -------------------------------------------------------------------- MaxViT


class RelativeAttention(nn.Module):
    """Multi-head attention within partitions, written with `torch.einsum` over
    [B, G, heads, N, D] as torchvision's MaxViT has it (the exporters keep Einsum nodes),
    with a learned relative position bias gathered from a table by a fixed index."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        span = 2 * window - 1
        self.bias_table = nn.Parameter(torch.zeros(span * span, heads))
        rows, cols = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        coords = torch.stack([rows.flatten(), cols.flatten()])
        offsets = coords[:, :, None] - coords[:, None, :] + window - 1
        self.register_buffer("bias_index", (offsets[0] * span + offsets[1]).flatten(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, groups, tokens, dim = x.shape
        q, k, v = (t.reshape(batch, groups, tokens, self.heads, dim // self.heads)
                   .transpose(2, 3) for t in self.qkv(x).chunk(3, dim=-1))
        scores = torch.einsum("bghid,bghjd->bghij", q * self.scale, k)
        bias = self.bias_table[self.bias_index].reshape(tokens, tokens, self.heads)
        weights = (scores + bias.permute(2, 0, 1)).softmax(dim=-1)
        context = torch.einsum("bghij,bghjd->bghid", weights, v)
        return self.proj(context.transpose(2, 3).reshape(batch, groups, tokens, dim))


def partition(x: torch.Tensor, window: int, grid: bool) -> torch.Tensor:
    """[B, C, H, W] -> [B, groups, window^2, C]: non-overlapping windows (block
    attention) or a window x window grid of cells H / window apart (grid attention)."""
    batch, channels, height, width = x.shape
    if grid:
        x = x.reshape(batch, channels, window, height // window, window, width // window)
        x = x.permute(0, 3, 5, 2, 4, 1)
    else:
        x = x.reshape(batch, channels, height // window, window, width // window, window)
        x = x.permute(0, 2, 4, 3, 5, 1)
    return x.reshape(batch, (height // window) * (width // window), window * window, channels)


def departition(x: torch.Tensor, window: int, grid: bool, height: int,
                width: int) -> torch.Tensor:
    """The inverse of `partition`."""
    batch, _, _, channels = x.shape
    x = x.reshape(batch, height // window, width // window, window, window, channels)
    if grid:
        x = x.permute(0, 5, 3, 1, 4, 2)
    else:
        x = x.permute(0, 5, 1, 3, 2, 4)
    return x.reshape(batch, channels, height, width)


class PartitionAttention(nn.Module):
    """Pre-norm attention and MLP over the partitions of a feature map."""

    def __init__(self, dim: int, heads: int, window: int, grid: bool):
        super().__init__()
        self.window, self.grid = window, grid
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RelativeAttention(dim, heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[2], x.shape[3]
        parts = partition(x, self.window, self.grid)
        parts = parts + self.attn(self.norm1(parts))
        parts = parts + self.mlp(self.norm2(parts))
        return departition(parts, self.window, self.grid, height, width)


class MbConv(nn.Module):
    """MaxViT's MBConv: pre-BatchNorm, 1x1 expand, depthwise 3x3 (stride 2 at a stage's
    start), squeeze-excite with SiLU and a sigmoid gate, 1x1 project; the shortcut pools
    and projects where the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        hidden = 4 * c_out
        self.body = nn.Sequential(
            nn.BatchNorm2d(c_in), conv_bn(c_in, hidden, 1, activation=nn.GELU()),
            conv_bn(hidden, hidden, 3, stride, groups=hidden, activation=nn.GELU()))
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, hidden // 16, 1),
                                  nn.SiLU(), nn.Conv2d(hidden // 16, hidden, 1), nn.Sigmoid())
        self.project = nn.Conv2d(hidden, c_out, 1)
        self.shortcut = nn.Sequential(nn.AvgPool2d(3, stride, 1), nn.Conv2d(c_in, c_out, 1)) \
            if stride != 1 or c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.shortcut(x) + self.project(y * self.gate(y))


class MaxVit(nn.Module):
    """MaxViT: a conv stem, stages of MBConv + block attention + grid attention, the first
    block of each stage halving the resolution, mean pool, LayerNorm and a classifier."""

    def __init__(self, stem: int = 64, dims: tuple[int, ...] = (64, 128, 256, 512),
                 depths: tuple[int, ...] = (2, 2, 5, 2), head_dim: int = 32, window: int = 7,
                 classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, stem, 3, 2, activation=nn.GELU()),
                                  nn.Conv2d(stem, stem, 3, 1, 1))
        layers: list[nn.Module] = []
        c_in = stem
        for dim, depth in zip(dims, depths):
            for index in range(depth):
                layers += [MbConv(c_in, dim, 2 if index == 0 else 1),
                           PartitionAttention(dim, dim // head_dim, window, grid=False),
                           PartitionAttention(dim, dim // head_dim, window, grid=True)]
                c_in = dim
        self.stages = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(c_in)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x)).mean((2, 3))
        return self.head(self.norm(x))


# -------------------------------------------------------------------- ShuffleNet-v2


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the channels of `groups` groups: view, swap, view back (the exporters
    write Reshape (N, g, C/g, H, W), Transpose (0, 2, 1, 3, 4), Reshape (N, C, H, W))."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """A ShuffleNet-v2 unit: stride 1 splits the channels in two halves (`chunk`: Split or
    Slices), one passed through, one through 1x1, depthwise 3x3, 1x1; stride 2 runs both
    branches on the whole input. Then Concat and a channel shuffle of 2 groups."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        half = c_out // 2
        self.down = None
        if stride > 1:
            self.down = nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in),
                                      conv_bn(c_in, half, 1, activation=nn.ReLU()))
        width = c_in if stride > 1 else half
        self.branch = nn.Sequential(conv_bn(width, half, 1, activation=nn.ReLU()),
                                    conv_bn(half, half, 3, stride, groups=half),
                                    conv_bn(half, half, 1, activation=nn.ReLU()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.down is None:
            kept, x = x.chunk(2, dim=1)
        else:
            kept = self.down(x)
        return channel_shuffle(torch.cat((kept, self.branch(x)), 1), 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNet-v2 (1.0x: 116, 232, 464 channels, none a whole number of 16-lane blocks):
    a 3x3 stride-2 stem, max pool, three stages whose first unit halves the resolution,
    a 1x1 conv to 1024, mean pool and a classifier."""

    def __init__(self, widths: tuple[int, ...] = (24, 116, 232, 464), repeats=(4, 8, 4),
                 last: int = 1024, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, widths[0], 3, 2, activation=nn.ReLU()),
                                  nn.MaxPool2d(3, 2, 1))
        units: list[nn.Module] = []
        for c_in, c_out, count in zip(widths, widths[1:], repeats):
            units += [ShuffleUnit(c_in, c_out, 2)]
            units += [ShuffleUnit(c_out, c_out, 1) for _ in range(count - 1)]
        self.stages = nn.Sequential(*units)
        self.last = conv_bn(widths[-1], last, 1, activation=nn.ReLU())
        self.head = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.last(self.stages(self.stem(x))).mean((2, 3)))


# -------------------------------------------------------------------- RegNet-Y


class RegNetBlock(nn.Module):
    """RegNet-Y's block: 1x1, grouped 3x3 (groups of `group_width` channels, stride 2 at a
    stage's start), squeeze-excite (a quarter of the input's width, sigmoid gate), 1x1; the
    shortcut projected where the shape changes, ReLU after the sum."""

    def __init__(self, c_in: int, c_out: int, stride: int, group_width: int):
        super().__init__()
        squeezed = max(1, round(c_in / 4))
        self.body = nn.Sequential(
            conv_bn(c_in, c_out, 1, activation=nn.ReLU()),
            conv_bn(c_out, c_out, 3, stride, groups=c_out // group_width,
                    activation=nn.ReLU()))
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c_out, squeezed, 1),
                                  nn.ReLU(), nn.Conv2d(squeezed, c_out, 1), nn.Sigmoid())
        self.project = conv_bn(c_out, c_out, 1)
        self.shortcut = conv_bn(c_in, c_out, 1, stride) \
            if stride != 1 or c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return F.relu(self.shortcut(x) + self.project(y * self.gate(y)))


class RegNetY(nn.Module):
    """RegNet-Y (400MF by default: widths 48, 104, 208, 440 in groups of 8, none but 48 and
    208 whole 16-lane blocks): a 3x3 stride-2 stem, four stages, mean pool, classifier."""

    def __init__(self, stem: int = 32, widths: tuple[int, ...] = (48, 104, 208, 440),
                 depths: tuple[int, ...] = (1, 3, 6, 6), group_width: int = 8,
                 classes: int = 1000):
        super().__init__()
        self.stem = conv_bn(3, stem, 3, 2, activation=nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = stem
        for width, depth in zip(widths, depths):
            for index in range(depth):
                blocks.append(RegNetBlock(c_in, width, 2 if index == 0 else 1, group_width))
                c_in = width
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


# -------------------------------------------------------------------- diffusion UNet


class GroupNormBlock(nn.Module):
    """A diffusion UNet's residual block: GroupNorm, SiLU, 3x3 conv, twice; the shortcut a
    1x1 conv where the width changes."""

    def __init__(self, c_in: int, c_out: int, groups: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.GroupNorm(groups, c_in), nn.SiLU(), nn.Conv2d(c_in, c_out, 3, padding=1),
            nn.GroupNorm(groups, c_out), nn.SiLU(), nn.Conv2d(c_out, c_out, 3, padding=1))
        self.shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class DiffusionUNet(nn.Module):
    """A Stable-Diffusion-style UNet on a latent (no time embedding or attention): GroupNorm
    residual blocks, stride-2 conv downsampling, one ConvTranspose and one nearest
    `nn.Upsample` on the way up, skip connections joined by Concat, a GroupNorm-SiLU-conv
    head back to the latent's channels."""

    def __init__(self, channels: int = 4, widths: tuple[int, int] = (64, 128),
                 groups: int = 8):
        super().__init__()
        first, second = widths
        self.stem = nn.Conv2d(channels, first, 3, padding=1)
        self.down1 = nn.Sequential(GroupNormBlock(first, first, groups),
                                   nn.Conv2d(first, first, 3, 2, 1))
        self.block2 = GroupNormBlock(first, second, groups)
        self.down2 = nn.Conv2d(second, second, 3, 2, 1)
        self.middle = GroupNormBlock(second, second, groups)
        self.up2 = nn.ConvTranspose2d(second, second, 4, 2, 1)
        self.block_up2 = GroupNormBlock(2 * second, second, groups)
        self.up1 = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.block_up1 = GroupNormBlock(second + first, first, groups)
        self.head = nn.Sequential(nn.GroupNorm(groups, first), nn.SiLU(),
                                  nn.Conv2d(first, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip1 = self.stem(x)
        skip2 = self.block2(self.down1(skip1))
        y = self.middle(self.down2(skip2))
        y = self.block_up2(torch.cat([self.up2(y), skip2], 1))
        y = self.block_up1(torch.cat([self.up1(y), skip1], 1))
        return self.head(y)


# -------------------------------------------------------------------- Swin


class ShiftedWindowBlock(nn.Module):
    """A Swin Transformer block on [B, H, W, C]: LayerNorm, attention within `window` x
    `window` windows (cyclically shifted by `shift` with `torch.roll`, partitioned by
    view-permute-reshape, a learned relative bias per head added to the scores and, in a
    shifted block, the mask that keeps a window's tokens from the regions the roll brought
    together: computed in the forward pass and added to the scores viewed per image, as
    torchvision, timm and Hugging Face write it), the windows put back and unshifted, then
    LayerNorm and a GELU MLP; residuals around both."""

    def __init__(self, dim: int, heads: int, window: int, shift: int):
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.zeros(heads, window * window, window * window))
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def _windows(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, dim = x.shape
        w = self.window
        x = x.view(batch, height // w, w, width // w, w, dim).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, w * w, dim)

    def _shift_mask(self, height: int, width: int) -> torch.Tensor:
        """[windows, N, N]: 0 between two tokens of a window from one region of the rolled
        image, -100 between regions (the last `window` rows and columns hold three
        regions each: the rows before the roll's seam, and those it wrapped around)."""
        w, shift = self.window, self.shift

        def regions(size: int) -> torch.Tensor:
            index = torch.arange(size)
            return (index >= size - w).long() + (index >= size - shift).long()

        label = regions(height)[:, None] * 3 + regions(width)[None, :]
        label = label.view(height // w, w, width // w, w).permute(0, 2, 1, 3).reshape(-1, w * w)
        apart = label[:, None, :] - label[:, :, None]
        return torch.where(apart != 0, torch.tensor(-100.0), torch.tensor(0.0))

    def _attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        count, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(count, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (dim // self.heads) ** -0.5 + self.bias_table
        if mask is not None:
            windows = mask.shape[0]
            scores = scores.view(count // windows, windows, self.heads, tokens, tokens)
            scores = (scores + mask.unsqueeze(1).unsqueeze(0)).view(-1, self.heads, tokens, tokens)
        return self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(count, tokens, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, dim = x.shape
        w, shift = self.window, self.shift
        y = self.norm1(x)
        if shift:
            y = torch.roll(y, (-shift, -shift), (1, 2))
        y = self._attention(self._windows(y), self._shift_mask(height, width) if shift else None)
        y = y.view(batch, height // w, width // w, w, w, dim).permute(0, 1, 3, 2, 4, 5)
        y = y.reshape(batch, height, width, dim)
        if shift:
            y = torch.roll(y, (shift, shift), (1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    """Swin-T's first stage (by default): a 4x4 patch-embedding conv, blocks alternating
    plain and shifted windows, mean pool, classifier."""

    def __init__(self, dim: int = 96, heads: int = 3, window: int = 7, depth: int = 2,
                 patch: int = 4, classes: int = 1000):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*[
            ShiftedWindowBlock(dim, heads, window, window // 2 if index % 2 else 0)
            for index in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.embed(x).permute(0, 2, 3, 1))
        return self.head(self.norm(x).mean((1, 2)))


# -------------------------------------------------------------------- sizes


# -------------------------------------------------------------------- CLIP


class QuickGelu(nn.Module):
    """CLIP's activation as OpenAI's code writes it: x * sigmoid(1.702 x)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ClipBlock(nn.Module):
    """A CLIP text-encoder block: pre-norm attention over one packed QKV Linear under an
    additive causal mask (-inf above the diagonal), an MLP with QuickGELU."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), QuickGelu(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads) + mask
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class ClipText(nn.Module):
    """CLIP's text encoder over embedded tokens (the corpus feeds one float input): learned
    positions, causal blocks, a final LayerNorm and the projection."""

    def __init__(self, dim: int = 512, heads: int = 8, layers: int = 4, positions: int = 77):
        super().__init__()
        self.position = nn.Parameter(torch.randn(positions, dim) * 0.01)
        self.blocks = nn.ModuleList(ClipBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.projection = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = x + self.position[:t]
        for block in self.blocks:
            x = block(x, mask)
        return self.projection(self.norm(x))


# -------------------------------------------------------------------- CSPDarknet


def conv_bn_mish(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out), nn.Mish())


class DarkResidual(nn.Module):
    """Darknet's residual block: 1x1 and 3x3 convs with Mish, added to the input."""

    def __init__(self, channels: int):
        super().__init__()
        self.block = nn.Sequential(conv_bn_mish(channels, channels, 1),
                                   conv_bn_mish(channels, channels, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class CspStage(nn.Module):
    """A CSPDarknet stage (YOLOv4's backbone): a strided 3x3 conv, two 1x1 branches, one
    through residual blocks, concatenated and mixed by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, blocks: int):
        super().__init__()
        half = c_out // 2
        self.down = conv_bn_mish(c_in, c_out, 3, 2)
        self.part1, self.part2 = conv_bn_mish(c_out, half, 1), conv_bn_mish(c_out, half, 1)
        self.blocks = nn.Sequential(*(DarkResidual(half) for _ in range(blocks)))
        self.mix = conv_bn_mish(c_out, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)
        return self.mix(torch.cat([self.blocks(self.part1(x)), self.part2(x)], 1))


class CspDarknet(nn.Module):
    """YOLOv4's CSPDarknet backbone with a classifier head: Mish after every conv."""

    def __init__(self, stem: int = 32, widths: tuple[int, ...] = (64, 128, 256, 512),
                 blocks: tuple[int, ...] = (1, 2, 4, 2), classes: int = 1000):
        super().__init__()
        self.stem = conv_bn_mish(3, stem, 3)
        stages, c_in = [], stem
        for width, count in zip(widths, blocks):
            stages.append(CspStage(c_in, width, count))
            c_in = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


@dataclass(frozen=True)
class NetSpec:
    """How to make one corpus network at one size: constructor arguments and input shape."""

    arguments: dict
    input_shape: tuple[int, ...]


NETWORKS: dict[str, type[nn.Module]] = {
    "mobilenetv3": MobileNetV3Small,
    "dbnet": TextDetector,
    "svtr": TextRecognizer,
    "vit": VisionTransformer,
    "convnext": ConvNeXt,
    "yolo": YoloDetector,
    "yolopost": YoloWithPostprocess,
    "resnext": ResNeXt,
    "speech": SpeechEncoder,
    "deeplab": DeepLabV3,
    "espcn": Espcn,
    "torchenc": TorchEncoder,
    "gpt": Gpt,
    "crnn": Crnn,
    "llama": Llama,
    "maxvit": MaxVit,
    "shufflenet": ShuffleNetV2,
    "regnet": RegNetY,
    "unet": DiffusionUNet,
    "swin": Swin,
    "clip": ClipText,
    "cspdarknet": CspDarknet,
}

# "ci": a few MFLOPs, built and exported in seconds; "bench": the real model's scale
# (or a stage of it) at a typical input size.
SIZES: dict[str, dict[str, NetSpec]] = {
    "ci": {
        "mobilenetv3": NetSpec({"width": 0.5, "blocks": 6, "classes": 10, "head": 64},
                               (1, 3, 64, 64)),
        "dbnet": NetSpec({"widths": (8, 16, 24, 32), "fpn": 16}, (1, 3, 64, 64)),
        "svtr": NetSpec({"dim": 32, "depth": 1, "heads": 2, "classes": 20}, (1, 3, 32, 64)),
        "vit": NetSpec({"image": 32, "patch": 8, "dim": 32, "depth": 2, "heads": 2,
                        "classes": 10}, (1, 3, 32, 32)),
        "convnext": NetSpec({"dims": (16, 32), "depths": (1, 1), "classes": 10},
                            (1, 3, 32, 32)),
        "yolo": NetSpec({"width": 4, "depth": 1, "classes": 8}, (1, 3, 64, 64)),
        # the random detector's scores lie in 0.52-0.56: a threshold among them keeps a
        # number of anchors that varies with the input
        "yolopost": NetSpec({"width": 4, "depth": 1, "classes": 8, "conf": 0.54},
                            (1, 3, 64, 64)),
        "resnext": NetSpec({"widths": (32, 64), "depths": (1, 1), "cardinality": 8,
                            "stem": 16, "classes": 10}, (1, 3, 64, 64)),
        "speech": NetSpec({"channels": 24, "layers": ((10, 5), (3, 2), (2, 2)),
                           "dilations": (1, 2), "classes": 8}, (1, 1, 1600)),
        "deeplab": NetSpec({"stem": (8, 16), "stages": (16, 24), "dilations": (2, 4),
                            "aspp": 16, "rates": (2, 3), "classes": 5}, (1, 3, 64, 64)),
        "espcn": NetSpec({"widths": (16, 8), "scale": 3}, (1, 3, 20, 20)),
        "torchenc": NetSpec({"dim": 32, "heads": 2, "ffn": 64, "layers": 2}, (1, 16, 32)),
        "gpt": NetSpec({"dim": 32, "heads": 2, "layers": 2, "vocab": 50}, (1, 16, 32)),
        "crnn": NetSpec({"widths": (8, 16, 24), "hidden": 20, "classes": 12}, (1, 3, 32, 64)),
        "llama": NetSpec({"dim": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "layers": 2,
                          "vocab": 50, "positions": 16}, (1, 16, 32)),
        "maxvit": NetSpec({"stem": 16, "dims": (16, 32), "depths": (1, 1), "head_dim": 8,
                           "window": 4, "classes": 10}, (1, 3, 32, 32)),
        "shufflenet": NetSpec({"widths": (8, 60, 116), "repeats": (3, 2), "last": 64,
                               "classes": 10}, (1, 3, 64, 64)),
        "regnet": NetSpec({"stem": 8, "widths": (24, 56), "depths": (1, 2), "classes": 10},
                          (1, 3, 64, 64)),
        "unet": NetSpec({"widths": (16, 24), "groups": 4}, (1, 4, 16, 16)),
        "swin": NetSpec({"dim": 24, "heads": 2, "window": 4, "depth": 2, "classes": 10},
                        (1, 3, 32, 32)),
        "clip": NetSpec({"dim": 32, "heads": 2, "layers": 2, "positions": 16}, (1, 16, 32)),
        "cspdarknet": NetSpec({"stem": 8, "widths": (16, 32), "blocks": (1, 1), "classes": 10},
                              (1, 3, 32, 32)),
    },
    "bench": {
        "mobilenetv3": NetSpec({}, (1, 3, 224, 224)),
        "dbnet": NetSpec({"widths": (16, 24, 56, 96), "fpn": 96, "blocks_per_stage": 2},
                         (1, 3, 320, 320)),
        "svtr": NetSpec({"dim": 128, "depth": 4, "heads": 4, "classes": 97},
                        (1, 3, 48, 192)),
        "vit": NetSpec({}, (1, 3, 224, 224)),
        "convnext": NetSpec({}, (1, 3, 224, 224)),
        "yolo": NetSpec({"width": 16, "depth": 1, "classes": 80}, (1, 3, 320, 320)),
        "yolopost": NetSpec({"width": 16, "depth": 1, "classes": 80}, (1, 3, 320, 320)),
        "resnext": NetSpec({}, (1, 3, 224, 224)),
        "speech": NetSpec({}, (1, 1, 16000)),
        "deeplab": NetSpec({}, (1, 3, 512, 512)),
        "espcn": NetSpec({}, (1, 3, 160, 160)),
        "torchenc": NetSpec({}, (1, 128, 256)),
        "gpt": NetSpec({}, (1, 128, 256)),
        "crnn": NetSpec({}, (1, 3, 32, 320)),
        "llama": NetSpec({}, (1, 128, 512)),
        "maxvit": NetSpec({}, (1, 3, 224, 224)),
        "shufflenet": NetSpec({}, (1, 3, 224, 224)),
        "regnet": NetSpec({}, (1, 3, 224, 224)),
        "unet": NetSpec({}, (1, 4, 64, 64)),
        "swin": NetSpec({}, (1, 3, 224, 224)),
        "clip": NetSpec({}, (1, 77, 512)),
        "cspdarknet": NetSpec({}, (1, 3, 256, 256)),
    },
}


def make_network(name: str, size: str, seed: int) -> tuple[nn.Module, tuple[int, ...]]:
    """The seeded network `name` at `size` ("ci" or "bench") and its input shape."""
    spec = SIZES[size][name]
    torch.manual_seed(seed)
    return seed_parameters(NETWORKS[name](**spec.arguments), seed), spec.input_shape
