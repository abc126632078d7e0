"""`resize.c` (wpk.kernels.cpu.resize_native): the C kernel of linear and cubic Resizes against
the float64 reference, on the calling thread and on the thread team, through its native
form, and what it refuses. Every coordinate mode against onnxruntime: tests/unit/test_resize.py."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel, native_call
from wpk.kernels.cpu.resize import resize_spec
from wpk.kernels.cpu.resize_native import (
    MAX_WIDTH,
    ORDERS,
    PARALLEL_ELEMENTS,
    RESIZE_C,
    resize_native_reason,
    tap_table,
)
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.kernels.reference import reference

# ISA-dependent code (compiled for the host): scripts/isa_check.sh reruns these on AVX2.
pytestmark = pytest.mark.isa


def resize(in_shape, out_shape, attrs=(), opset=13) -> Workload:
    """A Resize of `in_shape` to `out_shape` given by its sizes."""
    sizes = np.array(out_shape, np.int64)
    return Workload("Resize", (TensorSpec(in_shape), None, None, TensorSpec(sizes.shape, "int64")),
                    (TensorSpec(out_shape),), tuple(sorted(attrs)), const_inputs=(3,),
                    static_inputs=((3, sizes),), opset=opset)


def run(workload: Workload, x: np.ndarray, order: str = "rows") -> np.ndarray:
    kernel = RESIZE_C.prepare(workload, {3: workload.static_value(3)}, {"order": order})
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel([x, None, None, workload.static_value(3)], [out])
    return out


LINEAR, CUBIC = ("mode", b"linear"), ("mode", b"cubic")
CASES = {
    # a 2x upsample large enough for the thread team (rows split between threads)
    "linear 2x, two images": resize((2, 8, 33, 47), (2, 8, 66, 94), [LINEAR]),
    "cubic 2x": resize((1, 5, 31, 40), (1, 5, 62, 80), [CUBIC]),
    "linear down, align_corners": resize(
        (1, 16, 65, 70), (1, 16, 31, 33),
        [LINEAR, ("coordinate_transformation_mode", b"align_corners")]),
    "antialiased shrink": resize((1, 6, 64, 64), (1, 6, 20, 24), [LINEAR, ("antialias", 1)],
                                 opset=18),
    "one-pixel image": resize((1, 3, 1, 1), (1, 3, 4, 5), [CUBIC]),
    "width only, rank 3": resize((4, 9, 13), (4, 9, 30), [LINEAR]),
    "height only, rank 5": resize((2, 3, 2, 10, 7), (2, 3, 2, 25, 7), [CUBIC]),
    "rank 2": resize((9, 11), (4, 23), [LINEAR, ("coordinate_transformation_mode",
                                                 b"asymmetric")]),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_the_float64_reference(name, order, rng):
    workload = CASES[name]
    assert {"order": order} in RESIZE_C.configs(workload)
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    (expected,) = reference(workload, [x, None, None, workload.static_value(3)])
    assert relative_l2(run(workload, x, order), expected) < 1e-6


def test_columns_first_needs_distinct_slots_for_the_taps_of_a_row():
    # 64 -> 2 rows with antialias: 40-odd taps per output row, 2 x taps slots of 4000
    # columns would outgrow a thread's stack
    wide = resize((1, 1, 64, 4000), (1, 1, 2, 4000), [LINEAR, ("antialias", 1)], opset=18)
    assert RESIZE_C.configs(wide) == [{"order": "rows"}]
    with pytest.raises(ValueError, match="stack"):
        RESIZE_C.prepare(wide, {3: wide.static_value(3)}, {"order": "columns"})


@pytest.mark.parametrize("order", ORDERS)
def test_the_team_and_the_calling_thread_compute_the_same(order, rng):
    big = CASES["linear 2x, two images"]
    assert np.prod(big.outputs[0].shape) >= PARALLEL_ELEMENTS   # the team's path
    small = resize((1, 2, 10, 12), (1, 2, 20, 24), [LINEAR])
    assert np.prod(small.outputs[0].shape) < PARALLEL_ELEMENTS  # the calling thread's
    x = rng.standard_normal(big.inputs[0].shape).astype(np.float32)
    # the same planes, resized alone on the calling thread, plane by plane
    single = resize((1, 1, 33, 47), (1, 1, 66, 94), [LINEAR])
    out = run(big, x, order)
    for n in range(2):
        for c in range(8):
            np.testing.assert_array_equal(out[n, c],
                                          run(single, x[n:n + 1, c:c + 1], order)[0, 0])


def test_native_form_runs_in_a_chain_like_the_kernel(rng):
    workload = CASES["cubic 2x"]
    kernel = RESIZE_C.prepare(workload, {3: workload.static_value(3)}, {})
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    inputs = [x, None, None, workload.static_value(3)]
    direct = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [direct])
    chained = np.full_like(direct, np.nan)
    call = native_call(kernel, inputs, [chained])
    assert call is not None
    chain_kernel([call, call], keep=[kernel])(inputs, [chained])
    np.testing.assert_array_equal(chained, direct)
    # a non-contiguous input has no native form (the kernel copies it first)
    assert native_call(kernel, [x[..., ::-1], None, None, None], [chained]) is None


def test_tap_tables_hold_the_nonzero_weights_of_each_row():
    spec = resize_spec(CASES["cubic 2x"], [None, None, None, np.array([1, 5, 62, 80])])
    index, weight = tap_table(spec, 3)
    assert index.shape == weight.shape == (80, 4)
    np.testing.assert_allclose(weight.sum(axis=1), 1.0, rtol=1e-6)
    assert index.min() >= 0 and index.max() <= 39
    # an axis it does not resize: the identity
    index, weight = tap_table(spec, 1)
    assert (index[:, 0] == np.arange(5)).all() and (weight == 1).all()


@pytest.mark.parametrize(("workload", "words"), [
    (resize((1, 4, 5, 5), (1, 8, 10, 10), [LINEAR]), "last two axes"),
    (resize((1, 4, 5, 5), (1, 4, 10, 10), [("mode", b"nearest")]), "index copy"),
    (resize((1, 1, 2, MAX_WIDTH + 1), (1, 1, 4, MAX_WIDTH + 1), [LINEAR]), "row"),
    (resize((1, 4, 5, 5), (1, 4, 10, 10), [LINEAR], opset=10), "opset 11"),
    (Workload("Resize", (TensorSpec((1, 4, 5, 5)), None, TensorSpec((4,))),
              (TensorSpec((1, 4, 10, 10)),), (LINEAR,), opset=13), "computed"),
])
def test_what_it_refuses_says_why(workload, words):
    reason = resize_native_reason(workload)
    assert reason is not None and words in reason, reason
    assert "resize.c" not in {c.implementation.name for c in registry.candidates(workload)}


def test_the_benchmark_times_every_verified_candidate(rng):
    """scripts/bench_resize.py on a small workload: each candidate verified and timed."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import bench_resize
    finally:
        sys.path.pop(0)
    label, workload = bench_resize.resize("small", (1, 2, 6, 7), [1, 1, 2, 2], "linear")
    row = bench_resize.bench_workload(label, workload, SimpleNamespace(rounds=1, repeat=1), rng)
    assert {"resize.c[order=rows]", "resize.c[order=columns]", "ort",
            "numpy.formula"} <= set(row["median_ms"])
    assert row["ort_over"]["ort"] == 1.0
    assert max(row["relative_l2"].values()) < 1e-5


def blocked_upsample(b: int, channels: int, hw: tuple[int, int], scales: tuple[int, int],
                     transform: str, mode: str = "linear") -> Workload:
    """A blocked (wpk.nchwc) Upsample as the layout pass writes it for a Resize."""
    h, w = hw
    x = TensorSpec(fmt.blocked_shape((1, channels, h, w), b))
    y = TensorSpec(fmt.blocked_shape((1, channels, h * scales[0], w * scales[1]), b))
    attrs = {"block": b, "channels": channels, "mode": mode, "scales": scales,
             "coordinate_transformation_mode": transform}
    return Workload("Upsample", (x,), (y,), tuple(sorted(attrs.items())), domain="wpk.nchwc")


BLOCKED = {
    "2x half_pixel, a partial block": ((2, 2), "half_pixel", 3),
    "2x3 align_corners": ((2, 3), "align_corners", 2),
    "4x asymmetric, one pixel": ((4, 4), "asymmetric", 1),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("b", (8, 16))
@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_upsample_matches_the_reference_lanes_included(name, b, order, rng):
    """A pixel is the block's vector of channels; the padding lanes (random here, as a
    layout that leaves them dirty has them) are interpolated like the others."""
    scales, transform, blocks = BLOCKED[name]
    hw = (1, 1) if "one pixel" in name else (7, 9)
    workload = blocked_upsample(b, b * blocks - (3 if "partial" in name else 0), hw, scales,
                                transform)
    assert resize_native_reason(workload) is None
    assert {"order": order} in RESIZE_C.configs(workload)
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    expected = nchwc_reference(workload, [x])[0]
    kernel = RESIZE_C.prepare(workload, {}, {"order": order})
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel([x], [out])
    assert relative_l2(out, expected) < 1e-6
    chained = np.full_like(out, np.nan)
    chain_kernel([native_call(kernel, [x], [chained])], keep=[kernel])([], [])
    np.testing.assert_array_equal(chained, out)


def test_a_blocked_nearest_upsample_stays_native_nchwcs_copy():
    nearest = blocked_upsample(16, 16, (4, 4), (2, 2), "asymmetric", "nearest")
    assert "nearest" in resize_native_reason(nearest)
    linear = blocked_upsample(16, 16, (4, 4), (2, 2), "half_pixel")
    names = {c.implementation.name for c in registry.candidates(linear)}
    assert "resize.c" in names and "native.nchwc" not in names
