"""Aligned host buffers and their pages mapped ahead of the first write (`wpk.core.aligned`)."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np
import pytest

from wpk.core.aligned import PAGE_BYTES, aligned_bytes, touch_pages


def mapped_pages(buffer: np.ndarray) -> tuple[int, int]:
    """(pages of `buffer` the kernel has mapped, pages it spans), from /proc/self/pagemap
    (bit 63 of each page's entry: present; bit 62: swapped)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = buffer.ctypes.data // page
    last = (buffer.ctypes.data + buffer.nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            raw = pagemap.read(8 * (last - first + 1))
    except OSError:
        pytest.skip("/proc/self/pagemap cannot be read here")
    entries = struct.unpack(f"{last - first + 1}Q", raw)
    return sum(bool(e >> 63 & 1 or e >> 62 & 1) for e in entries), last - first + 1


@pytest.mark.parametrize("align", [16, 64, 4096])
def test_aligned_bytes_start_at_the_alignment(align):
    for size in (1, 1000, 1 << 20):
        buffer = aligned_bytes(size, align)
        assert buffer.nbytes == size and buffer.flags.writeable
        assert buffer.ctypes.data % align == 0


def _fresh_pages(size: int) -> np.ndarray:
    """A buffer of `size` bytes on pages no one has written: an anonymous mapping of its
    own (an allocator may hand back memory it used before, already mapped: even a 64 MiB
    buffer did in a long-lived pytest worker)."""
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)   # .base keeps the mapping alive


def test_touch_pages_maps_every_page_of_a_fresh_buffer():
    """A fresh buffer has pages to map; after touch_pages all are, so that no later write
    waits for the kernel."""
    size = 64 << 20
    assert os.sysconf("SC_PAGE_SIZE") >= PAGE_BYTES
    untouched = _fresh_pages(size)
    mapped, pages = mapped_pages(untouched)
    assert mapped < pages, "the check cannot see unmapped pages here"
    touched = _fresh_pages(size)
    touch_pages(touched)
    assert mapped_pages(touched) == (pages, pages)
    assert not touched[::PAGE_BYTES].any()


def test_touch_pages_takes_any_contiguous_dtype():
    buffer = aligned_bytes(3 << 20, 64).view(np.float32).reshape(3, -1)
    touch_pages(buffer)
    mapped, pages = mapped_pages(buffer)
    assert mapped == pages
