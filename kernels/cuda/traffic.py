"""On-chip work of a generated CUDA kernel, counted from its loop IR (no GPU needed).

    work = kernel_work(func.kernels[0])     # -> KernelWork
    seconds = onchip_seconds(work, gpu)     # throughput bound of the whole grid
    wait = latency_seconds(work, gpu)       # one thread's chain of global loads

The roofline of `analytic` sees only the minimum DRAM bytes and the useful flops, so
it cannot tell a kernel that reloads both operands for every multiply-add from one
that keeps a register tile. This module counts, per kernel:

* `flops`: floating-point operations of every executed store (padding lanes of a
  tile included);
* `memory_ops`: global and shared loads and stores, per warp (a warp's access is one
  issue of the load/store unit, a wavefront, whether its lanes read one broadcast
  address or 32 consecutive ones; bank conflicts and uncoalesced accesses are not
  modelled). A load inside an `unroll` loop whose variable its index does not use is
  counted once for the whole loop: the compiler keeps it in a register (CSE), which is
  exactly what a register tile relies on. Local (register) buffers cost nothing.
* `serial_loads`: the loop iterations of one thread whose statement reads global
  memory (unrolled copies count once: their loads are issued together). However many
  warps hide each other's latency, a kernel lasts at least as long as one thread's
  chain: what makes a long reduction on one thread per row slow.

`onchip_seconds` turns these into time at ASSUMED throughputs (one memory wavefront per
SM per clock; FP32_LANES_PER_SM lanes per SM per clock), with the clock derived from the
preset's fp32 peak. They rank schedules offline; they are not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wpk.dsl import loopir as L

FP32_LANES_PER_SM = {(9, 0): 128, (8, 6): 128, (8, 9): 128}   # else 64 (sm_60 .. sm_80)
MEMORY_WAVEFRONTS_PER_SM_CLOCK = 1.0                          # assumption, see docstring
# Cycles one thread waits per serial loop iteration that reads global memory, however
# many warps the SM has: fitted to one H200 measurement (2026-11-27: a Softmax over
# 1x1000 reduced by one thread, two chains of 1000 loads, 122 us, about 60 ns a load).
SERIAL_LOAD_CYCLES = 100
FLOAT_TYPES = ("f16", "f32", "f64")


@dataclass(frozen=True)
class KernelWork:
    """Executed flops and global/shared memory wavefronts of one kernel launch."""

    flops: float
    memory_ops: float        # warp-level load/store issues (global and shared)
    serial_loads: float = 0.0   # one thread's loop iterations that wait for a global load


def kernel_work(kernel: L.Kernel, warp_size: int = 32) -> KernelWork:
    """Count a kernel's flops and memory wavefronts over its whole grid."""
    scopes = {n.buffer.name: n.buffer.scope for n in L.walk(kernel.body)
              if isinstance(n, L.Allocate)}
    counter = _Counter(scopes)
    counter.stmt(kernel.body, 1.0, ())
    threads = counter.threads
    warps = counter.blocks * math.ceil(threads / warp_size)
    return KernelWork(counter.flops * counter.blocks * threads, counter.memory_ops * warps,
                      counter.serial_loads)


class _Counter:
    """Per-thread counts (multiplied by loop trip counts) of one kernel body."""

    def __init__(self, scopes: dict[str, str]):
        self.scopes = scopes
        self.flops = 0.0
        self.memory_ops = 0.0
        self.blocks = 1
        self.threads = 1
        self.serial_loads = 0.0

    def stmt(self, s: L.Stmt, trips: float, unrolled: tuple) -> None:
        if isinstance(s, L.Seq):
            for child in s.stmts:
                self.stmt(child, trips, unrolled)
        elif isinstance(s, L.For):
            if s.kind.startswith("blockIdx"):
                self.blocks *= s.extent
                self.stmt(s.body, trips, unrolled)
            elif s.kind.startswith("threadIdx"):
                self.threads *= s.extent
                self.stmt(s.body, trips, unrolled)
            elif s.kind == "unroll":
                self.stmt(s.body, trips, (*unrolled, (s.var.name, s.extent)))
            else:
                self.stmt(s.body, trips * s.extent, unrolled)
        elif isinstance(s, L.IfThenElse):
            self.stmt(s.then, trips, unrolled)
            if s.orelse is not None:
                self.stmt(s.orelse, trips, unrolled)
        elif isinstance(s, L.Store):
            every = trips * math.prod(e for _, e in unrolled)
            if self.scopes.get(s.buffer, "global") != "local":
                self.memory_ops += every
            self.flops += every * _float_ops(s.value)
            loads = {n for n in L.walk(s.value) if isinstance(n, L.Load)}
            for load in loads:
                if self.scopes.get(load.buffer, "global") == "local":
                    continue
                used = L.free_vars(load.index)
                self.memory_ops += trips * math.prod(e for v, e in unrolled if v in used)
            if any(self.scopes.get(load.buffer, "global") == "global" for load in loads):
                self.serial_loads += trips    # unrolled copies load together: one wait


def _float_ops(e: L.Expr) -> int:
    return sum(1 for n in L.walk(e) if isinstance(n, L.Bin) and n.dtype in FLOAT_TYPES)


def _clock_hz(gpu) -> float:
    lanes = FP32_LANES_PER_SM.get(tuple(gpu.compute_capability), 64)
    return gpu.fp32_tflops * 1e12 / (gpu.sm_count * 2 * lanes)


def onchip_seconds(work: KernelWork, gpu) -> float:
    """max(flops at the fp32 peak, memory wavefronts at one per SM per clock)."""
    memory = work.memory_ops / (gpu.sm_count * _clock_hz(gpu) * MEMORY_WAVEFRONTS_PER_SM_CLOCK)
    return max(work.flops / (gpu.fp32_tflops * 1e12), memory)


def latency_seconds(work: KernelWork, gpu) -> float:
    """One thread's chain of global loads, SERIAL_LOAD_CYCLES each: a lower bound of the
    kernel's time that no occupancy hides."""
    return work.serial_loads * SERIAL_LOAD_CYCLES / _clock_hz(gpu)
