"""Dirty padding lanes in the NCHWc layout (wpk/passes/nchwc_rewrite.py).

A squeeze-excite gate ends in sigmoid or hard_sigmoid, which map 0 to 0.5: fused
into the blocked conv that computes the gate, its padding lanes are no longer
zero. That is harmless where they are only multiplied by a clean tensor or
read by a conv (zero filter there); anything else must not see them.
"""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.nchwc_support import evaluate
from tests.unit.test_nchwc import B, _optimize_with_block
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep
from wpk.frontend import load_model
from wpk.passes.base import check_graph
from wpk.passes.nchwc_rewrite import Blocked, Rewrite

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

C = 12  # padding lanes with both blocks (8 and 16)


def model(tail: str, seed: int = 0):
    """conv -> relu -> GAP -> 1x1 conv (relu) -> 1x1 conv + gate activation -> `tail`:
    'gate': x * gate (squeeze-excite); 'add': gate + another blocked tensor."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["a0"], pads=[1, 1, 1, 1]), n("Relu", ["a0"], ["a"]),
             n("GlobalAveragePool", ["a"], ["p"]), n("Conv", ["p", "w2"], ["r0"]),
             n("Relu", ["r0"], ["r"]), n("Conv", ["r", "w3"], ["g0"])]
    if tail == "gate":
        nodes += [n("HardSigmoid", ["g0"], ["g"], alpha=1 / 6, beta=0.5),
                  n("Mul", ["a", "g"], ["m"]), n("Conv", ["m", "w4"], ["y"])]
        shape = [1, C, 8, 8]
    else:
        nodes += [n("Sigmoid", ["g0"], ["g"]), n("Conv", ["p", "w5"], ["q"]),
                  n("Add", ["g", "q"], ["y"])]
        shape = [1, C, 1, 1]
    inits = [w("w1", (C, 3, 3, 3)), w("w2", (8, C, 1, 1)), w("w3", (C, 8, 1, 1)),
             w("w4", (C, C, 1, 1)), w("w5", (C, C, 1, 1))]
    graph = helper.make_graph(nodes, tail, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, shape)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(m, block):
    optimized = _optimize_with_block(load_model(m), block)
    check_graph(optimized)
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(m.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    actual = evaluate(optimized, {"x": x}, "ort.nchwc" if block == B else "numpy.nchwc")["y"]
    assert relative_l2(actual, expected) <= 1e-5
    return collections.Counter((n.domain + ":" if n.domain else "") + n.op
                               for n in optimized.nodes)


@pytest.mark.parametrize("block", [8, 16])
def test_a_gate_with_dirty_padding_stays_blocked(block):
    ops = _run(model("gate"), block)
    assert "Conv" not in ops and "Mul" not in ops and "wpk.nchwc:ReorderInput" not in ops
    assert ops["wpk.nchwc:ReorderOutput"] == 1   # the graph output only


@pytest.mark.parametrize("block", [8, 16])
def test_dirty_padding_never_reaches_an_add(block):
    optimized = _optimize_with_block(load_model(model("add")), block)
    _run(model("add"), block)
    blocked_adds = [n for n in optimized.nodes if n.op == "Elementwise"
                    and any(s.op == "add" for s in n.epilogue)]
    assert not blocked_adds   # sigmoid's dirty lanes are dropped before the add


def test_the_chain_rule_tracks_dirty_lanes():
    graph = load_model(model("gate"))
    rw = Rewrite(graph, 16)
    rw.blocked["a"] = Blocked("a_b", C)
    rw.blocked["g"] = Blocked("g_b", C, dirty=True)
    full = tuple(graph.tensors["a"].shape)
    mul, add = EpilogueStep("mul"), EpilogueStep("add")
    relu = EpilogueStep("relu")
    assert rw.chain_is_blockable([(mul, "g")], C, full)                    # clean * dirty
    assert rw.chain_is_blockable([(mul, "a")], C, full, value_dirty=True)  # dirty * clean
    assert not rw.chain_is_blockable([(add, "g")], C, full)
    assert not rw.chain_is_blockable([(relu, None)], C, full, value_dirty=True)
    assert rw.chain_is_blockable([(relu, None)], C, full)
