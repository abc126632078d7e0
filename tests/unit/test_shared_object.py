"""`shared_object_problem`: what the dynamic loader would map must be in the file."""

from __future__ import annotations

import struct

import pytest

from wpk.core.shared_object import shared_object_problem
from wpk.dsl import toolchain


@pytest.fixture(scope="module")
def library() -> bytes:
    """A real shared object from the host's compiler."""
    return toolchain.compile_c_shared("int wpk_six(void) { return 6; }\n").read_bytes()


def test_a_whole_library_has_no_problem(library):
    assert shared_object_problem(library) is None


@pytest.mark.parametrize("fraction", [0.02, 0.3, 0.6, 0.9, 0.999])
def test_a_library_cut_anywhere_is_caught(library, fraction):
    """gcc writes the section header table last, so a cut anywhere reaches a table or a
    segment; the shortest cuts leave not even the ELF header."""
    problem = shared_object_problem(library[:int(len(library) * fraction)])
    assert problem is not None
    assert "cut short" in problem or "not an ELF file" in problem


def test_what_is_not_a_shared_object_for_this_host_is_named(library):
    def patched(offset: int, fmt: str, value: int) -> bytes:
        data = bytearray(library)
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)

    assert shared_object_problem(b"#!/bin/sh\n" * 10) == "it is not an ELF file"
    assert "64-bit" in shared_object_problem(patched(4, "B", 1))      # ELFCLASS32
    assert "64-bit" in shared_object_problem(patched(5, "B", 2))      # big endian
    assert shared_object_problem(patched(16, "<H", 2)) == "it is not a shared object"
    assert "ELF machine 40" in shared_object_problem(patched(18, "<H", 40))   # ARM
    assert "program header table" in shared_object_problem(patched(56, "<H", 0))
    # the program header table placed past the end of the file
    assert "cut short" in shared_object_problem(patched(32, "<Q", len(library)))
