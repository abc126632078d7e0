"""The instruction sets micro-kernels are generated for: vector width, registers, gcc flags.

    isa = host_isa()              # the widest this process can run: avx512, avx2 or portable
    isa.lanes, isa.registers      # 16 floats / 32 registers on AVX-512, 8 / 16 on AVX2
    compile_flags(isa)            # gcc flags that build for exactly that ISA

A micro-kernel's accumulators are GCC vector-extension values of `lanes`
floats; gcc lowers them to the ISA its flags allow. The `portable` ISA uses
4-float vectors and no -march level of x86 (SSE2 there, NEON on AArch64, or
whatever `-march=native` gives elsewhere), so it builds on any host gcc
targets. An ISA is part of every micro-kernel config, and its flags are part
of the compile cache key, so an AVX2 build never reuses an AVX-512 binary.
Tests force an ISA the host can run (AVX2 code on an AVX-512 host).
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.devices import cpu_flags, host_cpu
from wpk.dsl.toolchain import BASE_C_FLAGS

# ISO C (-std=c11) turns floating-point contraction off; the micro-kernels want their FMAs.
_CONTRACT = ("-ffp-contract=fast",)
# Floats per cache line: 64 bytes on every x86 ISA below (a prefetch knob issues one a line)
LINE_FLOATS = 16


@dataclass(frozen=True)
class Isa:
    """A vector instruction set: name, float32 lanes, vector registers, what it needs."""

    name: str
    lanes: int
    registers: int
    march: tuple[str, ...]      # gcc flags selecting it (x86-64)
    needs: tuple[str, ...]      # /proc/cpuinfo flags the host must have

    def runs_here(self) -> bool:
        """Whether this process can execute code built for the ISA."""
        return set(self.needs) <= set(cpu_flags())


ISAS = {
    "avx512": Isa("avx512", 16, 32, ("-march=x86-64-v4", "-mprefer-vector-width=512"),
                  ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma")),
    "avx2": Isa("avx2", 8, 16, ("-march=x86-64-v3",), ("avx", "avx2", "fma")),
    "portable": Isa("portable", 4, 16, (), ()),
}


def _is_x86() -> bool:
    return host_cpu().arch == "x86_64"


def usable_isas() -> list[Isa]:
    """The ISAs this host runs, widest first (`portable` always last)."""
    if not _is_x86():
        return [ISAS["portable"]]
    return [isa for isa in ISAS.values() if isa.runs_here()]


def host_isa() -> Isa:
    """The widest ISA this process can run."""
    return usable_isas()[0]


def isa_named(name: str) -> Isa:
    """The ISA called `name` (ValueError naming the known ones, or when the host lacks it)."""
    isa = ISAS.get(name)
    if isa is None:
        raise ValueError(f"unknown micro-kernel ISA {name!r} (known: {', '.join(ISAS)})")
    if isa not in usable_isas():
        raise ValueError(f"this host cannot run {name} code (it has "
                         f"{', '.join(i.name for i in usable_isas())})")
    return isa


def compile_flags(isa: Isa) -> tuple[str, ...]:
    """gcc flags of a micro-kernel built for `isa` (base flags, its -march level, FMA
    contraction; -march=native for the portable ISA off x86)."""
    march = isa.march if _is_x86() else ("-march=native",)
    return (*BASE_C_FLAGS, *march, *_CONTRACT)
