"""How ONNX workloads map onto DSL library operators: shapes, scalars and feeds per op.

Each `MAPPERS[op](workload, load_operator, core_inputs)` returns
`(operator, param shapes, scalars, feeds, output shape, DSL output shape)` or a
string saying why the workload does not map; `wpk.kernels.generated` fuses the
epilogue and binds the symbols. Helpers: `fold_operand` (an epilogue operand
against a reshaped output), `coalesce` (merging elementwise dims); a window op's pads
come from `wpk.kernels.cpu.window.pads_2d`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.group_norm_spec import GROUP_NORM_OP, group_norm_reason
from wpk.kernels.cpu.resize import nearest_indices, source_coordinates, static_resize_spec
from wpk.kernels.cpu.tensor_formulas import reduce_axes, slice_index
from wpk.kernels.cpu.window import conv_transpose_begin_pads, pads_2d


def _stub(shape: Sequence[int]) -> np.ndarray:
    return np.broadcast_to(np.float32(0), tuple(int(d) for d in shape))


def bind(op, shapes: Mapping[str, Sequence[int]], scalars: Mapping | None = None) -> dict:
    from wpk.dsl.compute import infer_bindings

    return infer_bindings(op, {k: _stub(v) for k, v in shapes.items()}, scalars or {})


def parse_operator(text: str, filename: str):
    """The one operator DSL `text` defines (the parser imported on the first mapping: a
    plan's load that maps nothing skips the DSL's 60 ms of imports)."""
    from wpk.dsl.parser import parse_source

    (op,) = parse_source(text, filename)
    return op


def strip_leading_ones(shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` without its leading 1s (the shape a broadcast operand really has)."""
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def fold_operand(shape: Sequence[int], out: Sequence[int], new_out: Sequence[int]
                 ) -> tuple[int, ...] | None:
    """The shape an epilogue operand broadcast against `out` takes against the reshaped
    output `new_out` (same elements), or None when the reshape breaks its broadcasting."""
    stripped = strip_leading_ones(shape)
    if math.prod(stripped) == math.prod(out) and stripped == strip_leading_ones(out):
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
        cs = strip_leading_ones(c.shape)
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
    op = parse_operator(text, "<gemm>")
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
    if any(strip_leading_ones(w.inputs[i].shape) != (d,) for i in (1, 2)):
        return "LayerNormalization with scale/bias not of shape [D] does not map"
    rows = math.prod(x[:-1])
    return (lib("layernorm"), {"X": (rows, d), "Gamma": (d,), "Beta": (d,)},
            {"eps": float(w.attr("epsilon", 1e-5))}, {"X": 0, "Gamma": 1, "Beta": 2},
            tuple(x), (rows, d))


def _normalization(lib, x: Sequence[int], groups: int, eps: float):
    """The `groupnorm` operator over X viewed as [N, groups, C / groups, spatial]."""
    flat = (x[0], groups, x[1] // groups, math.prod(x[2:]))
    return (lib("groupnorm"), {"X": flat, "Scale": flat[1:3], "Bias": flat[1:3]},
            {"eps": eps}, {"X": 0, "Scale": 1, "Bias": 2}, tuple(x), flat)


def _map_group_norm(w: Workload, lib, core: int):
    """wpk's GroupNorm (`group_norm_spec`; the plain form: the blocked one is not mapped)."""
    reason = group_norm_reason(w)
    if reason is not None:
        return reason
    return _normalization(lib, w.inputs[0].shape, int(w.attr("groups")),
                          float(w.attr("epsilon", 1e-5)))


def _map_instance_norm(w: Workload, lib, core: int):
    """ONNX InstanceNormalization: a GroupNorm of one channel per group."""
    x = tuple(w.inputs[0].shape)
    if len(x) < 3 or core < 3 or len(w.outputs) != 1 or any(
            w.inputs[i] is None or strip_leading_ones(w.inputs[i].shape) != (x[1],)
            for i in (1, 2)):
        return "InstanceNormalization maps with X of rank 3 or more and a scale and bias of [C]"
    return _normalization(lib, x, x[1], float(w.attr("epsilon", 1e-5)))


def _map_lrn(w: Workload, lib, core: int):
    x = tuple(w.inputs[0].shape)
    if len(x) < 3:
        return "LRN needs an input of rank 3 or more (N, C, spatial...)"
    flat = (x[0], x[1], math.prod(x[2:]))
    scalars = {"size": int(w.attr("size")), "alpha": float(w.attr("alpha", 1e-4)),
               "beta": float(w.attr("beta", 0.75)), "bias": float(w.attr("bias", 1.0))}
    return lib("lrn"), {"X": flat}, scalars, {"X": 0}, x, flat


def _map_batchnorm(w: Workload, lib, core: int):
    x = tuple(w.inputs[0].shape)
    if len(x) < 2 or len(w.outputs) > 1:
        return "only an inference BatchNormalization of rank 2 or more maps"
    if any(s is None or strip_leading_ones(s.shape) not in ((x[1],), ()) for s in w.inputs[1:5]):
        return "BatchNormalization's scale, bias, mean and var must be of shape [C]"
    flat = (x[0], x[1], math.prod(x[2:]))
    shapes = {"X": flat} | {name: (x[1],) for name in ("Scale", "Bias", "Mean", "Var")}
    feeds = {"X": 0, "Scale": 1, "Bias": 2, "Mean": 3, "Var": 4}
    return (lib("batchnorm"), shapes, {"eps": float(w.attr("epsilon", 1e-5))}, feeds, x,
            flat)


def _map_conv_transpose(w: Workload, lib, core: int):
    """2-D ConvTranspose in gather form: output (oh, ow) sums the filter taps (r, s) whose
    source oh + pad_t - r * dil_h (likewise w) is a whole multiple of the stride inside the
    input."""
    x, wt = w.inputs[0].shape, w.inputs[1].shape if w.inputs[1] is not None else None
    if len(x) != 4 or wt is None or len(wt) != 4:
        return "only 2-D ConvTranspose (NCHW) maps to a DSL operator"
    groups = int(w.attr("group", 1))
    (sh, sw) = tuple(w.attr("strides") or (1, 1))
    (dh, dw) = tuple(w.attr("dilations") or (1, 1))
    pt, pl = conv_transpose_begin_pads(w)
    cg, kg = x[1] // groups, wt[1]
    out = tuple(w.outputs[0].shape)
    oh, ow = f"oh + {pt} - r * {dh}", f"ow + {pl} - s * {dw}"
    channel = f"(k / {kg}) * {cg} + c"
    body = (f"sum(c in {cg}, r in {wt[2]}, s in {wt[3]}) {{\n"
            f"        select(({oh}) % {sh} == 0 and ({ow}) % {sw} == 0,\n"
            f"               X[n, {channel}, ({oh}) / {sh}, ({ow}) / {sw}] ?: 0, 0.0)\n"
            f"        * Wt[{channel}, k % {kg}, r, s]\n    }}")
    params = [f"X: f32[{', '.join(map(str, x))}]", f"Wt: f32[{', '.join(map(str, wt))}]"]
    shapes, feeds = {"X": x, "Wt": wt}, {"X": 0, "Wt": 1}
    if core > 2 and w.inputs[2] is not None:
        params.append(f"B: f32[{out[1]}]")
        body += " + B[k]"
        shapes["B"], feeds["B"] = (out[1],), 2
    op = parse_operator(f"op conv_transpose2d({', '.join(params)}) -> "
                        f"Y: f32[{', '.join(map(str, out))}] {{\n"
                        f"    Y[n, k, oh, ow] = {body}\n}}\n", "<conv_transpose>")
    return op, shapes, {}, feeds, out, out


_REDUCERS = {"ReduceMean": "sum", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


def _map_reduce(w: Workload, lib, core: int):
    x = tuple(w.inputs[0].shape)
    axes = reduce_axes(w, [None] * len(w.inputs))
    if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
        return "only a reduction over contiguous axes maps"
    a, r, b = math.prod(x[:axes[0]]), math.prod(x[axes[0]:axes[-1] + 1]), \
        math.prod(x[axes[-1] + 1:])
    body = f"{_REDUCERS[w.op]}(r in R) {{ X[a, r, b] }}"
    if w.op == "ReduceMean":
        body = f"{body} / f32(R)"
    op = parse_operator(f"op {w.op.lower()}(X: f32[A, R, B]) -> Y: f32[A, B] {{\n"
                        f"    Y[a, b] = {body}\n}}\n", "<reduce>")
    return op, {"X": (a, r, b)}, {}, {"X": 0}, tuple(w.outputs[0].shape), (a, b)


def _indexed_copy(name: str, in_shape, out_shape, sources) -> object:
    """A DSL operator copying X[sources[axis](i_axis)...] into Y (each source an index
    expression of `i{axis}`)."""
    dims_in = ", ".join(map(str, in_shape))
    dims_out = ", ".join(map(str, out_shape))
    index = ", ".join(f"i{k}" for k in range(len(out_shape)))
    op = parse_operator(f"op {name}(X: f32[{dims_in}]) -> Y: f32[{dims_out}] {{\n"
                        f"    Y[{index}] = X[{', '.join(sources)}]\n}}\n", f"<{name}>")
    return op


def _map_slice(w: Workload, lib, core: int):
    x, out = tuple(w.inputs[0].shape), tuple(w.outputs[0].shape)
    statics = [None] + [w.static_value(i) for i in range(1, len(w.inputs))]
    if w.opset >= 10 and (statics[1] is None or statics[2] is None):
        return "a Slice with computed starts or ends does not map"
    index = slice_index(w, statics, x)
    sources = []
    for k, (part, dim) in enumerate(zip(index, x)):
        start, _, step = part.indices(dim)
        sources.append(f"{start} + i{k} * {step}" if step != 1 or start else f"i{k}")
    return _indexed_copy("slice", x, out, sources), {"X": x}, {}, {"X": 0}, out, out


def _coordinate_line(spec, axis: int) -> tuple[float, float] | None:
    """(a, b) with the source coordinate of output position o along `axis` equal to
    a * o + b (`wpk.kernels.cpu.resize.source_coordinates`, every mode but
    tf_crop_and_resize, which extrapolates), computed in float64; None otherwise."""
    if spec.coordinates == "tf_crop_and_resize":
        return None
    size = spec.out_shape[axis]
    probe = source_coordinates(spec, axis)
    a = float(probe[1] - probe[0]) if size > 1 else 0.0
    b = float(probe[0])
    if not np.allclose(probe, a * np.arange(size) + b, rtol=0, atol=1e-9 * max(1, size)):
        return None
    return a, b


def _interpolated_read(spec, in_shape, lines: dict) -> tuple[str, str]:
    """(the reduction axes, the product of the taps' weights times the read of X) of a
    linear or cubic Resize: per resized axis k a tap variable t{k} over 2 (linear) or 4
    (cubic) taps from floor(x) (cubic: from floor(x) - 1), its weight the triangle or
    Keys' cubic of the distance, its index clamped to the input (edges repeat)."""
    taps = 2 if spec.mode == "linear" else 4
    first = 0 if spec.mode == "linear" else -1
    reductions, weights, index = [], [], []
    for k, length in enumerate(in_shape):
        if k not in lines:
            index.append(f"i{k}")
            continue
        a, b = lines[k]
        x = f"({a!r} * f32(i{k}) + {b!r})"
        tap = f"(i32(floor({x})) + {first} + t{k})"
        distance = f"abs({x} - f32({tap}))"
        reductions.append(f"t{k} in {taps}")
        index.append(f"min(max({tap}, 0), {length - 1})")
        if spec.mode == "linear":
            weights.append(f"(1.0 - {distance})")
        else:
            c = spec.cubic_coeff_a
            d = distance
            near = f"((({c!r} + 2.0) * {d} - ({c!r} + 3.0)) * {d} * {d} + 1.0)"
            far = f"(((({c!r} * {d} - {5 * c!r}) * {d} + {8 * c!r}) * {d}) - {4 * c!r})"
            weights.append(f"select({d} <= 1.0, {near}, select({d} < 2.0, {far}, 0.0))")
    read = " * ".join([*weights, f"X[{', '.join(index)}]"])
    return ", ".join(reductions), read


def _map_resize(w: Workload, lib, core: int):
    x, out = tuple(w.inputs[0].shape), tuple(w.outputs[0].shape)
    if w.opset < 11:
        return "Resize before opset 11 does not map"
    spec = static_resize_spec(w)
    if spec.coordinates == "tf_crop_and_resize":
        return "a tf_crop_and_resize Resize (it extrapolates) does not map"
    if spec.mode != "nearest":
        return _map_interpolating_resize(spec, x, out)
    sources = []
    for k, (size, length) in enumerate(zip(out, x)):
        if not (nearest_indices(spec, k) == np.arange(size) * length // size).all():
            return "only a nearest Resize whose source index is i * in // out maps"
        sources.append(f"i{k}" if size == length else f"i{k} * {length} / {size}")
    return (_indexed_copy("resize_nearest", x, out, sources), {"X": x}, {}, {"X": 0}, out,
            out)


# A linear or cubic Resize maps when it resizes at most this many axes (2**3 linear taps,
# 4**2 cubic ones per output element)
MAX_RESIZED_AXES = {"linear": 3, "cubic": 2}


def _map_interpolating_resize(spec, x: tuple[int, ...], out: tuple[int, ...]):
    """A linear or cubic Resize as a sum over each resized axis's taps (no antialias, no
    exclude_outside: their weights are renormalised per position)."""
    if spec.antialias or spec.exclude_outside:
        return "a linear or cubic Resize maps without antialias and exclude_outside"
    axes = spec.resized_axes()
    if not axes or len(axes) > MAX_RESIZED_AXES[spec.mode]:
        return (f"a {spec.mode} Resize maps when it resizes 1 to "
                f"{MAX_RESIZED_AXES[spec.mode]} axes")
    lines = {k: _coordinate_line(spec, k) for k in axes}
    if any(line is None for line in lines.values()):
        return "a Resize whose source coordinates are not a line does not map"
    reductions, read = _interpolated_read(spec, x, lines)
    index = ", ".join(f"i{k}" for k in range(len(out)))
    op = parse_operator(f"op resize_{spec.mode}(X: f32[{', '.join(map(str, x))}]) -> "
                        f"Y: f32[{', '.join(map(str, out))}] {{\n"
                        f"    Y[{index}] = sum({reductions}) {{ {read} }}\n}}\n",
                        f"<resize_{spec.mode}>")
    return op, {"X": x}, {}, {"X": 0}, out, out


MAPPERS = {"Conv": _map_conv, "MatMul": _map_matmul, "Gemm": _map_gemm,
           "MaxPool": _map_pool, "AveragePool": _map_pool, "GlobalAveragePool": _map_pool,
           "GlobalMaxPool": _map_pool, "Softmax": _map_softmax, "LogSoftmax": _map_softmax,
           "LayerNormalization": _map_layernorm, "LRN": _map_lrn,
           "BatchNormalization": _map_batchnorm, "Slice": _map_slice, "Resize": _map_resize,
           "ConvTranspose": _map_conv_transpose, GROUP_NORM_OP: _map_group_norm,
           "InstanceNormalization": _map_instance_norm,
           **{op: _map_reduce for op in _REDUCERS}}
