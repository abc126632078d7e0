"""The CPU pass `conv_transpose_as_matmul`: a ConvTranspose of a one-pixel image (a
generator's first layer) becomes Reshape, MatMul, bias Add, Reshape; where it must leave a
ConvTranspose alone; builds against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.conv_transpose_gemm import ConvTransposeAsMatMul

CI, CO, K = 20, 12, 4   # not multiples of a vector
OUT = ["n", "c", "h", "w"]   # left to shape inference


def generator_head(batch: int = 2, bias: bool = True, batch_norm: bool = True,
                   image: int = 1, **attrs) -> onnx.ModelProto:
    """z (batch, CI, image, image) -> ConvTranspose (K x K, stride 2) [-> BatchNorm] -> ReLU."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(
        (rng.standard_normal((CI, CO, K, K)) * 0.3).astype(np.float32), "w")]
    inputs = ["z", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.random(CO).astype(np.float32), "b"))
        inputs.append("b")
    attrs = {"strides": [2, 2], **attrs}
    nodes = [helper.make_node("ConvTranspose", inputs, ["t"], **attrs)]
    last = "t"
    if batch_norm:
        for name, value in (("gamma", rng.random(CO) + 0.5), ("beta", rng.random(CO)),
                            ("mean", rng.random(CO) * 0.1), ("var", rng.random(CO) + 0.5)):
            inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization",
                                      ["t", "gamma", "beta", "mean", "var"], ["n"]))
        last = "n"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                      [batch, CI, image, image])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, OUT)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _rewritten(model: onnx.ModelProto) -> int:
    graph = load_model(model)
    rewrite = ConvTransposeAsMatMul()
    graph = rewrite.run(graph)
    check_graph(graph)
    return rewrite.hits["conv_transpose_as_matmul"]


@pytest.mark.parametrize("bias, batch_norm", [(True, True), (False, False), (True, False)])
def test_a_one_pixel_conv_transpose_builds_as_a_matmul(bias, batch_norm, rng, tmp_path):
    """Through the pipeline (BatchNorm folded first, then the rewrite, the GEMM kernels):
    no ConvTranspose left, the output within 1e-5 of onnxruntime's on the model."""
    model = generator_head(bias=bias, batch_norm=batch_norm)
    optimized, report = optimize(load_model(model), "cpu")
    assert report.passes["conv_transpose_as_matmul"] == 1
    ops = [n.op for n in optimized.nodes]
    assert "ConvTranspose" not in ops and "MatMul" in ops
    (matmul,) = [n for n in optimized.nodes if n.op == "MatMul"]
    assert optimized.tensors[matmul.outputs[0]].shape == (2, CO * K * K)
    wpk.build(model, target="cpu", progress=False, partition=False).save(
        str(tmp_path / "head.wpk"))
    z = rng.standard_normal((2, CI, 1, 1)).astype(np.float32)
    got = wpk.load(str(tmp_path / "head.wpk")).run({"z": z})["y"]
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"z": z})[0]
    assert got.shape == expected.shape == (2, CO, K, K)
    assert relative_l2(got, expected) < 1e-5


def test_the_matrix_holds_each_tap_of_the_weights():
    """Column co * K * K + y * K + x of the MatMul's matrix is tap (y, x) of output
    channel co; the bias repeats over the taps."""
    graph = ConvTransposeAsMatMul().run(load_model(generator_head(batch_norm=False)))
    (matmul,) = [n for n in graph.nodes if n.op == "MatMul"]
    (add,) = [n for n in graph.nodes if n.op == "Add"]
    matrix, taps = graph.constants[matmul.inputs[1]], graph.constants[add.inputs[1]]
    model = generator_head(batch_norm=False)
    weights = numpy_helper.to_array(model.graph.initializer[0])
    bias = numpy_helper.to_array(model.graph.initializer[1])
    co, y, x = 5, 2, 3
    np.testing.assert_array_equal(matrix[:, co * K * K + y * K + x], weights[:, co, y, x])
    assert taps[co * K * K + y * K + x] == bias[co]


@pytest.mark.parametrize("change", [
    {"image": 2},                                   # more than one pixel
    {"pads": [1, 1, 1, 1]},                         # the output cropped
    {"output_padding": [1, 1]},                     # a row and a column added
    {"dilations": [2, 2]},                          # taps spread out
    {"auto_pad": "SAME_UPPER"},                     # the output shaped by the strides
    {"output_shape": [6, 6]},                       # the output shaped by the user
    # the kernel's size again, but shifted: the first row and column cropped, a zero
    # row and column added at the end
    {"pads": [1, 1, 0, 0], "output_padding": [1, 1]},
])
def test_what_the_pass_leaves_alone(change):
    assert _rewritten(generator_head(batch_norm=False, **change)) == 0
    assert _rewritten(generator_head(batch_norm=False)) == 1


def test_grouped_and_computed_weights_stay_conv_transposes():
    """A grouped ConvTranspose, and one whose weights are computed at run time."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((CI, CO // 2, K, K))).astype(np.float32),
                                "w")
    grouped = helper.make_graph(
        [helper.make_node("ConvTranspose", ["z", "w"], ["y"], group=2)], "g",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, CI, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, OUT)], [w])
    computed = helper.make_graph(
        [helper.make_node("Relu", ["v"], ["r"]),
         helper.make_node("ConvTranspose", ["z", "r"], ["y"])], "c",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, CI, 1, 1]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [CI, CO, K, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, OUT)])
    for graph in (grouped, computed):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        assert _rewritten(model) == 0
