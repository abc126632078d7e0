"""PyTorch equivalents of three `light` ONNX models, for GPU latency comparisons.

The ONNX light models' weights are constants, so any network with the same layers and shapes
serves for latency: these modules are written from the ONNX graphs (no torchvision, no
onnx2torch), with random weights. `check_against_onnx` compares the parameter count and the
output shape with the ONNX model (scripts/bench_gpu.py records the result).

    model = TORCH_MODELS["resnet50"]()      # torch.nn.Module, input [1, 3, 224, 224]
"""

from __future__ import annotations

import os

import torch
from torch import nn


class Bottleneck(nn.Module):
    """ResNet-50 v1 block as in the ONNX model: the stride sits on the first 1x1."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, stride), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1))
        self.shortcut = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        skip = x if self.shortcut is None else self.shortcut(x)
        return self.relu(self.body(x) + skip)


def resnet50() -> nn.Module:
    """ResNet-50 with batch norms folded into the convolutions (as wpk's passes fold them)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            layers.append(Bottleneck(cin, width, stride if index == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000), nn.Softmax(1)]
    return nn.Sequential(*layers)


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(inplace=True))
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, 1, 1), nn.ReLU(inplace=True))

    def forward(self, x):
        s = self.squeeze(x)
        return torch.cat([self.e1(s), self.e3(s)], 1)


def squeezenet() -> nn.Module:
    """SqueezeNet 1.1 (the layer list of the ONNX light model: output [1, 1000, 1, 1])."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2),
        Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2),
        Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        nn.Conv2d(512, 1000, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
        nn.Softmax(1))


def alexnet() -> nn.Module:
    """BVLC AlexNet (grouped convolutions, local response normalisation; 224 input)."""
    return nn.Sequential(
        nn.Conv2d(3, 96, 11, 4), nn.ReLU(inplace=True), nn.LocalResponseNorm(5, 1e-4, 0.75),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(96, 256, 5, 1, 2, groups=2), nn.ReLU(inplace=True),
        nn.LocalResponseNorm(5, 1e-4, 0.75), nn.MaxPool2d(3, 2),
        nn.Conv2d(256, 384, 3, 1, 1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 384, 3, 1, 1, groups=2), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, 1, 1, groups=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, ceil_mode=True),  # 12 -> 6, as the ONNX graph pads its last pool
        nn.Flatten(), nn.Linear(9216, 4096), nn.ReLU(inplace=True),
        nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 1000), nn.Softmax(1))


TORCH_MODELS = {"resnet50": resnet50, "squeezenet": squeezenet, "bvlc_alexnet": alexnet}


def onnx_path(name: str) -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        f"light_{name}.onnx")


def check_against_onnx(name: str) -> dict:
    """Parameter elements in tensors of over 64 elements (wpk's optimized graph: batch norms
    folded, as in these modules) and output shapes of the torch module and the ONNX model."""
    from wpk.frontend import load_model
    from wpk.passes import optimize

    graph, _ = optimize(load_model(onnx_path(name)), "cuda")
    float_constants = sum(int(v.size) for v in graph.constants.values()
                          if v.dtype.kind == "f" and v.size > 64)
    module = TORCH_MODELS[name]()
    with torch.no_grad():
        out = module(torch.zeros(1, 3, 224, 224))
    dims = list(graph.tensors[graph.outputs[0]].shape)
    # tiny constants (shape vectors, small biases) are left out on both sides alike
    return {"torch_params": sum(p.numel() for p in module.parameters() if p.numel() > 64),
            "onnx_params_folded": float_constants, "torch_output": list(out.shape),
            "onnx_output": dims, "same_output_shape": list(out.shape) == dims}
