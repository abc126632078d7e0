"""Whether bytes are a whole ELF shared object for this host, before the loader maps them.

    problem = shared_object_problem(data)   # None, or why `data` must not be loaded

The dynamic loader maps a library's segments as its program headers describe them and
trusts the file to hold them: a library cut short (a plan's kernel library truncated and
its checksum recomputed) ended the process with SIGBUS when the loader touched the
missing pages, before Python could report anything. This check reads only the ELF
header and the program header table (the layout the loader relies on) and the section
header table's place (the last part of a file gcc writes, so any cut reaches it). It
does not judge the code: a library whose instructions were altered is loaded as it is,
which is why plans carry native code only for hosts that trust them.
"""

from __future__ import annotations

import platform
import struct

ELF_MAGIC = b"\x7fELF"
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")     # Elf64_Ehdr, little endian
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")     # Elf64_Phdr
_SHARED_OBJECT = 3                               # e_type ET_DYN
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}


def shared_object_problem(data: bytes) -> str | None:
    """Why `data` is not a whole 64-bit little-endian shared object for this machine (a
    short sentence), or None when its headers and the tables they place fit in it."""
    if len(data) < _HEADER.size or not data.startswith(ELF_MAGIC):
        return "it is not an ELF file"
    (ident, kind, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     _) = _HEADER.unpack_from(data)
    if ident[4] != 2 or ident[5] != 1:
        return "it is not a 64-bit little-endian ELF file"
    if kind != _SHARED_OBJECT:
        return "it is not a shared object"
    expected = _MACHINES.get(platform.machine().lower())
    if expected is not None and machine != expected:
        return f"it is built for ELF machine {machine}, not this host's {expected}"
    if phentsize != _PROGRAM_HEADER.size or phnum == 0:
        return "its program header table is malformed"
    return (_beyond(data, "its program header table", phoff, phentsize * phnum)
            or _segments_problem(data, phoff, phnum)
            or _beyond(data, "its section header table", shoff, shentsize * shnum))


def _segments_problem(data: bytes, phoff: int, count: int) -> str | None:
    headers = _PROGRAM_HEADER.iter_unpack(data[phoff:phoff + count * _PROGRAM_HEADER.size])
    problems = (_beyond(data, f"segment {index}", offset, file_size)
                for index, (_, _, offset, _, _, file_size, _, _) in enumerate(headers))
    return next(filter(None, problems), None)


def _beyond(data: bytes, what: str, offset: int, size: int) -> str | None:
    if offset + size > len(data):
        return (f"{what} ends at byte {offset + size} but the file has {len(data)} "
                "(cut short)")
    return None
