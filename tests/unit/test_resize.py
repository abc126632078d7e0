"""Resize in every mode of the spec (wpk.kernels.cpu.resize): the float64 reference and every
kernel the registry offers, against onnxruntime and against values worked out by hand."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.resize import resize, resize_spec
from wpk.kernels.reference import reference
from wpk.kernels.support import unsupported_reason

X_SHAPE = (1, 3, 5, 6)
ROI = (0.0, 0.0, 0.1, 0.3, 1.0, 1.0, 0.9, 1.2)


def resize_model(attrs: dict, roi=None, scales=None, sizes=None):
    """One Resize node (opset 19), its roi/scales/sizes as initializers."""
    names, inits = ["x", "", "", ""], []
    for index, (name, value, dtype) in enumerate((("roi", roi, np.float32),
                                                  ("scales", scales, np.float32),
                                                  ("sizes", sizes, np.int64)), 1):
        if value is not None:
            inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
            names[index] = name
    while names[-1] == "":
        names.pop()
    graph = helper.make_graph(
        [helper.make_node("Resize", names, ["y"], **attrs)], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def resize_workload(attrs: dict, out_shape, roi=None, scales=None, sizes=None) -> Workload:
    statics = [(i, np.asarray(v, np.int64 if i == 3 else np.float32))
               for i, v in ((1, roi), (2, scales), (3, sizes)) if v is not None]
    inputs = [TensorSpec(X_SHAPE)] + [None] * 3
    for i, value in statics:
        inputs[i] = TensorSpec(value.shape, str(value.dtype))
    while inputs[-1] is None:
        inputs.pop()
    encoded = tuple(sorted((k, tuple(v) if isinstance(v, list) else
                            v.encode() if isinstance(v, str) else v) for k, v in attrs.items()))
    return Workload("Resize", tuple(inputs), (TensorSpec(tuple(out_shape)),), encoded,
                    const_inputs=tuple(i for i, _ in statics), static_inputs=tuple(statics),
                    opset=19)


# (mode, coordinate transformation, extra attributes, scales or sizes): cases onnxruntime
# runs (it takes linear and cubic over the two innermost axes only, and exclude_outside
# with cubic, or linear with antialias).
CASES = [
    ("linear", "half_pixel", {}, {"scales": [1, 1, 2.0, 0.6]}),
    ("linear", "half_pixel", {}, {"sizes": [1, 3, 9, 4]}),
    ("linear", "half_pixel_symmetric", {}, {"scales": [1, 1, 0.5, 1.7]}),
    ("linear", "pytorch_half_pixel", {}, {"sizes": [1, 3, 1, 7]}),
    ("linear", "align_corners", {}, {"scales": [1, 1, 2.0, 3.0]}),
    ("linear", "asymmetric", {}, {"scales": [1, 1, 0.5, 1.7]}),
    ("linear", "tf_crop_and_resize", {"extrapolation_value": 7.5}, {"sizes": [1, 3, 9, 4]}),
    ("linear", "half_pixel", {"antialias": 1}, {"scales": [1, 1, 0.5, 0.4]}),
    ("linear", "half_pixel", {"antialias": 1, "exclude_outside": 1}, {"sizes": [1, 3, 2, 3]}),
    ("linear", "half_pixel", {"axes": [2, 3]}, {"scales": [2.0, 0.6]}),
    ("linear", "half_pixel", {"axes": [3, 2]}, {"sizes": [4, 9]}),
    ("cubic", "half_pixel", {}, {"scales": [1, 1, 2.0, 0.6]}),
    ("cubic", "half_pixel", {"exclude_outside": 1, "cubic_coeff_a": -0.5},
     {"scales": [1, 1, 0.5, 1.7]}),
    ("cubic", "pytorch_half_pixel", {}, {"sizes": [1, 3, 9, 4]}),
    ("cubic", "asymmetric", {}, {"scales": [1, 1, 2.0, 2.0]}),
    ("cubic", "half_pixel_symmetric", {}, {"sizes": [1, 3, 1, 7]}),
    ("cubic", "tf_crop_and_resize", {"extrapolation_value": -3.0}, {"scales": [1, 1, 2.0, 0.6]}),
    ("cubic", "half_pixel", {"antialias": 1}, {"scales": [1, 1, 0.4, 0.5]}),
    ("nearest", "half_pixel", {"nearest_mode": "floor"}, {"scales": [1, 1, 2.0, 0.6]}),
    ("nearest", "asymmetric", {"nearest_mode": "ceil"}, {"sizes": [1, 3, 9, 4]}),
    ("nearest", "tf_half_pixel_for_nn", {}, {"scales": [1, 1, 0.5, 1.7]}),
    ("nearest", "tf_crop_and_resize", {"extrapolation_value": 7.5}, {"scales": [1, 1, 2.0, 0.6]}),
    ("nearest", "half_pixel", {"keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]},
     {"sizes": [7, 7]}),
    ("nearest", "asymmetric", {"keep_aspect_ratio_policy": "not_smaller", "axes": [2, 3]},
     {"sizes": [7, 7]}),
    ("nearest", "align_corners", {"axes": [2, 3]}, {"sizes": [7, 7]}),
]


def _case(case):
    mode, transform, extra, given = case
    attrs = {"mode": mode, "coordinate_transformation_mode": transform, **extra}
    roi = None
    if transform == "tf_crop_and_resize":
        roi = ROI[2:4] + ROI[6:] if "axes" in extra else ROI
    return attrs, roi, given.get("scales"), given.get("sizes")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{sorted(c[2])}")
def test_reference_and_every_kernel_match_onnxruntime(case, rng):
    attrs, roi, scales, sizes = _case(case)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    model = resize_model(attrs, roi, scales, sizes)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    workload = resize_workload(attrs, expected.shape, roi, scales, sizes)
    assert unsupported_reason(workload) is None
    statics = [None if v is None else np.asarray(v) for v in (roi, scales, sizes)]
    inputs = [x, *statics][:len(workload.inputs)]
    (ref,) = reference(workload, inputs)
    assert relative_l2(ref, expected) < 1e-6
    candidates = registry.candidates(workload)
    wpk_own = [c for c in candidates if c.implementation.name.startswith("numpy.")]
    assert len(wpk_own) == 1   # an index copy or the formula, never both
    index_copy = case[0] == "nearest" and case[1] != "tf_crop_and_resize"
    assert wpk_own[0].implementation.name == ("numpy.copy" if index_copy else "numpy.formula")
    names = {c.implementation.name for c in candidates}
    assert ("resize.c" in names) == (case[0] != "nearest")   # the C kernel interpolates
    for candidate in candidates:
        kernel = candidate.implementation.prepare(
            workload, {i: v for i, v in zip((1, 2, 3), statics) if v is not None},
            candidate.config)
        out = np.full(expected.shape, np.nan, np.float32)
        kernel(inputs, [out])
        assert relative_l2(out, expected) < 1e-5, candidate.label


def _spec(attrs, in_shape, out_shape, scales):
    workload = Workload("Resize", (TensorSpec(in_shape), None, TensorSpec((len(scales),))),
                        (TensorSpec(out_shape),), tuple(sorted(attrs.items())), opset=19)
    return resize_spec(workload, [None, None, np.asarray(scales, np.float32)])


def test_linear_and_cubic_by_hand():
    x = np.array([[0.0, 10.0, 20.0, 40.0]])
    # half_pixel 2x: output j samples (j + 0.5) / 2 - 0.5; the first clamps to the edge
    linear = _spec({"mode": b"linear"}, (1, 4), (1, 8), [1, 2])
    np.testing.assert_allclose(resize(linear, x),
                               [[0, 2.5, 7.5, 12.5, 17.5, 25, 35, 40]])
    # cubic (a = -0.75) at x = 1.25: taps 0..3 at distances 1.25, 0.25, 0.75, 1.75
    a = -0.75
    near = [((a + 2) * t - (a + 3)) * t * t + 1 for t in (0.25, 0.75)]
    far = [((a * t - 5 * a) * t + 8 * a) * t - 4 * a for t in (1.25, 1.75)]
    weights = [far[0], near[0], near[1], far[1]]
    cubic = _spec({"mode": b"cubic", "coordinate_transformation_mode": b"asymmetric"},
                  (1, 4), (1, 16), [1, 4])   # output 5 samples x = 5 / 4
    assert sum(weights) == pytest.approx(1.0)
    assert resize(cubic, x)[0, 5] == pytest.approx(float(np.dot(weights, x[0])))


def test_antialias_widens_the_linear_kernel_when_shrinking():
    # half by half_pixel: x = 0.5 and 2.5, taps at distance 1.5, 0.5, 0.5, 1.5, weights
    # 1 - d / 2 = 0.25, 0.75, 0.75, 0.25 normalised; the tap left of 0 repeats the edge
    x = np.array([[1.0, 2.0, 4.0, 8.0]])
    spec = _spec({"mode": b"linear", "antialias": 1}, (1, 4), (1, 2), [1, 0.5])
    expected = [(0.25 * 1 + 0.75 * 1 + 0.75 * 2 + 0.25 * 4) / 2,
                (0.25 * 2 + 0.75 * 4 + 0.75 * 8 + 0.25 * 8) / 2]
    np.testing.assert_allclose(resize(spec, x)[0], expected)
    plain = _spec({"mode": b"linear"}, (1, 4), (1, 2), [1, 0.5])
    np.testing.assert_allclose(resize(plain, x)[0], [1.5, 6.0])


def test_align_corners_divides_by_the_scaled_length():
    # ONNX's test_resize_downsample_scales_linear_align_corners: 4 -> 2 at scale 0.6, so
    # output 1 samples 1 * 3 / (4 * 0.6 - 1) = 2.142857 (onnxruntime samples 3)
    x = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    spec = _spec({"mode": b"linear", "coordinate_transformation_mode": b"align_corners"},
                 (2, 4), (1, 2), [0.6, 0.6])
    np.testing.assert_allclose(resize(spec, x), [[1.0, 3.142857]], rtol=1e-6)


@pytest.mark.parametrize(("attrs", "opset", "words"), [
    ({"mode": b"linear"}, 10, "before opset 11"),
    ({"mode": b"bilinear"}, 13, "mode 'bilinear'"),
    ({"coordinate_transformation_mode": b"half_pixel_center"}, 13, "half_pixel_center"),
    ({"keep_aspect_ratio_policy": b"fit"}, 18, "'fit'"),
])
def test_what_is_not_in_the_spec_is_refused_with_a_reason(attrs, opset, words):
    workload = Workload("Resize", (TensorSpec((1, 1, 2, 2)), None, TensorSpec((4,))),
                        (TensorSpec((1, 1, 4, 4)),), tuple(attrs.items()), const_inputs=(2,),
                        static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=opset)
    reason = unsupported_reason(workload)
    assert reason is not None and words in reason
