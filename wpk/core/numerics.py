"""The one accuracy measure wpk uses everywhere: relative L2 error against a reference."""

from __future__ import annotations

import numpy as np

# Ops whose integer outputs round float arithmetic (quantization, requantization): run in
# other precisions or orders, x / scale now and then lands on the other side of a rounding
# boundary, and two correct implementations differ by one in a few elements.
ROUNDING_OPS = frozenset({
    "QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "QLinearAdd",
    "QLinearMul", "QGemm", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool",
    "QLinearAveragePool", "QLinearConcat", "QLinearSoftmax",
})

# At most this share of a quantized output's elements may round to the step next to the
# reference's (`rounding_flips`); a correct float32 kernel flips far fewer.
FLIP_SHARE = 0.01


def relative_l2(actual, expected) -> float:
    """||actual - expected|| / ||expected|| in float64 over the finite reference entries.

    inf when the shapes differ or a non-finite value does not match the reference
    exactly (a NaN left where the reference is finite is an unwritten element).
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return float("inf")
    finite = np.isfinite(expected)
    if not np.array_equal(np.isfinite(actual), finite) or not np.array_equal(
            actual[~finite], expected[~finite], equal_nan=True):
        return float("inf")
    diff = np.linalg.norm(actual[finite] - expected[finite])   # no inf - inf computed
    return float(diff / max(np.linalg.norm(expected[finite]), 1e-30))


def is_ml_dtype(dtype) -> bool:
    """Whether a dtype is one of ml_dtypes' (bfloat16, float8_*, int4, ...), which ONNX's
    narrow types map to: numpy neither computes in them nor stores them in .npy files."""
    return np.dtype(dtype).type.__module__.split(".")[0] == "ml_dtypes"


def finite_float(text: str) -> float:
    """A JSON number literal as a float; ValueError for one that overflows (`1e400`), as
    `json.loads(..., parse_float=finite_float)` uses it (wpk never writes such literals)."""
    value = float(text)
    if not np.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def rounding_flips(got: np.ndarray, ref: np.ndarray, quantum: float
                   ) -> tuple[np.ndarray | None, str]:
    """Where a quantized output lies one step from the reference, or why it is wrong.

    The value before the rounding comes out of float32 arithmetic a little off the float64
    reference's, so where it falls next to a rounding boundary the two round to neighbouring
    steps: those elements differ by exactly one step. Every other element must agree, and
    the flips stay rare (at most `FLIP_SHARE` of the elements, at least one allowed): a
    wrong scale, zero point, range or rounding moves far more of them, or by more."""
    diff = np.abs(got - ref)
    same = diff <= 1e-5 * np.maximum(np.abs(ref), quantum)
    flips = ~same & (np.abs(diff - quantum) <= 1e-3 * quantum)
    if not (same | flips).all():
        return None, "a quantized output differs from the reference by more than one step"
    allowed = max(1, int(FLIP_SHARE * got.size))
    if int(flips.sum()) > allowed:
        return None, (f"a quantized output lies one step off the reference in "
                      f"{int(flips.sum())} of {got.size} elements (at most {allowed} may)")
    return flips, ""
