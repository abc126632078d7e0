"""Vectorized math functions in generated C: glibc's libmvec, where the host has it.

    decls, libraries = vector_math(source_text, isa)

A fused epilogue that calls `erff` (GELU), `expf` (sigmoid), `tanhf`, ... one
element at a time costs more than the GEMM it follows (measured: a 128x3072
GELU epilogue 20 ms scalar, the product itself 11 ms). glibc >= 2.35 ships
SIMD variants of these functions (`_ZGVeN16v_erff` and so on, the x86-64
vector function ABI) in libmvec; declaring the scalar function with
`__attribute__((simd("notinbranch")))` lets gcc vectorize a loop that calls
it, and `-lmvec` links the variants. gcc may pick any ISA variant up to the
one its flags allow (SSE, AVX, AVX2, AVX-512), so all four must exist. Without
libmvec (another libc, another architecture, the portable ISA) the loop stays
scalar: same results to the functions' accuracy, just slower.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re

from wpk.core.devices import host_cpu
from wpk.kernels.cpu.microkernels.isa import Isa

# scalar function -> its parameter letters in the vector ABI ('v': one vector argument)
FUNCTIONS = {"expf": "v", "logf": "v", "log1pf": "v", "erff": "v", "tanhf": "v", "powf": "vv"}
# x86-64 vector ABI variants gcc may call: (ISA letter, float lanes)
_VARIANTS = (("b", 4), ("c", 8), ("d", 8), ("e", 16))


@functools.lru_cache(maxsize=1)
def _libmvec() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("mvec")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def has_vector_variants(function: str) -> bool:
    """Whether this host's libmvec has every x86-64 variant of `function`."""
    lib = _libmvec()
    if lib is None or host_cpu().arch != "x86_64" or function not in FUNCTIONS:
        return False
    params = FUNCTIONS[function]
    return all(hasattr(lib, f"_ZGV{letter}N{lanes}{params}_{function}")
               for letter, lanes in _VARIANTS)


def vector_math(source: str, isa: Isa) -> tuple[str, tuple[str, ...]]:
    """(C declarations, linker libraries) that vectorize the libmvec functions `source`
    calls, for code built for `isa`; ('', ('-lm',)) when none applies."""
    if isa.name == "portable":
        return "", ("-lm",)
    used = [f for f in FUNCTIONS if re.search(rf"\b{f}\(", source) and has_vector_variants(f)]
    if not used:
        return "", ("-lm",)
    decls = []
    for f in used:
        args = ", ".join(["float"] * len(FUNCTIONS[f]))
        decls.append(f"float {f}({args}) __attribute__((simd(\"notinbranch\")));\n")
    return "".join(decls), ("-lmvec", "-lm")
