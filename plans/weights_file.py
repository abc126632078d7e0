"""The plan's `weights.npz`: arrays written 64-byte aligned, read back as views of one buffer.

    data = npz_bytes({"c0": array, ...})            # what `np.savez` writes, aligned
    buffer = read_stored_member(path, info)          # the member, straight into one buffer
    arrays = npz_views(buffer, caps)                 # {key: array}, views of buffer

Writing: one stored `.npy` per array, as `np.savez` writes them, with fixed timestamps, and
each member's local header padded (an extra field, as Android's zipalign does) so that
the `.npy` starts at a multiple of ALIGN bytes from the npz's start; numpy pads the `.npy`
header to a multiple of 64, so the array data starts aligned too. `np.load` reads it.

Reading: a stored member goes from the file into one ALIGN-aligned numpy buffer (no bytes
object, no copy per array): a fresh process pays a page fault for every page it first
touches, and a plan of VGG-19's 550 MB of weights went through two such copies. Each array
is a view of the buffer where its data is aligned for its dtype, and a copy where it is
not (plans written before the padding) or where the inner member is deflated.
"""

from __future__ import annotations

import io
import struct
import tokenize
import zipfile
from collections.abc import Mapping

import numpy as np

from wpk.core.aligned import aligned_bytes

ALIGN = 64
# the extra field's header ID for padding (the one Android's zipalign writes)
_PADDING_ID = 0xD935
_LOCAL_HEADER = 30        # bytes of a zip local file header before its name and extra field
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An npz of `arrays` (keys without `.npy`; no pickle) whose array data start aligned."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for key, array in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.asanyarray(array), allow_pickle=False)
            name = f"{key}.npy"
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED
            start = buffer.tell() + _LOCAL_HEADER + len(name.encode()) + 4
            info.extra = struct.pack("<HH", _PADDING_ID, -start % ALIGN) + bytes(-start % ALIGN)
            archive.writestr(info, npy.getbuffer())
    return buffer.getvalue()


def aligned_buffer(size: int) -> np.ndarray:
    """A writable uint8 array of `size` bytes whose first byte is ALIGN-aligned."""
    return aligned_bytes(size, ALIGN)


def _plainly_stored(info: zipfile.ZipInfo) -> bool:
    """Whether a member's bytes lie in the zip as they are (stored, not encrypted)."""
    return info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1


def _data_offset(local_header: bytes, at: int) -> int | None:
    """Where a member's data starts, from its local header read at `at` (None if it is not
    one)."""
    if len(local_header) < _LOCAL_HEADER or local_header[:4] != _LOCAL_SIGNATURE:
        return None
    name_length, extra_length = struct.unpack_from("<HH", local_header, 26)
    return at + _LOCAL_HEADER + name_length + extra_length


def read_stored_member(path: str, info: zipfile.ZipInfo) -> np.ndarray | None:
    """The bytes of a stored, unencrypted member as an aligned uint8 array, read from the
    file straight into it; None for any other member (the caller reads it through zipfile).
    Raises OSError or EOFError where the file ends before the member does."""
    if not _plainly_stored(info):
        return None
    with open(path, "rb") as stream:
        stream.seek(info.header_offset)
        start = _data_offset(stream.read(_LOCAL_HEADER), info.header_offset)
        if start is None:
            return None
        buffer = aligned_buffer(info.file_size)
        stream.seek(start)
        view, done = memoryview(buffer), 0
        while done < info.file_size:
            count = stream.readinto(view[done:])
            if not count:
                raise EOFError(f"the file ends {info.file_size - done} bytes into the member")
            done += count
    return buffer


class _BufferReader(io.RawIOBase):
    """A read-only, seekable file over a buffer without copying it (zipfile reads the
    npz's directory through it)."""

    def __init__(self, buffer: np.ndarray):
        self._view = memoryview(buffer).cast("B")
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        count = max(0, min(len(target), len(self._view) - self._at))
        target[:count] = self._view[self._at:self._at + count]
        self._at += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


def _array_at(buffer: np.ndarray, start: int, end: int) -> np.ndarray | None:
    """The `.npy` in buffer[start:end], a view where its data is aligned for its dtype;
    None where the header is not a plain array's or the data does not fit."""
    stream = _BufferReader(buffer[start:end])
    try:
        reader = _HEADER_READERS.get(np.lib.format.read_magic(stream))
        if reader is None:
            return None
        shape, fortran_order, dtype = reader(stream)
    except (ValueError, SyntaxError, tokenize.TokenError):   # numpy parses the header's dict
        return None
    if dtype.hasobject:
        return None
    count = int(np.prod(shape, dtype=object))
    nbytes = count * dtype.itemsize
    first = start + stream.tell()
    if first + nbytes > end:
        return None
    flat = buffer[first:first + nbytes]
    if flat.ctypes.data % max(dtype.alignment, 1):
        flat = flat.copy()   # a fresh numpy buffer is aligned for every dtype
    array = flat.view(dtype)
    return array.reshape(shape[::-1]).T if fortran_order else array.reshape(shape)


def _inflated_array(archive: zipfile.ZipFile, info: zipfile.ZipInfo,
                    cap: int) -> np.ndarray | None:
    """A deflated (or otherwise unplaceable) member's array, never inflating past `cap`."""
    with archive.open(info) as stream:
        data = stream.read(cap + 1)
    if len(data) > cap:
        return None
    return _array_at(np.frombuffer(data, dtype=np.uint8).copy(), 0, len(data))


def npz_views(buffer: np.ndarray, caps: Mapping[str, int]) -> dict[str, np.ndarray | None]:
    """{key: array, or None where `key.npy` is missing, not a plain array or (deflated)
    longer than caps[key] bytes} of the npz in `buffer`. Raises zipfile.BadZipFile (and the
    other errors zipfile raises) where the npz is not one."""
    found: dict[str, np.ndarray | None] = {}
    with zipfile.ZipFile(_BufferReader(buffer)) as archive:
        names = set(archive.namelist())
        for key, cap in caps.items():
            name = f"{key}.npy"
            if name not in names:
                found[key] = None
                continue
            info = archive.getinfo(name)
            start = None
            if _plainly_stored(info):
                at = info.header_offset
                start = _data_offset(bytes(buffer[at:at + _LOCAL_HEADER]), at)
            if start is None or start + info.file_size > len(buffer):
                found[key] = _inflated_array(archive, info, cap)
            else:
                found[key] = _array_at(buffer, start, start + info.file_size)
    return found

