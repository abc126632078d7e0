"""A check shared by the tests of kernels that join the plan's native chain."""

from __future__ import annotations

import numpy as np

from wpk.core.numerics import relative_l2
from wpk.kernels.cpu.native_chain import chain_kernel, native_call


def assert_chain_matches(kernel, arrays: list[np.ndarray], expected: np.ndarray,
                         tolerance: float = 1e-6) -> None:
    """`kernel`'s native call on `arrays`, run in a native chain into a poisoned output,
    matches `expected`; and an input not passed as it is (Fortran order) has no native
    form."""
    out = np.full(expected.shape, np.nan, np.float32)
    call = native_call(kernel, arrays, [out])
    assert call is not None
    chain_kernel([call])([], [])
    assert relative_l2(out, expected) < tolerance
    strided = np.asfortranarray(arrays[0])
    assert kernel.native([strided, *arrays[1:]], [out]) is None
