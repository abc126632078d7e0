"""NCHW <-> NHWC transposes at the edge of the NCHWc layout become reorders with
`channels_last` (wpk/passes/nchwc_layout.py `_transpose`): ConvNeXt's blocks transpose
to NHWC for their LayerNorm and Linear layers and back for the residual add."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.unit.nchwc_support import evaluate, model_x_to_y, ort_outputs
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.passes.base import check_graph
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()


def _convnext_like(rng, channels=2 * B, back_reader="Add", act=None, size=5, mid=None):
    """conv -> Transpose to NHWC -> MatMul (to `mid` channels) -> Transpose to NCHW ->
    `back_reader`(conv out, it) -> conv; `act` puts an activation on the first conv."""
    mid = mid or channels
    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)
    inits = [w("w1", (channels, 3, 3, 3)), w("wm", (channels, mid)),
             w("w2", (8, mid, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1])]
    first = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        first = "a"
    nodes += [helper.make_node("Transpose", [first], ["t"], perm=[0, 2, 3, 1]),
              helper.make_node("MatMul", ["t", "wm"], ["m"]),
              helper.make_node("Transpose", ["m"], ["u"], perm=[0, 3, 1, 2])]
    if back_reader == "Add":
        nodes.append(helper.make_node("Add", [first, "u"], ["r"]))
    elif back_reader == "Relu":
        nodes.append(helper.make_node("Relu", ["u"], ["r"]))
    else:
        nodes.append(helper.make_node(back_reader, ["u"], ["r"], axis=1))
    nodes.append(helper.make_node("Conv", ["r", "w2"], ["y"]))
    return model_x_to_y("convnext_like", nodes, inits, [1, 3, size, size],
                        [1, 8, size, size])


def _optimize(model, rng, impl="ort.nchwc", block=None, min_convs=1):
    graph = load_model(model)
    feeds = {"x": rng.standard_normal(graph.tensors["x"].shape).astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    optimized = NchwcLayout(NchwcOptions(block=block, min_convs=min_convs)).run(graph.copy())
    check_graph(optimized)
    actual = evaluate(optimized, feeds, impl)
    assert relative_l2(actual["y"], expected["y"]) <= 1e-5
    return optimized


def _ops(graph):
    return collections.Counter(n.op for n in graph.nodes)


def _reorders(graph):
    return sorted((n.op, int(n.attrs.get("channels_last", 0))) for n in graph.nodes
                  if n.op.startswith("Reorder"))


@pytest.mark.parametrize("channels", [2 * B, B + 4])
@pytest.mark.parametrize("impl,block", [("ort.nchwc", None), ("numpy.nchwc", 8),
                                        ("numpy.nchwc", 16)])
def test_a_convnext_block_transposes_through_its_reorders(channels, impl, block, rng):
    optimized = _optimize(_convnext_like(rng, channels), rng, impl, block)
    ops = _ops(optimized)
    assert "Transpose" not in ops
    # and the graph output's ReorderOutput to NCHW
    assert _reorders(optimized) == [("ReorderInput", 1), ("ReorderOutput", 0),
                                    ("ReorderOutput", 1)]
    (add,) = [n for n in optimized.nodes if n.op == "Elementwise"]  # the residual, blocked
    assert len(optimized.tensors[add.outputs[0]].shape) == 5


def test_a_transpose_back_read_only_by_an_op_that_stays_nchw_is_kept(rng):
    optimized = _optimize(_convnext_like(rng, back_reader="Softmax"), rng)
    assert [tuple(n.attrs["perm"]) for n in optimized.nodes if n.op == "Transpose"] == \
        [(0, 3, 1, 2)]
    assert ("ReorderOutput", 1) in _reorders(optimized)


def test_channels_that_are_not_a_multiple_of_4_are_transposed_as_before(rng):
    """onnxruntime's ReorderInput reads whole groups of 4 channels."""
    optimized = _optimize(_convnext_like(rng, mid=B + 2, back_reader="Relu"), rng)
    assert [tuple(n.attrs["perm"]) for n in optimized.nodes if n.op == "Transpose"] == \
        [(0, 3, 1, 2)]
    assert ("ReorderOutput", 1) in _reorders(optimized)


def test_a_dirty_blocked_tensor_is_not_transposed_by_a_reorder(rng):
    """Sigmoid fused into a conv leaves sigmoid(0) = 0.5 in padding lanes; the reorder to
    NHWC would drop them correctly, but the rule keeps to clean tensors."""
    optimized = _optimize(_convnext_like(rng, channels=B + 4, act="Sigmoid"), rng)
    assert (0, 2, 3, 1) in [tuple(n.attrs["perm"]) for n in optimized.nodes
                            if n.op == "Transpose"]


@pytest.mark.parametrize("op", ["ReorderInput", "ReorderOutput"])
@pytest.mark.parametrize("block", [8, 16])
def test_channels_last_reorders_match_the_float64_reference(op, block, rng):
    channels, h, w = 12, 3, 5
    blocked = fmt.blocked_shape((1, channels, h, w), block)
    nhwc = (1, h, w, channels)
    ins, outs = (nhwc, blocked) if op == "ReorderInput" else (blocked, nhwc)
    workload = Workload(op, (TensorSpec(ins, "float32"),), (TensorSpec(outs, "float32"),),
                        (("block", block), ("channels", channels), ("channels_last", 1)),
                        domain="wpk.nchwc")
    x = rng.standard_normal(ins).astype(np.float32)
    if op == "ReorderOutput":
        x = fmt.block(fmt.unblock(x, channels), block)  # zero padding lanes
    expected = nchwc_reference(workload, [x])[0]
    logical = x.transpose(0, 3, 1, 2) if op == "ReorderInput" else fmt.unblock(x, channels)
    if op == "ReorderInput":
        assert np.array_equal(fmt.unblock(expected, channels), logical)
    else:
        assert np.array_equal(expected.transpose(0, 3, 1, 2), logical)
    impls = ["numpy.nchwc"] + (["ort.nchwc"] if block == B else [])
    for name in impls:
        impl = registry.get(name)
        assert impl.unsupported_reason(workload) is None, name
        out = np.empty(outs, np.float32)
        impl.prepare(workload, {}, {})([x], [out])
        assert np.array_equal(out, expected.astype(np.float32)), name
