"""Transpose sinking (`wpk.passes.transpose_sinking`): the channels-last converters'
Transposes around every conv (tf2onnx's Keras MobileNetV3) are moved through the
elementwise nodes, pads, reductions, softmaxes and concats between them until they
cancel; the graph computes what the model did (run through `to_onnx` in onnxruntime, and
built into a plan); Transposes that nothing cancels stay where they were."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

import wpk
from tests.built_plans import FAST_BUILD
from wpk.frontend import load_model
from wpk.passes import optimize, to_onnx
from wpk.passes.base import check_graph
from wpk.passes.transpose_sinking import TransposeSinking, compose, inverse

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


class _Builder:
    """An NHWC model written as tf2onnx writes Keras' MobileNetV3: every conv between a
    Transpose to NCHW and one back, the rest channels-last."""

    def __init__(self, rng: np.random.Generator, opset: int = 17):
        self.rng, self.opset = rng, opset
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        name = name or self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(h.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_nhwc(self, x: str, cin: int, cout: int, k: int = 1, group: int = 1,
                  stride: int = 1, pads: int = 0) -> str:
        """Transpose to NCHW, Conv, Transpose back (tf2onnx around each Keras conv)."""
        w = self.rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * 0.3
        nchw = self.node("Transpose", [x], perm=TO_NCHW)
        y = self.node("Conv", [nchw, self.const(w)], kernel_shape=[k, k], group=group,
                      strides=[stride, stride], pads=[pads] * 4)
        return self.node("Transpose", [y], perm=TO_NHWC)

    def hard_swish(self, x: str, sixth: str) -> str:
        """x * relu6(x + 3) / 6, the 1/6 a constant every block shares."""
        three = self.const(np.array(3.0, np.float32))
        clipped = self.node("Clip", [self.node("Add", [x, three]),
                                     self.const(np.array(0.0, np.float32)),
                                     self.const(np.array(6.0, np.float32))])
        return self.node("Mul", [self.node("Mul", [x, clipped]), sixth])

    def hard_sigmoid(self, x: str, sixth: str) -> str:
        """relu6(x + 3) / 6, the squeeze-excite gate's activation."""
        three = self.const(np.array(3.0, np.float32))
        clipped = self.node("Clip", [self.node("Add", [x, three]),
                                     self.const(np.array(0.0, np.float32)),
                                     self.const(np.array(6.0, np.float32))])
        return self.node("Mul", [clipped, sixth])

    def model(self, x: str, y: str, shape: list[int], out_shape: list | None = None):
        graph = h.make_graph(
            self.nodes, "nhwc", [h.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [h.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)], self.inits)
        return onnx.shape_inference.infer_shapes(
            h.make_model(graph, opset_imports=[h.make_opsetid("", self.opset)]))


def mobilenet_v3_like(rng: np.random.Generator, widths=(24, 40)):
    """Inverted-residual blocks with hard-swish and a squeeze-excite gate, channels-last
    between the convs: the first with a stride-2 depthwise conv after an explicit Pad
    (Keras' ZeroPadding2D), the others stride 1 with a residual Add. Every block's
    hard-swish and hard-sigmoid share one 1/6 constant, as tf2onnx writes it."""
    b = _Builder(rng)
    sixth = b.const(np.array(1 / 6, np.float32), "one_sixth")
    x = b.node("Mul", ["image", b.const(np.array(0.5, np.float32))])
    x = b.hard_swish(b.conv_nhwc(x, 3, 16, k=3, pads=1), sixth)
    for block, width in enumerate(widths):
        e = b.node("Mul", [b.conv_nhwc(x, 16, width),
                           b.const(rng.uniform(0.5, 1.5, width).astype(np.float32))])
        e = b.hard_swish(e, sixth)
        if block == 0:
            e = b.node("Pad", [e, b.const(np.array([0, 0, 0, 0, 0, 1, 1, 0], np.int64))])
            d = b.conv_nhwc(e, width, width, k=3, group=width, stride=2)
        else:
            d = b.conv_nhwc(e, width, width, k=3, group=width, pads=1)
        d = b.node("Relu", [d])
        pooled = b.node("ReduceMean", [d], axes=[1, 2], keepdims=1)
        gate = b.node("Relu", [b.conv_nhwc(pooled, width, 8)])
        gate = b.hard_sigmoid(b.conv_nhwc(gate, 8, width), sixth)
        y = b.conv_nhwc(b.node("Mul", [d, gate]), width, 16)
        x = y if block == 0 else b.node("Add", [y, x])
    out = b.node("ReduceMean", [x], axes=[1, 2], keepdims=0)
    return b.model("image", out, [1, 32, 32, 3])


def feeds_of(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    value = model.graph.input[0]
    dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return {value.name: rng.standard_normal(dims).astype(np.float32)}


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def transposes(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "Transpose")


def test_permutations_invert_and_compose():
    perm = (0, 2, 3, 1)
    assert inverse(perm) == (0, 3, 1, 2)
    assert compose(perm, inverse(perm)) == (0, 1, 2, 3)
    x = np.arange(24).reshape(1, 2, 3, 4)
    np.testing.assert_array_equal(np.transpose(np.transpose(x, perm), (0, 3, 1, 2)),
                                  np.transpose(x, compose(perm, (0, 3, 1, 2))))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_converters_transposes_around_each_conv_cancel(rng, target):
    """All but the input's Transpose cancel (on the CPU it becomes the blocked layout's
    reorder); the CUDA graph, all standard ops and wpk's own, computes what the model did
    (the CPU's blocked graph: the plan test below)."""
    model = mobilenet_v3_like(rng)
    graph, report = optimize(load_model(model), target)
    check_graph(graph)
    assert transposes(load_model(model)) == 22
    assert report.passes["transpose_sinking"] > 0
    assert transposes(graph) <= 1, graph.op_counts()
    if target == "cuda":
        feeds = feeds_of(model, rng)
        (expected,) = run(model, feeds)
        (actual,) = run(to_onnx(graph), feeds)
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_plan_of_the_channels_last_model_matches(rng, tmp_path):
    """End to end on the CPU: the blocks stay in the blocked layout, and the 1/6 every
    block's hard-swish shares is blocked once per channel count (24 and 40 here)."""
    model = mobilenet_v3_like(rng)
    plan = wpk.build(model, target="cpu", **FAST_BUILD)
    ops = [s.op for s in plan.steps]
    assert ops.count("ReorderInput") + ops.count("ReorderOutput") <= 2, ops
    plan.save(tmp_path / "nhwc.wpk")
    feeds = feeds_of(model, rng)
    (expected,) = run(model, feeds)
    actual = next(iter(wpk.load(tmp_path / "nhwc.wpk").run(feeds).values()))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def layout_ops_model(rng: np.random.Generator, opset: int = 17) -> onnx.ModelProto:
    """NCHW in, NHWC between two Transposes: an uneven Pad, a channel Concat with another
    transposed tensor, a Softmax over W, a ReduceSum over H kept, a per-channel Sub."""
    b = _Builder(rng, opset)
    a = b.node("Transpose", ["image"], perm=TO_NHWC)
    other = b.node("Transpose", [b.node("Sigmoid", ["image"])], perm=TO_NHWC)
    padded = b.node("Pad", [a, b.const(np.array([0, 1, 0, 0, 0, 2, 3, 0], np.int64))])
    cut = b.node("Pad", [other, b.const(np.array([0, 1, 0, 0, 0, 2, 3, 0], np.int64)),
                         b.const(np.array(0.5, np.float32))])
    joined = b.node("Concat", [padded, cut], axis=3)
    soft = b.node("Softmax", [joined], axis=2)
    kept = b.node("ReduceSum", [soft, b.const(np.array([1], np.int64))], keepdims=1)
    shifted = b.node("Sub", [kept, b.const(rng.standard_normal(8).astype(np.float32))])
    out = b.node("Transpose", [shifted], perm=TO_NCHW)
    return b.model("image", out, [1, 4, 5, 6])


def test_pads_concat_softmax_and_reductions_take_their_axes_through_the_permutation(rng):
    model = layout_ops_model(rng)
    graph = TransposeSinking().run(load_model(model))
    check_graph(graph)
    assert transposes(graph) == 0, graph.op_counts()
    feeds = feeds_of(model, rng)
    np.testing.assert_allclose(run(to_onnx(graph), feeds)[0], run(model, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def _unchanged(model: onnx.ModelProto) -> None:
    graph = load_model(model)
    before = [(n.op, list(n.inputs), dict(n.attrs)) for n in graph.nodes]
    sinker = TransposeSinking()
    after = sinker.run(graph)
    assert [(n.op, list(n.inputs), dict(n.attrs)) for n in after.nodes] == before
    assert not sinker.hits


def test_a_transpose_nothing_cancels_stays_where_it_was(rng):
    """The head split of attention: Transpose, a scale, then a MatMul (no reader after
    it takes the heads untransposed): moving it past the Mul would gain nothing."""
    b = _Builder(rng)
    heads = b.node("Reshape", ["image", b.const(np.array([1, 6, 2, 4], np.int64))])
    split = b.node("Transpose", [heads], perm=[0, 2, 1, 3])
    scaled = b.node("Mul", [split, b.const(np.array(0.5, np.float32))])
    out = b.node("MatMul", [scaled, b.const(rng.standard_normal((4, 4)).astype(np.float32))])
    _unchanged(b.model("image", out, [1, 6, 8]))


def _around(rng, middle, opset: int = 17) -> onnx.ModelProto:
    """Transpose to NHWC, `middle(builder, x)`, Transpose back."""
    b = _Builder(rng, opset)
    x = b.node("Transpose", ["image"], perm=TO_NHWC)
    out = b.node("Transpose", [middle(b, x)], perm=TO_NCHW)
    return b.model("image", out, [1, 4, 5, 6])


@pytest.mark.parametrize("middle, opset, why", [
    (lambda b, x: b.node("Softmax", [x], axis=3), 11, "before opset 13 Softmax flattens"),
    (lambda b, x: b.node("Pad", [x, b.const(np.array([1, 1], np.int64)), "",
                                 b.const(np.array([1], np.int64))]), 18,
     "a Pad of some axes only"),
    (lambda b, x: b.node("Add", [x, b.node("Reshape", [
        b.node("Relu", ["image"]), b.const(np.array([1, 5, 6, 4], np.int64))])]), 17,
     "an operand that is not transposed (nor a constant)"),
    (lambda b, x: b.node("Concat", [x, b.const(np.zeros((1, 5, 6, 1), np.float32))], axis=3),
     17, "a Concat with a constant"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_nodes_that_cannot_take_the_untransposed_tensor_stop_it(rng, middle, opset, why):
    _unchanged(_around(rng, middle, opset))


def test_a_graph_output_keeps_its_name_and_value(rng):
    """A tensor the pass defers that is also a graph output is transposed for the output."""
    b = _Builder(rng)
    x = b.node("Transpose", ["image"], perm=TO_NHWC)
    relu = b.node("Relu", [x])
    back = b.node("Transpose", [relu], perm=TO_NCHW)
    out = b.node("Conv", [back, b.const(rng.standard_normal((3, 4, 1, 1)).astype(np.float32))],
                 kernel_shape=[1, 1])
    graph = h.make_graph(b.nodes, "outputs",
                         [h.make_tensor_value_info("image", TensorProto.FLOAT, [1, 4, 5, 6])],
                         [h.make_tensor_value_info(out, TensorProto.FLOAT, None),
                          h.make_tensor_value_info(relu, TensorProto.FLOAT, None)], b.inits)
    model = onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    sunk = TransposeSinking().run(load_model(model))
    check_graph(sunk)
    assert sunk.outputs == [out, relu] and transposes(sunk) == 1
    feeds = feeds_of(model, rng)
    for got, want in zip(run(to_onnx(sunk), feeds), run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
