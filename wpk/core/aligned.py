"""Aligned host buffers: numpy allocates at 16 bytes, vector kernels want a cache line.

    buffer = aligned_bytes(size, 64)    # uint8, writable, buffer.ctypes.data % 64 == 0
"""

from __future__ import annotations

import numpy as np


def aligned_bytes(size: int, align: int) -> np.ndarray:
    """A writable uint8 array of `size` bytes whose first byte lies at a multiple of
    `align` (a view of a slightly larger allocation, which it keeps alive)."""
    raw = np.empty(size + align, dtype=np.uint8)
    shift = -raw.ctypes.data % align
    return raw[shift:shift + size]
