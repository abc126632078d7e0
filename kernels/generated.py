"""Generated kernels: ONNX workloads mapped onto DSL operators, compiled with a searched schedule.

    mapping = map_workload(workload)        # DslMapping, or a str saying why it does not map
    space = search_space(workload, "cpu")   # the schedule knobs the tuners search
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

from wpk.errors import WpkError
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register
from wpk.kernels.workload import Workload

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
    library_op: str              # the library operator it came from ("" when written here)
    packed: tuple = ()           # (param, input index, packer, blocks, block): packed once


# ----------------------------------------------------------------------------- helpers
def _stub(shape: Sequence[int]) -> np.ndarray:
    return np.broadcast_to(np.float32(0), tuple(int(d) for d in shape))


def _bind(op, shapes: Mapping[str, Sequence[int]], scalars: Mapping | None = None) -> dict:
    from wpk.dsl.compute import infer_bindings

    return infer_bindings(op, {k: _stub(v) for k, v in shapes.items()}, scalars or {})


def _strip(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def fold_operand(shape: Sequence[int], out: Sequence[int], new_out: Sequence[int]
                 ) -> tuple[int, ...] | None:
    """The shape an epilogue operand broadcast against `out` takes against the reshaped
    output `new_out` (same elements), or None when the reshape breaks its broadcasting."""
    stripped = _strip(shape)
    if math.prod(stripped) == math.prod(out) and stripped == _strip(out):
        return tuple(new_out)
    if not stripped:
        return (1,)
    rank = len(stripped)
    if rank <= len(new_out) and tuple(out[-rank:]) == tuple(new_out[-rank:]):
        return stripped
    return None


def coalesce(out: Sequence[int], operands: Sequence[Sequence[int]]
             ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 output dims and merge adjacent ones wherever every operand is full in
    both or broadcast (size 1) in both, like numpy's iterator; returns the new output
    and operand shapes."""
    rank = len(out)
    aligned = [(1,) * (rank - len(s)) + tuple(s) for s in operands]
    groups: list[list[int]] = []
    for axis in (a for a in range(rank) if out[a] != 1):   # size-1 dims drop out
        if groups and all((a[axis] == 1) == (a[groups[-1][-1]] == 1) for a in aligned) \
                and all(a[axis] in (1, out[axis]) for a in aligned):
            groups[-1].append(axis)
        else:
            groups.append([axis])
    new_out = tuple(math.prod(out[a] for a in g) for g in groups) or (1,)
    new_ops = [tuple(math.prod(s[a] for a in g) for g in groups) or (1,) for s in aligned]
    return new_out, new_ops


def pads_2d(workload: Workload, kernel: tuple[int, int]):
    """(pad_t, pad_l, pad_b, pad_r, strides, dilations) giving exactly the output size."""
    from wpk.kernels.cpu.window import window_geometry

    geom = window_geometry(workload, kernel)
    # The declared end pads, unless ceil_mode windows reach further (then exactly those).
    ends = tuple(max(c, e) for c, e in zip(geom.cover_end, geom.pads_end))
    for size, begin, end, ext, stride, out in zip(geom.in_size, geom.pads_begin, ends,
                                                  geom.extent, geom.strides, geom.out_size):
        if (size + begin + end - ext) // stride + 1 != out:
            return None
    return (*geom.pads_begin, *ends), geom


# ----------------------------------------------------------------------------- per op
def _map_conv(w: Workload, lib, core: int):
    x, wt = w.inputs[0], w.inputs[1]
    if len(x.shape) != 4 or wt is None or len(wt.shape) != 4:
        return "only 2-D convolutions (NCHW) map to DSL operators"
    found = pads_2d(w, tuple(wt.shape[2:]))
    if found is None:
        return "the padding does not give the output size"
    (pt, pl, pb, pr), geom = found
    has_bias = core > 2 and w.inputs[2] is not None
    op = lib("conv2d_bias" if has_bias else "conv2d")
    scalars = dict(stride_h=geom.strides[0], stride_w=geom.strides[1], pad_t=pt, pad_l=pl,
                   pad_b=pb, pad_r=pr, dil_h=geom.dilations[0], dil_w=geom.dilations[1],
                   groups=int(w.attr("group", 1)))
    shapes = {"X": x.shape, "Wt": wt.shape}
    feeds = {"X": 0, "Wt": 1}
    if has_bias:
        shapes["B"] = w.inputs[2].shape
        feeds["B"] = 2
    return op, shapes, scalars, feeds, tuple(w.outputs[0].shape), tuple(w.outputs[0].shape)


def _map_matmul(w: Workload, lib, core: int):
    a, b = w.inputs[0].shape, w.inputs[1].shape
    out = tuple(w.outputs[0].shape)
    if len(a) < 2 or len(b) < 2:
        return "MatMul of 1-D operands does not map"
    if len(b) == 2:
        m = math.prod(a[:-1])
        return (lib("matmul"), {"A": (m, a[-1]), "B": b}, {}, {"A": 0, "B": 1}, out,
                (m, b[-1]))
    if tuple(a[:-2]) != tuple(b[:-2]):
        return "MatMul with broadcast batch dimensions does not map"
    bt = math.prod(a[:-2])
    return (lib("batched_matmul"), {"A": (bt, *a[-2:]), "B": (bt, *b[-2:])}, {},
            {"A": 0, "B": 1}, out, (bt, a[-2], b[-1]))


def _map_gemm(w: Workload, lib, core: int):
    from wpk.dsl.parser import parse_source

    ta, tb = int(w.attr("transA", 0)), int(w.attr("transB", 0))
    alpha, beta = float(w.attr("alpha", 1.0)), float(w.attr("beta", 1.0))
    a, b = w.inputs[0].shape, w.inputs[1].shape
    m, n = w.outputs[0].shape
    params = [f"A: f32[{'K, M' if ta else 'M, K'}]", f"B: f32[{'N, K' if tb else 'K, N'}]"]
    body = f"sum(k in K) {{ A[{'k, m' if ta else 'm, k'}] * B[{'n, k' if tb else 'k, n'}] }}"
    if alpha != 1.0:
        body = f"{alpha!r} * {body}"
    shapes = {"A": a, "B": b}
    feeds = {"A": 0, "B": 1}
    c = w.inputs[2] if core > 2 else None
    if c is not None and beta != 0.0:
        cs = _strip(c.shape)
        index = {(m, n): ("C[m, n]", (m, n)), (n,): ("C[n]", (n,)), (m, 1): ("C[m]", (m,)),
                 (): ("C[0]", (1,)), (1,): ("C[0]", (1,))}.get(cs)
        if cs == (m,) and m != n:
            index = None
        if index is None:
            return f"Gemm with C of shape {c.shape} does not map"
        params.append(f"C: f32[{', '.join(map(str, index[1]))}]")
        term = index[0] if beta == 1.0 else f"{beta!r} * {index[0]}"
        body = f"{body} + {term}"
        shapes["C"] = index[1]
        feeds["C"] = 2
    text = f"op gemm_{'t' if ta else 'n'}{'t' if tb else 'n'}({', '.join(params)}) " \
           f"-> Y: f32[M, N] {{\n    Y[m, n] = {body}\n}}\n"
    (op,) = parse_source(text, "<gemm>")
    return op, shapes, {}, feeds, (m, n), (m, n)


def _map_pool(w: Workload, lib, core: int):
    x = w.inputs[0].shape
    if len(x) != 4:
        return "only 2-D pooling (NCHW) maps to DSL operators"
    out = tuple(w.outputs[0].shape)
    if w.op in ("GlobalAveragePool", "GlobalMaxPool"):
        name = "global_avgpool2d" if w.op == "GlobalAveragePool" else "global_maxpool2d"
        return lib(name), {"X": x}, {}, {"X": 0}, out, out
    if len(w.outputs) > 1:
        return "MaxPool with an Indices output does not map"
    kernel = tuple(int(k) for k in w.attr("kernel_shape"))
    found = pads_2d(w, kernel)
    if found is None:
        return "the padding does not give the output size"
    (pt, pl, pb, pr), geom = found
    scalars = dict(KH=kernel[0], KW=kernel[1], stride_h=geom.strides[0],
                   stride_w=geom.strides[1], pad_t=pt, pad_l=pl, pad_b=pb, pad_r=pr)
    if w.op == "MaxPool":
        scalars.update(dil_h=geom.dilations[0], dil_w=geom.dilations[1])
        return lib("maxpool2d"), {"X": x}, scalars, {"X": 0}, out, out
    if any(d != 1 for d in geom.dilations):
        return "AveragePool with dilations does not map"
    include = int(w.attr("count_include_pad", 0))
    if include and (pb, pr) != tuple(geom.pads_end):
        return "AveragePool counting pads with ceil_mode windows does not map"
    scalars["count_include_pad"] = include
    return lib("avgpool2d"), {"X": x}, scalars, {"X": 0}, out, out


def _last_axis(w: Workload, default: int) -> int:
    rank = len(w.inputs[0].shape)
    axis = int(w.attr("axis", default))
    return axis + rank if axis < 0 else axis


def _map_softmax(w: Workload, lib, core: int):
    x = w.inputs[0].shape
    axis = _last_axis(w, -1 if w.opset >= 13 else 1)
    if w.opset >= 13 and axis != len(x) - 1:
        return "Softmax over an axis other than the last does not map"
    rows, cols = math.prod(x[:axis]), math.prod(x[axis:])
    name = "softmax" if w.op == "Softmax" else "log_softmax"
    return lib(name), {"X": (rows, cols)}, {}, {"X": 0}, tuple(x), (rows, cols)


def _map_layernorm(w: Workload, lib, core: int):
    x = w.inputs[0].shape
    if len(w.outputs) > 1:
        return "LayerNormalization with Mean/InvStdDev outputs does not map"
    if _last_axis(w, -1) != len(x) - 1:
        return "LayerNormalization over more than the last axis does not map"
    d = x[-1]
    if core < 3 or w.inputs[2] is None:
        return "LayerNormalization without a bias does not map"
    if _strip(w.inputs[1].shape) != (d,) or _strip(w.inputs[2].shape) != (d,):
        return "LayerNormalization with scale/bias not of shape [D] does not map"
    rows = math.prod(x[:-1])
    return (lib("layernorm"), {"X": (rows, d), "Gamma": (d,), "Beta": (d,)},
            {"eps": float(w.attr("epsilon", 1e-5))}, {"X": 0, "Gamma": 1, "Beta": 2},
            tuple(x), (rows, d))


MAPPERS = {"Conv": _map_conv, "MatMul": _map_matmul, "Gemm": _map_gemm,
           "MaxPool": _map_pool, "AveragePool": _map_pool, "GlobalAveragePool": _map_pool,
           "GlobalMaxPool": _map_pool, "Softmax": _map_softmax, "LogSoftmax": _map_softmax,
           "LayerNormalization": _map_layernorm}


def _elementwise(w: Workload) -> DslMapping | str:
    from wpk.dsl.epilogue import with_epilogue
    from wpk.dsl.parser import parse_source
    from wpk.kernels.cpu.numpy_ops import elementwise_steps

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
    (op,) = parse_source(f"op elementwise(X: f32[{dims}]) -> Y: f32[{dims}] "
                         f"{{ Y[{index}] = X[{index}] }}\n", "<elementwise>")
    op = with_epilogue(op, steps, dict(zip(operands, shapes)))
    feeds = {"X": 0} | {f"E{i}": i for i in operands}
    all_shapes = {"X": new_out} | {f"E{i}": s for i, s in zip(operands, shapes)}
    return DslMapping(op, _bind(op, all_shapes), feeds, "Y", "")


def _map(w: Workload) -> DslMapping | str:
    from wpk.dsl.epilogue import with_epilogue
    from wpk.kernels.cpu.node_model import core_input_count, is_elementwise
    from wpk.kernels.cpu.tensor_formulas import BINARY_UFUNCS, UNARY_AS_STEP
    from wpk.kernels.dsl_library import load_operator

    nchwc = w.domain == "wpk.nchwc" and w.op == "Conv"
    if w.domain not in ("", "ai.onnx") and not is_elementwise(w) and not nchwc:
        return f"domain {w.domain!r} {w.op} does not map to DSL operators"
    specs = [s for s in w.inputs if s is not None] + list(w.outputs)
    if any(s.dtype != DTYPE for s in specs):
        return "generated kernels compute float32 only"
    if any(0 in s.shape for s in specs):
        return "empty tensors do not map"
    if is_elementwise(w) or w.op in UNARY_AS_STEP or (
            w.op in BINARY_UFUNCS and core_input_count(w) == 2):
        return _elementwise(w)
    core = core_input_count(w)
    packed = ()
    if nchwc:
        from wpk.kernels.generated_nchwc import map_nchwc_conv

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
    op = with_epilogue(op, w.epilogue, folded)
    feeds = feeds | {f"E{i}": i for i in operands}
    shapes = dict(shapes) | {f"E{i}": s for i, s in folded.items()}
    return DslMapping(op, _bind(op, shapes, scalars), feeds, op.outputs[0],
                      "" if op.name.startswith(("gemm_", "elementwise", "conv_nchwc"))
                      else op.name, packed)


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
    from wpk.dsl.build import specialize_for
    from wpk.dsl.templates import template_for

    mapping = _MAPPINGS[key]
    return template_for(specialize_for(mapping.op, mapping.bindings), target)


def template_of(workload: Workload, target: str = "cpu"):
    """The DSL schedule template of a mapped workload (WpkError-free: call map first)."""
    mapping = map_workload(workload)
    if isinstance(mapping, str):
        from wpk.errors import UnsupportedError

        raise UnsupportedError(f"{workload.label}: {mapping}",
                               hint="only workloads that map to DSL operators can be tuned")
    return _template(workload.key, target)


def search_space(workload: Workload, target: str = "cpu"):
    """The schedule `SearchSpace` of a workload's generated kernel on `target`."""
    from wpk.search.space import SearchSpace

    template = template_of(workload, target)
    return SearchSpace.from_template(template, name=workload.label)


def default_config(workload: Workload, target: str = "cpu") -> dict:
    """The template's default schedule of the workload."""
    return template_of(workload, target).default_config()


def compile_generated(workload: Mapping, config: Mapping | None = None) -> str:
    """Compile a workload's generated CPU kernel into the compile cache (a `CompileJob`
    function: `CompileJob("wpk.kernels.generated:compile_generated", {...})`)."""
    from wpk.dsl import build
    from wpk.dsl.codegen_c import generate_c

    w = Workload.from_json(workload)
    mapping = map_workload(w)
    if isinstance(mapping, str):
        from wpk.errors import UnsupportedError

        raise UnsupportedError(f"{w.label}: {mapping}", hint="not a generated-kernel workload")
    func = build.lower_for(mapping.op, mapping.bindings, dict(config or {}), "cpu")
    return str(build.compile_c(generate_c(func)))


def compile_job(workload: Workload, config: Mapping):
    """The `CompileJob` that puts the workload's kernel for `config` in the compile cache."""
    from wpk.search.compile_pool import CompileJob

    return CompileJob("wpk.kernels.generated:compile_generated",
                      {"workload": workload.to_json(), "config": dict(config)},
                      label=f"{workload.label} {dict(config)}")


# ----------------------------------------------------------------------------- implementation
class DslCpu(Implementation):
    """Generated C kernels of DSL operators, scheduled by a config from the search."""

    name = "dsl.cpu"
    kind = GENERATED
    target = "cpu"

    def unsupported_reason(self, workload: Workload) -> str | None:
        mapping = map_workload(workload)
        return mapping if isinstance(mapping, str) else None

    def configs(self, workload: Workload) -> list[dict]:
        """None: generated configs come from the search, not from enumeration."""
        return []

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        from wpk.dsl.build import build_cpu

        mapping = map_workload(workload)
        if isinstance(mapping, str):
            raise ValueError(f"{workload.label}: {mapping}")
        built = build_cpu(mapping.op, mapping.bindings, dict(config))
        packed = {}
        if mapping.packed:
            from wpk.kernels.generated_nchwc import PACKERS

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

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
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

        return kernel


DSL_CPU = register(DslCpu())
