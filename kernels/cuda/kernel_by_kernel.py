"""Sampled emulation of a big multi-kernel CUDA module, one kernel at a time.

    result = verify_kernel_by_kernel(func, feeds, expected, tolerance)

`offline.verify_emulated` runs a pipeline (Winograd's input transform, batched GEMM
and output transform; a reduction cut into parts) with every kernel before the last
over its whole grid, because each output needs intermediates from all over the earlier
grids. On VGG-19's 64-channel 224x224 convs that is 7 million emulated threads per
kernel and about a minute per config. Here each kernel is checked on its own sampled
blocks instead, which is as strict for the code and costs a few seconds:

1. The kernels run in order. Before each one, the intermediates it reads hold defined
   values: the earlier kernels' sampled outputs, every element they did not write
   filled with seeded random numbers (positive, so logs and divisions stay finite).
   Its own output starts as a NaN of a payload no computation writes.
2. It runs on sampled blocks (`offline.sample_blocks`; small grids fully). The elements
   it wrote are compared with the float64 reference interpreter evaluated at exactly
   those elements, on the inputs the kernel read (`wpk.dsl.evaluate.evaluate_points`).
   Every kernel must write something, and a fully run kernel must write its whole
   output.
3. The operator itself: at the output elements the last kernel checked (a seeded sample
   of 4096 when it wrote more), the reference interpreter on the real inputs
   (intermediates computed only where those elements need them) must match the
   caller's reference (onnxruntime's semantics), which catches a wrong mapping of the
   workload onto the operator, a wrong constant (Winograd's transformed filter) or a
   wrong epilogue.

What it does not see is the rounding that float32 intermediates accumulate across the
kernels; the reported error is the largest single kernel's. Winograd's end-to-end error
bound is checked where a full run is cheap (small grids, the unit tests) and on the
device, and measured per layer by the CPU family that shares its transforms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from wpk.core.numerics import relative_l2
from wpk.dsl import loopir as L
from wpk.dsl.emulator import EmulatorError, global_memory, run_kernel
from wpk.dsl.evaluate import evaluate_points
from wpk.dsl.templates import launch_of
from wpk.kernels.cuda.offline import FULL_GRID_BLOCKS, Verification, sample_blocks

FULL_PIPELINE_LANES = 1 << 16   # pipelines whose earlier kernels have more threads go here
FILL_RANGE = (0.5, 1.5)         # unwritten intermediates: positive, near one
OPERATOR_POINTS = 4096          # sampled outputs the operator check evaluates, at most
_POISON = {2: (np.uint16, 0x7D2A), 4: (np.uint32, 0x7FA5A5A5),   # signalling NaNs by width
           8: (np.uint64, 0x7FF4A5A5A5A5A5A5)}


def earlier_lanes(func: L.PrimFunc) -> int:
    """Threads of every kernel before the last (what a full pipeline run emulates)."""
    return sum(math.prod(launch_of(k).grid) * math.prod(launch_of(k).block)
               for k in func.kernels[:-1])


def checkable(func: L.PrimFunc) -> bool:
    """Whether `func` carries what a kernel-by-kernel check needs: the operator it was
    lowered from, the tensor each kernel writes, and float intermediates only."""
    meta = func.meta
    return ("operator" in meta and "kernel_outputs" in meta
            and all(b.dtype.startswith("f") for b in func.workspaces))


def verify_kernel_by_kernel(func: L.PrimFunc, feeds: Mapping[str, np.ndarray],
                            expected: Mapping[str, np.ndarray], tolerance: float = 1e-4,
                            seed: int = 0, full_grid_blocks: int = FULL_GRID_BLOCKS
                            ) -> Verification:
    """Check every kernel of `func` on sampled blocks against the reference interpreter,
    then the operator against `expected` (float64 outputs by name) where the last kernel
    was checked (see the module docstring)."""
    rng = np.random.default_rng(seed)
    globals_ = global_memory(func, feeds)
    workspaces = {b.name for b in func.workspaces}
    for name in workspaces:
        globals_[name][:] = rng.uniform(*FILL_RANGE, globals_[name].size)
    writes = func.meta["kernel_outputs"]
    ran = total = 0
    worst = 0.0
    checked: dict[str, np.ndarray] = {}
    for kernel, name in zip(func.kernels, writes):
        launch = launch_of(kernel)
        grid = math.prod(launch.grid)
        blocks = sample_blocks(launch.grid, rng) if grid > full_grid_blocks else None
        out = globals_[name]
        _poison(out)
        try:
            run_kernel(func, kernel, launch, globals_, blocks)
        except EmulatorError as exc:
            return Verification(False, math.inf, ran, total, 0, f"emulator: {exc.message}")
        ran, total = ran + (grid if blocks is None else len(blocks)), total + grid
        mask = _written(out)
        written = np.flatnonzero(mask)
        problem = _coverage_problem(kernel.name, name, mask,
                                    blocks is None and writes.count(name) == 1)
        if problem:
            return Verification(False, math.inf, ran, total, 0, problem)
        error = _kernel_error(func, globals_, name, written)
        worst = max(worst, error)
        if not error <= tolerance:
            return Verification(False, error, ran, total, written.size,
                                f"kernel {kernel.name}: relative L2 error {error:.3g} of "
                                f"{name} on its inputs exceeds {tolerance:g}")
        checked[name] = written
        if name in workspaces:
            out[~mask] = rng.uniform(*FILL_RANGE, out.size - written.size)
    return _operator_check(func, feeds, expected, checked, tolerance, worst, ran, total,
                           rng)


def _poison(out: np.ndarray) -> None:
    """Fill `out` with a NaN whose payload no computation produces, so the elements a
    kernel writes are told apart even where it writes NaN (a square root of a negative
    input, as the reference does too)."""
    out.view(_POISON[out.dtype.itemsize][0]).fill(_POISON[out.dtype.itemsize][1])


def _written(out: np.ndarray) -> np.ndarray:
    kind, pattern = _POISON[out.dtype.itemsize]
    return out.view(kind) != pattern


def _coverage_problem(kernel: str, name: str, written: np.ndarray, must_cover: bool) -> str:
    """'' or why the kernel's writes (a mask over `name`) fall short."""
    if not written.any():
        return f"kernel {kernel}: the emulated blocks wrote no element of {name}"
    if must_cover and not written.all():
        return f"kernel {kernel}: {name}[{int(np.argmin(written))}] was never written"
    return ""


def _kernel_error(func: L.PrimFunc, globals_: dict, name: str, written: np.ndarray) -> float:
    """Relative L2 error of the written elements of `name` against the reference
    interpreter on the kernel's inputs as they are in memory."""
    shape = func.buffer(name).shape
    inputs = {b.name: globals_[b.name].reshape(b.shape)
              for b in func.params + func.workspaces
              if b.name != name and b.name not in func.meta["outputs"]}
    points = np.stack(np.unravel_index(written, shape), axis=1)
    ref = evaluate_points(func.meta["operator"], inputs, name, points,
                          func.meta.get("bindings"))
    return relative_l2(globals_[name][written], ref)


def _operator_check(func, feeds, expected, checked, tolerance, worst, ran, total, rng
                    ) -> Verification:
    """The operator's outputs at (up to OPERATOR_POINTS of) the checked elements, from
    the real inputs, against the caller's reference."""
    elements = 0
    for name in func.meta["outputs"]:
        written = checked.get(name)
        if written is None:
            return Verification(False, math.inf, ran, total, 0,
                                f"no kernel of {func.name} writes its output {name}")
        elements += written.size
        if written.size > OPERATOR_POINTS:
            written = np.sort(rng.choice(written, OPERATOR_POINTS, replace=False))
        buffer = func.buffer(name)
        points = np.stack(np.unravel_index(written, buffer.shape), axis=1)
        params = {b.name: np.asarray(feeds[b.name]).reshape(b.shape) for b in func.params
                  if b.name not in func.meta["outputs"]}
        ours = evaluate_points(func.meta["operator"], params, name, points,
                               func.meta.get("bindings"))
        ref = np.asarray(expected[name], np.float64).reshape(-1)[written]
        error = relative_l2(ours, ref)
        if not error <= tolerance:
            return Verification(False, error, ran, total, written.size,
                                f"the operator differs from the reference: relative L2 "
                                f"error {error:.3g} of {name} over {written.size} sampled "
                                f"outputs exceeds {tolerance:g}")
    return Verification(True, worst, ran, total, elements)
