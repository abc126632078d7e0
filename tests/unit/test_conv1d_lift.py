"""The CPU pass `conv1d_as_2d`: regions of 1-d convolutions lifted to 2-d ones (so the
blocked layout and its kernels take them), where it must leave a graph alone, and a build
of a 1-d network against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.nchwc_support import check_blocked_activation_kernels
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.conv1d_lift import Conv1dAs2d, lifted_shape

C, L = 8, 37   # channels and length: not multiples of a vector


def _const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def network(opset: int = 17) -> onnx.ModelProto:
    """x (1, 3, L) through every op the pass lifts: a padded conv, a per-channel (C, 1)
    scale, ReLU, a dilated depthwise conv, a residual Add, a max pool, a SAME_UPPER strided
    conv, BatchNorm, a channel Concat with a Sigmoid of itself, an Add of a length-wise
    (rank-1) constant, a ConvTranspose with output padding, a strided conv and LeakyReLU
    (a vocoder's upsampling); outputs: that 3-d tensor, its global average (N, C, 1), its mean
    over time without keepdims (N, C) and its maximum over time (N, C, 1). A second
    input t (1, 4, 6) goes through a ReLU alone (no conv: not lifted)."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    inits = [_const("w1", rng.standard_normal((C, 3, 5)) * 0.3), _const("b1", rng.random(C)),
             _const("scale", rng.random((C, 1)) + 0.5),
             _const("w2", rng.standard_normal((C, 1, 3)) * 0.5),
             _const("w3", rng.standard_normal((C, C, 3)) * 0.3),
             _const("gamma", rng.random(C) + 0.5), _const("beta", rng.random(C)),
             _const("mean", rng.random(C) * 0.1), _const("var", rng.random(C) + 0.5),
             _const("along", rng.random(10)),
             _const("wt", rng.standard_normal((2 * C, 2 * C, 4)) * 0.2),
             _const("bt", rng.random(2 * C)),
             _const("w4", rng.standard_normal((2 * C, 2 * C, 2)) * 0.2)]
    nodes = [n("Conv", ["x", "w1", "b1"], ["y1"], pads=[2, 2]),
             n("Mul", ["y1", "scale"], ["y2"]),
             n("Relu", ["y2"], ["y3"]),
             n("Conv", ["y3", "w2"], ["y4"], group=C, dilations=[2], pads=[2, 2]),
             n("Add", ["y4", "y3"], ["y5"]),
             n("MaxPool", ["y5"], ["y6"], kernel_shape=[3], strides=[2], pads=[1, 1]),
             n("Conv", ["y6", "w3"], ["y7"], kernel_shape=[3], strides=[2],
               auto_pad="SAME_UPPER"),
             n("BatchNormalization", ["y7", "gamma", "beta", "mean", "var"], ["y8"]),
             n("Sigmoid", ["y8"], ["s8"]),
             n("Concat", ["y8", "s8"], ["y9"], axis=-2),   # the channels, counted back
             n("Add", ["y9", "along"], ["y10"]),
             # a vocoder's upsampling: stride 2, output padding, then cropped by a conv
             n("ConvTranspose", ["y10", "wt", "bt"], ["y11"], strides=[2], pads=[1, 1],
               output_padding=[1]),
             n("Conv", ["y11", "w4"], ["y12"], strides=[2]),
             n("LeakyRelu", ["y12"], ["y"], alpha=0.1),
             n("GlobalAveragePool", ["y"], ["pooled"]),
             n("Relu", ["t"], ["u"])]
    # torch's x.mean(2) and x.amax(2, keepdim=True): global pools once lifted
    if opset >= 18:
        inits.append(_const("time_axis", [2], np.int64))
        nodes += [n("ReduceMean", ["y", "time_axis"], ["avg"], keepdims=0),
                  n("ReduceMax", ["y", "time_axis"], ["peak"])]
    else:
        nodes += [n("ReduceMean", ["y"], ["avg"], axes=[2], keepdims=0),
                  n("ReduceMax", ["y"], ["peak"], axes=[-1])]
    graph = helper.make_graph(
        nodes, "net1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, L]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * C, 10]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 2 * C, 1]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 4, 6]),
         helper.make_tensor_value_info("avg", TensorProto.FLOAT, [1, 2 * C]),
         helper.make_tensor_value_info("peak", TensorProto.FLOAT, [1, 2 * C, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feeds(rng) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((1, 3, L)).astype(np.float32),
            "t": rng.standard_normal((1, 4, 6)).astype(np.float32)}


def _onnxruntime(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(names, feeds)))


def test_every_op_of_the_region_is_lifted_and_the_rest_left_alone():
    graph = load_model(network())
    lift = Conv1dAs2d()
    graph = lift.run(graph)
    check_graph(graph)
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert len(convs) == 4 and all(len(graph.tensors[c.inputs[0]].shape) == 4 for c in convs)
    first, depthwise, strided, _ = convs
    (transpose,) = [n for n in graph.nodes if n.op == "ConvTranspose"]
    assert transpose.attrs["output_padding"] == (0, 1) and transpose.attrs["strides"] == (1, 2)
    assert graph.tensors[transpose.inputs[1]].shape == (2 * C, 2 * C, 1, 4)
    assert first.attrs["pads"] == (0, 2, 0, 2) and graph.tensors[first.inputs[1]].shape == \
        (C, 3, 1, 5)
    assert depthwise.attrs["dilations"] == (1, 2) and depthwise.attrs["group"] == C
    assert strided.attrs["kernel_shape"] == (1, 3) and strided.attrs["strides"] == (1, 2)
    (pool,) = [n for n in graph.nodes if n.op == "MaxPool"]
    assert pool.attrs["kernel_shape"] == (1, 3) and pool.attrs["pads"] == (0, 1, 0, 1)
    (scale,) = [n for n in graph.nodes if n.op == "Mul"]
    assert graph.tensors[scale.inputs[1]].shape == (C, 1, 1)   # broadcasts as (C, 1) did
    (length,) = [n for n in graph.nodes if n.op == "Add" and "along" in n.inputs]
    assert graph.tensors[length.inputs[1]].shape == (10,)      # rank 1: broadcasts as it is
    # the reductions over time are global pools of the lifted tensor
    assert [n.op for n in graph.nodes if n.op.startswith("Global")] == [
        "GlobalAveragePool", "GlobalAveragePool", "GlobalMaxPool"]
    assert not [n for n in graph.nodes if n.op.startswith("Reduce")]
    # the region reads x through one Reshape; its four outputs leave through one each
    reshapes = [n for n in graph.nodes if n.op == "Reshape"]
    assert len(reshapes) == 5 and {r.outputs[0] for r in reshapes} >= {"y", "pooled", "avg",
                                                                       "peak"}
    assert graph.tensors["avg"].shape == (1, 2 * C)
    assert graph.tensors["y"].shape == (1, 2 * C, 10) and graph.tensors["pooled"].shape == \
        (1, 2 * C, 1)
    (relu_t,) = [n for n in graph.nodes if n.inputs == ["t"]]
    assert relu_t.op == "Relu" and graph.tensors["u"].shape == (1, 4, 6)   # no conv: 1-d
    assert lift.hits["conv1d_as_2d"] == 17


@pytest.mark.parametrize("opset", [13, 18])
def test_the_lifted_graph_computes_what_the_model_did(opset, rng, tmp_path):
    """The pipeline (the lift, then the fusions and the blocked layout) through a build:
    every output within 1e-5 of onnxruntime's on the original 1-d model."""
    model = network(opset)
    optimized, report = optimize(load_model(model), "cpu")
    assert report.passes["conv1d_as_2d"] == 17
    assert not any(n.op == "Conv" and len(optimized.tensors[n.inputs[0]].shape) == 3
                   for n in optimized.nodes)
    wpk.build(model, target="cpu", progress=False, partition=False).save(
        str(tmp_path / "net1d.wpk"))
    feeds = _feeds(rng)
    got = wpk.load(str(tmp_path / "net1d.wpk")).run(feeds)
    expected = _onnxruntime(model, feeds)
    for name, value in expected.items():
        assert got[name].shape == value.shape
        assert relative_l2(got[name], value) < 1e-5, name


def test_what_the_pass_leaves_alone():
    """No conv or pool in reach: a rank-3 transformer-like chain stays; a conv whose weights
    are computed stays 1-d; so does MaxPool with its Indices output."""
    n = helper.make_node
    f = TensorProto.FLOAT
    nodes = [n("Relu", ["x"], ["a"]), n("Add", ["a", "x"], ["b"]),
             n("Mul", ["wx", "two"], ["wv"]), n("Conv", ["b", "wv"], ["c"], pads=[1, 1]),
             n("MaxPool", ["c"], ["d", "idx"], kernel_shape=[2], strides=[2])]
    graph = helper.make_graph(
        nodes, "left", [helper.make_tensor_value_info("x", f, [1, 4, 8]),
                        helper.make_tensor_value_info("wx", f, [4, 4, 3])],
        [helper.make_tensor_value_info("d", f, [1, 4, 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 4, 4])],
        [_const("two", 2.0)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    loaded = load_model(model)
    lift = Conv1dAs2d()
    after = lift.run(loaded)
    assert sum(lift.hits.values()) == 0
    assert not any(node.op == "Reshape" for node in after.nodes)
    assert all(len(after.tensors[o].shape) == 3 for node in after.nodes for o in node.outputs)


def test_lifted_shapes_broadcast_as_before():
    assert lifted_shape(()) == () and lifted_shape((7,)) == (7,)
    assert lifted_shape((C, 1)) == (C, 1, 1) and lifted_shape((1, C, L)) == (1, C, 1, L)
    for shape in ((C, 1), (1, C, 1), (1, 1, L), (C, L)):
        a = np.broadcast_shapes(shape, (2, C, L))
        b = np.broadcast_shapes(lifted_shape(shape), (2, C, 1, L))
        assert b == (*a[:2], 1, a[2])


def _conv_gelu_model() -> onnx.ModelProto:
    """Two wav2vec2 encoder layers as torch writes them: Conv1d, then erf's GELU spelled
    out (Div by sqrt 2, Erf, Add 1, Mul by x, Mul by 0.5)."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    inits = [_const("sqrt2", 2 ** 0.5), _const("one", 1.0), _const("half", 0.5)]
    nodes, value = [], "x"
    for layer in range(2):
        inits.append(_const(f"w{layer}", rng.standard_normal((24, 24, 3)) * 0.3))
        out = "y" if layer else "h"
        nodes += [n("Conv", [value, f"w{layer}"], [f"c{layer}"], strides=[2]),
                  n("Div", [f"c{layer}", "sqrt2"], [f"d{layer}"]),
                  n("Erf", [f"d{layer}"], [f"e{layer}"]),
                  n("Add", [f"e{layer}", "one"], [f"f{layer}"]),
                  n("Mul", [f"c{layer}", f"f{layer}"], [f"g{layer}"]),
                  n("Mul", [f"g{layer}", "half"], [out])]
        value = out
    graph = helper.make_graph(
        nodes, "conv_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 41])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 9])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_gelu_rides_on_the_lifted_conv_in_both_blocked_kernels(rng, tmp_path):
    """The written-out GELU is the blocked conv's epilogue (no Elementwise step after it):
    the micro-kernel computes it on the registers, onnxruntime's candidate as its contrib
    Gelu node after the conv; both verified, and the plan matches onnxruntime."""
    model = _conv_gelu_model()
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    convs = [plan.workloads[s.workload_key] for s in plan.steps if s.op == "Conv"]
    assert [[e.op for e in w.epilogue] for w in convs] == [["gelu"]] * 2
    assert all(w.attr("block") for w in convs)   # blocked
    assert not [s for s in plan.steps if s.op == "Elementwise"]
    check_blocked_activation_kernels(convs[1], ["Conv", "Gelu"], rng)
    plan.save(str(tmp_path / "conv_gelu.wpk"))
    x = rng.standard_normal((1, 24, 41)).astype(np.float32)
    got = wpk.load(str(tmp_path / "conv_gelu.wpk")).run({"x": x})["y"]
    assert relative_l2(got, _onnxruntime(model, {"x": x})["y"]) < 1e-5


@pytest.mark.parametrize("name, rule", [("svtr_paddle", "layer_norm"),
                                        ("vit_tf", "layer_norm_reciprocal")])
def test_transformers_written_out_layer_norms_stay_theirs(name, rule):
    """A transformer's (B, S, D) tensors are 3-d too, and its written-out LayerNorm reduces
    them over D: no conv, so nothing is lifted and the LayerNorm rules still fire (a
    reduction alone once anchored a region here and took them apart)."""
    from tests import corpus

    graph = load_model(corpus.build_model(name, "ci"), input_shapes=corpus.input_shapes(name))
    _, report = optimize(graph, "cpu")
    assert report.passes["conv1d_as_2d"] == 0 and report.rules[rule] > 0
