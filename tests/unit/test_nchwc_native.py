"""The blocked data movement and MaxPool in C (kernels/cpu/nchwc_native.py): each op
against the float64 reference on odd shapes, with dirty padding lanes, for both block
sizes; its native form against its Python call; what it refuses; the planner's use."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel
from wpk.kernels.nchwc_reference import nchwc_reference

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

NATIVE = registry.get("native.nchwc")
BLOCKS = (8, 16)   # both ISAs' blocks: the C is portable, whatever this host has


def _blocked(b: int, channels: int, h: int, w: int) -> TensorSpec:
    return TensorSpec(fmt.blocked_shape((1, channels, h, w), b), "float32")


def _op(op: str, b: int, channels: int, x: tuple[int, int], y, **attrs) -> Workload:
    out = y if isinstance(y, TensorSpec) else _blocked(b, attrs.pop("out_channels", channels),
                                                       *y)
    return Workload(op, (_blocked(b, channels, *x),), (out,),
                    tuple(sorted({"block": b, "channels": channels, **attrs}.items())),
                    domain="wpk.nchwc")


def _cases(b: int) -> dict[str, Workload]:
    c = 2 * b + 3   # a partial last block
    return {
        "maxpool sppf 5x5": _op("MaxPool", b, c, (9, 11), (9, 11), kernel_shape=(5, 5),
                                pads=(2, 2, 2, 2), strides=(1, 1)),
        "maxpool s2 ceil": _op("MaxPool", b, b, (10, 10), (5, 5), kernel_shape=(3, 3),
                               pads=(0, 0, 0, 0), strides=(2, 2), ceil_mode=1),
        "maxpool asymmetric pads, dilation": _op(
            "MaxPool", b, c, (11, 12), (4, 7), kernel_shape=(3, 3), pads=(1, 2, 0, 1),
            strides=(2, 2), dilations=(2, 1)),
        # more floats than PAR_MIN: the rows over OpenMP threads (ResNet's stem pool)
        "maxpool 3x3 s2, threads": _op("MaxPool", b, c, (37, 29), (19, 15), kernel_shape=(3, 3),
                                       pads=(1, 1, 1, 1), strides=(2, 2)),
        "maxpool 1 pixel": _op("MaxPool", b, 3, (1, 1), (1, 1), kernel_shape=(3, 3),
                               pads=(1, 1, 1, 1), strides=(1, 1)),
        "average pool 7x7 (ResNet's)": _op("AveragePool", b, c, (7, 7), (1, 1),
                                           kernel_shape=(7, 7), pads=(0, 0, 0, 0),
                                           strides=(1, 1)),
        "average pool asymmetric pads, ceil": _op(
            "AveragePool", b, c, (10, 11), (5, 6), kernel_shape=(3, 3), pads=(1, 0, 0, 1),
            strides=(2, 2), ceil_mode=1),
        "average pool counting pads, ceil": _op(
            "AveragePool", b, c, (10, 11), (5, 6), kernel_shape=(3, 3), pads=(1, 0, 0, 1),
            strides=(2, 2), ceil_mode=1, count_include_pad=1),
        "average pool 2x2 stride 2 (SVTR's), threads": _op(
            "AveragePool", b, c, (48, 96), (24, 48), kernel_shape=(2, 2), pads=(0, 0, 0, 0),
            strides=(2, 2)),
        "global average pool": _op("GlobalAveragePool", b, c, (7, 9), (1, 1)),
        "global max pool, 1 pixel": _op("GlobalMaxPool", b, c, (1, 1), (1, 1)),
        "global average pool, threads": _op("GlobalAveragePool", b, c, (61, 37), (1, 1)),
        "global max pool, threads": _op("GlobalMaxPool", b, 2 * b, (61, 37), (1, 1)),
        "upsample 2x3": _op("Upsample", b, c, (4, 5), (8, 15), mode="nearest",
                            coordinate_transformation_mode="asymmetric", scales=(2, 3)),
        "upsample 1x2, 1 pixel": _op("Upsample", b, 5, (1, 1), (1, 2), mode="nearest",
                                     coordinate_transformation_mode="asymmetric",
                                     scales=(1, 2)),
        "channel slice": _op("ChannelSlice", b, 3 * b + 5, (3, 4), (3, 4), start=2 * b,
                             out_channels=b + 5),
        "reorder to NCHW": _op("ReorderOutput", b, c, (6, 7),
                               TensorSpec((1, c, 6, 7), "float32")),
        "reorder whole blocks": _op("ReorderOutput", b, 2 * b, (5, 3),
                                    TensorSpec((1, 2 * b, 5, 3), "float32")),
        "reorder to NHWC": _op("ReorderOutput", b, c, (6, 7),
                               TensorSpec((1, 6, 7, c), "float32"), channels_last=1),
        "reorder 1 pixel": _op("ReorderOutput", b, 3, (1, 1),
                               TensorSpec((1, 3, 1, 1), "float32")),
        "reorder from NCHW": _reorder_input(b, (2, c, 6, 7)),
        "reorder from NHWC": _reorder_input(b, (1, 6, 7, c), channels_last=1),
        "reorder from whole blocks, 1 pixel": _reorder_input(b, (1, 2 * b, 1, 1)),
        # more pixels than a parallel unit's run (RUN), not a multiple of it nor of b, and
        # more floats than PAR_MIN: the OpenMP path, the transposed tiles and their tails
        "reorder to NCHW, threads": _op("ReorderOutput", b, c, (61, 37),
                                        TensorSpec((1, c, 61, 37), "float32")),
        "reorder to NHWC, threads": _op("ReorderOutput", b, c, (61, 37),
                                        TensorSpec((1, 61, 37, c), "float32"),
                                        channels_last=1),
        "reorder from NCHW, threads": _reorder_input(b, (2, c, 61, 37)),
        "reorder from NHWC, threads": _reorder_input(b, (2, 61, 37, c), channels_last=1),
        "reorder from NHWC whole blocks, threads": _reorder_input(b, (1, 61, 37, 2 * b),
                                                                  channels_last=1),
    }


def _reorder_input(b: int, shape: tuple[int, ...], channels_last: int = 0) -> Workload:
    n, c, h, w = (shape[0], shape[3], *shape[1:3]) if channels_last else shape
    return Workload("ReorderInput", (TensorSpec(shape, "float32"),),
                    (TensorSpec(fmt.blocked_shape((n, c, h, w), b), "float32"),),
                    (("block", b), ("channels_last", channels_last)), domain="wpk.nchwc")


CASES = [pytest.param(b, name, id=f"b{b}-{name}") for b in BLOCKS for name in _cases(b)]


def _run(kernel, workload: Workload, x: np.ndarray) -> np.ndarray:
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)   # every lane must be written
    kernel([x], [y])
    return y


@pytest.mark.parametrize(("b", "name"), CASES)
def test_matches_the_reference_padding_lanes_included(b, name, rng):
    workload = _cases(b)[name]
    assert NATIVE.unsupported_reason(workload) is None
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)  # dirty lanes too
    expected = nchwc_reference(workload, [x])[0]
    kernel = NATIVE.prepare(workload, {}, {})
    same = _agrees if workload.op in ("GlobalAveragePool", "AveragePool") \
        else np.testing.assert_array_equal
    same(_run(kernel, workload, x), expected.astype(np.float32))
    x2 = rng.standard_normal(x.shape).astype(np.float32)   # new buffers: rebound, not stale
    same(_run(kernel, workload, x2), nchwc_reference(workload, [x2])[0].astype(np.float32))


def _agrees(actual: np.ndarray, expected: np.ndarray) -> None:
    """A mean in float32, summed in another order than the float64 reference's."""
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("b", "name"), CASES)
def test_its_native_form_in_a_chain_computes_the_same(b, name, rng):
    workload = _cases(b)[name]
    kernel = NATIVE.prepare(workload, {}, {})
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    call = kernel.native([x], [y])
    assert call is not None
    chain_kernel([call, call], keep=[kernel])([], [])
    np.testing.assert_array_equal(y, _run(kernel, workload, x))


def test_refuses_what_it_does_not_compute():
    b = fmt.host_block_size()
    cases = _cases(b)
    linear = _op("Upsample", b, b, (4, 4), (8, 8), mode="linear",
                 coordinate_transformation_mode="half_pixel", scales=(2, 2))
    assert "linear" in NATIVE.unsupported_reason(linear)
    fused = cases["maxpool sppf 5x5"]
    fused = Workload(fused.op, fused.inputs, fused.outputs, fused.attrs, domain=fused.domain,
                     epilogue=(EpilogueStep("relu"),))
    assert "epilogue" in NATIVE.unsupported_reason(fused)
    stored = _op("MaxPool", b, b, (4, 4), (4, 4), kernel_shape=(3, 3), pads=(1, 1, 1, 1),
                 storage_order=1)
    assert "storage_order" in NATIVE.unsupported_reason(stored)
    conv = Workload("Conv", cases["maxpool sppf 5x5"].inputs, cases["maxpool sppf 5x5"].outputs,
                    (("block", b),), domain="wpk.nchwc")
    assert NATIVE.unsupported_reason(conv) is not None
    plain = Workload("MaxPool", (TensorSpec((1, 3, 4, 4), "float32"),),
                     (TensorSpec((1, 3, 4, 4), "float32"),), (("kernel_shape", (3, 3)),))
    assert NATIVE.unsupported_reason(plain) is not None


def test_a_plan_on_generated_kernels_may_keep_it():
    """No thread pool of its own and no BLAS: `on_generated_kernels` takes it instead of
    onnxruntime's blocked kernels, so the step joins the native chain."""
    assert NATIVE.one_pool and not NATIVE.uses_blas and NATIVE.kind == "library"
    workload = _cases(fmt.host_block_size())["channel slice"]
    names = {c.implementation.name for c in registry.candidates(workload, "cpu")}
    assert {"native.nchwc", "ort.nchwc"} <= names
