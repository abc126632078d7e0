"""The NCHWc classifier rule: Flatten/Reshape of blocked pooled features -> Gemm becomes a
blocked 1x1 Conv (wpk.passes.nchwc_classifier), checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.unit.nchwc_support import evaluate, ort_outputs
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.kernels import nchwc_format as fmt
from wpk.passes.base import check_graph
from wpk.passes.nchwc_layout import NchwcLayout

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
C = 2 * B
OUT = 10


def _classifier_model(rng, flatten="Flatten", trans_b=1, alpha=1.0, beta=1.0,
                      bias_shape=(OUT,), batch=1, extra_reader=False) -> onnx.ModelProto:
    """Two convs, GlobalAveragePool, Flatten (or Reshape) and a Gemm."""
    def const(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    fc = rng.standard_normal((OUT, C) if trans_b else (C, OUT)) * 0.3
    inits = [const("w1", rng.standard_normal((C, 3, 3, 3)) * 0.3),
             const("w2", rng.standard_normal((C, C, 1, 1)) * 0.3), const("fc", fc),
             numpy_helper.from_array(np.array([batch, C], np.int64), "shape")]
    inputs = ["flat", "fc"]
    if bias_shape is not None:
        inits.append(const("bias", rng.standard_normal(bias_shape)))
        inputs.append("bias")
    n = helper.make_node
    flat = (n("Flatten", ["gap"], ["flat"], axis=1) if flatten == "Flatten"
            else n("Reshape", ["gap", "shape"], ["flat"]))
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2"], ["c2"]), n("GlobalAveragePool", ["c2"], ["gap"]), flat,
             n("Gemm", inputs, ["y"], transB=trans_b, alpha=alpha, beta=beta)]
    outputs = [helper.make_tensor_value_info("y", 1, [batch, OUT])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("flat", 1, [batch, C]))
    graph = helper.make_graph(nodes, "classifier",
                              [helper.make_tensor_value_info("x", 1, [batch, 3, 8, 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(model, rng, batch=1) -> tuple[dict, list[tuple[str, str]]]:
    """Run the layout pass, compare with onnxruntime; the pass's hits and the ops after."""
    graph = load_model(model)
    feeds = {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    layout = NchwcLayout()
    optimized = layout.run(graph.copy())
    check_graph(optimized)
    actual = evaluate(optimized, feeds)
    for name in expected:
        assert relative_l2(actual[name], expected[name]) < 1e-5, name
    return layout.hits, [(node.domain, node.op) for node in optimized.nodes]


@pytest.mark.parametrize("flatten,trans_b,alpha,beta,bias_shape,batch", [
    ("Flatten", 1, 1.0, 1.0, (OUT,), 1),
    ("Reshape", 1, 1.0, 1.0, (1, OUT), 1),
    ("Flatten", 0, 0.5, 2.0, (OUT,), 1),
    ("Flatten", 1, 1.0, 3.0, (), 2),         # a scalar C, a batch of two
    ("Reshape", 0, 1.0, 1.0, None, 2),       # no C
])
def test_gemm_on_pooled_features_becomes_a_blocked_conv(flatten, trans_b, alpha, beta,
                                                         bias_shape, batch, rng):
    model = _classifier_model(rng, flatten, trans_b, alpha, beta, bias_shape, batch)
    hits, ops = _check(model, rng, batch)
    assert hits["classifier"] == 1
    assert ("", "Gemm") not in ops
    assert ops[-3:] == [("wpk.nchwc", "Conv"), ("wpk.nchwc", "ReorderOutput"),
                               ("", "Flatten")]


@pytest.mark.parametrize("options", [
    {"bias_shape": (2, OUT), "batch": 2},   # C differs per row: not a conv bias
    {"extra_reader": True},                 # the flattened features are an output too
])
def test_other_classifiers_stay_gemm(options, rng):
    hits, ops = _check(_classifier_model(rng, **options), rng, options.get("batch", 1))
    assert hits.get("classifier", 0) == 0
    assert ("", "Gemm") in ops
