"""Offline checks of a generated CUDA kernel: compile for the preset, resources, emulator.

    reason = check_usage(binary_usage, launches, gpu)       # None, or why ptxas usage misfits
    result = verify_emulated(func, feeds, expected)         # sampled-block emulation
    blocks = sample_blocks(grid, rng, count=4)

Without the target GPU a kernel is still checked end to end:

1. the config is validated against the preset by the template (threads, shared
   memory, estimated registers) *before* anything is compiled;
2. it is compiled for the preset's arch (`compile_cuda`: nvcc for sm_75+,
   NVRTC 12 + ptxas for p100/v100) and the ptxas usage is checked against the
   preset: registers per thread and per block, static shared memory per
   block (spills are allowed but reported and cost time in the model);
3. the exact loop IR the CUDA C was printed from runs in the GPU emulator.
   Small grids run fully. For grids of more than FULL_GRID_BLOCKS blocks the
   output kernel runs only on a sample of blocks (first, last, the last block
   of every grid dimension, and a few seeded random ones). A kernel before it
   (split-C/split-K partial sums into a workspace, `blockIdx.y` = the part)
   with a big grid runs on sampled columns: a few `blockIdx.x` values with
   every `blockIdx.y`/`z`, so the tiles it covers get all their parts; the
   output kernel then runs fully. Outputs and workspaces start as NaN, which
   propagates through sums and epilogues, so the output elements the run
   computed from written data are exactly the non-NaN ones; those are compared
   with the float64 reference by relative L2 error, and a sample that writes
   nothing fails.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.numerics import rounding_flips
from wpk.dsl import loopir as L
from wpk.dsl.emulator import EmulatorError, global_memory, run_kernel
from wpk.dsl.templates import launch_of

FULL_GRID_BLOCKS = 16        # grids up to this many blocks are emulated fully
RANDOM_BLOCKS = 3            # random blocks added to the first/last/edge ones


@dataclass(frozen=True)
class Verification:
    """Outcome of an emulator verification (`ok`, relative L2 error, what was run)."""

    ok: bool
    rel_l2_error: float
    blocks: int                # blocks emulated (all kernels)
    grid_blocks: int           # blocks in their grids
    elements: int              # output elements checked
    message: str = ""

    @property
    def sampled(self) -> bool:
        return self.blocks < self.grid_blocks

    def describe(self) -> str:
        how = (f"{self.blocks} of {self.grid_blocks} blocks" if self.sampled
               else f"all {self.grid_blocks} blocks")
        return f"emulator: {how}, {self.elements} outputs, rel L2 {self.rel_l2_error:.2e}"


def check_usage(usage: Mapping, launches: Sequence, gpu) -> str | None:
    """None when every kernel's ptxas usage fits the preset, else the reason (names the
    kernel, the figure and the limit). `usage` maps kernel name -> ResourceUsage."""
    for item in launches:
        used = _usage_of(usage, item.name)
        if used is None:
            return f"ptxas reported no resource usage for kernel {item.name}"
        threads = math.prod(item.launch.block)
        if used.registers > gpu.max_registers_per_thread:
            return (f"{item.name}: {used.registers} registers per thread exceed the "
                    f"{gpu.name} limit of {gpu.max_registers_per_thread}")
        if used.registers * threads > gpu.registers_per_block:
            return (f"{item.name}: {used.registers} registers x {threads} threads exceed the "
                    f"{gpu.name} register file of {gpu.registers_per_block} per block")
        if used.shared_bytes > gpu.shared_memory_per_block:
            return (f"{item.name}: {used.shared_bytes} bytes of shared memory per block exceed "
                    f"the {gpu.name} limit of {gpu.shared_memory_per_block}")
    return None


def _usage_of(usage: Mapping, name: str):
    if name in usage:
        return usage[name]
    matches = [u for key, u in usage.items() if name in key]
    return matches[0] if len(matches) == 1 else None


def spill_note(usage: Mapping) -> str:
    """'' or a note naming the kernels that spill registers."""
    spilling = [f"{name} ({u.spill_stores} B stores, {u.spill_loads} B loads)"
                for name, u in usage.items() if u.spills]
    return "spills: " + ", ".join(spilling) if spilling else ""


def sample_blocks(grid: Sequence[int], rng: np.random.Generator,
                  count: int = RANDOM_BLOCKS) -> list[int]:
    """Linear block ids to emulate: first, last, the last block of each grid dimension
    (edge blocks, where partial tiles and padding live) and `count` random ones."""
    gx, gy, gz = (int(d) for d in grid)
    total = gx * gy * gz
    chosen = {0, total - 1, gx - 1, (gy - 1) * gx, (gz - 1) * gx * gy}
    if total > len(chosen):
        chosen.update(int(b) for b in rng.choice(total, size=min(count, total), replace=False))
    return sorted(b for b in chosen if 0 <= b < total)


def column_blocks(grid: Sequence[int], rng: np.random.Generator,
                  count: int = RANDOM_BLOCKS) -> list[int]:
    """Linear block ids of sampled columns: the first, the last and `count` random
    `blockIdx.x` values, each with every `blockIdx.y` and `blockIdx.z`."""
    gx, gy, gz = (int(d) for d in grid)
    xs = {0, gx - 1}
    if gx > len(xs):
        xs.update(int(x) for x in rng.choice(gx, size=min(count, gx), replace=False))
    return sorted(x + gx * (y + gy * z) for x in xs for y in range(gy) for z in range(gz))


def emulate_sampled(func: L.PrimFunc, feeds: Mapping[str, np.ndarray],
                    rng: np.random.Generator, full_grid_blocks: int = FULL_GRID_BLOCKS,
                    full_before_last: bool = False) -> tuple[dict[str, np.ndarray], int, int]:
    """Run `func` in the emulator, the last kernel on sampled blocks when its grid is big.
    With `full_before_last` the kernels before it run fully (a pipeline of stages whose
    intermediates every output needs, as Winograd's transforms and GEMM), not on columns.
    Returns (outputs poisoned with NaN where not written, blocks run, blocks in the grid)."""
    outputs = func.meta["outputs"]
    globals_ = global_memory(func, feeds)
    *before, last = func.kernels
    ran = total = 0
    for kernel in before:
        launch = launch_of(kernel)
        grid = math.prod(launch.grid)
        sampled = grid > full_grid_blocks and not full_before_last
        blocks = column_blocks(launch.grid, rng) if sampled else None
        run_kernel(func, kernel, launch, globals_, blocks)
        ran, total = ran + (grid if blocks is None else len(blocks)), total + grid
    launch = launch_of(last)
    grid = math.prod(launch.grid)
    if grid <= full_grid_blocks or ran < total:  # after sampled parts: every output block
        run_kernel(func, last, launch, globals_)
        ran += grid
    else:
        blocks = sample_blocks(launch.grid, rng)
        run_kernel(func, last, launch, globals_, blocks)
        ran += len(blocks)
    total += grid
    return ({name: globals_[name].reshape(func.buffer(name).shape) for name in outputs},
            ran, total)


def verify_emulated(func: L.PrimFunc, feeds: Mapping[str, np.ndarray],
                    expected: Mapping[str, np.ndarray], tolerance: float = 1e-4,
                    seed: int = 0, full_grid_blocks: int = FULL_GRID_BLOCKS,
                    full_before_last: bool = False,
                    quanta: Mapping[str, float] | None = None) -> Verification:
    """Emulate `func` (sampled blocks for big grids; `emulate_sampled`) and compare the
    outputs the run wrote with `expected` (float64 references by output name, reshaped to
    the buffer's size). An output with a quantization step in `quanta` may lie one step off
    the reference in a few elements (`wpk.core.numerics.rounding_flips`), which leave the
    L2 error."""
    rng = np.random.default_rng(seed)
    try:
        got, ran, total = emulate_sampled(func, feeds, rng, full_grid_blocks,
                                          full_before_last)
    except EmulatorError as exc:
        return Verification(False, math.inf, 0, 0, 0, f"emulator: {exc.message}")
    sampled = ran < total
    checked, num, den = 0, 0.0, 0.0
    for name, out in got.items():
        ref = np.asarray(expected[name], np.float64).reshape(-1)
        out = out.reshape(-1).astype(np.float64)
        written = ~np.isnan(out)
        if not sampled and not written.all():
            missing = int(np.argmin(written))
            return Verification(False, math.inf, ran, total, checked,
                                f"output {name}[{missing}] was never written")
        if (quanta or {}).get(name):
            flips, why = rounding_flips(out[written], ref[written], quanta[name])
            if flips is None:
                return Verification(False, math.inf, ran, total, checked, f"output {name}: {why}")
            written[written] = ~flips
        checked += int(written.sum())
        num += float(np.sum((out[written] - ref[written]) ** 2))
        den += float(np.sum(ref[written] ** 2))
    if checked == 0:
        return Verification(False, math.inf, ran, total, 0,
                            "the emulated blocks wrote no output element")
    error = math.sqrt(num / den) if den > 0 else math.sqrt(num)
    ok = bool(np.isfinite(error) and error <= tolerance)
    message = "" if ok else f"relative L2 error {error:.3g} over {checked} emulated outputs " \
                            f"exceeds {tolerance:g}"
    return Verification(ok, error, ran, total, checked, message)


def cubin_arch(cubin: bytes) -> str:
    """'sm_XY' a cubin was compiled for, read from its ELF header (e_flags: the arch is the
    low byte in the older CUDA ELF ABI, the second byte in the newer one, OS ABI 0x41)."""
    if cubin[:4] != b"\x7fELF" or len(cubin) < 52:
        raise ValueError("not a cubin (no ELF header)")
    flags = struct.unpack_from("<I", cubin, 48)[0]
    number = (flags >> 8) & 0xFF if cubin[7] == 0x41 else flags & 0xFF
    return f"sm_{number}"
