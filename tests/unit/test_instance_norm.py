"""InstanceNormalization: `instancenorm.c` (kernels/cpu/instance_norm_native) against the
float64 reference on odd sizes (spatial sizes not a multiple of the vector width, one
pixel, rank 3 and 5, batches, variable scale and bias), through the native chain, what it
refuses; and GroupNorm as the torch exporters write it (Reshape, InstanceNormalization,
Reshape, Mul, Add) built end to end, matching onnxruntime with no fallback step."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.native_checks import assert_chain_matches
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.instance_norm_native import INSTANCE_NORM_C, instance_norm_reason
from wpk.kernels.reference import reference
from wpk.kernels.support import unsupported_reason

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

T = TensorSpec


def instance_norm(x, consts=(1, 2), eps=1e-5, dtype="float32", epilogue=(),
                  channels=None) -> Workload:
    c = (x[1],) if channels is None else channels
    inputs = (T(x, dtype), T(c, dtype), T(c, dtype))
    return Workload("InstanceNormalization", inputs, (T(x, dtype),), (("epsilon", eps),),
                    tuple(epilogue), "", tuple(consts))


def arrays_for(w: Workload, rng) -> list[np.ndarray]:
    x = rng.standard_normal(w.inputs[0].shape).astype(np.float32) * 3 + 2   # off-centre
    return [x] + [rng.standard_normal(s.shape).astype(np.float32) for s in w.inputs[1:]]


CASES = {
    "groupnorm_form": dict(x=(1, 8, 4096)),        # a UNet's [N, groups, C/groups*H*W]
    "odd_image": dict(x=(2, 5, 13, 11)),
    "one_pixel": dict(x=(3, 7, 1, 1)),
    "volume": dict(x=(1, 3, 5, 6, 7)),
    "variable_scale_and_bias": dict(x=(2, 6, 9), consts=()),
    "tiny_eps": dict(x=(1, 4, 33), eps=1e-12),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("par", [1, 0])
def test_matches_the_reference(rng, case, par):
    w = instance_norm(**CASES[case])
    assert instance_norm_reason(w) is None and unsupported_reason(w) is None
    arrays = arrays_for(w, rng)
    consts = {i: arrays[i] for i in w.const_inputs}
    out = np.full(w.outputs[0].shape, np.nan, np.float32)   # poisoned: every element written
    INSTANCE_NORM_C.prepare(w, consts, {"par": par})(arrays, [out])
    assert relative_l2(out, reference(w, arrays)[0]) < 1e-6


def test_a_constant_slice_gives_its_bias():
    """Zero variance: the output is the channel's bias (eps keeps the division finite)."""
    w = instance_norm((1, 2, 3, 3))
    x = np.full((1, 2, 3, 3), 5.0, np.float32)
    scale, bias = np.array([2.0, 3.0], np.float32), np.array([0.5, -1.0], np.float32)
    out = np.empty_like(x)
    INSTANCE_NORM_C.prepare(w, {1: scale, 2: bias}, {"par": 1})([x, scale, bias], [out])
    np.testing.assert_allclose(out, np.broadcast_to(bias.reshape(1, 2, 1, 1), x.shape))


def test_the_native_form_computes_the_same_in_a_chain(rng):
    w = instance_norm((2, 4, 8, 8))
    arrays = arrays_for(w, rng)
    kernel = INSTANCE_NORM_C.prepare(w, {1: arrays[1], 2: arrays[2]}, {"par": 1})
    assert_chain_matches(kernel, arrays, reference(w, arrays)[0])


def test_the_planner_offers_it_next_to_onnxruntime_and_numpy():
    names = {c.implementation.name for c in registry.candidates(instance_norm((1, 8, 64)))}
    assert {"instancenorm.c", "ort", "numpy.formula"} <= names


@pytest.mark.parametrize("w, words", [
    (instance_norm((4, 8, 9), epilogue=(EpilogueStep("relu"),)), "no fused epilogue"),
    (instance_norm((4, 8, 9), dtype="float16"), "float32"),
    (instance_norm((4, 8, 9), channels=(1,)), "one value per channel"),
    (instance_norm((4, 8)), "N x C x D1"),
    (Workload("Softmax", (T((4, 8)),), (T((4, 8)),)), "InstanceNormalization only"),
])
def test_what_it_refuses(w, words):
    assert words in instance_norm_reason(w)
    with pytest.raises(ValueError):
        INSTANCE_NORM_C.prepare(w, {}, {"par": 1})


def test_wpk_does_not_claim_a_rank_two_input():
    assert "rank 3 or more" in unsupported_reason(instance_norm((4, 8)))


def instance_norm_model(channels=24, size=(9, 7), seed=0) -> onnx.ModelProto:
    """conv -> InstanceNormalization with its own scale and bias (a style-transfer net's) ->
    Relu -> conv. (GroupNorm's Reshape / InstanceNormalization / Reshape becomes wpk's
    GroupNorm: `test_group_norm.py`.)"""
    rng = np.random.default_rng(seed)
    h, w = size

    def const(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    inits = [const("w1", rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3),
             const("scale", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
             const("bias", rng.uniform(-0.2, 0.2, channels).astype(np.float32)),
             const("w2", rng.standard_normal((8, channels, 3, 3)).astype(np.float32) * 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c1", "scale", "bias"], ["n"],
                              epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "instance_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, h, w])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_instance_norm_model_matches_onnxruntime_with_no_fallback_step(rng, tmp_path):
    model = instance_norm_model()
    plan = wpk.build(model, target="cpu", search="none", progress=False, partition=False,
                     warmup=0, repeats=1, min_time=0.0)
    steps = [s for s in plan.steps if s.op == "InstanceNormalization"]
    assert steps and all(s.kind != "fallback" for s in plan.steps)
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    expected = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    plan.save(tmp_path / "instance_norm.wpk")
    assert relative_l2(wpk.load(tmp_path / "instance_norm.wpk").run({"x": x})["y"],
                       expected) < 1e-5
