"""Forcing the host ISA in tests, so an AVX-512 machine also checks the AVX2 paths.

    pytest --isa avx2 tests/unit        # every test in this process sees an AVX2-only CPU
    with forced_isa("avx2"): ...        # one block of a test

What is forced is wpk's view of the CPU in this process: the ISA flags
(`wpk.core.devices.cpu_flags`, so `host_cpu()`'s vector width, the records
fingerprint and the C compiler's `-march` level) and with them every schedule
template and generated kernel. onnxruntime's MLAS still picks its NCHWc block
from the real CPU; `scripts/isa_check.sh` runs these tests under
`scripts/avx2_only.sh` for that (AVX-512 hidden from every library by CPUID
faulting) where the CPU allows, else the NCHWc tests under an emulated AVX2-only
CPU. Worker processes started by wpk inherit the restriction; a `wpk` command
started as a subprocess does not.
"""

from __future__ import annotations

import contextlib

ISAS = ("host", "avx2")


def force_isa(isa: str) -> None:
    """Make wpk in this process (and the workers it starts) see an `isa` CPU ('host':
    the real one)."""
    from wpk.core import devices

    if isa not in ISAS:
        raise ValueError(f"unknown ISA {isa!r}; one of {ISAS}")
    if isa == "host":
        devices.restrict_cpu_flags(None)
        return
    devices.restrict_cpu_flags(None)
    devices.restrict_cpu_flags(f for f in devices.cpu_flags() if not f.startswith("avx512"))


@contextlib.contextmanager
def forced_isa(isa: str):
    """`force_isa(isa)` for the duration of a with-block (then what was seen before)."""
    from wpk.core import devices

    before = devices.restricted_cpu_flags()
    force_isa(isa)
    try:
        yield
    finally:
        devices.restrict_cpu_flags(before)


def current_isa() -> str:
    """'avx2' when this process is restricted to AVX2 by `force_isa`, else 'host' (what a
    test hands a `python -c` child so it sees the same CPU)."""
    from wpk.core import devices

    restricted = devices.restricted_cpu_flags()
    return "host" if restricted is None or "avx512f" in restricted else "avx2"
