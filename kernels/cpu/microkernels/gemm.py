"""`micro.gemm`: the GEMM micro-kernels (MatMul, Gemm) as a registered implementation.

    MICRO_GEMM.configs(workload)    # [default config]: what an untuned build measures
    kernel = MICRO_GEMM.prepare(workload, consts, config)   # kernel(inputs, outputs)
    GemmKernels().template(workload)   # its config space, for the GA/RL tuners

An untuned build measures the default config next to onnxruntime's MatMul/Gemm
node and numpy's BLAS, and the planner keeps the faster verified one. `prepare`
compiles the source of `gemm_templates.gemm_source` for the config's ISA
through the compile cache and, for a constant B (weights), packs it once in
panel order (alpha applied); a variable B is packed at every call into a
buffer the kernel owns (so one kernel runs one call at a time, as the runtime
runs steps).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c, load_function
from wpk.kernels.algorithms import GEMM
from wpk.kernels.cpu.microkernels.family import MicroFamily
from wpk.kernels.cpu.microkernels.gemm_space import (
    GemmGeometry,
    GemmSpace,
    config_reason,
    default_config,
    gemm_geometry,
)
from wpk.kernels.cpu.microkernels.gemm_templates import gemm_source
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register


def _geometry(workload: Workload) -> GemmGeometry:
    g = gemm_geometry(workload)
    if isinstance(g, str):
        raise ValueError(f"{workload.label}: {g}")
    return g


def _library(g: GemmGeometry, config: Mapping) -> str:
    isa = ISAS[str(config["isa"])]
    source, libraries = gemm_source(g, config)
    return str(compile_c(source, compile_flags(isa), libraries).path)


def compile_gemm(workload: Mapping, config: Mapping) -> str:
    """Compile a workload's GEMM micro-kernel into the compile cache (a `CompileJob`
    function); the shared library's path."""
    return _library(_geometry(Workload.from_json(workload)), config)


def packed_size(g: GemmGeometry, config: Mapping) -> int:
    """Floats of the packed B of `g` under `config` (every B matrix, whole panels)."""
    nr = int(config["nv"]) * ISAS[str(config["isa"])].lanes
    return g.b_count * -(-g.n // nr) * nr * g.k


def load_gemm(g: GemmGeometry, config: Mapping):
    """(pack, gemm): the loaded C functions of `g` under `config` (compiled once)."""
    library = _library(g, config)
    build.openmp_defaults()
    pack = load_function(library, "wpk_gemm_pack", [ctypes.c_void_p] * 2)
    gemm = load_function(library, "wpk_gemm", [ctypes.c_void_p] * 4)
    return pack, gemm


class MicroGemm(Implementation):
    """Generated GEMMs with explicit register tiles (see the module docstring)."""

    name = "micro.gemm"
    kind = GENERATED
    target = "cpu"
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        g = gemm_geometry(workload)
        return g if isinstance(g, str) else None

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return GEMM

    def configs(self, workload: Workload) -> list[dict]:
        """The default config (an untuned build measures it next to the libraries')."""
        return [default_config(_geometry(workload))]

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        g = _geometry(workload)
        reason = config_reason(g, config)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        pack, gemm = load_gemm(g, config)
        packed = np.empty(packed_size(g, config), np.float32)
        if g.const_b:
            b = np.ascontiguousarray(consts[1], dtype=np.float32)
            pack(b.ctypes.data, packed.ctypes.data)
        operand_indices = sorted({op.index for op in g.operands} | ({g.c.index} if g.c else set()))
        ops = (ctypes.c_void_p * max(1, len(workload.inputs)))()
        out_spec = workload.outputs[0]
        p_ptr = packed.ctypes.data

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if not (out.flags.c_contiguous and out.dtype == np.float32) \
                    or out.shape != out_spec.shape:
                raise ValueError(f"micro.gemm writes C-contiguous float32 {out_spec.shape}")
            a = np.ascontiguousarray(inputs[0], dtype=np.float32)
            if not g.const_b:
                b = np.ascontiguousarray(inputs[1], dtype=np.float32)
                pack(b.ctypes.data, p_ptr)
            held = []   # operands stay alive (and unaliased with out) until the call returns
            for index in operand_indices:
                value = np.ascontiguousarray(inputs[index], dtype=np.float32)
                if np.may_share_memory(value, out):
                    value = value.copy()
                held.append(value)
                ops[index] = value.ctypes.data
            if np.may_share_memory(a, out):
                a = a.copy()
            gemm(a.ctypes.data, p_ptr, out.ctypes.data, ops)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers as (function, pointers), with an operand table of
            its own, when B is a constant (packed once) and nothing needs a copy."""
            a, out = inputs[0], outputs[0]
            operands = [inputs[index] for index in operand_indices]
            if not g.const_b or not (plain(a) and plain(out, out_spec.shape)) or \
                    any(not plain(v) or np.may_share_memory(v, out) for v in (a, *operands)):
                return None
            table = (ctypes.c_void_p * len(ops))()
            for index, value in zip(operand_indices, operands):
                table[index] = value.ctypes.data
            kernel.keep += (table,)
            return function_address(gemm), (a.ctypes.data, p_ptr, out.ctypes.data,
                                            ctypes.addressof(table))

        kernel.native = native
        kernel.keep = (packed, ops)   # the packed B lives as long as the kernel
        return kernel


MICRO_GEMM = register(MicroGemm())


class GemmKernels(MicroFamily):
    """The GEMM micro-kernels as a target's generated kernels: what `wpk.search.driver`'s
    `tune_workload` searches (`template` is the workload's `GemmSpace`)."""

    implementation = MICRO_GEMM
    compile_function = "wpk.kernels.cpu.microkernels.gemm:compile_gemm"

    def template(self, workload: Workload) -> GemmSpace:
        return GemmSpace(_geometry(workload))
