"""Generated kernels: ONNX workloads mapped onto DSL operators, compiled with a searched schedule.

    mapping = map_workload(workload)        # DslMapping, or a str saying why it does not map
    template = template_of(workload, "cpu")   # its knob space is what the tuners search
    kernel = DSL_CPU.prepare(workload, consts, config)   # kernel(inputs, outputs)

`DSL_CPU` (name `dsl.cpu`, kind `generated`) is a registered `Implementation`.
What maps (float32 only):

- Conv, 2-D NCHW, any groups (depthwise), strides, dilations, pads/auto_pad,
  with or without bias -> `conv2d` / `conv2d_bias`;
- MatMul 2-D, batched with equal batch dims -> `batched_matmul`, and
  batched x 2-D (the batch folded into M) -> `matmul`;
- Gemm (transA, transB, alpha, beta, C of shape [M,N], [N], [1,N], [M,1] or
  scalar) -> a DSL operator written for the workload;
- MaxPool / AveragePool 2-D (pads, strides, ceil_mode; dilations for MaxPool),
  GlobalAveragePool / GlobalMaxPool -> the pool operators;
- Softmax and LayerNormalization over the last axis (reshaped to 2-D),
  Softmax of opset < 13 over any axis (its 2-D coercion);
- LRN of rank 3 or more (spatial dims flattened) -> `lrn`;
- BatchNormalization in inference form (spatial dims flattened) -> `batchnorm`;
- ReduceMean/Sum/Max/Min over contiguous axes, static Slice, nearest Resize whose
  source index is i * in // out, 2-D ConvTranspose (gather form) -> operators
  written for the workload (`wpk.kernels.generated_ops`);
- `Elementwise` chains and plain unary/binary ONNX elementwise ops, their
  dims coalesced where every operand broadcasts alike;
- blocked `wpk.nchwc` Convs (regular, first-layer NCHW input, depthwise) ->
  operators written over the blocked layout, filters packed in `prepare`
  (`wpk.kernels.generated_nchwc`).

The workload's epilogue is fused into the output stage with
`wpk.dsl.epilogue.with_epilogue`. `configs(workload)` is empty: generated
configs come from the search (`wpk.search.driver`), which adds the best one
of each workload to the planner's candidates. The mapping itself is
target-independent, so a CUDA sibling can reuse `map_workload`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import UnsupportedError, WpkError
from wpk.core.workload import Workload
from wpk.kernels.algorithms import GEMM, conv_algorithm
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_DOMAIN, GROUP_NORM_OP
from wpk.kernels.cpu.native_chain import NativeCall, function_address, plain
from wpk.kernels.cpu.node_model import core_input_count, is_elementwise
from wpk.kernels.cpu.numpy_ops import elementwise_steps
from wpk.kernels.cpu.tensor_formulas import BINARY_UFUNCS, UNARY_AS_STEP, static_clip_step
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.generated_nchwc import PACKERS, map_nchwc_conv
from wpk.kernels.generated_ops import MAPPERS, bind, coalesce, fold_operand, parse_operator
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register

DTYPE = "float32"


@dataclass(frozen=True)
class DslMapping:
    """A workload as a DSL operator: the operator (epilogue fused), its bindings, and
    which workload tensor feeds each operator parameter (`feeds[name]` = input index;
    the output parameter reads output 0)."""

    op: object                   # wpk.dsl.compute.Operator
    bindings: dict
    feeds: dict[str, int]
    output: str
    packed: tuple = ()           # (param, input index, packer, blocks, block): packed once


def _with_epilogue(op, steps, shapes):
    """`op` with the epilogue `steps` fused (the DSL imported where a workload is mapped:
    its parser, lowering and emulator are 60 ms a plan's load seldom needs)."""
    from wpk.dsl.epilogue import with_epilogue

    return with_epilogue(op, steps, shapes)


def _elementwise(w: Workload) -> DslMapping | str:
    steps = elementwise_steps(w)
    out = tuple(w.outputs[0].shape)
    if tuple(w.inputs[0].shape) != out:
        return "an elementwise chain whose input 0 broadcasts does not map"
    operands = sorted({s.operand for s in steps if s.operand is not None})
    if any(w.inputs[i] is None or w.inputs[i].dtype != DTYPE for i in operands):
        return "elementwise operands must be float32 tensors"
    new_out, shapes = coalesce(out, [w.inputs[i].shape for i in operands])
    dims = ", ".join(f"D{i}" for i in range(len(new_out)))
    index = ", ".join(f"i{i}" for i in range(len(new_out)))
    op = parse_operator(f"op elementwise(X: f32[{dims}]) -> Y: f32[{dims}] "
                        f"{{ Y[{index}] = X[{index}] }}\n", "<elementwise>")
    op = _with_epilogue(op, steps, dict(zip(operands, shapes)))
    feeds = {"X": 0} | {f"E{i}": i for i in operands}
    all_shapes = {"X": new_out} | {f"E{i}": s for i, s in zip(operands, shapes)}
    return DslMapping(op, bind(op, all_shapes), feeds, "Y")


def maps_elementwise(w: Workload) -> bool:
    """Whether the workload maps to the DSL as an elementwise chain (wpk's Elementwise, a
    unary op, a Clip with fixed bounds, a two-input binary op)."""
    return is_elementwise(w) or w.op in UNARY_AS_STEP or static_clip_step(w) is not None or (
        w.op in BINARY_UFUNCS and core_input_count(w) == 2)


def _map(w: Workload) -> DslMapping | str:
    nchwc = w.domain == "wpk.nchwc" and w.op == "Conv"
    ours = w.domain == GROUP_NORM_DOMAIN and w.op == GROUP_NORM_OP   # wpk's plain GroupNorm
    if w.domain not in ("", "ai.onnx") and not is_elementwise(w) and not nchwc and not ours:
        return f"domain {w.domain!r} {w.op} does not map to DSL operators"
    # the tensors computed on (static operands such as Slice's starts, Resize's empty roi
    # are read by the mapping, not by the kernel)
    specs = [s for i, s in enumerate(w.inputs) if s is not None and
             w.static_value(i) is None] + list(w.outputs)
    if any(s.dtype != DTYPE for s in specs):
        return "generated kernels compute float32 only"
    if any(0 in s.shape for s in specs):
        return "empty tensors do not map"
    if maps_elementwise(w):
        return _elementwise(w)
    core = core_input_count(w)
    packed = ()
    if nchwc:
        found = map_nchwc_conv(w, core)
        if isinstance(found, str):
            return found
        op, shapes, scalars, feeds, packed = found
        out = new_out = tuple(w.outputs[0].shape)
    else:
        mapper = MAPPERS.get(w.op)
        if mapper is None:
            return f"no DSL operator for {w.op}"
        found = mapper(w, load_operator, core)
        if isinstance(found, str):
            return found
        op, shapes, scalars, feeds, out, new_out = found
    operands = sorted({s.operand for s in w.epilogue if s.operand is not None})
    folded = {}
    for i in operands:
        spec = w.inputs[i]
        shape = None if spec is None else fold_operand(spec.shape, out, new_out)
        if shape is None:
            return f"epilogue operand {i} does not broadcast against the DSL output"
        folded[i] = shape
    op = _with_epilogue(op, w.epilogue, folded)
    feeds = feeds | {f"E{i}": i for i in operands}
    shapes = dict(shapes) | {f"E{i}": s for i, s in folded.items()}
    return DslMapping(op, bind(op, shapes, scalars), feeds, op.outputs[0], packed)


_MAPPINGS: dict[str, DslMapping | str] = {}


def map_workload(workload: Workload) -> DslMapping | str:
    """The DSL form of a workload, or why it has none (cached per workload key)."""
    found = _MAPPINGS.get(workload.key)
    if found is None:
        try:
            found = _map(workload)
        except WpkError as exc:   # a failed `require`, an unknown epilogue step
            found = f"does not map to a DSL operator: {exc.message}"
        except (KeyError, TypeError, ValueError) as exc:
            found = f"does not map to a DSL operator ({type(exc).__name__}: {exc})"
        _MAPPINGS[workload.key] = found
    return found


@functools.lru_cache(maxsize=256)
def _template(key: str, target: str):
    from wpk.dsl.compute import specialize
    from wpk.kernels.templates import template_for

    mapping = _MAPPINGS[key]
    return template_for(specialize(mapping.op, mapping.bindings), target)


def template_of(workload: Workload, target: str = "cpu"):
    """The DSL schedule template of a mapped workload (WpkError-free: call map first)."""
    mapping = map_workload(workload)
    if isinstance(mapping, str):
        raise UnsupportedError(f"{workload.label}: {mapping}",
                               hint="only workloads that map to DSL operators can be tuned")
    return _template(workload.key, target)


def default_config(workload: Workload, target: str = "cpu") -> dict:
    """The template's default schedule of the workload."""
    return template_of(workload, target).default_config()


def compile_generated(workload: Mapping, config: Mapping | None = None) -> str:
    """Compile a workload's generated CPU kernel into the compile cache (a `CompileJob`
    function: `CompileJob("wpk.kernels.generated:compile_generated", {...})`)."""
    w = Workload.from_json(workload)
    mapping = map_workload(w)
    if isinstance(mapping, str):
        raise UnsupportedError(f"{w.label}: {mapping}", hint="not a generated-kernel workload")
    from wpk.dsl import build
    from wpk.dsl.codegen_c import generate_c
    from wpk.kernels import templates

    func = templates.lower_for(mapping.op, mapping.bindings, dict(config or {}), "cpu")
    return str(build.compile_c(generate_c(func)))


def compile_job(workload: Workload, config: Mapping):
    """The `CompileJob` that puts the workload's kernel for `config` in the compile cache."""
    return CompileJob("wpk.kernels.generated:compile_generated",
                      {"workload": workload.to_json(), "config": dict(config)},
                      label=f"{workload.label} {dict(config)}")


# ----------------------------------------------------------------------------- implementation
# Non-elementwise ops whose default schedule an untuned build measures: memory-bound and
# quick to compile, and a generated step lets the plan run on one thread pool (one native
# chain, `native_chain`) where onnxruntime's node would need its own pool woken.
UNTUNED_OPS = ("Softmax", "LogSoftmax", "LayerNormalization", "LRN", "BatchNormalization")


class DslCpu(Implementation):
    """Generated C kernels of DSL operators, scheduled by a config from the search."""

    name = "dsl.cpu"
    uses_blas = False
    kind = GENERATED
    target = "cpu"

    def unsupported_reason(self, workload: Workload) -> str | None:
        mapping = map_workload(workload)
        return mapping if isinstance(mapping, str) else None

    def configs(self, workload: Workload) -> list[dict]:
        """What an untuned build measures: the template's default schedule of a memory-bound
        workload (`UNTUNED_OPS`, elementwise chains); no config of the others, whose
        generated kernels come from the search (or from the micro-kernel families)."""
        if workload.op in UNTUNED_OPS or maps_elementwise(workload):
            return [default_config(workload)]
        return []

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """A loop nest over the op's index expression: a direct convolution (depthwise or
        1x1 by shape), a gemm for Gemm/MatMul, else the implementation's name."""
        if workload.op == "Conv":
            return conv_algorithm(workload)
        return GEMM if workload.op in ("Gemm", "MatMul") else self.name

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        mapping = map_workload(workload)
        if isinstance(mapping, str):
            raise ValueError(f"{workload.label}: {mapping}")
        from wpk.kernels.templates import build_cpu

        built = build_cpu(mapping.op, mapping.bindings, dict(config))
        packed = {}
        if mapping.packed:
            for param, index, packer, blocks, block in mapping.packed:
                if index not in consts:
                    raise ValueError(f"{workload.label}: input {index} must be a constant")
                value = np.asarray(consts[index], np.float32)
                packed[param] = PACKERS[packer](value, blocks, block)
        order = []   # (source, index or packed array, size) per C parameter
        for buffer in built.func.params:
            size = math.prod(buffer.shape)
            if buffer.name == mapping.output:
                order.append(("out", 0, size))
            elif buffer.name in packed:
                order.append(("packed", packed[buffer.name], size))
            elif buffer.name in mapping.feeds:
                order.append(("in", mapping.feeds[buffer.name], size))
            else:
                raise ValueError(f"generated kernel parameter {buffer.name} has no feed")
        fn = built._fn
        keep = built

        bound: list = [None, ()]  # the arrays of the last call and their pointers

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            arrays = (*inputs, *outputs)
            if bound[0] is not None and len(arrays) == len(bound[0]) and \
                    all(a is b for a, b in zip(arrays, bound[0])):
                fn(*bound[1])  # the runtime's arena views: checked when first bound
                return
            pointers, temps = [], []
            for source, index, size in order:
                if source == "packed":
                    pointers.append(index.ctypes.data)
                    continue
                is_output = source == "out"
                array = outputs[index] if is_output else inputs[index]
                if array.size != size:
                    raise ValueError(f"{keep.func.name}: tensor of {array.size} elements "
                                     f"where {size} are expected")
                if not (array.flags.c_contiguous and array.dtype == np.float32):
                    if is_output:
                        raise ValueError("generated kernels write C-contiguous float32 outputs")
                    array = np.ascontiguousarray(array, dtype=np.float32)
                    temps.append(array)
                pointers.append(array.ctypes.data)
            fn(*pointers)
            bound[:] = [None if temps else arrays, pointers]

        def native(inputs, outputs) -> NativeCall | None:
            """The call on these buffers as (function, pointers), when it copies nothing."""
            pointers = []
            for source, index, size in order:
                if source == "packed":
                    pointers.append(index.ctypes.data)
                    continue
                array = outputs[index] if source == "out" else inputs[index]
                if not plain(array) or array.size != size:
                    return None
                pointers.append(array.ctypes.data)
            return function_address(fn), pointers

        kernel.native = native
        return kernel


DSL_CPU = register(DslCpu())
