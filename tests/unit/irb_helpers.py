"""Shared pieces of the inverted-residual block tests: blocked random inputs, a poisoned
run, numpy activations by their definition, the fused-kernel-vs-reference check, the
compiled kernel's channel-split and shared-rows decisions and an OpenMP team size for a
test."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

import numpy as np

from wpk.core.numerics import relative_l2
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.inverted_residual_spec import inverted_residual_reason
from wpk.kernels.cpu.microkernels.inverted_residual import MICRO_INVERTED_RESIDUAL
from wpk.kernels.cpu.microkernels.ir_space import block_geometry, default_config
from wpk.kernels.cpu.microkernels.ir_templates import block_source
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags
from wpk.kernels.reference import reference

TOLERANCE = 1e-5


def arrays_for(workload, rng: np.random.Generator, block: int) -> tuple[list, dict]:
    """Blocked input (padding lanes zero, as the layout keeps them) and constants."""
    x = workload.inputs[0]
    channels = workload.inputs[3].shape[0] if workload.inputs[1] is None \
        else workload.inputs[1].shape[1]
    logical = rng.standard_normal((x.shape[0], channels, *x.shape[2:4])).astype(np.float32)
    count = len(workload.inputs)
    consts = {i: (rng.standard_normal(workload.inputs[i].shape) * 0.4).astype(np.float32)
              for i in range(1, count) if workload.inputs[i] is not None}
    return [fmt.block(logical, block), *(consts.get(i) for i in range(1, count))], consts


def run(kernel, workload, arrays) -> np.ndarray:
    """The kernel's output, written over a NaN-poisoned buffer (every element must be set)."""
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(arrays, [out])
    assert np.isfinite(out).all()
    return out


def activation(v, act):
    """numpy activation `act` = (name, attribute pairs), by the ONNX definition."""
    name, attrs = act[0], dict(act[1])
    if name == "clip":
        return np.clip(v, attrs["min"], attrs["max"])
    if name == "relu":
        return np.maximum(v, 0)
    if name == "leaky_relu":
        return np.where(v > 0, v, v * attrs["alpha"])
    if name == "hard_swish":
        return v * np.clip(v / 6 + 0.5, 0, 1)
    if name == "hard_sigmoid":
        attrs = {"alpha": 0.2, "beta": 0.5, **attrs}
        return np.clip(v * attrs["alpha"] + attrs["beta"], 0, 1)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-v))
    if name == "silu":
        return v / (1 + np.exp(-v))
    assert name == "", name
    return v


def check_fused_kernel(workload, isa: str, block: int) -> None:
    """The fused kernel's default config for `isa` matches the float64 reference."""
    assert inverted_residual_reason(workload) is None
    arrays, consts = arrays_for(workload, np.random.default_rng(2), block)
    expected = reference(workload, arrays)[0]
    config = default_config(block_geometry(workload), isa)
    out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload, arrays)
    assert relative_l2(out, expected) < TOLERANCE, config


def _kernel_decision(workload, config, function: str, threads: int) -> int:
    """What the compiled kernel's exported `int function(int threads)` answers."""
    from wpk.dsl.toolchain import compile_c, load_function

    library = compile_c(block_source(block_geometry(workload), config),
                        compile_flags(ISAS[str(config["isa"])])).path
    return load_function(library, function, [ctypes.c_int], ctypes.c_int)(threads)


def channel_chunks(workload, config, threads: int) -> int:
    """How the compiled kernel splits its first phase on `threads` threads (0: rows)."""
    return _kernel_decision(workload, config, "wpk_ir_channel_chunks", threads)


def shared_strips(workload, config, threads: int) -> int:
    """The strips per image whose boundary rows the compiled kernel shares on `threads`
    threads (0: the strips compute them twice)."""
    return _kernel_decision(workload, config, "wpk_ir_shared_strips", threads)


@contextlib.contextmanager
def openmp_threads(threads: int):
    """OpenMP's team size set to `threads` for the block, then restored."""
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(threads)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)
