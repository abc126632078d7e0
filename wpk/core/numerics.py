"""The one accuracy measure wpk uses everywhere: relative L2 error against a reference."""

from __future__ import annotations

import numpy as np


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
    diff = np.linalg.norm((actual - expected)[finite])
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
