"""Written-out HardSigmoid/HardSwish chains become one step (wpk/passes/activation_chains.py),
and steps without a standard single op use onnxruntime's contrib ops in its models."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.nchwc_support import evaluate
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels.cpu.node_model import MS_DOMAIN, build_node_model
from wpk.passes import optimize
from wpk.passes.base import check_graph

SHAPE = [1, 8, 6, 6]


def _model(body, opset=13):
    """x -> 3x3 conv -> c -> body(c) -> y; `body(nodes, scalar)` appends nodes ending in y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3)
                                     .astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])]

    def scalar(value):
        name = f"k{len(inits)}"
        inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    body(nodes, scalar)
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, SHAPE)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, SHAPE)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def paddle_hard_swish(nodes, k):          # x * Clip(x + 3, 0, 6) / 6
    nodes += [helper.make_node("Add", ["c", k(3.0)], ["s"]),
              helper.make_node("Clip", ["s", k(0.0), k(6.0)], ["r"]),
              helper.make_node("Mul", ["c", "r"], ["m"]),
              helper.make_node("Div", ["m", k(6.0)], ["y"])]


def relu6_over_6_times_x(nodes, k):       # x * (Clip(x + 3, 0, 6) * (1/6))
    nodes += [helper.make_node("Add", ["c", k(3.0)], ["s"]),
              helper.make_node("Clip", ["s", k(0.0), k(6.0)], ["r"]),
              helper.make_node("Mul", ["r", k(1 / 6)], ["h"]),
              helper.make_node("Mul", ["h", "c"], ["y"])]


def tf_hard_sigmoid(nodes, k):            # Clip(relu(x) * 0.2 + 0.5, 0, 1), then tanh
    nodes += [helper.make_node("Relu", ["c"], ["p"]),
              helper.make_node("Mul", ["p", k(0.2)], ["a"]),
              helper.make_node("Add", ["a", k(0.5)], ["b"]),
              helper.make_node("Clip", ["b", k(0.0), k(1.0)], ["h"]),
              helper.make_node("Tanh", ["h"], ["y"])]


def hard_sigmoid_mid_chain(nodes, k):     # tanh first: no hard_swish, a hard_sigmoid
    nodes += [helper.make_node("Tanh", ["c"], ["t"]),
              helper.make_node("Add", ["t", k(3.0)], ["s"]),
              helper.make_node("Clip", ["s", k(0.0), k(6.0)], ["r"]),
              helper.make_node("Div", ["r", k(6.0)], ["y"])]


def not_a_hard_swish(nodes, k):           # x * Clip(x + 2, 0, 6) / 6 (shift 2)
    nodes += [helper.make_node("Add", ["c", k(2.0)], ["s"]),
              helper.make_node("Clip", ["s", k(0.0), k(6.0)], ["r"]),
              helper.make_node("Mul", ["c", "r"], ["m"]),
              helper.make_node("Div", ["m", k(6.0)], ["y"])]


CASES = {
    "paddle_hard_swish": (paddle_hard_swish, ["hard_swish"]),
    "relu6_over_6_times_x": (relu6_over_6_times_x, ["hard_swish"]),
    "tf_hard_sigmoid": (tf_hard_sigmoid, ["relu", "hard_sigmoid", "tanh"]),
    "hard_sigmoid_mid_chain": (hard_sigmoid_mid_chain, ["tanh", "hard_sigmoid"]),
    "not_a_hard_swish": (not_a_hard_swish, ["add", "clip", "mul", "div"]),
}


def _steps(graph):
    """The steps of the graph's one Elementwise chain (a Conv's epilogue or its own node)."""
    (node,) = [n for n in graph.nodes if n.epilogue]
    return node, [s.op for s in node.epilogue]


@pytest.mark.parametrize("case", sorted(CASES))
def test_written_out_activations_become_one_step_with_the_same_values(case):
    body, expected_steps = CASES[case]
    model = _model(body)
    optimized, report = optimize(load_model(model), "test")
    check_graph(optimized)
    node, steps = _steps(optimized)
    assert steps == expected_steps
    scalars = {n for n in node.inputs if n.startswith("k")}
    assert scalars == {node.inputs[s.operand] for s in node.epilogue if s.operand}
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32) * 4
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    actual = evaluate(optimized, {"x": x}, "ort")["y"]
    assert relative_l2(actual, expected) <= 1e-6


def test_hard_sigmoid_forms_keep_their_constants():
    optimized, _ = optimize(load_model(_model(hard_sigmoid_mid_chain)), "test")
    node, _ = _steps(optimized)
    (step,) = [s for s in node.epilogue if s.op == "hard_sigmoid"]
    assert step.attr("alpha") == pytest.approx(1 / 6) and step.attr("beta") == pytest.approx(0.5)


def _elementwise(step: str, dtype="float32", opset=17) -> Workload:
    spec = TensorSpec((2, 16), dtype)
    return Workload("Elementwise", (spec,), (spec,), (), (EpilogueStep(step),),
                    domain="wpk", opset=opset)


REFERENCE = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                  * (x + 0.044715 * x ** 3))),
}


@pytest.mark.parametrize(("step", "contrib"), [("silu", "QuickGelu"), ("gelu", "Gelu"),
                                               ("gelu_tanh", "FastGelu")])
def test_onnxruntime_models_use_its_one_pass_contrib_ops(step, contrib):
    model = build_node_model(_elementwise(step)).model
    assert [(n.domain, n.op_type) for n in model.graph.node] == [(MS_DOMAIN, contrib)]
    assert MS_DOMAIN in {o.domain for o in model.opset_import}
    x = np.linspace(-6, 6, 32, dtype=np.float32).reshape(2, 16)
    (y,) = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"in0": x})
    formula = build_node_model(_elementwise(step, "float64")).model
    assert all(n.domain == "" for n in formula.graph.node)   # contrib ops are float32 only
    assert relative_l2(y, REFERENCE[step](x.astype(np.float64))) <= 1e-5


def test_standard_single_ops_win_over_contrib_ops():
    model = build_node_model(_elementwise("gelu", opset=20)).model
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("", "Gelu")]
