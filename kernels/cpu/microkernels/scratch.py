"""Scratch buffers of a generated kernel, one per concurrent call.

    pool = ScratchPool(floats)
    buffer = pool.take()      # a free buffer, or a new one (64-byte aligned)
    pool.give(buffer)         # back for the next call
    address = pool.reserve()  # a native chain's own buffer, held by the pool

A kernel that needs working memory (Winograd's transformed tiles, a conv's phase split)
takes a buffer per call, so calls of one kernel from several threads at once never
share one, and a call never allocates after the first.
"""

from __future__ import annotations

import numpy as np

from wpk.core.aligned import aligned_bytes

ALIGN = 64   # bytes: the scratch's vectors start on cache lines


class ScratchPool:
    """Aligned float32 scratch buffers of one size; a call takes one and gives it back."""

    def __init__(self, floats: int):
        self.floats = floats
        self.free: list[np.ndarray] = []
        self.reserved: list[np.ndarray] = []

    def take(self) -> np.ndarray:
        """A free buffer, or a new one (list pop/append are atomic under the GIL)."""
        try:
            return self.free.pop()
        except IndexError:
            return aligned_bytes(4 * self.floats, ALIGN).view(np.float32)

    def give(self, buffer: np.ndarray) -> None:
        """Return a buffer taken from this pool."""
        self.free.append(buffer)

    def reserve(self) -> int:
        """The address of a buffer that is never given back (a native chain's, which calls
        the kernel with the same pointers every run); the pool keeps it alive."""
        buffer = self.take()
        self.reserved.append(buffer)
        return buffer.ctypes.data
