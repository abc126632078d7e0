"""Resize, Split and Slice inside the NCHWc layout (wpk/passes/nchwc_data.py, the
`wpk.nchwc` Upsample and ChannelSlice ops)."""

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
from wpk.passes.nchwc_data import channel_slices, spatial_crop, upsample_form
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()


def _weight(rng, name, out, inp, k=1):
    return numpy_helper.from_array((rng.standard_normal((out, inp, k, k)) * 0.3)
                                   .astype(np.float32), name)


def _resize_model(rng, channels=2 * B, size=5, scales=(2, 2), **attrs):
    """conv -> Resize(attrs) -> conv, so the Resize sits between two blocked convs."""
    inits = [_weight(rng, "w1", channels, 3, 3), _weight(rng, "w2", 8, channels),
             numpy_helper.from_array(np.array([1, 1, *scales], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["a", "", "scales"], ["r"], **attrs),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    out = [1, 8, size * scales[0], size * scales[1]]
    return model_x_to_y("resize", nodes, inits, [1, 3, size, size], out)


def _split_model(rng, sizes, use_slice=False, channels=None):
    """conv -> channel Split (or Slices) -> one conv per piece -> Concat."""
    channels = channels or sum(sizes)
    inits = [_weight(rng, "w0", channels, 3, 3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1])]
    pieces, start = [], 0
    for index, size in enumerate(sizes):
        piece = f"p{index}"
        if use_slice:
            for tag, value in (("s", start), ("e", start + size), ("ax", 1)):
                inits.append(numpy_helper.from_array(np.array([value], np.int64),
                                                     f"{tag}{index}"))
            nodes.append(helper.make_node("Slice", ["a", f"s{index}", f"e{index}",
                                                    f"ax{index}"], [piece]))
        start += size
        pieces.append(piece)
    if not use_slice:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "split"))
        nodes.append(helper.make_node("Split", ["a", "split"], pieces, axis=1))
    outs = []
    for index, (piece, size) in enumerate(zip(pieces, sizes)):
        inits.append(_weight(rng, f"w{index + 1}", B, size))
        nodes.append(helper.make_node("Conv", [piece, f"w{index + 1}"], [f"c{index}"]))
        outs.append(f"c{index}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    return model_x_to_y("split", nodes, inits, [1, 3, 6, 6], [1, B * len(sizes), 6, 6])


def _ops(graph):
    return collections.Counter((n.domain + ":" if n.domain else "") + n.op for n in graph.nodes)


def _check(model, rng, impl="ort.nchwc", block=None):
    graph = load_model(model)
    feeds = {"x": rng.standard_normal(graph.tensors["x"].shape)
             .astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    optimized = NchwcLayout(NchwcOptions(block=block)).run(graph.copy())
    check_graph(optimized)
    actual = evaluate(optimized, feeds, impl)
    assert relative_l2(actual["y"], expected["y"]) <= 1e-5
    return _ops(optimized)


RESIZES = {
    "torch_nearest": dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                          nearest_mode="floor"),
    "nearest_half_pixel_round": dict(mode="nearest"),  # the spec's defaults: replication too
    "nearest_half_pixel_ceil_x3": dict(mode="nearest", nearest_mode="round_prefer_ceil",
                                       scales=(3, 3)),
    "bilinear": dict(mode="linear"),
    "bilinear_pytorch": dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    "bilinear_align_corners": dict(mode="linear",
                                   coordinate_transformation_mode="align_corners",
                                   scales=(2, 3)),
    "bilinear_asymmetric": dict(mode="linear", coordinate_transformation_mode="asymmetric"),
}


@pytest.mark.parametrize("case", sorted(RESIZES))
def test_resizes_stay_blocked_and_keep_the_function(case, rng):
    attrs = dict(RESIZES[case])
    scales = attrs.pop("scales", (2, 2))
    ops = _check(_resize_model(rng, scales=scales, **attrs), rng)
    assert ops["wpk.nchwc:Upsample"] == 1 and "Resize" not in ops
    assert "wpk.nchwc:ReorderInput" not in ops and ops["wpk.nchwc:ReorderOutput"] == 1


@pytest.mark.parametrize("attrs", [
    dict(mode="nearest", coordinate_transformation_mode="asymmetric",
         nearest_mode="round_prefer_ceil"),                 # picks the next pixel: not a copy
    dict(mode="cubic"),
    dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"),
    dict(mode="linear", antialias=1),
])
def test_resizes_the_blocked_upsample_cannot_compute_are_left_alone(attrs, rng):
    model = _resize_model(rng, **attrs)
    if "antialias" in attrs:
        model.opset_import[0].version = 18
    graph = load_model(model)
    (resize,) = [n for n in graph.nodes if n.op == "Resize"]
    assert upsample_form(graph, resize) is None


def test_fractional_scales_are_left_alone(rng):
    model = _resize_model(rng, mode="linear")
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(
        np.array([1, 1, 2.2, 2.2], np.float32), "scales"))   # 5 * 2.2 -> 11, not 10
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 11
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 11
    graph = load_model(model)
    (resize,) = [n for n in graph.nodes if n.op == "Resize"]
    assert upsample_form(graph, resize) is None


@pytest.mark.parametrize(("sizes", "use_slice"), [
    ((B, B), False), ((2 * B, B), True), ((B, B, B), True), ((B, B // 2), False)])
def test_block_aligned_channel_splits_stay_blocked(sizes, use_slice, rng):
    ops = _check(_split_model(rng, sizes, use_slice), rng)
    assert ops["wpk.nchwc:ChannelSlice"] == len(sizes)
    assert "Split" not in ops and "Slice" not in ops
    assert "wpk.nchwc:ReorderInput" not in ops


def test_splits_off_the_block_boundaries_are_left_alone(rng):
    graph = load_model(_split_model(rng, (B // 2, B + B // 2)))
    (split,) = [n for n in graph.nodes if n.op == "Split"]
    assert channel_slices(graph, split, B) is None
    assert channel_slices(graph, split, B // 2) == [(0, B // 2), (B // 2, B + B // 2)]


def _crop_model(rng, channels, starts, ends, axes):
    """conv -> conv -> Pad (0, 1) on H and W -> Slice(starts, ends, axes) -> 1x1 average
    pool of stride 2 -> conv: the shifted path of Keras' NASNet reductions (ZeroPadding2D,
    Cropping2D) through tf2onnx (two convs before it, so that the layout pass finds enough
    convs to run at either ISA's block)."""
    inits = [_weight(rng, "w0", 16, 3, 3), _weight(rng, "w1", channels, 16),
             _weight(rng, "w2", 8, channels),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")]
    for name, value in (("starts", starts), ("ends", ends), ("axes", axes)):
        inits.append(numpy_helper.from_array(np.array(value, np.int64), name))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x0", "w1"], ["a"]),
             helper.make_node("Pad", ["a", "pads"], ["p"]),
             helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"]),
             helper.make_node("AveragePool", ["s"], ["q"], kernel_shape=[1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["q", "w2"], ["y"])]
    return model_x_to_y("crop", nodes, inits, [1, 3, 9, 9], [1, 8, 5, 5])


BIG = 2 ** 31 - 1
CROPS = {
    "tf2onnx_all_axes": ((0, 1, 1, 0), (BIG, BIG, BIG, BIG), (0, 2, 3, 1)),
    "h_w_only": ((1, 1), (10, 10), (2, 3)),
    "negative_axes_and_starts": ((-9, -9), (BIG, BIG), (-2, -1)),
}


@pytest.mark.parametrize("crop", sorted(CROPS))
@pytest.mark.parametrize("channels", [11, 2 * B])
def test_spatial_crops_stay_blocked(crop, channels, rng):
    """A Slice that crops H and W of a blocked tensor is the same Slice of the 5-d one
    (no reorder around it), whatever its channel count, and computes what it did."""
    ops = _check(_crop_model(rng, channels, *CROPS[crop]), rng, "native.nchwc")
    assert ops["Slice"] == 1 and ops["Pad"] == 1 and ops["wpk.nchwc:AveragePool"] == 1
    assert ops["wpk.nchwc:ReorderOutput"] == 1 and "wpk.nchwc:ReorderInput" not in ops


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), [
    ((0,), (4,), (1,), (1,)),          # channels: a ChannelSlice's, or left alone
    ((0, 1), (1, 10), (0, 2), (1, 1)),  # a batch crop to 1 of 1 is whole, H cropped: kept
    ((1,), (10,), (2,), (2,)),         # a step
    ((5,), (5,), (3,), (1,)),          # nothing left
])
def test_spatial_crop_reads_only_whole_batches_and_channels_at_step_one(starts, ends, axes,
                                                                         steps, rng):
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
             (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    model = model_x_to_y("s", [node], inits, [1, 2 * B, 10, 10], [None] * 4)
    graph = load_model(model)
    found = spatial_crop(graph, graph.nodes[0])
    if axes == (0, 2):
        assert found == ((1, 0), (10, 10))
    else:
        assert found is None


def test_the_library_kernels_and_another_block_size_agree(rng):
    """numpy.nchwc (unblock, logical op, block) computes both ops with the other ISA's block."""
    other = 8 if B != 8 else 16
    ops = _check(_split_model(rng, (2 * other, other), channels=3 * other), rng,
                 "numpy.nchwc", block=other)
    assert ops["wpk.nchwc:ChannelSlice"] == 2
    ops = _check(_resize_model(rng, channels=2 * other, mode="nearest",
                               coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor"), rng, "numpy.nchwc", block=other)
    assert ops["wpk.nchwc:Upsample"] == 1


def _blocked(channels, h, w):
    return TensorSpec(fmt.blocked_shape((1, channels, h, w), B), "float32")


@pytest.mark.parametrize(("impl", "mode", "transform"), [
    ("ort.nchwc", "linear", "half_pixel"), ("ort.nchwc", "linear", "align_corners"),
    ("ort.nchwc", "nearest", "asymmetric"), ("numpy.nchwc", "nearest", "asymmetric")])
def test_blocked_upsample_matches_the_reference_padding_lanes_included(impl, mode, transform,
                                                                       rng):
    attrs = (("block", B), ("channels", B + 3), ("coordinate_transformation_mode", transform),
             ("mode", mode), ("scales", (2, 3)))
    workload = Workload("Upsample", (_blocked(B + 3, 4, 5),), (_blocked(B + 3, 8, 15),),
                        attrs, domain="wpk.nchwc")
    implementation = registry.get(impl)
    assert implementation.unsupported_reason(workload) is None
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)  # dirty lanes too
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    implementation.prepare(workload, {}, {})([x], [y])
    assert relative_l2(y, nchwc_reference(workload, [x])[0]) <= 1e-6


@pytest.mark.parametrize("impl", ["ort.nchwc", "numpy.nchwc"])
def test_blocked_channel_slice_matches_the_reference(impl, rng):
    workload = Workload("ChannelSlice", (_blocked(3 * B + 5, 3, 4),), (_blocked(B + 5, 3, 4),),
                        (("block", B), ("channels", B + 5), ("start", 2 * B)),
                        domain="wpk.nchwc")
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    registry.get(impl).prepare(workload, {}, {})([x], [y])
    np.testing.assert_array_equal(y, x[:, 2:])


def test_onnxruntimes_upsample_refuses_what_it_cannot_compute():
    workload = Workload("Upsample", (_blocked(B, 4, 4),), (_blocked(B, 8, 8),),
                        (("block", B), ("channels", B), ("coordinate_transformation_mode",
                                                         "half_pixel"),
                         ("mode", "nearest"), ("scales", (2, 2))), domain="wpk.nchwc")
    assert "nearest" in registry.get("ort.nchwc").unsupported_reason(workload)
