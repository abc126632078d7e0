"""wpk.frontend_pools: a pool with `ceil_mode` set gets the ONNX spec's output size (the
last window dropped when it would start in the end padding), which onnxruntime and torch
compute and ONNX's own shape inference (1.23) does not; such models, as torch exports
them, build to plans that match onnxruntime."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import wpk
from wpk.core.onnx_pool import spec_pool_size
from wpk.runtime import Session

FAST = {"search": "none", "warmup": 0, "repeats": 1, "min_time": 0.0, "progress": False,
        "partition": False}


def pool_model(op: str, size: int, kernel: int, stride: int, pad: int,
               **attrs) -> onnx.ModelProto:
    node = h.make_node(op, ["x"], ["y"], kernel_shape=[kernel, kernel], pads=[pad] * 4,
                       strides=[stride, stride], ceil_mode=1, **attrs)
    graph = h.make_graph([node], "pool", [h.make_tensor_value_info("x", T.FLOAT,
                                                                   [1, 8, size, size])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", "c", "h", "w"])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])


def onnxruntime_run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("size, kernel, stride, pad, dilation", [
    c for c in itertools.product((2, 5, 7, 8), (1, 2, 3, 5), (1, 2, 3), (0, 1, 2), (1, 2))
    if c[3] < c[1] and c[0] + 2 * c[3] >= c[4] * (c[1] - 1) + 1])
def test_the_spec_size_is_onnxruntimes(size, kernel, stride, pad, dilation):
    model = pool_model("MaxPool", size, kernel, stride, pad, dilations=[dilation] * 2)
    x = np.zeros((1, 8, size, size), np.float32)
    assert onnxruntime_run(model, {"x": x}).shape[2] == spec_pool_size(
        size, kernel, stride, pad, pad, dilation)


@pytest.mark.parametrize("op, size, kernel, stride, pad, attrs", [
    ("MaxPool", 5, 2, 2, 1, {}),                  # ONNX inference: 4, the spec: 3
    ("MaxPool", 8, 3, 3, 1, {}),
    ("MaxPool", 8, 3, 2, 1, {}),                  # no window dropped
    ("AveragePool", 8, 3, 2, 2, {"count_include_pad": 0}),
    ("AveragePool", 7, 2, 3, 1, {"count_include_pad": 1}),
    ("AveragePool", 7, 3, 2, 1, {"count_include_pad": 1})])
def test_a_ceil_mode_pool_builds_to_onnxruntimes_shape_and_values(op, size, kernel, stride,
                                                                 pad, attrs):
    model = pool_model(op, size, kernel, stride, pad, **attrs)
    x = np.random.default_rng(size + kernel).standard_normal((1, 8, size, size)).astype(
        np.float32)
    expected = onnxruntime_run(model, {"x": x})
    actual = Session(wpk.build(model, target="cpu", **FAST)).run({"x": x})["y"]
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_exports_of_ceil_mode_pools_with_padding_match_torch(dynamo, tmp_path):
    """TorchScript's export declares ONNX inference's (wrong) output shape, 4x4: the plan
    computed an extra row and column. The dynamo export declares torch's 3x3, and the
    model failed ONNX's checker in wpk ("Inferred shape and existing shape differ")."""
    import warnings

    import torch

    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.max = torch.nn.MaxPool2d(2, 2, padding=1, ceil_mode=True)
            self.avg = torch.nn.AvgPool2d(3, 2, padding=1, ceil_mode=True,
                                          count_include_pad=False)

        def forward(self, x):
            return self.avg(torch.relu(self.max(self.conv(x))))

    torch.manual_seed(0)
    net, x = Pools().eval(), torch.randn(1, 3, 9, 9)
    path = tmp_path / "pools.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(path), dynamo=dynamo, opset_version=17)
    model = onnx.load(str(path))
    name = model.graph.input[0].name
    with torch.no_grad():
        expected = net(x).numpy()
    actual = next(iter(Session(wpk.build(model, target="cpu", **FAST)).run(
        {name: x.numpy()}).values()))
    assert actual.shape == expected.shape == (1, 8, 3, 3)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
