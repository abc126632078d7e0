"""Generated kernels (`wpk.kernels.generated`): every mapped op against the float64 reference.

Each case is prepared with the template's default schedule and with a seeded
random valid schedule, run on NaN-poisoned outputs (`measure_candidate`
verifies against `wpk.kernels.reference`), and once more directly here.
"""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.generated import (
    DSL_CPU,
    coalesce,
    default_config,
    fold_operand,
    map_workload,
    template_of,
)
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.search.measure import Status, measure_candidate
from wpk.search.space import SearchSpace

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa


def t(*shape: int, dtype: str = "float32") -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


E = EpilogueStep

CASES = {
    "conv_depthwise_bias_relu": Workload(
        "Conv", (t(1, 8, 9, 9), t(8, 1, 3, 3), t(8)), (t(1, 8, 9, 9),),
        (("group", 8), ("pads", (1, 1, 1, 1))), (E("relu"),), const_inputs=(1, 2)),
    "conv_stride2_odd": Workload(
        "Conv", (t(1, 3, 11, 13), t(5, 3, 3, 3)), (t(1, 5, 5, 6),),
        (("strides", (2, 2)),), const_inputs=(1,)),
    "conv_dilation2_residual": Workload(
        "Conv", (t(1, 4, 11, 11), t(6, 4, 3, 3), t(6), t(1, 6, 7, 7)), (t(1, 6, 7, 7),),
        (("dilations", (2, 2)),), (E("add", operand=3), E("relu")), const_inputs=(1, 2)),
    "conv_grouped_same_upper": Workload(
        "Conv", (t(2, 4, 7, 7), t(6, 2, 3, 3)), (t(2, 6, 4, 4),),
        (("auto_pad", "SAME_UPPER"), ("group", 2), ("strides", (2, 2))), const_inputs=(1,)),
    "conv_pointwise_clip": Workload(
        "Conv", (t(1, 16, 5, 5), t(8, 16, 1, 1), t(8)), (t(1, 8, 5, 5),), (),
        (E("clip", (("max", 6.0), ("min", 0.0))),), const_inputs=(1, 2)),
    "matmul_2d": Workload("MatMul", (t(7, 5), t(5, 3)), (t(7, 3),)),
    "matmul_batched_times_2d_bias_gelu": Workload(
        "MatMul", (t(1, 6, 9), t(9, 10), t(10)), (t(1, 6, 10),),
        epilogue=(E("add", operand=2), E("gelu")), const_inputs=(1, 2)),
    "matmul_batched_scaled": Workload(
        "MatMul", (t(2, 3, 7, 5), t(2, 3, 5, 4), t(1)), (t(2, 3, 7, 4),),
        epilogue=(E("mul", operand=2),), static_inputs=((2, np.array([0.25], np.float32)),)),
    "gemm_transb_alpha_relu": Workload(
        "Gemm", (t(4, 6), t(5, 6), t(5)), (t(4, 5),), (("alpha", 0.5), ("transB", 1)),
        (E("relu"),), const_inputs=(1, 2)),
    "gemm_transa_beta_full_c": Workload(
        "Gemm", (t(6, 4), t(6, 5), t(4, 5)), (t(4, 5),), (("beta", 2.0), ("transA", 1))),
    "gemm_no_c": Workload("Gemm", (t(3, 8), t(8, 2)), (t(3, 2),)),
    "maxpool_pads_stride2": Workload(
        "MaxPool", (t(1, 3, 9, 9),), (t(1, 3, 5, 5),),
        (("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)), ("strides", (2, 2)))),
    "maxpool_ceil_mode": Workload(
        "MaxPool", (t(1, 3, 8, 8),), (t(1, 3, 4, 4),),
        (("ceil_mode", 1), ("kernel_shape", (3, 3)), ("strides", (2, 2)))),
    "maxpool_dilation2": Workload(
        "MaxPool", (t(1, 2, 9, 9),), (t(1, 2, 5, 5),),
        (("dilations", (2, 2)), ("kernel_shape", (3, 3)))),
    "avgpool_exclude_pad": Workload(
        "AveragePool", (t(1, 3, 9, 9),), (t(1, 3, 5, 5),),
        (("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)), ("strides", (2, 2)))),
    "avgpool_include_pad": Workload(
        "AveragePool", (t(1, 3, 7, 7),), (t(1, 3, 7, 7),),
        (("count_include_pad", 1), ("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)))),
    "global_avgpool": Workload("GlobalAveragePool", (t(1, 5, 7, 7),), (t(1, 5, 1, 1),)),
    "global_maxpool": Workload("GlobalMaxPool", (t(2, 3, 5, 6),), (t(2, 3, 1, 1),)),
    "softmax_last_axis": Workload("Softmax", (t(2, 3, 10),), (t(2, 3, 10),), (("axis", -1),)),
    "softmax_opset11_axis1": Workload("Softmax", (t(2, 3, 5),), (t(2, 3, 5),), (("axis", 1),),
                                      opset=11),
    "layernorm": Workload(
        "LayerNormalization", (t(2, 3, 16), t(16), t(16)), (t(2, 3, 16),),
        (("axis", -1), ("epsilon", 1e-5)), const_inputs=(1, 2)),
    "lrn_even_window": Workload("LRN", (t(2, 7, 3, 5),), (t(2, 7, 3, 5),),
                                (("alpha", 0.02), ("beta", 0.6), ("bias", 1.5), ("size", 4))),
    "lrn_rank3_window_over_channels": Workload(
        "LRN", (t(1, 3, 9),), (t(1, 3, 9),), (("size", 7),)),
    "batchnorm_relu": Workload(
        "BatchNormalization", (t(2, 6, 5, 3), t(6), t(6), t(6), t(6)), (t(2, 6, 5, 3),),
        (("epsilon", 1e-3),), (E("relu"),), const_inputs=(1, 2, 3, 4)),
    "batchnorm_2d": Workload("BatchNormalization", (t(4, 7), t(7), t(7), t(7), t(7)),
                             (t(4, 7),), const_inputs=(1, 2, 3, 4)),
    "reduce_mean_spatial": Workload("ReduceMean", (t(1, 8, 5, 6),), (t(1, 8, 1, 1),),
                                    (("axes", (2, 3)),)),
    "reduce_max_middle_keepdims0": Workload("ReduceMax", (t(2, 3, 7),), (t(2, 7),),
                                            (("axes", (1,)), ("keepdims", 0))),
    "reduce_sum_axes_input": Workload(
        "ReduceSum", (t(2, 3, 7), t(1, dtype="int64")), (t(2, 3, 1),), const_inputs=(1,),
        static_inputs=((1, np.array([-1])),), opset=13),
    "slice_steps_negative": Workload(
        "Slice", (t(1, 8, 6, 5),) + (t(2, dtype="int64"),) * 4, (t(1, 4, 3, 5),),
        const_inputs=(1, 2, 3, 4), opset=13, static_inputs=(
            (1, np.array([1, 5])), (2, np.array([8, -100])), (3, np.array([1, 2])),
            (4, np.array([2, -2])))),
    "resize_nearest_2x_half_pixel": Workload(
        "Resize", (t(1, 4, 3, 5), None, t(4)), (t(1, 4, 6, 10),), (("mode", b"nearest"),),
        const_inputs=(2,), static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=13),
    "resize_nearest_sizes_empty_roi": Workload(   # as tf2onnx writes an upsample
        "Resize", (t(1, 4, 3, 5), t(0), t(0), t(4, dtype="int64")), (t(1, 4, 6, 10),),
        (("coordinate_transformation_mode", b"asymmetric"), ("mode", b"nearest"),
         ("nearest_mode", b"floor")), const_inputs=(1, 2, 3), opset=13, static_inputs=(
            (1, np.zeros(0, np.float32)), (2, np.zeros(0, np.float32)),
            (3, np.array([1, 4, 6, 10])))),
    "resize_nearest_half_asymmetric": Workload(
        "Resize", (t(1, 4, 6, 10), None, t(4)), (t(1, 4, 3, 5),),
        (("coordinate_transformation_mode", b"asymmetric"), ("mode", b"nearest")),
        const_inputs=(2,), static_inputs=((2, np.array([1, 1, 0.5, 0.5], np.float32)),),
        opset=13),
    "resize_linear_2x_half_pixel": Workload(
        "Resize", (t(1, 4, 3, 5), None, t(4)), (t(1, 4, 6, 10),), (("mode", b"linear"),),
        const_inputs=(2,), static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=13),
    "resize_linear_down_align_corners": Workload(   # odd lengths, a downscale, sizes
        "Resize", (t(2, 3, 7, 9), None, None, t(4, dtype="int64")), (t(2, 3, 3, 4),),
        (("coordinate_transformation_mode", b"align_corners"), ("mode", b"linear")),
        const_inputs=(3,), opset=13, static_inputs=((3, np.array([2, 3, 3, 4])),)),
    "resize_linear_one_axis_rank3_pytorch": Workload(   # output length 1: coordinate 0
        "Resize", (t(3, 5, 6), None, t(3)), (t(3, 1, 9),),
        (("coordinate_transformation_mode", b"pytorch_half_pixel"), ("mode", b"linear")),
        const_inputs=(2,), opset=13,
        static_inputs=((2, np.array([1, 0.2, 1.5], np.float32)),)),
    "resize_cubic_asymmetric_a05": Workload(
        "Resize", (t(1, 2, 7, 6), None, t(4)), (t(1, 2, 10, 9),),
        (("coordinate_transformation_mode", b"asymmetric"), ("cubic_coeff_a", -0.5),
         ("mode", b"cubic")), const_inputs=(2,), opset=13,
        static_inputs=((2, np.array([1, 1, 1.5, 1.5], np.float32)),)),
    "resize_cubic_half_pixel_down": Workload(
        "Resize", (t(1, 3, 11, 8), None, t(4)), (t(1, 3, 5, 4),), (("mode", b"cubic"),),
        const_inputs=(2,), opset=13,
        static_inputs=((2, np.array([1, 1, 0.5, 0.5], np.float32)),)),
    "conv_transpose_k2s2_bias": Workload(
        "ConvTranspose", (t(1, 6, 5, 4), t(6, 3, 2, 2), t(3)), (t(1, 3, 10, 8),),
        (("pads", (0, 0, 0, 0)), ("strides", (2, 2))), const_inputs=(1, 2)),
    "conv_transpose_output_padding": Workload(
        "ConvTranspose", (t(2, 4, 5, 5), t(4, 5, 3, 3), t(5)), (t(2, 5, 10, 10),),
        (("output_padding", (1, 1)), ("pads", (1, 1, 1, 1)), ("strides", (2, 2))),
        const_inputs=(1, 2)),
    "conv_transpose_grouped_dilated": Workload(
        "ConvTranspose", (t(1, 6, 4, 5), t(6, 2, 3, 2)), (t(1, 6, 8, 6),),
        (("dilations", (2, 1)), ("group", 3), ("pads", (0, 0, 0, 0))), const_inputs=(1,)),
    "conv_transpose_same_upper": Workload(
        "ConvTranspose", (t(1, 4, 5, 6), t(4, 3, 3, 3)), (t(1, 3, 10, 12),),
        (("auto_pad", b"SAME_UPPER"), ("strides", (2, 2))), const_inputs=(1,)),
    "elementwise_channel_chain": Workload(
        "Elementwise", (t(1, 8, 5, 5), t(8, 1, 1), t(1, 8, 5, 5)), (t(1, 8, 5, 5),), (),
        (E("mul", operand=1), E("add", operand=2), E("sigmoid")), domain="wpk"),
    "elementwise_swap_div_scalar": Workload(
        "Elementwise", (t(3, 7), t(1)), (t(3, 7),), (), (E("div", operand=1, swap=True),
                                                       E("tanh")), domain="wpk"),
    "relu": Workload("Relu", (t(3, 7),), (t(3, 7),)),
    "nchwc_first_conv_stride2": Workload(
        "Conv", (t(1, 3, 11, 11), t(20, 3, 3, 3), t(20)), (t(1, 2, 5, 5, 16),),
        (("block", 16), ("channels", 20), ("strides", (2, 2))), (E("relu"),),
        domain="wpk.nchwc", const_inputs=(1, 2)),
    "nchwc_pointwise_padded_lanes": Workload(
        "Conv", (t(1, 1, 5, 5, 16), t(24, 12, 1, 1)), (t(1, 2, 5, 5, 16),),
        (("block", 16), ("channels", 24)), domain="wpk.nchwc", const_inputs=(1,)),
    "nchwc_3x3_residual": Workload(
        "Conv", (t(1, 2, 7, 7, 16), t(16, 32, 3, 3), t(16), t(1, 1, 7, 7, 16)),
        (t(1, 1, 7, 7, 16),), (("block", 16), ("channels", 16), ("pads", (1, 1, 1, 1))),
        (E("add", operand=3), E("relu")), domain="wpk.nchwc", const_inputs=(1, 2)),
    "nchwc_depthwise_stride2": Workload(
        "Conv", (t(1, 2, 9, 9, 16), t(32, 1, 3, 3), t(32)), (t(1, 2, 5, 5, 16),),
        (("block", 16), ("channels", 32), ("group", 32), ("pads", (1, 1, 1, 1)),
         ("strides", (2, 2))), (E("clip", (("max", 6.0), ("min", 0.0))),),
        domain="wpk.nchwc", const_inputs=(1, 2)),
    "add_broadcast_row": Workload("Add", (t(3, 7), t(7)), (t(3, 7),)),
    "hard_swish_odd": Workload("HardSwish", (t(1, 13),), (t(1, 13),)),
    # a clamp to [0, 1] after a super-resolution network's pixel shuffle: static bounds
    "clip_static_bounds": Workload(
        "Clip", (t(1, 3, 9, 7), t(), t()), (t(1, 3, 9, 7),), const_inputs=(1, 2), opset=13,
        static_inputs=((1, np.array(0.25, np.float32)), (2, np.array(0.5, np.float32)))),
    "clip_max_only": Workload(
        "Clip", (t(5, 11), None, t()), (t(5, 11),), const_inputs=(2,), opset=13,
        static_inputs=((2, np.array(0.3, np.float32)),)),
    "clip_opset6_attributes": Workload("Clip", (t(4, 9),), (t(4, 9),),
                                       (("max", 0.4), ("min", -0.2)), opset=6),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_kernel_matches_reference(name, rng):
    workload = CASES[name]
    assert DSL_CPU.unsupported_reason(workload) is None, map_workload(workload)
    space = SearchSpace.from_template(template_of(workload), name=workload.label)
    configs = [default_config(workload)]
    configs += [c for c in template_of(workload).sample(np.random.default_rng(7), 1)
                if c != configs[0]]
    for config in configs:
        assert space.is_valid(space.indices(config))
        measurement = measure_candidate(workload, Candidate(DSL_CPU, config), rng=rng)
        assert measurement.status is Status.OK, (config, measurement.message)
        assert measurement.kind == "generated"
        # And directly: poisoned outputs are fully overwritten with the right values.
        inputs = random_inputs(workload, rng)
        consts = {i: inputs[i] for i in workload.const_inputs}
        kernel = DSL_CPU.prepare(workload, consts, config)
        outputs = [np.full(s.shape, np.nan, np.float32) for s in workload.outputs]
        kernel(inputs, outputs)
        expected = reference(workload, inputs)
        assert np.isfinite(outputs[0]).all()
        np.testing.assert_allclose(outputs[0], expected[0], rtol=1e-4, atol=1e-5)


def test_generated_kernel_takes_non_contiguous_inputs(rng):
    workload = CASES["add_broadcast_row"]
    kernel = DSL_CPU.prepare(workload, {}, default_config(workload))
    a = rng.standard_normal((7, 3)).astype(np.float32).T   # a transposed view
    b = rng.standard_normal(7).astype(np.float32)
    out = np.full((3, 7), np.nan, np.float32)
    kernel([a, b], [out])
    np.testing.assert_allclose(out, a + b, rtol=1e-6)


def test_generated_kernel_binds_again_when_the_arrays_change(rng):
    """A kernel keeps the pointers of the arrays it was last called with (the runtime's
    arena views, the same every run); other arrays, or a non-contiguous one that it must
    copy each time, are bound afresh."""
    workload = CASES["add_broadcast_row"]
    kernel = DSL_CPU.prepare(workload, {}, default_config(workload))
    first = [rng.standard_normal((3, 7)).astype(np.float32), np.ones(7, np.float32)]
    out = np.empty((3, 7), np.float32)
    for _ in range(2):
        kernel(first, [out])
        np.testing.assert_allclose(out, first[0] + 1, rtol=1e-6)
    first[0][:] = 5.0  # the same array, new values: read through the kept pointer
    kernel(first, [out])
    np.testing.assert_allclose(out, 6.0)
    other_out = np.empty((3, 7), np.float32)
    strided = rng.standard_normal((7, 3)).astype(np.float32).T
    kernel([strided, first[1]], [other_out])
    np.testing.assert_allclose(other_out, strided + 1, rtol=1e-6)
    strided[:] = 3.0  # copied to a contiguous temporary each call: the new values count
    kernel([strided, first[1]], [other_out])
    np.testing.assert_allclose(other_out, 4.0)
    np.testing.assert_allclose(out, 6.0)  # the first output was not written again


UNSUPPORTED = {
    "nchwc pool": (Workload("MaxPool", (t(1, 1, 4, 4, 16),), (t(1, 1, 2, 2, 16),),
                            (("block", 16), ("channels", 16), ("kernel_shape", (2, 2)),
                             ("strides", (2, 2))), domain="wpk.nchwc"), "domain"),
    "nchwc runtime filter": (Workload("Conv", (t(1, 1, 4, 4, 16), t(16, 16, 1, 1)),
                                      (t(1, 1, 4, 4, 16),), (("block", 16), ("channels", 16)),
                                      domain="wpk.nchwc"), "constant"),
    "float64": (Workload("Relu", (t(3, dtype="float64"),), (t(3, dtype="float64"),)),
                "float32 only"),
    "1-D matmul": (Workload("MatMul", (t(5), t(5, 3)), (t(3),)), "1-D"),
    "broadcast batch": (Workload("MatMul", (t(2, 4, 5), t(1, 5, 3)), (t(2, 4, 3),)),
                        "broadcast batch"),
    "3-D conv": (Workload("Conv", (t(1, 2, 4, 4, 4), t(2, 2, 1, 1, 1)), (t(1, 2, 4, 4, 4),)),
                 "2-D"),
    "maxpool indices": (Workload("MaxPool", (t(1, 1, 4, 4),), (t(1, 1, 2, 2), t(1, 1, 2, 2,
                                                                               dtype="int64")),
                                 (("kernel_shape", (2, 2)), ("strides", (2, 2)))), "float32"),
    "softmax inner axis": (Workload("Softmax", (t(2, 3, 4),), (t(2, 3, 4),), (("axis", 1),)),
                           "last"),
    "unknown op": (Workload("TopK", (t(4),), (t(2),)), "no DSL operator"),
    "LRN of rank 2": (Workload("LRN", (t(4, 6),), (t(4, 6),), (("size", 3),)), "rank 3"),
    "reduce over axes 1 and 3": (Workload("ReduceMean", (t(2, 3, 4, 5),), (t(2, 1, 4, 1),),
                                          (("axes", (1, 3)),)), "contiguous"),
    "antialiased resize": (Workload(
        "Resize", (t(1, 4, 6, 10), None, t(4)), (t(1, 4, 3, 5),),
        (("antialias", 1), ("mode", b"linear")), const_inputs=(2,), opset=18,
        static_inputs=((2, np.array([1, 1, 0.5, 0.5], np.float32)),)), "antialias"),
    "crop and resize": (Workload(
        "Resize", (t(1, 4, 6, 10), t(8), t(4)), (t(1, 4, 3, 5),),
        (("coordinate_transformation_mode", b"tf_crop_and_resize"), ("mode", b"linear")),
        const_inputs=(1, 2), opset=13, static_inputs=(
            (1, np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8], np.float32)),
            (2, np.array([1, 1, 0.5, 0.5], np.float32)))), "extrapolates"),
    "cubic resize of three axes": (Workload(
        "Resize", (t(1, 4, 3, 5), None, t(4)), (t(1, 8, 6, 10),), (("mode", b"cubic"),),
        const_inputs=(2,), opset=13,
        static_inputs=((2, np.array([1, 2, 2, 2], np.float32)),)), "1 to 2 axes"),
    "clip of computed bounds": (Workload("Clip", (t(3, 4), t(), t()), (t(3, 4),), opset=13),
                                "no DSL operator"),
    "computed slice": (Workload("Slice", (t(4, 6),) + (t(1, dtype="int64"),) * 2, (t(2, 6),),
                                opset=13), "float32 only"),   # computed integer starts
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unmapped_workloads_say_why(name):
    workload, words = UNSUPPORTED[name]
    reason = DSL_CPU.unsupported_reason(workload)
    assert reason is not None and words in reason, reason


@pytest.mark.parametrize("case", ["relu", "elementwise_channel_chain", "add_broadcast_row",
                                  "softmax_last_axis", "layernorm", "lrn_even_window",
                                  "batchnorm_relu", "clip_static_bounds"])
def test_an_untuned_build_measures_the_default_schedule_of_memory_bound_ops(case):
    workload = CASES[case]
    assert registry.get("dsl.cpu") is DSL_CPU
    assert DSL_CPU.configs(workload) == [default_config(workload)]
    assert [c.config for c in registry.candidates(workload)
            if c.implementation is DSL_CPU] == [default_config(workload)]


@pytest.mark.parametrize("name", ["clip_static_bounds", "clip_max_only",
                                  "clip_opset6_attributes"])
def test_numpy_computes_a_clip_of_fixed_bounds_as_one_step(name, rng):
    """numpy.elementwise takes a Clip whose bounds are fixed (one clip step into the
    output); one whose bounds are computed stays numpy.formula's."""
    workload, numpy_elementwise = CASES[name], registry.get("numpy.elementwise")
    assert numpy_elementwise.unsupported_reason(workload) is None
    inputs = random_inputs(workload, rng)
    inputs[0] = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    numpy_elementwise.prepare(workload, {}, {})(inputs, [out])
    np.testing.assert_array_equal(out, reference(workload, inputs)[0].astype(np.float32))
    computed = UNSUPPORTED["clip of computed bounds"][0]
    assert "run time" in numpy_elementwise.unsupported_reason(computed)


@pytest.mark.parametrize("case", ["conv_pointwise_clip", "matmul_2d", "gemm_no_c",
                                  "maxpool_pads_stride2", "nchwc_3x3_residual"])
def test_compute_bound_ops_get_their_generated_configs_from_the_search(case):
    assert DSL_CPU.configs(CASES[case]) == []
    assert not any(c.implementation is DSL_CPU for c in registry.candidates(CASES[case]))


def test_coalesce_merges_dims_that_broadcast_alike():
    out, ops = coalesce((1, 8, 5, 5), [(8, 1, 1), (1, 8, 5, 5)])
    assert out == (8, 25) and ops == [(8, 1), (8, 25)]
    out, ops = coalesce((2, 3, 4), [(1,)])
    assert out == (24,) and ops == [(1,)]


def test_fold_operand_keeps_right_aligned_broadcasting():
    assert fold_operand((768,), (1, 128, 768), (128, 768)) == (768,)
    assert fold_operand((1, 128, 768), (1, 128, 768), (128, 768)) == (128, 768)
    assert fold_operand((128, 1), (1, 128, 768), (128, 768)) == (128, 1)
    assert fold_operand((2, 1, 1), (2, 3, 4), (6, 4)) is None
