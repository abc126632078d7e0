"""`micro.nchwc`: the NCHWc convolution micro-kernels as a registered implementation.

    MICRO_NCHWC.configs(workload)    # [default config]: what an untuned build measures
    kernel = MICRO_NCHWC.prepare(workload, consts, config)   # kernel(inputs, outputs)
    MicroKernels().template(workload)   # its config space, for the GA/RL tuners

An untuned build measures the default config next to onnxruntime's MLAS kernel
(`ort.nchwc`) and the planner keeps the faster verified one, so adding it never
makes a plan slower. `prepare` packs the filter in the tile's order and the
bias to whole tiles, keeps a pool of a phase-split config's scratch buffers (one per
concurrent call: `scratch.ScratchPool`), and compiles the source of
`templates.conv_source` for the config's ISA through the compile cache. A network's
first conv (NCHW input with fewer channels than a block, the stem) is one of its
workloads: its tile broadcasts single input channels, where onnxruntime's MLAS has its
NCHW-input conv kernel.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c, load_function
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.algorithms import conv_algorithm
from wpk.kernels.cpu.microkernels.family import MicroFamily
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags
from wpk.kernels.cpu.microkernels.scratch import ScratchPool
from wpk.kernels.cpu.microkernels.space import (
    ConvGeometry,
    MicroSpace,
    config_reason,
    conv_geometry,
    default_config,
    narrow_group_width,
    sparse_group_count,
)
from wpk.kernels.cpu.microkernels.templates import conv_source, split_floats
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register


def pack_conv_filter(weight: np.ndarray, g: ConvGeometry, lanes: int, kv: int) -> np.ndarray:
    """OIHW -> [tiles, CB, R, S, in_block, kv*lanes]: for each input channel the tile's
    output channels are contiguous; output channels zero padded to whole tiles, input
    channels to whole blocks (an NCHW input's blocks are single channels; a grouped
    conv's CB is one group's blocks)."""
    tk = kv * lanes
    tiles = -(-g.out_vectors(lanes) // kv)
    o, i, r, s = weight.shape
    blocks = g.reduction_blocks   # a grouped conv's filter holds one group's inputs
    padded = np.zeros((tiles * tk, blocks * g.in_block, r, s), np.float32)
    padded[:o, :i] = weight
    packed = padded.reshape(tiles, tk, blocks, g.in_block, r, s).transpose(0, 2, 4, 5, 3, 1)
    if g.sparse_groups:
        packed = _band_filter(packed, g.tile_bands(lanes, kv))
    return np.ascontiguousarray(packed)


def _band_filter(packed: np.ndarray, bands: list[tuple[int, int]]) -> np.ndarray:
    """A packed dense filter [tiles, CB, ...] cut to each tile's band of input blocks,
    [tiles, widest band, ...] (zero past a narrower band); ValueError where a weight
    outside its tile's band is not zero (the filter is not of those sparse groups)."""
    widest = max(count for _, count in bands)
    out = np.zeros((packed.shape[0], widest, *packed.shape[2:]), np.float32)
    for t, (first, count) in enumerate(bands):
        out[t, :count] = packed[t, first:first + count]
        if np.count_nonzero(packed[t, :first]) or np.count_nonzero(packed[t, first + count:]):
            raise ValueError("the filter is not zero outside its sparse groups")
    return out


def narrow_filter(weight: np.ndarray, width: int) -> np.ndarray:
    """The [O, width, R, S] filter of narrow groups from their widened one [O, block, R, S]
    (ValueError where a weight outside an output channel's own group is not zero)."""
    o, block = weight.shape[:2]
    lanes = fmt.narrow_group_lanes(o, block, width)
    if np.any(weight[~lanes]):
        raise ValueError(f"the filter is not zero outside its groups of {width} channels")
    return np.ascontiguousarray(weight[lanes].reshape(o, width, *weight.shape[2:]))


def pack_depthwise_filter(weight: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """[O, GW, R, S] -> [KB, R, GW, S, block] (GW the input channels of a group: 1 for a
    depthwise conv; a widened filter of narrow groups first cut to them), zero padded
    channels."""
    if g.group_width:
        weight = narrow_filter(weight, g.group_width)
    o, width, r, s = weight.shape
    padded = np.zeros((g.kb * g.block, width, r, s), np.float32)
    padded[:o] = weight
    return np.ascontiguousarray(padded.reshape(g.kb, g.block, width, r, s)
                                .transpose(0, 3, 2, 4, 1))


def pack_bias(bias: np.ndarray | None, length: int) -> np.ndarray:
    """The bias zero padded to `length` floats (zeros without a bias)."""
    out = np.zeros(length, np.float32)
    if bias is not None:
        out[: bias.shape[0]] = bias
    return out


def _geometry(workload: Workload) -> ConvGeometry:
    g = conv_geometry(workload, nchw_input=True)
    if isinstance(g, str):
        raise ValueError(f"{workload.label}: {g}")
    return g


def compile_micro(workload: Mapping, config: Mapping) -> str:
    """Compile a workload's micro-kernel into the compile cache (a `CompileJob` function);
    the shared library's path."""
    w = Workload.from_json(workload)
    isa = ISAS[str(config["isa"])]
    return str(compile_c(conv_source(_geometry(w), config), compile_flags(isa)).path)


def load_micro(g: ConvGeometry, config: Mapping):
    """The loaded C function `wpk_micro_conv(x, w, bias, sum, y, scratch)` of `g` under
    `config` (compiled once)."""
    isa = ISAS[str(config["isa"])]
    library = compile_c(conv_source(g, config), compile_flags(isa)).path
    build.openmp_defaults()
    return load_function(library, "wpk_micro_conv", [ctypes.c_void_p] * 6)


class MicroNchwc(Implementation):
    """Generated NCHWc convolutions with explicit register tiles (see the module docstring)."""

    name = "micro.nchwc"
    kind = GENERATED
    target = "cpu"
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        g = conv_geometry(workload, nchw_input=True)
        if isinstance(g, str):
            return g
        return None if MicroSpace(g).isas else "no usable ISA's vector divides the block"

    def configs(self, workload: Workload) -> list[dict]:
        """The default config (an untuned build measures it next to onnxruntime's)."""
        return [default_config(_geometry(workload))]

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'depthwise', '1x1' or 'direct' (`conv_algorithm`), 'direct (NCHW input)' for a
        stem, 'grouped, N channels a group in a vector' for narrow groups (reduced like a
        depthwise conv), with ', N groups in bands of blocks' for sparse groups (each tile
        reducing over its groups' input blocks), ', phase split' when the config splits a
        strided conv's input (', padded input' for a stride-1 conv: its one phase)."""
        name = conv_algorithm(workload)
        if len(workload.inputs[0].shape) == 4:
            name = "direct (NCHW input)"
        width = narrow_group_width(workload)
        if width and not isinstance(width, str):
            name = f"grouped, {width} channels a group in a vector"
        sparse = sparse_group_count(workload)
        if sparse and not isinstance(sparse, str):
            name = f"{name}, {sparse} groups in bands of blocks"
        if not int(config.get("split", 0) or 0):
            return name
        strided = any(int(v) > 1 for v in dict(workload.attrs).get("strides", (1, 1)))
        return name + (", phase split" if strided else ", padded input")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        g = _geometry(workload)
        reason = config_reason(g, config)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        lanes, kv = ISAS[str(config["isa"])].lanes, int(config["kv"])
        weight = np.asarray(consts[1], np.float32)
        bias = np.asarray(consts[2], np.float32) if g.has_bias else None
        if g.within_vector:
            packed = pack_depthwise_filter(weight, g)
            packed_bias = pack_bias(bias, g.kb * g.block)
        else:
            packed = pack_conv_filter(weight, g, lanes, kv)
            packed_bias = pack_bias(bias, packed.shape[0] * kv * lanes)
        fn = load_micro(g, config)
        floats = split_floats(g, config)   # the phase split's buffer, one per concurrent call
        pool = ScratchPool(floats) if floats else None
        w_ptr, b_ptr = packed.ctypes.data, packed_bias.ctypes.data
        out_spec = workload.outputs[0]
        sum_index = g.sum_index

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if not (out.flags.c_contiguous and out.dtype == np.float32) \
                    or out.shape != out_spec.shape:
                raise ValueError(f"micro.nchwc writes C-contiguous float32 {out_spec.shape}")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            s = None if sum_index is None else np.ascontiguousarray(inputs[sum_index],
                                                                    dtype=np.float32)
            if s is not None and np.shares_memory(s, out):   # y holds partial sums first
                s = s.copy()
            scratch = pool.take() if pool else None
            try:
                fn(x.ctypes.data, w_ptr, b_ptr, None if s is None else s.ctypes.data,
                   out.ctypes.data, None if scratch is None else scratch.ctypes.data)
            finally:
                if scratch is not None:
                    pool.give(scratch)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers as (function, pointers), when it copies nothing."""
            x, out = inputs[0], outputs[0]
            s = None if sum_index is None else inputs[sum_index]
            if not (plain(x) and plain(out, out_spec.shape)) or \
                    (s is not None and (not plain(s) or np.shares_memory(s, out))):
                return None
            return function_address(fn), (x.ctypes.data, w_ptr, b_ptr,
                                           0 if s is None else s.ctypes.data,
                                           out.ctypes.data, pool.reserve() if pool else 0)

        kernel.native = native
        kernel.keep = (packed, packed_bias, pool)   # live as long as the kernel
        return kernel


MICRO_NCHWC = register(MicroNchwc())


class MicroKernels(MicroFamily):
    """The micro-kernels as a target's generated kernels: what `wpk.search.driver`'s
    `tune_workload` searches (`template` is the workload's `MicroSpace`)."""

    implementation = MICRO_NCHWC
    compile_function = "wpk.kernels.cpu.microkernels.kernel:compile_micro"

    def template(self, workload: Workload) -> MicroSpace:
        return MicroSpace(_geometry(workload))
