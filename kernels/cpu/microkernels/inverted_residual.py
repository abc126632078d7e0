"""Implementations of wpk's fused inverted-residual block (`inverted_residual_spec`).

- `micro.inverted_residual` (kind `generated`): the C kernel of `ir_templates`
  (strips of output rows, the expanded tensor only in a thread's buffer; a
  gated block in two phases, the depthwise output in a scratch array the
  kernel owns); its
  config space (`ir_space.BlockSpace`: strip rows, channel and pixel tiles,
  ISA) is what the GA/RL tuners search, an untuned build measures the default.
- `ort.inverted_residual` (kind `vendor`): onnxruntime running the block's
  separate steps (`block_parts`: MLAS NCHWc Convs, a HardSwish or SiLU node,
  the gate's pool, convs and multiply) in one session, the steps the fused node
  replaced; it joins onnxruntime regions like any onnxruntime step. The planner
  measures both and keeps the faster verified one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.deferred import helper, numpy_helper
from wpk.core.workload import Workload
from wpk.dsl import build
from wpk.dsl.toolchain import compile_c, load_function
from wpk.kernels.cpu.inverted_residual_spec import (
    Part,
    block_parts,
    has_gate,
    inverted_residual_reason,
)
from wpk.kernels.cpu.microkernels.family import MicroFamily
from wpk.kernels.cpu.microkernels.ir_space import (
    BlockGeometry,
    BlockSpace,
    block_geometry,
    config_reason,
    default_config,
)
from wpk.kernels.cpu.microkernels.ir_templates import block_source, gate_padded, scratch_floats
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.nchwc import ORT_NCHWC_DOMAIN, build_ort_model, make_kernel
from wpk.kernels.cpu.nchwc import unsupported_reason as nchwc_unsupported_reason
from wpk.kernels.cpu.nchwc_gate import is_gate_multiply
from wpk.kernels.cpu.nchwc_standard import FRAGMENT_OPSET
from wpk.kernels.cpu.node_model import OnnxPart
from wpk.kernels.registry import GENERATED, VENDOR, Implementation, Kernel, register


def _padded(array: np.ndarray | None, length: int) -> np.ndarray:
    out = np.zeros(length, np.float32)
    if array is not None:
        out[: array.shape[0]] = array
    return out


def pack_pointwise(weight: np.ndarray, in_padded: int, out_padded: int, lanes: int,
                   kv: int) -> np.ndarray:
    """A 1x1 filter [O, I, 1, 1] as [tiles, in_padded, kv * lanes]: per input channel the
    tile's output channels contiguous, both counts zero padded."""
    padded = np.zeros((out_padded, in_padded), np.float32)
    o, i = weight.shape[:2]
    padded[:o, :i] = weight[:, :, 0, 0]
    tk = kv * lanes
    return np.ascontiguousarray(padded.reshape(out_padded // tk, tk, in_padded)
                                .transpose(0, 2, 1))


def pack_block(g: BlockGeometry, consts: Mapping[int, np.ndarray], lanes: int, kv1: int,
               kv2: int) -> np.ndarray:
    """Every parameter of the block in the kernel's order (see `ir_templates`), one array."""
    def const(i):
        return None if consts.get(i) is None else np.asarray(consts[i], np.float32)
    cin, ce, co = g.cb * g.block, g.kbe * g.block, g.kbo * g.block
    w2 = np.zeros((ce, g.k, g.k), np.float32)
    w2[: g.expanded] = const(3)[:, 0]
    w2 = w2.reshape(g.kbe, g.block, g.k, g.k).transpose(0, 2, 3, 1)
    parts = [pack_pointwise(const(1), cin, ce, lanes, kv1), _padded(const(2), ce)] \
        if g.expand else []
    parts += [w2, _padded(const(4), ce), pack_pointwise(const(5), ce, co, lanes, kv2),
              _padded(const(6), co)]
    if g.squeezed:
        parts += pack_gate(g, const(7), const(8), const(9), const(10), lanes)
    return np.ascontiguousarray(np.concatenate([p.reshape(-1) for p in parts]))


def pack_gate(g: BlockGeometry, wr, br, we, be, lanes: int) -> list[np.ndarray]:
    """The gate's two 1x1 convs as the kernel reads them: WR as [CE][SQP] and WE as
    [SQP][CE] (per input channel the outputs contiguous), biases padded, all zero padded."""
    ce, sqp = g.kbe * g.block, gate_padded(g, lanes)
    reduce = np.zeros((ce, sqp), np.float32)
    reduce[: g.expanded, : g.squeezed] = wr[:, :, 0, 0].T
    expand = np.zeros((sqp, ce), np.float32)
    expand[: g.squeezed, : g.expanded] = we[:, :, 0, 0].T
    return [reduce, _padded(br, sqp), expand, _padded(be, ce)]


def _geometry(workload: Workload) -> BlockGeometry:
    g = block_geometry(workload)
    if isinstance(g, str):
        raise ValueError(f"{workload.label}: {g}")
    return g


def compile_block(workload: Mapping, config: Mapping) -> str:
    """Compile a block's kernel into the compile cache (a `CompileJob` function); the
    shared library's path."""
    g = _geometry(Workload.from_json(workload))
    return str(compile_c(block_source(g, config), compile_flags(ISAS[str(config["isa"])])).path)


def load_block(g: BlockGeometry, config: Mapping):
    """The loaded C function `wpk_inverted_residual` of `g` under `config`."""
    library = compile_c(block_source(g, config), compile_flags(ISAS[str(config["isa"])])).path
    build.openmp_defaults()
    return load_function(library, "wpk_inverted_residual", [ctypes.c_void_p] * 4)


class MicroInvertedResidual(Implementation):
    """The generated fused block kernel (see the module docstring)."""

    name = "micro.inverted_residual"
    kind = GENERATED
    target = "cpu"
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        g = block_geometry(workload)
        if isinstance(g, str):
            return g
        return None if BlockSpace(g).isas else "no usable ISA's vector divides the block"

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "fused inverted residual (row strips)"

    def configs(self, workload: Workload) -> list[dict]:
        """The default config (an untuned build measures it next to onnxruntime's nodes)."""
        return [default_config(_geometry(workload))]

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        g = _geometry(workload)
        reason = config_reason(g, config)
        if reason:
            raise ValueError(f"{workload.label}: {reason}")
        lanes = ISAS[str(config["isa"])].lanes
        packed = pack_block(g, consts, lanes, int(config["kv1"]), int(config["kv2"]))
        scratch = np.empty(max(scratch_floats(g, lanes), 1), np.float32)
        fn = load_block(g, config)
        out_spec = workload.outputs[0]
        w_ptr, s_ptr = packed.ctypes.data, scratch.ctypes.data   # about 1 us each a call

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if not (out.flags.c_contiguous and out.dtype == np.float32) \
                    or out.shape != out_spec.shape:
                raise ValueError(f"micro.inverted_residual writes C-contiguous float32 "
                                 f"{out_spec.shape}")
            x = np.ascontiguousarray(inputs[0], dtype=np.float32)
            if np.shares_memory(x, out):   # the residual is read after rows are written
                x = x.copy()
            fn(x.ctypes.data, w_ptr, out.ctypes.data, s_ptr)

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers as (function, pointers), when it copies nothing."""
            x, out = inputs[0], outputs[0]
            if not (plain(x) and plain(out, out_spec.shape)) or np.shares_memory(x, out):
                return None
            return function_address(fn), (x.ctypes.data, w_ptr, out.ctypes.data, s_ptr)

        kernel.native = native
        kernel.keep = (packed, scratch)   # they live as long as the kernel
        return kernel


def _rename(graph, prefix: str, keep: Mapping[str, str]) -> None:
    """Prefix every tensor and node name of a part's graph, except those in `keep`, which
    become their mapped names."""
    def name(value: str) -> str:
        return keep.get(value, prefix + value) if value else value
    for node in graph.node:
        node.input[:] = [name(v) for v in node.input]
        node.output[:] = [name(v) for v in node.output]
        node.name = prefix + (node.name or node.op_type)
    for tensor in graph.initializer:
        tensor.name = name(tensor.name)


def _link(part: Part, index: int) -> str:
    """The separate model's tensor feeding input `index` of `part`."""
    source = part.inputs[index]
    return "x" if source == 0 else source if isinstance(source, str) else f"in{source}"


def _part_model(part: Part, consts: Mapping[int, np.ndarray], prefix: str):
    """A part's onnxruntime fragment, its tensors renamed into the block's model (a gate
    multiply reads the gate through a Reshape to the filter shape it binds)."""
    own = {k: consts.get(i) for k, i in enumerate(part.inputs) if isinstance(i, int) and i}
    model, feeds = build_ort_model(part.workload, own)
    graph = model.graph
    keep = {name: _link(part, index) for name, index in feeds}
    keep["y"] = part.output
    nodes = []
    if is_gate_multiply(part.workload):
        shape = [d.dim_value for d in graph.input[1].type.tensor_type.shape.dim]
        keep["gate"] = prefix + "gate"
        nodes.append(helper.make_node("Reshape", [_link(part, 1), prefix + "gate_shape"],
                                      [prefix + "gate"], prefix + "gate_reshape"))
        graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64),
                                                         "gate_shape"))
    _rename(graph, prefix, keep)
    return nodes + list(graph.node), list(graph.initializer), graph


def separate_model(workload: Workload, consts: Mapping[int, np.ndarray]):
    """The block's separate steps (`block_parts`) as one onnxruntime model of MLAS NCHWc
    and standard nodes (input 'x', output 'y')."""
    nodes, initializers = [], []
    parts = block_parts(workload)
    for index, part in enumerate(parts):
        part_nodes_, part_inits, graph = _part_model(part, consts, f"p{index}_")
        nodes += part_nodes_
        initializers += part_inits
        if index == 0:
            x_info = graph.input[0]
        if index == len(parts) - 1:
            y_info = graph.output[0]
    x_info.name, y_info.name = "x", "y"
    graph = helper.make_graph(nodes, "wpk_inverted_residual", [x_info], [y_info], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FRAGMENT_OPSET),
                                                    helper.make_opsetid(ORT_NCHWC_DOMAIN, 1)])
    model.ir_version = 8
    return model


class OrtInvertedResidual(Implementation):
    """onnxruntime running the block's separate NCHWc steps (one session)."""

    name = "ort.inverted_residual"
    kind = VENDOR
    target = "cpu"
    onnxruntime = True
    uses_blas = False
    joins_regions = True

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        return "separate NCHWc steps (onnxruntime)"

    def unsupported_reason(self, workload: Workload) -> str | None:
        reason = inverted_residual_reason(workload)
        if reason:
            return reason
        if has_gate(workload) and workload.inputs[0].shape[0] != 1:
            return "the separate gate multiply (MLAS's depthwise conv) is batch 1 only"
        for part in block_parts(workload):
            reason = nchwc_unsupported_reason(part.workload)   # e.g. not MLAS's block
            if reason:
                return f"{part.name}: {reason}"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        return make_kernel(separate_model(workload, consts), (("x", 0),), workload,
                           config.get("threads"))

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]) -> OnnxPart:
        return OnnxPart(separate_model(workload, consts), (("x", 0),), ("y",))

    def onnx_opset(self, workload: Workload) -> int:
        return max(workload.opset, FRAGMENT_OPSET)   # as ort.nchwc's parts


MICRO_INVERTED_RESIDUAL = register(MicroInvertedResidual())
ORT_INVERTED_RESIDUAL = register(OrtInvertedResidual())


class InvertedResidualKernels(MicroFamily):
    """The fused block kernel as a target's generated kernels: what `wpk.search.driver`'s
    `tune_workload` searches (`template` is the block's `BlockSpace`)."""

    implementation = MICRO_INVERTED_RESIDUAL
    compile_function = "wpk.kernels.cpu.microkernels.inverted_residual:compile_block"

    def template(self, workload: Workload) -> BlockSpace:
        return BlockSpace(_geometry(workload))
