"""wpk's GroupNorm: the rules that write it (the torch exporters' Reshape /
InstanceNormalization / Reshape / Mul / Add, ONNX's GroupNormalization), its activation
epilogue, the blocked layout, its onnxruntime and numpy candidates, and whole models
against onnxruntime. The C kernel's own tests: `test_group_norm_kernel.py`."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.test_group_norm_kernel import blocked_norm, plain_norm
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep
from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.kernels.reference import reference
from wpk.passes import optimize, to_onnx

FAST = {"search": "none", "progress": False, "partition": False, "warmup": 0, "repeats": 1,
        "min_time": 0.0}


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def group_norm_model(channels=24, groups=4, size=(9, 7), seed=0, convs_after=1,
                     in_scale=None, in_bias=None, gamma_shape=None) -> onnx.ModelProto:
    """conv -> GroupNorm as the torch exporters write it -> SiLU -> `convs_after` convs.
    `in_scale`/`in_bias`: the InstanceNormalization's own (default ones and zeros);
    `gamma_shape`: the Mul's constant's shape (default one value per channel)."""
    rng = np.random.default_rng(seed)
    h, w = size
    gamma_shape = gamma_shape or (channels, 1, 1)
    inits = [_const("w1", rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3),
             _const("grouped", np.array([0, groups, -1], np.int64)),
             _const("back", np.array([1, channels, h, w], np.int64)),
             _const("ones", np.ones(groups, np.float32) if in_scale is None else in_scale),
             _const("zeros", np.zeros(groups, np.float32) if in_bias is None else in_bias),
             _const("gamma", rng.uniform(0.5, 1.5, gamma_shape).astype(np.float32)),
             _const("beta", rng.uniform(-0.2, 0.2, (channels, 1, 1)).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c1", "grouped"], ["g"]),
             helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"],
                              epsilon=1e-5),
             helper.make_node("Reshape", ["n", "back"], ["r"]),
             helper.make_node("Mul", ["r", "gamma"], ["s"]),
             helper.make_node("Add", ["s", "beta"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["sg"]),
             helper.make_node("Mul", ["a", "sg"], ["y0"])]
    nodes, inits = _convs_after(nodes, inits, "y0", channels, convs_after, rng)
    return _model(nodes, inits, channels, size, convs_after)


def _convs_after(nodes, inits, value, channels, count, rng):
    for k in range(count):
        inits.append(_const(f"wc{k}", rng.standard_normal((channels, channels, 3, 3))
                            .astype(np.float32) * 0.1))
        nodes.append(helper.make_node("Conv", [value, f"wc{k}"], [f"y{k + 1}"],
                                      pads=[1, 1, 1, 1]))
        value = f"y{k + 1}"
    nodes.append(helper.make_node("Identity", [value], ["y"]))
    return nodes, inits


def _model(nodes, inits, channels, size, convs_after, opset=17, inputs=()):
    h, w = size
    graph = helper.make_graph(
        nodes, "group_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w]), *inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, h, w])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def onnx_group_norm_model(opset: int, channels=16, groups=4, size=(6, 5), seed=1):
    """conv -> ONNX GroupNormalization (opset 21: scale and bias per channel) -> SiLU ->
    conv."""
    rng = np.random.default_rng(seed)
    count = channels
    inits = [_const("w1", rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3),
             _const("scale", rng.uniform(0.5, 1.5, count).astype(np.float32)),
             _const("bias", rng.uniform(-0.3, 0.3, count).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c1", "scale", "bias"], ["a"],
                              num_groups=groups, epsilon=1e-4),
             helper.make_node("Sigmoid", ["a"], ["sg"]),
             helper.make_node("Mul", ["a", "sg"], ["y0"])]
    nodes, inits = _convs_after(nodes, inits, "y0", channels, 1, rng)
    return _model(nodes, inits, channels, size, 1, opset=opset)


def _optimized(model):
    graph, _ = optimize(load_model(model), "cpu")
    return graph


def _onnxruntime(model, x):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _built(model, x, tmp_path):
    """The plan wpk builds of `model` and its output on `x` (saved and loaded)."""
    plan = wpk.build(model, target="cpu", **FAST)
    plan.save(tmp_path / "model.wpk")
    return plan, wpk.load(tmp_path / "model.wpk").run({"x": x})["y"]


def _ops(graph):
    return [(n.domain, n.op) for n in graph.nodes]


def test_the_exporters_pattern_becomes_one_blocked_group_norm_with_its_silu():
    graph = _optimized(group_norm_model())
    norms = [n for n in graph.nodes if n.op == "GroupNorm"]
    assert len(norms) == 1 and norms[0].domain == "wpk.nchwc"
    assert [s.op for s in norms[0].epilogue] == ["silu"]
    assert norms[0].attrs["groups"] == 4 and norms[0].attrs["channels"] == 24
    ops = {op for _, op in _ops(graph)}
    assert not ops & {"InstanceNormalization", "Reshape", "Mul", "Add", "Elementwise",
                      "ReorderInput"}
    assert _ops(graph).count(("wpk.nchwc", "ReorderOutput")) == 1   # the graph output's
    model = group_norm_model()
    gamma = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "gamma"))
    np.testing.assert_allclose(graph.constants[norms[0].inputs[1]], gamma.reshape(-1))


def test_the_instance_norms_own_scale_and_bias_are_folded_in(rng, tmp_path):
    model = group_norm_model(in_scale=np.array([0.5, 2.0, 1.0, 1.5], np.float32),
                             in_bias=np.array([0.1, -0.2, 0.0, 0.3], np.float32))
    assert [n.op for n in _optimized(model).nodes].count("GroupNorm") == 1
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    assert relative_l2(_built(model, x, tmp_path)[1], _onnxruntime(model, x)) < 1e-5


def _scale_input(model):
    """The InstanceNormalization's scale a graph input (not a constant)."""
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "ones"))
    model.graph.input.append(helper.make_tensor_value_info("ones", TensorProto.FLOAT, [4]))
    return model


def _read_twice(model):
    """The InstanceNormalization's output is a graph output too."""
    model.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT,
                                                            [1, 4, 378]))
    return model


@pytest.mark.parametrize("make, group_norms", [
    (lambda: _scale_input(group_norm_model()), 0),
    (lambda: _read_twice(group_norm_model()), 0),
])
def test_what_the_rule_leaves_alone(make, group_norms):
    graph = _optimized(make())
    assert [n.op for n in graph.nodes].count("GroupNorm") == group_norms
    assert "InstanceNormalization" in [n.op for n in graph.nodes]


def test_a_mul_by_a_constant_per_pixel_stays_outside():
    graph = _optimized(group_norm_model(gamma_shape=(1, 1, 9, 7)))
    norms = [n for n in graph.nodes if n.op == "GroupNorm"]
    assert len(norms) == 1 and not norms[0].epilogue   # the Mul comes between it and SiLU
    np.testing.assert_array_equal(graph.constants[norms[0].inputs[1]], np.ones(24))


def test_with_one_conv_the_group_norm_runs_in_the_plain_layout(rng, tmp_path):
    model = group_norm_model(convs_after=0)
    graph = _optimized(model)
    assert [(n.domain, n.op) for n in graph.nodes if n.op == "GroupNorm"] == [
        ("wpk", "GroupNorm")]
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    plan, y = _built(model, x, tmp_path)
    assert any(s.op == "GroupNorm" for s in plan.steps)
    assert relative_l2(y, _onnxruntime(model, x)) < 1e-5


def test_onnx_group_normalization_becomes_group_norm_and_matches_onnxruntime(rng, tmp_path):
    model = onnx_group_norm_model(21)
    graph = _optimized(model)
    norms = [n for n in graph.nodes if n.op == "GroupNorm"]
    assert len(norms) == 1 and [s.op for s in norms[0].epilogue] == ["silu"]
    x = rng.standard_normal((1, 3, 6, 5)).astype(np.float32)
    assert relative_l2(_built(model, x, tmp_path)[1], _onnxruntime(model, x)) < 1e-5


def test_a_group_norm_model_matches_onnxruntime_with_no_fallback_step(rng, tmp_path):
    model = group_norm_model(convs_after=2)
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    plan, y = _built(model, x, tmp_path)
    assert any(s.op == "GroupNorm" for s in plan.steps)
    assert all(s.kind != "fallback" for s in plan.steps)
    assert relative_l2(y, _onnxruntime(model, x)) < 1e-5


def test_to_onnx_writes_the_exporters_nodes_back(rng):
    model = group_norm_model(convs_after=0)
    written = to_onnx(_optimized(model))
    ops = [n.op_type for n in written.graph.node]
    assert "InstanceNormalization" in ops and "Sigmoid" in ops
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    assert relative_l2(_onnxruntime(written, x), _onnxruntime(model, x)) < 1e-5


def _workload(domain="wpk", epilogue=()):
    """A GroupNorm of 2 x 12 x 5 x 3, 4 groups (blocked: in blocks of 8)."""
    if domain == "wpk":
        return plain_norm((2, 12, 5, 3), 4, epilogue, consts=())
    return blocked_norm(2, 12, 5, 3, 8, 4, epilogue, consts=())


@pytest.mark.parametrize("domain, name", [("wpk", "ort.group_norm"),
                                          ("wpk", "numpy.group_norm"),
                                          ("wpk.nchwc", "numpy.nchwc")])
@pytest.mark.parametrize("epilogue", [(), (EpilogueStep("silu"),)])
def test_the_library_and_onnxruntime_candidates_match_the_reference(rng, domain, name,
                                                                    epilogue):
    w = _workload(domain, epilogue)
    inputs = [rng.standard_normal(s.shape).astype(np.float32) * 3 + 1 for s in w.inputs]
    candidate = next(c for c in registry.candidates(w, "cpu")
                     if c.implementation.name == name)
    consts = {1: inputs[1], 2: inputs[2]}
    kernel = candidate.implementation.prepare(w, consts, candidate.config)
    out = np.full(w.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [out])
    np.testing.assert_allclose(out, reference(w, inputs)[0], rtol=1e-5, atol=1e-5)


def test_group_normalization_with_scale_and_bias_as_inputs_runs_as_wpks_own(rng, tmp_path):
    """ONNX's own conformance form: scale and bias are graph inputs (nothing folded)."""
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5, 3])
    vectors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [6]) for n in ("s", "b")]
    graph = helper.make_graph(
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3,
                          epsilon=1e-3)], "group_norm", [x_info, *vectors],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 5, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert [(n.domain, n.op) for n in _optimized(model).nodes] == [("wpk", "GroupNorm")]
    plan = wpk.build(model, target="cpu", **FAST)
    assert [s.op for s in plan.steps] == ["GroupNorm"] and plan.steps[0].kind != "fallback"
    feeds = {"x": rng.standard_normal((2, 6, 5, 3)).astype(np.float32) * 4 + 2,
             "s": rng.uniform(0.5, 2, 6).astype(np.float32),
             "b": rng.uniform(-1, 1, 6).astype(np.float32)}
    plan.save(tmp_path / "model.wpk")
    expected = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert relative_l2(wpk.load(tmp_path / "model.wpk").run(feeds)["y"], expected) < 1e-6
