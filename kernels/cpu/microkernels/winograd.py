"""`micro.winograd`: Winograd F(2x2, 3x3) and F(4x4, 3x3) NCHWc convolutions, registered.

    MICRO_WINOGRAD.configs(workload)    # F(2, 3) and F(4, 3) defaults: an untuned build
                                        # measures both next to ort.nchwc and micro.nchwc
    kernel = MICRO_WINOGRAD.prepare(workload, consts, config)   # kernel(inputs, outputs)
    WinogradKernels().template(workload)   # its config space (m is a knob), for GA/RL

`prepare` transforms the filter once (G g G^T in float64, then float32), packs
it for the batched GEMM's register tile (`pack_winograd_filter`), and compiles
`winograd_templates.winograd_source` for the config's ISA through the compile
cache. A kernel call takes a scratch buffer from its own pool (a concurrent
call gets another), so calls never allocate after the first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c, load_function
from wpk.kernels.cpu.microkernels.family import MicroFamily
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags
from wpk.kernels.cpu.microkernels.kernel import pack_bias
from wpk.kernels.cpu.microkernels.scratch import ScratchPool
from wpk.kernels.cpu.microkernels.space import ConvGeometry, conv_geometry
from wpk.kernels.cpu.microkernels.winograd_space import (
    M_CHOICES,
    WinogradSpace,
    config_reason,
    default_config,
    error_bound,
    filter_transform_matrix,
    winograd_reason,
)
from wpk.kernels.cpu.microkernels.winograd_templates import (
    winograd_scratch_floats,
    winograd_source,
)
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register


def pack_winograd_filter(weight: np.ndarray, geometry: ConvGeometry, m: int, lanes: int,
                         kv: int) -> np.ndarray:
    """The transformed filter as the GEMM reads it: [(m+2)^2, KT, CB * block, kv * lanes]
    (for each tile position and input channel, a tile's output channels contiguous);
    output channels zero padded to whole tiles, input channels to whole blocks. The values
    of `filter_transform` (the same float64 products), computed a tile of output channels
    at a time straight into that order through two small float64 buffers: a 512 x 512
    layer packs in 8-18 ms where transforming all filters first took 17-44 (a float64
    copy of the weight and a [36, O, I] float64 array of 75 MB written and read again)."""
    tk = kv * lanes
    kt = -(-geometry.out_vectors(lanes) // kv)
    t2 = (m + 2) ** 2
    out_channels, in_channels = weight.shape[:2]
    g_kron_g = filter_transform_matrix(m)
    filters = np.asarray(weight, np.float32).reshape(out_channels, in_channels, 9)
    packed = np.zeros((t2, kt, geometry.cb * geometry.block, tk), np.float32)
    by_input = np.empty((9, in_channels, tk))            # a tile's filters, [9, I, n]
    product = np.empty((t2, in_channels * tk))
    for tile in range(kt):
        rows = filters[tile * tk:(tile + 1) * tk]           # [n, I, 9]
        n = rows.shape[0]
        if n == 0:
            break
        tile_filters = by_input[:, :, :n]
        tile_filters[...] = rows.transpose(2, 1, 0)
        tile_product = product[:, :in_channels * n]
        np.matmul(g_kron_g, tile_filters.reshape(9, in_channels * n), out=tile_product)
        packed[:, tile, :in_channels, :n] = tile_product.reshape(t2, in_channels, n)
    return packed


def _geometry(workload: Workload) -> ConvGeometry:
    reason = winograd_reason(workload)
    if reason:
        raise ValueError(f"{workload.label}: {reason}")
    return conv_geometry(workload)


def compile_winograd(workload: Mapping, config: Mapping) -> str:
    """Compile a workload's Winograd kernel into the compile cache (a `CompileJob`
    function); the shared library's path."""
    g = _geometry(Workload.from_json(workload))
    isa = ISAS[str(config["isa"])]
    return str(compile_c(winograd_source(g, config), compile_flags(isa)).path)


def load_winograd(g: ConvGeometry, config: Mapping):
    """The loaded C function `wpk_winograd_conv` of `g` under `config` (compiled once)."""
    isa = ISAS[str(config["isa"])]
    library = compile_c(winograd_source(g, config), compile_flags(isa)).path
    build.openmp_defaults()
    return load_function(library, "wpk_winograd_conv", [ctypes.c_void_p] * 6)


class MicroWinograd(Implementation):
    """Winograd NCHWc convolutions (see the module docstring)."""

    name = "micro.winograd"
    kind = GENERATED
    target = "cpu"
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        reason = winograd_reason(workload)
        if reason:
            return reason
        g = conv_geometry(workload)
        if not WinogradSpace(g).isas:
            return "no usable ISA's vector divides the block"
        reasons = [config_reason(g, default_config(g, m=m)) for m in M_CHOICES]
        return None if None in reasons else reasons[0]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'winograd F(m x m, 3x3)' with the config's output tile m."""
        m = int(config.get("m", 0) or 0)
        return f"winograd F({m}x{m},3x3)" if m else "winograd"

    def tolerance(self, workload: Workload, config: Mapping) -> float | None:
        """`winograd_space.error_bound` of the config's m: scaled by the reduction length."""
        m = int(config.get("m", 4))
        return error_bound(_geometry(workload), m) if m in M_CHOICES else None

    def configs(self, workload: Workload) -> list[dict]:
        """The default config of each tile size (an untuned build measures both)."""
        g = _geometry(workload)
        found = [default_config(g, m=m) for m in M_CHOICES]
        return [c for c in found if config_reason(g, c) is None]

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        g = _geometry(workload)
        reason = config_reason(g, config)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        lanes, kv, m = ISAS[str(config["isa"])].lanes, int(config["kv"]), int(config["m"])
        packed = pack_winograd_filter(np.asarray(consts[1], np.float32), g, m, lanes, kv)
        bias = np.asarray(consts[2], np.float32) if g.has_bias else None
        packed_bias = pack_bias(bias, packed.shape[1] * kv * lanes)
        fn = load_winograd(g, config)
        pool = ScratchPool(winograd_scratch_floats(g, config))
        u_ptr, b_ptr = packed.ctypes.data, packed_bias.ctypes.data
        out_spec, sum_index = workload.outputs[0], g.sum_index

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if not (out.flags.c_contiguous and out.dtype == np.float32) \
                    or out.shape != out_spec.shape:
                raise ValueError(f"micro.winograd writes C-contiguous float32 {out_spec.shape}")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            # each output element reads its own residual element just before writing it, so
            # a residual that is the output buffer itself is fine
            s = None if sum_index is None else np.ascontiguousarray(inputs[sum_index],
                                                                    dtype=np.float32)
            scratch = pool.take()
            try:
                fn(x.ctypes.data, u_ptr, b_ptr, None if s is None else s.ctypes.data,
                   out.ctypes.data, scratch.ctypes.data)
            finally:
                pool.give(scratch)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers as (function, pointers), with a scratch buffer of
            its own, when it copies nothing."""
            x, out = inputs[0], outputs[0]
            s = None if sum_index is None else inputs[sum_index]
            if not (plain(x) and plain(out, out_spec.shape) and (s is None or plain(s))):
                return None
            return function_address(fn), (x.ctypes.data, u_ptr, b_ptr,
                                           0 if s is None else s.ctypes.data,
                                           out.ctypes.data, pool.reserve())

        kernel.native = native
        kernel.keep = (packed, packed_bias, pool)   # they live as long as the kernel
        return kernel


MICRO_WINOGRAD = register(MicroWinograd())


class WinogradKernels(MicroFamily):
    """The Winograd kernels as a target's generated kernels: what `wpk.search.driver`'s
    `tune_workload` searches (`template` is the workload's `WinogradSpace`, m a knob)."""

    implementation = MICRO_WINOGRAD
    compile_function = "wpk.kernels.cpu.microkernels.winograd:compile_winograd"

    def template(self, workload: Workload) -> WinogradSpace:
        return WinogradSpace(_geometry(workload))
