"""Implementations of wpk's fused attention (`wpk.kernels.cpu.attention_spec`).

- `attention.c` (kind `generated`): the generated C kernel of
  `wpk.kernels.cpu.attention_c` (query tiles, online softmax, OpenMP over
  (batch*head, query tile)); its configs are a small schedule space (query
  tile, key tile, micro-tile rows, vector width), each compiled for this
  host's ISA through the compile cache.
- `ort.attention` (kind `vendor`): onnxruntime running the standard nodes the
  fused op replaced ([Transpose], MatMul, Mul, [Add], Softmax, MatMul) in one
  session, so the planner keeps the fused kernel only where it beats them; it
  joins onnxruntime regions like any single-node onnxruntime step.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.devices import host_cpu
from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import c_flags, load_function
from wpk.kernels.cpu.attention_c import KNOBS, attention_source, config_reason
from wpk.kernels.cpu.attention_spec import (
    AttentionShape,
    attention_onnx_nodes,
    attention_reason,
    attention_shape,
    bshd_flags,
    kernel_rank,
    logical_shapes,
)
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.node_model import OnnxPart, expanded_model, input_name, output_name
from wpk.kernels.cpu.ort_node import create_session, session_kernel
from wpk.kernels.registry import GENERATED, VENDOR, Implementation, Kernel, register

# ISO C (-std=c11) turns floating-point contraction off; the kernel wants its FMAs.
EXTRA_FLAGS = ("-ffp-contract=fast",)
# Below this many flops a problem is also measured on the calling thread alone.
SMALL_FLOPS = 32e6
# Score micro-tiles (keys, vectors of queries), preferred first.
_MICRO_TILES = ((4, 4), (8, 2), (4, 2), (2, 4), (6, 2), (2, 2), (1, 2), (1, 1))
# With 16 vector registers (AVX2) also 6 keys x 2 query vectors, the micro-tile that keeps
# 12 of them accumulating (4 x 2 keeps 8, two FMA ports' latency and no slack), with key
# tiles of 96 and 144 (multiples of 6); the P V product takes its 6 queries at a time and
# the query tile's remainder in one narrower micro-tile. On an AVX2 run
# (scripts/avx2_only.sh on an AMX VM) 64 x 96 tiles ran seq 128 and 256 7-12% faster than
# the best 4 x 2 schedule, and seq 512 as fast as 48 x 96 (whose tiles padded seq 128 and
# 256 by 12%, the first form of this tile); 144-key tiles, one key step fewer where a
# padding mask leaves 102 or 204 keys, 0-10% faster than 96 there; measured as more
# candidates, chosen only where faster.
_WIDE_TILE = (6, 2)
_WIDE_KEY_TILES = (96, 144)


def _heads_and_rank(workload: Workload) -> tuple[int, int]:
    shape = logical_shapes(workload)[0]
    return (shape[-3] if len(shape) >= 4 else 1), kernel_rank(len(shape))


def attention_configs(workload: Workload, lanes: int | None = None) -> list[dict]:
    """The schedules worth measuring, at the host's vector width: query tile 32/64, key tile
    64/128 (tiles much larger than the sequence left out), and per tile pair the first two
    score micro-tiles (keys x query vectors) that fit it and the register file; with 16
    vector registers also the 6 x 2 micro-tile with key tiles 96 and 144 per query tile;
    for small problems also the first two on the calling thread alone (`par` 0)."""
    shape = attention_shape(workload)
    vw = lanes or host_cpu().vector_lanes
    registers = 32 if vw >= 16 else 16
    found = []
    for tq in (32, 64):
        if tq > 32 and tq >= 2 * shape.sq:
            continue
        for tk in (64, 128):
            if tk > 64 and tk >= 2 * shape.sk:
                continue
            configs = [{"tq": tq, "tk": tk, "vw": vw, "mr": mr, "nr": nr}
                       for mr, nr in _MICRO_TILES if (mr + 1) * nr + 1 <= registers]
            found += [c for c in configs if config_reason(shape, c) is None][:2]
        if registers == 16:
            found += _wide_tile_configs(shape, tq, vw)
    flops = 2 * shape.batch * shape.sq * shape.sk * (shape.d + shape.dv)
    if flops < SMALL_FLOPS:   # small enough that waking threads may cost more than it saves
        found += [{**config, "par": 0} for config in found[:2]]
    return found


def _wide_tile_configs(shape: AttentionShape, tq: int, vw: int) -> list[dict]:
    """`_WIDE_TILE`'s configs for query tile `tq`, one per key tile of `_WIDE_KEY_TILES`
    under twice the keys, where valid."""
    mr, nr = _WIDE_TILE
    configs = [{"tq": tq, "tk": tk, "vw": vw, "mr": mr, "nr": nr}
               for tk in _WIDE_KEY_TILES if tk < 2 * shape.sk]
    return [c for c in configs if config_reason(shape, c) is None]


def compile_attention(workload: Workload, config: Mapping):
    """The loaded C function `wpk_attention` of the workload under `config` (compiled once
    per source, flags and compiler: `wpk.dsl.toolchain`'s cache, keyed by the host ISA)."""
    heads, rank = _heads_and_rank(workload)
    source = attention_source(attention_shape(workload), heads, rank, config,
                              bshd_flags(workload))
    library = build.compile_c(source, (*c_flags(), *EXTRA_FLAGS))
    build.openmp_defaults()
    return load_function(library, "wpk_attention", [ctypes.c_void_p] * 5)


def _pointer(array: np.ndarray | None, keep: list) -> int | None:
    if array is None:
        return None
    if not (array.flags.c_contiguous and array.dtype == np.float32):
        array = np.ascontiguousarray(array, dtype=np.float32)
        keep.append(array)
    return array.ctypes.data


class AttentionC(Implementation):
    """The generated fused attention kernel (see the module docstring)."""

    name = "attention.c"
    kind = GENERATED
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        return attention_reason(workload)

    def configs(self, workload: Workload) -> list[dict]:
        return attention_configs(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "fused, online softmax"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        reason = attention_reason(workload) or config_reason(attention_shape(workload), config)
        if reason:
            raise ValueError(f"{workload.label}: {reason} (knobs: {', '.join(KNOBS)})")
        fn = compile_attention(workload, config)
        has_mask = len(workload.inputs) > 3 and workload.inputs[3] is not None

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if not (out.flags.c_contiguous and out.dtype == np.float32):
                raise ValueError("attention.c writes C-contiguous float32 outputs")
            keep: list = []
            mask = _pointer(inputs[3], keep) if has_mask else None
            fn(_pointer(inputs[0], keep), _pointer(inputs[1], keep), _pointer(inputs[2], keep),
               mask, out.ctypes.data)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers when every operand is passed as it is."""
            q, k, v = inputs[:3]
            mask = inputs[3] if has_mask else None
            if not all(plain(a) for a in (q, k, v, outputs[0]) + ((mask,) if has_mask else ())):
                return None
            return function_address(fn), (q.ctypes.data, k.ctypes.data, v.ctypes.data,
                                          mask.ctypes.data if has_mask else None,
                                          outputs[0].ctypes.data)

        kernel.native = native
        return kernel


def attention_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The unfused nodes as an ONNX model (inputs `in{i}`, output `out0`; constants as
    initializers) and the workload input indices it is fed, in graph order."""
    shape = attention_shape(workload)
    rank = len(logical_shapes(workload)[0])
    return expanded_model(
        workload, consts,
        lambda names: attention_onnx_nodes(names, output_name(0), "att_", shape.scale,
                                           shape.k_transposed, rank, workload.opset,
                                           bshd_flags(workload)),
        "wpk_attention")


class OrtAttention(Implementation):
    """onnxruntime running the nodes the fused attention replaced (one session)."""

    name = "ort.attention"
    kind = VENDOR
    onnxruntime = True
    uses_blas = False
    joins_regions = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        return attention_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "unfused (MatMul, Softmax, MatMul)"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        model, feeds = attention_model(workload, consts)
        session = create_session(model.SerializeToString(), workload.label,
                                 config.get("threads"))
        return session_kernel(session, workload, [(i, input_name(i)) for i in feeds])

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        model, feeds = attention_model(workload, consts)
        return OnnxPart(model, tuple((input_name(i), i) for i in feeds), (output_name(0),))


ATTENTION_C = register(AttentionC())
ORT_ATTENTION = register(OrtAttention())
