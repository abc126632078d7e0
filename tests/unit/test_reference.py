"""The float64 references checked against independent oracles (onnxruntime, onnx.reference),
the epilogue helpers, and random input generation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from wpk.core.errors import WpkError
from wpk.core.numerics import relative_l2 as rel_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.epilogue import apply_epilogue, epilogue_onnx_nodes
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import has_formula, reference

S = TensorSpec
E = EpilogueStep


def oracle_model(op, input_shapes, output_shape, attrs, opset=17):
    """A hand-written single-node model (independent of wpk's node-model builder)."""
    names = [f"x{i}" for i in range(len(input_shapes))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "oracle",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
         zip(names, input_shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, names


def run_ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


ORACLE_CASES = [
    ("Conv", [(1, 6, 11, 10), (6, 2, 3, 3), (6,)], (1, 6, 5, 4),
     {"group": 3, "strides": [2, 2], "dilations": [1, 2], "pads": [1, 0, 0, 1]}),
    ("Conv", [(1, 8, 9, 9), (8, 1, 3, 3)], (1, 8, 5, 5),
     {"group": 8, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("Conv", [(2, 3, 7, 7, 5), (4, 3, 3, 3, 2)], (2, 4, 5, 5, 4), {}),
    ("Gemm", [(5, 7), (4, 7), (1, 4)], (5, 4), {"transB": 1, "alpha": 0.3, "beta": -1.5}),
    ("MaxPool", [(1, 3, 10, 11)], (1, 3, 5, 6),
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": 1}),
    ("AveragePool", [(1, 3, 10, 11)], (1, 3, 5, 6),
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": 1,
      "count_include_pad": 1}),
    ("LRN", [(2, 7, 3, 3)], (2, 7, 3, 3), {"size": 5, "alpha": 0.05, "beta": 0.6, "bias": 1.5}),
    ("ConvTranspose", [(1, 4, 5, 6), (4, 3, 3, 3), (3,)], (1, 3, 10, 12),
     {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("ConvTranspose", [(1, 4, 5, 6), (4, 3, 4, 3)], (1, 3, 10, 12),
     {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("ConvTranspose", [(1, 4, 5, 6), (4, 2, 3, 3)], (1, 4, 9, 14),
     {"strides": [2, 3], "output_shape": [9, 14], "group": 2, "dilations": [1, 2]}),
    ("ConvTranspose", [(2, 3, 7), (3, 2, 4)], (2, 2, 16),
     {"strides": [2], "output_shape": [16], "output_padding": [1], "auto_pad": "SAME_UPPER"}),
    ("Softmax", [(4, 3, 5)], (4, 3, 5), {"axis": 1}),
    ("LayerNormalization", [(3, 4, 5), (4, 5), (4, 5)], (3, 4, 5), {"axis": -2}),
]


@pytest.mark.parametrize("op,shapes,out_shape,attrs", ORACLE_CASES,
                         ids=[f"{c[0]}{i}" for i, c in enumerate(ORACLE_CASES)])
def test_reference_matches_onnxruntime(op, shapes, out_shape, attrs, rng):
    model, names = oracle_model(op, shapes, out_shape, attrs)
    workload = Workload(op, tuple(S(s) for s in shapes), (S(out_shape),),
                        attrs=tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                           for k, v in attrs.items())))
    assert has_formula(workload)
    inputs = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    expected = run_ort(model, dict(zip(names, inputs)))
    actual = reference(workload, inputs)[0]
    assert actual.dtype == np.float64 and actual.shape == expected.shape
    assert rel_l2(actual, expected) < 1e-5


def test_reference_matches_onnx_reference_where_onnxruntime_refuses(rng):
    # onnxruntime rejects dilation with SAME padding; onnx.reference is the oracle here.
    attrs = {"auto_pad": "SAME_UPPER", "dilations": [2, 2]}
    model, names = oracle_model("Conv", [(1, 3, 9, 8), (5, 3, 3, 3)], (1, 5, 9, 8), attrs)
    workload = Workload("Conv", (S((1, 3, 9, 8)), S((5, 3, 3, 3))), (S((1, 5, 9, 8)),),
                        attrs=(("auto_pad", "SAME_UPPER"), ("dilations", (2, 2))))
    inputs = [rng.uniform(-1, 1, s).astype(np.float64) for s in ((1, 3, 9, 8), (5, 3, 3, 3))]
    expected = ReferenceEvaluator(model).run(None, {n: x.astype(np.float32) for n, x in
                                                    zip(names, inputs)})[0]
    assert rel_l2(reference(workload, inputs)[0], expected) < 1e-5


def test_reference_applies_residual_epilogue(rng):
    workload = Workload("Conv", (S((1, 4, 6, 6)), S((4, 4, 1, 1)), None, S((1, 4, 6, 6))),
                        (S((1, 4, 6, 6)),), epilogue=(E("add", operand=3), E("relu")))
    x, w, residual = (rng.standard_normal(s).astype(np.float32)
                      for s in ((1, 4, 6, 6), (4, 4, 1, 1), (1, 4, 6, 6)))
    conv = np.einsum("nchw,mc->nmhw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    expected = np.maximum(conv + residual, 0)
    np.testing.assert_allclose(reference(workload, [x, w, None, residual])[0], expected,
                               rtol=1e-12, atol=1e-12)


def test_fallback_reference_runs_onnx_reference(rng):
    workload = Workload("TopK", (S((3, 8)), S((1,), "int64")), (S((3, 2)), S((3, 2), "int64")),
                        attrs=(("axis", -1),), static_inputs=((1, np.array([2])),))
    assert not has_formula(workload)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    values, indices = reference(workload, [x, np.array([2], np.int64)])
    assert values.dtype == np.float64 and indices.dtype == np.int64
    np.testing.assert_array_equal(indices, np.argsort(-x, axis=1)[:, :2])
    np.testing.assert_allclose(values, np.sort(x, axis=1)[:, ::-1][:, :2])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax", "TopK"])
def test_a_workload_whose_outputs_are_empty_has_empty_references(op):
    """A Softmax over the empty axis a Slice past the end leaves (found by the CLI fuzzer,
    `scripts/fuzz.py --seed 71`): the formula's max over nothing raised, and the build
    ended in an internal error. The outputs hold no element: empty arrays of their shapes,
    float64 for float outputs, whatever the op."""
    if op == "TopK":
        workload = Workload(op, (S((0, 5)), S((1,), "int64")),
                            (S((0, 2)), S((0, 2), "int64")), attrs=(("axis", -1),),
                            static_inputs=((1, np.array([2])),))
        inputs = [np.empty((0, 5), np.float32), np.array([2], np.int64)]
    else:
        workload = Workload(op, (S((0, 1, 5, 2), "float16"),), (S((0, 1, 5, 2), "float16"),),
                            attrs=(("axis", -4),))
        inputs = [np.empty((0, 1, 5, 2), np.float16)]
    outputs = reference(workload, inputs)
    assert [(y.shape, y.dtype) for y in outputs] == [
        (spec.shape, np.dtype(np.float64 if spec.dtype.startswith("float") else spec.dtype))
        for spec in workload.outputs]


def test_reference_refuses_bad_calls():
    workload = Workload("Relu", (S((2,)),), (S((2,)),))
    with pytest.raises(WpkError, match="inputs given"):
        reference(workload, [])
    unknown = Workload("NoSuchOp", (S((2,)),), (S((2,)),))
    with pytest.raises(WpkError, match="NoSuchOp"):
        reference(unknown, [np.zeros(2, np.float32)])
    bad_step = Workload("Relu", (S((2,)),), (S((2,)),), epilogue=(E("add", operand=5),))
    with pytest.raises(WpkError, match="operand"):
        reference(bad_step, [np.zeros(2, np.float32)])


def test_apply_epilogue_is_in_place_and_keeps_dtype(rng):
    y = rng.standard_normal((4, 5)).astype(np.float32)
    bias = rng.standard_normal(5)  # float64 operand: the result stays float32
    expected = np.tanh(np.maximum(y.astype(np.float64) - bias, 0))
    result = apply_epilogue(y, (E("sub", operand=1), E("relu"), E("tanh")), [None, bias])
    assert result is y and result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)


def test_epilogue_onnx_nodes_compute_the_same_as_numpy(rng):
    steps = (E("mul", operand=1), E("clip", (("max", 0.6), ("min", -0.2))), E("gelu_tanh"),
             E("sub", operand=1, swap=True), E("hard_swish"))
    nodes = epilogue_onnx_nodes(steps, "v", {1: "w"}, "out", "ep_")
    assert nodes[-1].output == ["out"]
    assert all(n.name.startswith("ep_") for n in nodes)
    graph = helper.make_graph(
        nodes, "epi", [helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, 4]),
                       helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    v = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    w = rng.uniform(-2, 2, 4).astype(np.float32)
    expected = apply_epilogue(v.astype(np.float64), steps, [None, w.astype(np.float64)])
    np.testing.assert_allclose(run_ort(model, {"v": v, "w": w}), expected, rtol=1e-5, atol=1e-6)


def test_random_inputs_respect_the_op(rng):
    gather = Workload("Gather", (S((5, 9)), S((4, 3), "int64")), (S((5, 4, 3, 9)),),
                      attrs=(("axis", 1),))
    indices = random_inputs(gather, rng)[1]
    assert indices.dtype == np.int64 and indices.min() >= -9 and indices.max() < 9
    reshape = Workload("Reshape", (S((2, 6)), S((2,), "int64")), (S((3, 4)),),
                       const_inputs=(1,), static_inputs=((1, np.array([3, -1])),))
    np.testing.assert_array_equal(random_inputs(reshape, rng)[1], [3, -1])
    bn = Workload("BatchNormalization", tuple(S(s) for s in [(1, 64, 2, 2)] + [(64,)] * 4),
                  (S((1, 64, 2, 2)),))
    arrays = random_inputs(bn, rng)
    assert arrays[4].min() > 0 and arrays[0].min() < 0 and arrays[0].dtype == np.float32
    conv = Workload("Conv", (S((1, 64, 8, 8)), S((32, 64, 3, 3)), None), (S((1, 32, 6, 6)),))
    x, w, absent = random_inputs(conv, rng)
    assert absent is None and np.abs(w).max() <= 1 / np.sqrt(64 * 9)
    assert np.abs(x).max() <= 1 and np.abs(x).max() > 0.9


def test_apply_epilogue_broadcasting_to_a_bigger_shape_returns_a_new_array():
    y = np.ones((1, 3), np.float32)
    operand = np.arange(6, dtype=np.float64).reshape(2, 3)
    result = apply_epilogue(y, (E("mul", operand=0),), [operand])
    assert result is not y and result.shape == (2, 3) and result.dtype == np.float32
    np.testing.assert_array_equal(result, operand)


def test_epilogue_nodes_for_old_opsets_use_clip_attributes(rng):
    steps = (E("clip", (("min", -0.5),)), E("leaky_relu", (("alpha", 0.3),)))
    nodes = epilogue_onnx_nodes(steps, "v", {}, "out", "p_", opset=9)
    clip = next(n for n in nodes if n.op_type == "Clip")
    assert len(clip.input) == 1 and {a.name for a in clip.attribute} == {"min", "max"}
    graph = helper.make_graph(
        nodes, "old", [helper.make_tensor_value_info("v", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    v = rng.uniform(-2, 2, 8).astype(np.float32)
    expected = apply_epilogue(v.astype(np.float64), steps, [])
    np.testing.assert_allclose(run_ort(model, {"v": v}), expected, rtol=1e-6, atol=1e-7)


def test_unknown_epilogue_step_is_refused():
    with pytest.raises(WpkError, match="unknown epilogue op"):
        apply_epilogue(np.zeros(2), (E("cosh"),), [])
    with pytest.raises(WpkError, match="unknown epilogue op"):
        epilogue_onnx_nodes((E("cosh"),), "v", {}, "out", "p_")


@pytest.mark.parametrize(("mode", "transform"), [
    ("linear", "half_pixel"), ("linear", "align_corners"), ("linear", "asymmetric"),
    ("cubic", "half_pixel"), ("nearest", "half_pixel"), ("nearest", "asymmetric")])
def test_resize_reference_follows_every_mode_of_the_spec(mode, transform, rng):
    """Every mode is wpk's own formula (`wpk.kernels.cpu.resize`), checked against
    onnxruntime (when the formula did nearest only, the reference of any other mode had to
    come from elsewhere: torch's bilinear Upsample failed every build)."""
    scales = np.array([1, 1, 2, 3], np.float32)
    workload = Workload("Resize", (S((1, 2, 4, 5), "float32"), None, S((4,), "float32")),
                        (S((1, 2, 8, 15), "float32"),),
                        (("coordinate_transformation_mode", transform), ("mode", mode)),
                        const_inputs=(2,), static_inputs=((2, scales),))
    assert has_formula(workload)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    model, names = oracle_model("Resize", [(1, 2, 4, 5), (0,), (4,)], (1, 2, 8, 15),
                                {"mode": mode, "coordinate_transformation_mode": transform})
    expected = run_ort(model, {names[0]: x, names[1]: np.zeros(0, np.float32),
                               names[2]: scales})
    (actual,) = reference(workload, [x, None, scales])
    assert rel_l2(actual, expected) <= 1e-6


def test_random_inputs_scale_every_conv_weight_of_a_fused_block(rng):
    """Unscaled weights chained through a block grow its activations to hundreds, where a
    sigmoid lands on denormal floats and the block times 10x slower than on a model's."""
    from wpk.kernels.cpu.inverted_residual_spec import block_workload

    workload = block_workload(1, 24, 144, 40, 8, 8, k=5, act=("silu", ()), squeezed=6,
                              gate_acts=(("silu", ()), ("sigmoid", ())))
    arrays = random_inputs(workload, rng)
    weights = [i for i, spec in enumerate(workload.inputs) if spec and len(spec.shape) == 4
               and i > 0]
    assert len(weights) == 5   # expand, depthwise, project, the gate's two
    for index in weights:
        fan_in = int(np.prod(workload.inputs[index].shape[1:]))
        assert np.abs(arrays[index]).max() <= 1 / np.sqrt(fan_in)
        assert np.abs(arrays[index]).max() > 0.5 / np.sqrt(fan_in)
    assert np.abs(arrays[2]).max() > 0.9   # a bias: U(-1, 1) as before
