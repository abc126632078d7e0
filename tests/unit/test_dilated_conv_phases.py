"""The CPU pass `dilated_conv_phases`: a dilated blocked 3x3 conv becomes an undilated conv
of its d x d phase images (transposes of whole blocks around it); where it must leave a
conv alone; builds against onnxruntime."""

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
from wpk.passes.dilated_conv_phases import DilatedConvPhases

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa


def dilated_net(side: int = 16, dilation: int = 2, pads: int | None = None, stride: int = 1,
                group: int = 1, kernel: int = 3, residual: bool = False, batch: int = 1,
                channels: tuple[int, int, int] = (20, 24, 24)) -> onnx.ModelProto:
    """x (batch, 3, side, side) -> 3x3 conv to c0, ReLU -> the conv under test (c0 -> c1,
    its dilation, pads (default: d, a 'same' conv), stride, group, kernel; `residual`:
    its output plus the first conv's output) -> ReLU -> 1x1 conv to c2."""
    c0, c1, c2 = channels
    rng = np.random.default_rng(4)
    pads = dilation * (kernel // 2) if pads is None else pads

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)
    inits = [weight("w0", (c0, 3, 3, 3)), weight("b0", (c0,)),
             weight("w1", (c1, c0 // group, kernel, kernel)), weight("b1", (c1,)),
             weight("w2", (c2, c1, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[pads] * 4,
                              dilations=[dilation, dilation], strides=[stride, stride],
                              group=group)]
    last = "c1"
    if residual:
        nodes.append(helper.make_node("Add", ["c1", "a0"], ["s1"]))
        last = "s1"
    nodes += [helper.make_node("Relu", [last], ["a1"]),
              helper.make_node("Conv", ["a1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "dilated", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [batch, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _optimized(model: onnx.ModelProto):
    graph, report = optimize(load_model(model), "cpu")
    check_graph(graph)
    return graph, report.passes.get(DilatedConvPhases.name, 0)


@pytest.mark.parametrize("dilation, side, batch", [(2, 16, 1), (3, 24, 2), (4, 16, 1)])
def test_a_dilated_conv_becomes_a_conv_of_its_phases(dilation, side, batch):
    graph, hits = _optimized(dilated_net(side, dilation, batch=batch))
    assert hits == 1
    convs = [n for n in graph.nodes if n.op == "Conv" and n.domain == "wpk.nchwc"]
    inner = [n for n in convs if graph.tensors[n.inputs[0]].shape[0] == dilation ** 2 * batch]
    assert len(inner) == 1
    assert tuple(inner[0].attr("dilations")) == (1, 1)
    assert tuple(inner[0].attr("pads")) == (1, 1, 1, 1)
    assert graph.tensors[inner[0].inputs[0]].shape[2:4] == (side // dilation,) * 2
    assert [n.op for n in graph.nodes].count("Transpose") == 2


@pytest.mark.parametrize("why, kwargs", [
    ("undilated", {"dilation": 1}),
    ("stride 2", {"stride": 2}),
    ("pads not a multiple of the dilation", {"pads": 1}),
    ("side not a multiple of the dilation", {"side": 15}),
    ("phase images under 4 pixels", {"side": 12, "dilation": 4}),
    ("a residual add in its epilogue", {"residual": True, "channels": (24, 24, 24)}),
    ("grouped", {"group": 4}),
    ("5x5", {"kernel": 5}),
])
def test_where_it_leaves_the_conv_alone(why, kwargs):
    graph, hits = _optimized(dilated_net(**kwargs))
    assert hits == 0, why
    assert "Transpose" not in [n.op for n in graph.nodes]


@pytest.mark.parametrize("dilation, side, batch", [(2, 16, 2), (3, 24, 1)])
def test_builds_match_onnxruntime(dilation, side, batch):
    model = dilated_net(side, dilation, batch=batch)
    x = np.random.default_rng(0).random((batch, 3, side, side), np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    assert [s.op for s in plan.steps].count("Transpose") == 2
    got = wpk.runtime.Session(plan).run({"x": x})
    got = got["y"] if isinstance(got, dict) else got[0]
    assert got.shape == expected.shape
    assert relative_l2(got, expected) < 1e-4   # Winograd's own bound, if it is chosen
