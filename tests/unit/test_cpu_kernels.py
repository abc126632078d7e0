"""Every CPU implementation (numpy library kernels, onnxruntime vendor and fallback kernels)
against the float64 reference, with outputs poisoned (NaN) before each run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from wpk.core.errors import WpkError
from wpk.core.numerics import relative_l2 as rel_l2
from wpk.core.workload import UNARY_EPILOGUE_OPS, EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu import ort_node
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.support import SUPPORTED_OPS, is_supported, unsupported_reason

S = TensorSpec
E = EpilogueStep
RESIDUAL = (E("add", operand=3), E("relu"))


def conv(x, w, out, bias=True, residual=False, epilogue=(), **attrs) -> Workload:
    inputs = [S(x), S(w), S((w[0],)) if bias else None]
    if residual:
        inputs.append(S(out))
    return Workload("Conv", tuple(inputs), (S(out),), attrs=tuple(sorted(attrs.items())),
                    epilogue=epilogue, const_inputs=(1, 2) if bias else (1,))


def conv_transpose(x, w, out, group=1, bias=True, **attrs) -> Workload:
    inputs = (S(x), S(w), S((w[1] * group,))) if bias else (S(x), S(w))
    return Workload("ConvTranspose", inputs, (S(out),),
                    attrs=tuple(sorted({"group": group, **attrs}.items())),
                    const_inputs=(1, 2) if bias else (1,))


def static(op, inputs, out, statics, **attrs) -> Workload:
    return Workload(op, tuple(inputs), (S(out),), attrs=tuple(sorted(attrs.items())),
                    const_inputs=tuple(sorted(statics)),
                    static_inputs=tuple(sorted(statics.items())))


CASES = {
    "conv3x3_residual_relu": conv((1, 8, 10, 10), (16, 8, 3, 3), (1, 16, 10, 10), residual=True,
                                  epilogue=RESIDUAL, pads=(1, 1, 1, 1)),
    "conv_depthwise_stride2_asym": conv((2, 12, 11, 9), (12, 1, 3, 3), (2, 12, 6, 4),
                                        group=12, strides=(2, 2), pads=(1, 0, 1, 1)),
    "conv_depthwise_multiplier": conv((1, 6, 9, 9), (12, 1, 3, 3), (1, 12, 9, 9),
                                      group=6, pads=(1, 1, 1, 1),
                                      epilogue=(E("clip", (("max", 6.0), ("min", 0.0))),)),
    "conv_dilation2_groups3": conv((1, 12, 13, 13), (9, 4, 3, 3), (1, 9, 9, 9), bias=False,
                                   group=3, dilations=(2, 2)),
    "conv_same_upper_stride2": conv((1, 5, 9, 8), (7, 5, 3, 3), (1, 7, 5, 4),
                                    auto_pad="SAME_UPPER", strides=(2, 2)),
    "conv_same_upper_dilation2": conv((1, 5, 9, 8), (7, 5, 3, 3), (1, 7, 9, 8),
                                      auto_pad="SAME_UPPER", dilations=(2, 2)),
    "conv_1x1_stride2": conv((1, 16, 8, 8), (8, 16, 1, 1), (1, 8, 4, 4), strides=(2, 2)),
    "conv_1x1_silu": conv((1, 16, 7, 7), (24, 16, 1, 1), (1, 24, 7, 7), epilogue=(E("silu"),)),
    "conv1d": conv((2, 4, 20), (6, 4, 5), (2, 6, 16)),
    "gemm_transB_alpha_beta": Workload("Gemm", (S((6, 20)), S((12, 20)), S((12,))), (S((6, 12)),),
                                       attrs=(("alpha", 0.5), ("beta", 2.0), ("transB", 1)),
                                       const_inputs=(1, 2)),
    "gemm_transA_dynamic": Workload("Gemm", (S((20, 6)), S((20, 12)), S((6, 12))), (S((6, 12)),),
                                    attrs=(("alpha", 1.5), ("transA", 1))),
    "gemm_no_c_residual": Workload("Gemm", (S((4, 9)), S((9, 5)), None, S((4, 5))), (S((4, 5)),),
                                   epilogue=(E("add", operand=3), E("tanh")), const_inputs=(1,)),
    "matmul_batched_gelu": Workload("MatMul", (S((2, 3, 7, 16)), S((16, 8)), S((8,))),
                                    (S((2, 3, 7, 8)),), const_inputs=(1, 2),
                                    epilogue=(E("add", operand=2), E("gelu"))),
    "matmul_broadcast_batches": Workload("MatMul", (S((3, 1, 4, 6)), S((5, 6, 2))),
                                         (S((3, 5, 4, 2)),)),
    "maxpool_ceil": Workload("MaxPool", (S((1, 4, 10, 10)),), (S((1, 4, 5, 5)),),
                             attrs=(("ceil_mode", 1), ("kernel_shape", (3, 3)),
                                    ("strides", (2, 2)))),
    "maxpool_pads_dilation": Workload("MaxPool", (S((1, 3, 9, 9)),), (S((1, 3, 8, 8)),),
                                      attrs=(("dilations", (2, 2)), ("kernel_shape", (2, 2)),
                                             ("pads", (1, 1, 0, 0)))),
    "avgpool_include_pad": Workload("AveragePool", (S((1, 4, 9, 9)),), (S((1, 4, 5, 5)),),
                                    attrs=(("count_include_pad", 1), ("kernel_shape", (3, 3)),
                                           ("pads", (1, 1, 1, 1)), ("strides", (2, 2)))),
    "avgpool_exclude_pad_ceil": Workload("AveragePool", (S((1, 4, 10, 10)),), (S((1, 4, 5, 5)),),
                                         attrs=(("ceil_mode", 1), ("kernel_shape", (3, 3)),
                                                ("pads", (1, 1, 0, 0)), ("strides", (2, 2)))),
    "global_avgpool": Workload("GlobalAveragePool", (S((2, 8, 5, 5)),), (S((2, 8, 1, 1)),)),
    "global_maxpool": Workload("GlobalMaxPool", (S((2, 8, 5, 5)),), (S((2, 8, 1, 1)),)),
    "softmax_axis1": Workload("Softmax", (S((3, 10, 4)),), (S((3, 10, 4)),), attrs=(("axis", 1),)),
    "softmax_opset11": Workload("Softmax", (S((3, 10, 4)),), (S((3, 10, 4)),),
                                attrs=(("axis", 1),), opset=11),
    "logsoftmax": Workload("LogSoftmax", (S((3, 10)),), (S((3, 10)),), attrs=(("axis", -1),)),
    "layernorm": Workload("LayerNormalization", (S((2, 5, 16)), S((16,)), S((16,))),
                          (S((2, 5, 16)),), attrs=(("epsilon", 1e-5),), const_inputs=(1, 2)),
    "layernorm_2axes_residual": Workload(
        "LayerNormalization", (S((2, 4, 6)), S((4, 6)), None, S((2, 4, 6))), (S((2, 4, 6)),),
        attrs=(("axis", 1),), epilogue=(E("add", operand=3),), const_inputs=(1,)),
    "batchnorm_relu": Workload("BatchNormalization", tuple(S(s) for s in
                                                           [(2, 6, 4, 4)] + [(6,)] * 4),
                               (S((2, 6, 4, 4)),), const_inputs=(1, 2, 3, 4),
                               epilogue=(E("relu"),)),
    "lrn": Workload("LRN", (S((1, 10, 4, 4)),), (S((1, 10, 4, 4)),),
                    attrs=(("alpha", 1e-2), ("beta", 0.75), ("bias", 2.0), ("size", 3))),
    "add_broadcast": Workload("Add", (S((2, 3, 4)), S((3, 1))), (S((2, 3, 4)),)),
    "div": Workload("Div", (S((2, 3)), S((2, 3))), (S((2, 3)),)),
    "max_variadic": Workload("Max", (S((2, 3)), S((3,)), S((2, 1))), (S((2, 3)),)),
    "sum3_relu": Workload("Sum", (S((2, 3)), S((3,)), S((2, 3))), (S((2, 3)),), opset=9,
                          epilogue=(E("relu"),)),
    "mul_then_add_own_input": Workload("Mul", (S((2, 3)), S((2, 3))), (S((2, 3)),),
                                       epilogue=(E("add", operand=1),)),
    "mean2": Workload("Mean", (S((2, 3)), S((2, 1))), (S((2, 3)),)),
    "dropout_opset9": Workload("Dropout", (S((2, 5)),), (S((2, 5)),), attrs=(("ratio", 0.5),),
                               opset=9),
    "dropout_inference": static("Dropout", [S((2, 5)), S(()), S((), "bool")], (2, 5),
                                {1: np.array(0.3, np.float32), 2: np.array(False)}),
    "leaky_relu": Workload("LeakyRelu", (S((2, 7)),), (S((2, 7)),), attrs=(("alpha", 0.2),)),
    "hard_sigmoid": Workload("HardSigmoid", (S((2, 7)),), (S((2, 7)),),
                             attrs=(("alpha", 0.3), ("beta", 0.4))),
    "clip_static": static("Clip", [S((3, 8)), S(()), S(())], (3, 8),
                          {1: np.array(-0.3, np.float32), 2: np.array(0.4, np.float32)}),
    "erf": Workload("Erf", (S((4, 5)),), (S((4, 5)),)),
    "sqrt": Workload("Sqrt", (S((4, 5)),), (S((4, 5)),)),
    "reshape": static("Reshape", [S((2, 3, 4)), S((2,), "int64")], (6, 4),
                      {1: np.array([-1, 4], np.int64)}),
    "flatten": Workload("Flatten", (S((2, 3, 4)),), (S((2, 12)),), attrs=(("axis", 1),)),
    "squeeze": static("Squeeze", [S((2, 1, 4)), S((1,), "int64")], (2, 4),
                      {1: np.array([1], np.int64)}),
    "unsqueeze": static("Unsqueeze", [S((2, 4)), S((1,), "int64")], (2, 1, 4),
                        {1: np.array([1], np.int64)}),
    "transpose": Workload("Transpose", (S((2, 3, 4)),), (S((4, 2, 3)),),
                          attrs=(("perm", (2, 0, 1)),)),
    "concat_relu": Workload("Concat", (S((2, 3)), S((2, 5))), (S((2, 8)),), attrs=(("axis", 1),),
                            epilogue=(E("relu"),)),
    "gather_axis1": static("Gather", [S((3, 7, 2)), S((2, 2), "int64")], (3, 2, 2, 2),
                           {1: np.array([[0, -1], [3, 6]], np.int64)}, axis=1),
    "slice_negative_step": static("Slice", [S((6, 8))] + [S((2,), "int64")] * 4, (2, 3),
                                  {1: np.array([4, -1], np.int64), 2: np.array([0, 0], np.int64),
                                   3: np.array([0, 1], np.int64),
                                   4: np.array([-2, -3], np.int64)}),
    "pad_constant": static("Pad", [S((2, 3)), S((4,), "int64"), S((), "float32")], (3, 6),
                           {1: np.array([1, 2, 0, 1], np.int64), 2: np.array(0.5, np.float32)}),
    "pad_reflect": static("Pad", [S((1, 2, 4, 4)), S((8,), "int64")], (1, 2, 6, 7),
                          {1: np.array([0, 0, 1, 2, 0, 0, 1, 1], np.int64)}, mode="reflect"),
    "split_sizes_axis1": Workload(
        "Split", (S((2, 7, 3)), S((3,), "int64")), (S((2, 2, 3)), S((2, 4, 3)), S((2, 1, 3))),
        attrs=(("axis", 1),), const_inputs=(1,),
        static_inputs=((1, np.array([2, 4, 1], np.int64)),), opset=13),
    "split_equal_last_axis": Workload("Split", (S((3, 8)),), (S((3, 4)), S((3, 4))),
                                      attrs=(("axis", -1),), opset=11),
    # the exporters' reductions: over H (a recognizer's pooling), over channels (a channel
    # LayerNorm written out), axes as an input from opset 18 (13 for ReduceSum)
    "reduce_mean_h_dropped": Workload("ReduceMean", (S((1, 5, 4, 6)),), (S((1, 5, 6)),),
                                      attrs=(("axes", (2,)), ("keepdims", 0)), opset=13),
    "reduce_mean_channels": Workload("ReduceMean", (S((2, 7, 3, 3)),), (S((2, 1, 3, 3)),),
                                     attrs=(("axes", (1,)),), opset=11),
    "reduce_max_spatial_input_axes": Workload(
        "ReduceMax", (S((1, 3, 5, 4)), S((2,), "int64")), (S((1, 3, 1, 1)),), const_inputs=(1,),
        static_inputs=((1, np.array([-1, 2], np.int64)),), opset=18),
    "reduce_sum_all_keepdims0": Workload("ReduceSum", (S((3, 4)),), (S(()),),
                                         attrs=(("keepdims", 0),), opset=13),
    "reduce_min_noop_empty_axes": Workload("ReduceMin", (S((3, 4)),), (S((3, 4)),),
                                           attrs=(("noop_with_empty_axes", 1),), opset=18),
    # a text detector's upsampling head (kernel = stride), a decoder's 3x3 stride 2 with
    # pads and output_padding, grouped with dilation, 1-d
    "conv_transpose_k2s2": conv_transpose((1, 6, 5, 4), (6, 3, 2, 2), (1, 3, 10, 8),
                                          strides=(2, 2), pads=(0, 0, 0, 0)),
    "conv_transpose_3x3_s2_output_padding": conv_transpose(
        (2, 4, 5, 5), (4, 5, 3, 3), (2, 5, 10, 10), strides=(2, 2), pads=(1, 1, 1, 1),
        output_padding=(1, 1)),
    "conv_transpose_grouped_dilated": conv_transpose(
        (1, 6, 4, 5), (6, 2, 3, 2), (1, 6, 8, 6), group=3, dilations=(2, 1), pads=(0, 0, 0, 0),
        bias=False),
    "conv_transpose_1d_asymmetric": conv_transpose((1, 3, 7), (3, 2, 4), (1, 2, 15),
                                                   strides=(2,), pads=(1, 0)),
    # pads from auto_pad SAME (an odd total: the extra one at the end or the begin) and
    # from output_shape
    "conv_transpose_same_upper": conv_transpose((1, 4, 5, 6), (4, 3, 3, 3), (1, 3, 10, 12),
                                                strides=(2, 2), auto_pad=b"SAME_UPPER"),
    "conv_transpose_same_lower": conv_transpose((1, 4, 5, 6), (4, 3, 4, 3), (1, 3, 10, 12),
                                                strides=(2, 2), auto_pad=b"SAME_LOWER",
                                                bias=False),
    "conv_transpose_output_shape": conv_transpose(
        (1, 4, 5, 6), (4, 2, 3, 3), (1, 4, 9, 14), group=2, strides=(2, 3), dilations=(1, 2),
        output_shape=(9, 14)),
    "resize_nearest_scales": static(
        "Resize", [S((1, 2, 3, 4)), S((0,)), S((4,))], (1, 2, 6, 10),
        {1: np.zeros(0, np.float32), 2: np.array([1, 1, 2, 2.5], np.float32)}),
    "resize_sizes_align_corners_floor": static(
        "Resize", [S((1, 2, 5, 4)), S((0,)), S((0,)), S((4,), "int64")], (1, 2, 3, 7),
        {1: np.zeros(0, np.float32), 2: np.zeros(0, np.float32),
         3: np.array([1, 2, 3, 7], np.int64)},
        coordinate_transformation_mode="align_corners", nearest_mode="floor"),
    "resize_asymmetric_ceil": static(
        "Resize", [S((2, 3, 4)), S((0,)), S((3,))], (2, 3, 9),
        {1: np.zeros(0, np.float32), 2: np.array([1, 1, 2.25], np.float32)},
        coordinate_transformation_mode="asymmetric", nearest_mode="ceil"),
    "resize_pytorch_prefer_ceil": static(
        "Resize", [S((1, 1, 4, 6)), S((0,)), S((4,))], (1, 1, 6, 3),
        {1: np.zeros(0, np.float32), 2: np.array([1, 1, 1.5, 0.5], np.float32)},
        coordinate_transformation_mode="pytorch_half_pixel", nearest_mode="round_prefer_ceil"),
    "elementwise_chain": Workload("Elementwise", (S((2, 6, 5)), S((6, 1))), (S((2, 6, 5)),),
                                  domain="wpk", epilogue=(E("mul", operand=1), E("sigmoid"),
                                                          E("sub", operand=0, swap=True))),
    "elementwise_add_then_log": Workload("Elementwise", (S((4, 6)), S((4, 6))), (S((4, 6)),),
                                         domain="wpk",
                                         epilogue=(E("add", operand=1), E("log"), E("neg"))),
    "elementwise_broadcast_out": Workload("Elementwise", (S((6, 1)), S((2, 6, 5))),
                                          (S((2, 6, 5)),), domain="wpk",
                                          epilogue=(E("add", operand=1), E("hard_swish"))),
}
# One Elementwise case per unary epilogue step, and per binary step (plain and swapped).
for _op in sorted(UNARY_EPILOGUE_OPS):
    _attrs = {"clip": (("max", 0.5), ("min", -0.25)), "leaky_relu": (("alpha", 0.1),),
              "hard_sigmoid": (("alpha", 0.25), ("beta", 0.4))}.get(_op, ())
    CASES[f"step_{_op}"] = Workload("Elementwise", (S((3, 17)),), (S((3, 17)),), domain="wpk",
                                    epilogue=(E(_op, _attrs),))
for _op in ("add", "sub", "mul", "div", "pow", "max", "min"):
    for _swap in (False, True):
        CASES[f"step_{_op}{'_swap' if _swap else ''}"] = Workload(
            "Elementwise", (S((3, 17)), S((17,))), (S((3, 17)),), domain="wpk",
            epilogue=(E("abs"), E(_op, operand=1, swap=_swap)) if _op == "pow" and not _swap
            else (E(_op, operand=1, swap=_swap),))


def run_poisoned(candidate, workload, inputs):
    consts = {i: inputs[i] for i in workload.const_inputs}
    kernel = candidate.implementation.prepare(workload, consts, candidate.config)
    outputs = [np.full(s.shape, np.nan, s.dtype) if np.dtype(s.dtype).kind == "f"
               else np.full(s.shape, -7, s.dtype) for s in workload.outputs]
    assert kernel(inputs, outputs) is None
    return kernel, outputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_candidate_matches_reference(name, rng):
    workload = CASES[name]
    assert is_supported(workload), name
    candidates = registry.candidates(workload)
    kinds = {c.implementation.kind for c in candidates}
    assert registry.LIBRARY in kinds, f"{name}: no library kernel for a supported op"
    inputs = random_inputs(workload, rng)
    expected = reference(workload, inputs)
    assert np.isfinite(expected[0]).all()
    compared = len(workload.outputs) if workload.op == "Split" else 1   # every piece
    for candidate in candidates:
        kernel, outputs = run_poisoned(candidate, workload, inputs)
        for j in range(compared):
            error = rel_l2(outputs[j], expected[j])
            assert error < 1e-5, f"{name} {candidate.label} output {j}: rel L2 {error:.3g}"
        # A second call on fresh inputs and fresh buffers: nothing stale is reused.
        fresh = random_inputs(workload, rng)
        for i in workload.const_inputs:
            fresh[i] = inputs[i]
        again = [np.full(s.shape, np.nan, s.dtype) for s in workload.outputs]
        kernel(fresh, again)
        for j, value in enumerate(reference(workload, fresh)[:compared]):
            error = rel_l2(again[j], value)
            assert error < 1e-5, f"{name} {candidate.label} second call: rel L2 {error:.3g}"


def test_ort_vendor_kernel_is_offered_for_supported_ops():
    labels = {c.label for c in registry.candidates(CASES["conv3x3_residual_relu"])}
    assert "ort" in labels and "ort.fallback" not in labels
    assert ort_node.kind_for(CASES["conv3x3_residual_relu"]) == registry.VENDOR


def test_ort_offers_plain_nchw_sessions_for_layout_sensitive_ops():
    labels = {c.label for c in registry.candidates(CASES["conv3x3_residual_relu"])}
    assert {"ort", "ort[optimization=extended]"} <= labels
    labels = {c.label for c in registry.candidates(CASES["softmax_axis1"])}
    assert "ort[optimization=extended]" not in labels
    with pytest.raises(WpkError, match="optimization"):
        registry.get("ort").prepare(CASES["softmax_axis1"], {}, {"optimization": "none"})


def test_ort_rejects_what_it_cannot_run():
    # onnxruntime refuses dilation with SAME padding; wpk's own kernel still runs it.
    reason = registry.get("ort").unsupported_reason(CASES["conv_same_upper_dilation2"])
    assert reason and "Dilation" in reason


def test_a_batchnorm_in_training_mode_is_refused():
    # training_mode 1 normalises by the batch's statistics, not the running ones
    inputs = (S((2, 3, 4)),) + (S((3,)),) * 4
    train = Workload("BatchNormalization", inputs, (S((2, 3, 4)),),
                     attrs=(("training_mode", 1),), const_inputs=(1, 2, 3, 4), opset=15)
    assert "training mode" in unsupported_reason(train)
    assert unsupported_reason(Workload("BatchNormalization", inputs, (S((2, 3, 4)),),
                                       const_inputs=(1, 2, 3, 4), opset=15)) is None


def test_a_conv_transpose_output_shape_beyond_its_full_result_is_refused():
    # full result 2 x (5 - 1) + 3 = 11 along H: an output of 13 would start before it
    workload = conv_transpose((1, 4, 5, 6), (4, 3, 3, 3), (1, 3, 13, 12), strides=(2, 2),
                              output_shape=(13, 12))
    assert "larger than its full result" in unsupported_reason(workload)
    assert unsupported_reason(conv_transpose((1, 4, 5, 6), (4, 3, 3, 3), (1, 3, 10, 12),
                                             strides=(2, 2), output_shape=(10, 12))) is None


@pytest.mark.parametrize("workload", [
    Workload("Hardmax", (S((3, 6)),), (S((3, 6)),), attrs=(("axis", -1),)),
    Workload("TopK", (S((3, 9)), S((1,), "int64")), (S((3, 4)), S((3, 4), "int64")),
             attrs=(("axis", 1),), const_inputs=(1,), static_inputs=((1, np.array([4])),)),
    Workload("CumSum", (S((4, 5)), S((), "int64")), (S((4, 5)),), const_inputs=(1,),
             static_inputs=((1, np.array(1)),), epilogue=(E("relu"),)),
    Workload("FastGelu", (S((2, 8)),), (S((2, 8)),), domain="com.microsoft"),
], ids=["Hardmax", "TopK", "CumSum+relu", "contrib-FastGelu"])
def test_fallback_runs_unsupported_ops_and_says_so(workload, rng):
    assert workload.op not in SUPPORTED_OPS and not is_supported(workload)
    candidates = registry.candidates(workload)
    assert [c.label for c in candidates] == ["ort.fallback"]
    assert candidates[0].implementation.kind == registry.FALLBACK
    assert ort_node.kind_for(workload) == registry.FALLBACK
    inputs = random_inputs(workload, rng)
    expected = reference(workload, inputs)
    _, outputs = run_poisoned(candidates[0], workload, inputs)
    for out, ref in zip(outputs, expected):
        if out.dtype.kind == "f":
            assert rel_l2(out, ref) < 1e-5
        else:
            np.testing.assert_array_equal(out, ref)


def test_ort_binding_handles_non_contiguous_inputs(rng):
    workload = Workload("Relu", (S((64, 64)),), (S((64, 64)),))
    kernel = registry.get("ort").prepare(workload, {}, {})
    x = rng.standard_normal((64, 64)).astype(np.float32).T
    out = np.full((64, 64), np.nan, np.float32)
    kernel([x], [out])
    np.testing.assert_array_equal(out, np.maximum(x, 0))


def test_big_constants_reach_onnxruntime_as_external_initializers(rng):
    """A weight of EXTERNAL_MIN_BYTES or more is left out of the node model (an initializer
    naming its shape, no data) and handed to the session as is; a smaller one is baked
    in. Both give onnxruntime's answer for the node, also once the caller let go of its
    arrays (the kernel keeps them alive)."""
    from wpk.kernels.cpu.node_model import build_node_model, input_name

    rows = ort_node.EXTERNAL_MIN_BYTES // (4 * 64) + 1
    for count, external in ((rows, True), (rows // 8, False)):
        workload = Workload("Gemm", (S((3, 64)), S((count, 64)), S((count,))), (S((3, count)),),
                            (("transB", 1),))
        weight = rng.standard_normal((count, 64)).astype(np.float32)
        bias = rng.standard_normal(count).astype(np.float32)
        node = build_node_model(workload, {1: weight, 2: bias},
                                external_min_bytes=ort_node.EXTERNAL_MIN_BYTES)
        assert (input_name(1) in node.external) == external
        assert input_name(2) not in node.external
        assert (node.model.ByteSize() < weight.nbytes) == external
        kernel = registry.get("ort").prepare(workload, {1: weight, 2: bias}, {})
        x = rng.standard_normal((3, 64)).astype(np.float32)
        expected = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
        del weight, bias
        out = np.full((3, count), np.nan, np.float32)
        kernel([x, None, None], [out])
        assert rel_l2(out, expected) < 1e-5


def test_conv_strategies_are_configs(rng):
    workload = CASES["conv_depthwise_stride2_asym"]
    configs = registry.get("numpy.conv").configs(workload)
    assert {"strategy": "depthwise"} in configs and {"strategy": "im2col"} in configs


def test_thread_count_is_configurable():
    assert ort_node.cpu_threads() >= 1
    ort_node.set_cpu_threads(1)
    try:
        assert ort_node.cpu_threads() == 1
        assert ort_node.session_options().intra_op_num_threads == 1
    finally:
        ort_node.set_cpu_threads(None)
    with pytest.raises(WpkError):
        ort_node.set_cpu_threads(0)


def test_unknown_op_is_refused_with_a_reason():
    workload = Workload("NoSuchOp", (S((2,)),), (S((2,)),))
    assert registry.candidates(workload) == []
    reason = registry.get("ort.fallback").unsupported_reason(workload)
    assert "NoSuchOp" in reason


def test_fallback_runs_ops_with_subgraphs():
    from onnx import TensorProto, helper

    def branch(values):
        node = helper.make_node("Constant", [], ["r"], value=helper.make_tensor(
            "t", TensorProto.FLOAT, [2], values))
        return helper.make_graph([node], "branch", [], [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])]).SerializeToString()

    workload = Workload("If", (S((), "bool"),), (S((2,)),),
                        attrs=(("else_branch", branch([3, 4])), ("then_branch", branch([1, 2]))))
    (candidate,) = registry.candidates(workload)
    assert candidate.implementation.kind == registry.FALLBACK
    kernel = candidate.implementation.prepare(workload, {}, {})
    for cond, expected in ((True, [1, 2]), (False, [3, 4])):
        out = np.full(2, np.nan, np.float32)
        kernel([np.array(cond)], [out])
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(reference(workload, [np.array(cond)])[0], expected)


def test_support_by_op_name_and_by_dtype():
    assert is_supported("Conv") and is_supported("Elementwise", "wpk")
    assert not is_supported("TopK") and not is_supported("Conv", "com.microsoft")
    integer_add = Workload("Add", (S((3,), "int64"), S((3,), "int64")), (S((3,), "int64"),))
    assert not is_supported(integer_add)
    assert [c.label for c in registry.candidates(integer_add)] == ["ort.fallback"]


def _conformance_workload(model, inputs, outputs):
    """A workload for a single-node ONNX conformance case (integer inputs become static)."""
    from onnx import GraphProto, TensorProto, helper, numpy_helper

    def value(attribute):
        v = helper.get_attribute_value(attribute)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        if isinstance(v, TensorProto):
            return numpy_helper.to_array(v)
        return v.SerializeToString() if isinstance(v, GraphProto) else v

    node = model.graph.node[0]
    feeds = dict(zip([i.name for i in model.graph.input], inputs))
    arrays = [np.asarray(feeds[name]) if name else None for name in node.input]
    small_float_static = node.op_type in ("Clip", "Pad", "Resize", "Dropout", "Slice")
    statics = tuple((i, a) for i, a in enumerate(arrays) if a is not None and i > 0 and (
        a.dtype.kind in "iub" or (small_float_static and a.size <= 64)))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    workload = Workload(node.op_type, tuple(None if a is None else S(a.shape, a.dtype.name)
                                            for a in arrays),
                        tuple(S(np.shape(o), np.asarray(o).dtype.name) for o in outputs),
                        attrs=tuple(sorted((a.name, value(a)) for a in node.attribute)),
                        opset=opset, const_inputs=tuple(i for i, _ in statics),
                        static_inputs=statics)
    return workload, arrays


# Cases where onnxruntime's kernel departs from ONNX's expected values: align_corners with
# a scaled length that is not whole (onnxruntime divides by the output length, the spec
# by length * scale). wpk's own kernels follow the spec; the planner rejects onnxruntime's.
ORT_DEPARTS = {"test_resize_downsample_scales_linear_align_corners",
               "test_resize_downsample_scales_cubic_align_corners"}


def test_onnx_conformance_cases_of_supported_ops():
    """ONNX's node test cases (expected values rounded, hence the runner's rtol 1e-3)."""
    from onnx.backend.test.case.node import collect_testcases

    checked, failures = 0, []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    for case in cases:
        graph = case.model.graph
        if len(graph.node) != 1 or graph.node[0].op_type not in SUPPORTED_OPS:
            continue
        for inputs, outputs in case.data_sets or []:
            workload, arrays = _conformance_workload(case.model, inputs, outputs)
            if not is_supported(workload):
                continue
            expected = np.asarray(outputs[0])
            actual = reference(workload, arrays)[0]
            results = {"reference": actual}
            for candidate in registry.candidates(workload):
                results[candidate.label] = run_poisoned(candidate, workload, arrays)[1][0]
            for label, result in results.items():
                matches = result.shape == expected.shape and np.allclose(
                    result, expected, rtol=1e-3, atol=1e-6, equal_nan=True)
                if matches == (label == "ort" and case.name in ORT_DEPARTS):
                    failures.append(f"{case.name} {label}")
            checked += 1
    assert not failures, failures
    assert checked >= 200  # the sweep really ran (about 230 data sets today)


def test_ort_kernel_reuses_bindings_of_unchanged_buffers(rng):
    workload = Workload("Relu", (S((64, 128)),), (S((64, 128)),))  # big enough to bind
    kernel = registry.get("ort").prepare(workload, {}, {})
    x = rng.standard_normal((64, 128)).astype(np.float32)
    out, other = np.empty_like(x), np.empty_like(x)
    kernel([x], [out])
    x *= -1  # same buffer, new contents
    kernel([x], [out])
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    kernel([x.copy()], [other])  # new addresses: rebound
    np.testing.assert_array_equal(other, np.maximum(x, 0))


def test_layernorm_statistics_outputs(rng):
    workload = Workload("LayerNormalization", (S((3, 4, 8)), S((8,)), S((8,))),
                        (S((3, 4, 8)), S((3, 4, 1)), S((3, 4, 1))), const_inputs=(1, 2))
    inputs = random_inputs(workload, rng)
    expected = reference(workload, inputs)
    candidates = registry.candidates(workload)
    assert {c.label for c in candidates} == {"ort", "numpy.layernorm"}
    for candidate in candidates:
        _, outputs = run_poisoned(candidate, workload, inputs)
        for out, ref in zip(outputs, expected):
            assert rel_l2(out, ref) < 1e-5, candidate.label


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
def test_blocked_layout_ops_are_supported_as_their_logical_op():
    def blocked(c, size):
        return S((1, -(-c // 8), size, size, 8))

    conv = Workload("Conv", (blocked(16, 6), S((16, 16, 3, 3)), S((16,))), (blocked(16, 6),),
                    attrs=(("block", 8), ("channels", 16), ("dilations", (1, 1)), ("group", 1),
                           ("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)),
                           ("strides", (1, 1))),
                    domain="wpk.nchwc", const_inputs=(1, 2))
    assert is_supported(conv) and is_supported("ReorderInput", "wpk.nchwc")
    reorder = Workload("ReorderOutput", (blocked(12, 4),), (S((1, 12, 4, 4)),),
                       attrs=(("block", 8), ("channels", 12)), domain="wpk.nchwc")
    assert is_supported(reorder)
    assert not is_supported("Softmax", "wpk.nchwc")
    # wpk's own ops are never onnxruntime fallbacks, and NCHW kernels do not take them.
    labels = {c.label for c in registry.candidates(conv)}
    assert "ort.fallback" not in labels and not any(
        label.startswith(("numpy.conv", "ort[", "numpy.formula")) or label == "ort"
        for label in labels)
