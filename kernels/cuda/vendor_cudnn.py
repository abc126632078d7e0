"""cuDNN candidates: Conv forward through the cuDNN frontend graph API, every engine tried.

    cudnn_impl = registry.get("cudnn")
    configs = cudnn_impl.configs(workload)   # [{'fuse': 2, 'plan': NAME, 'index': 3}, ...]
    kernel = cudnn_impl.prepare(workload, consts, configs[0])

A workload becomes a cuDNN graph (`cudnn.pygraph`, NCHW float32, float32
compute): `conv_fprop`, then the bias (`bias`) and as much of the fused
epilogue as cuDNN has pointwise ops for (`fusable_prefix`: relu, clipped and
leaky relu, sigmoid, tanh, swish, gelu, exp, ..., and a residual `add` of a
full-size or per-channel operand). Runtime-fusion engines do not take every
such graph in float32 NCHW, so graphs are tried from the most fused to the
plain convolution (`fusion_levels`); what cuDNN does not fuse runs after it
as one elementwise kernel. Like cudnnFind, every execution plan the
heuristics (modes A and FALLBACK) offer that builds and computes in float32
(no TF32 tensor-core engines: `NOT_FLOAT32_NOTES`) is a config of its own
(up to `MAX_PLANS` per fusion level); the planner measures them all and keeps
the fastest, and the step config stores the fusion level, the plan's name
(engine and knobs) and its index. `prepare` rebuilds that graph and selects
the plan by name (index as a fallback: `find_plan`). Execution takes raw
device pointers and a workspace allocated once, on the current cupy stream,
so it can be captured in a CUDA graph.

The frontend is the `nvidia-cudnn-frontend` wheel (installed with
`--no-deps`); it loads the cuDNN 9 libraries that torch or
`nvidia-cudnn-cu*` install. Without it, or without a GPU, the
implementation says why in `unsupported_reason` and the build moves on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import DeviceError
from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.cuda.cupy_support import missing_reason, require_cupy
from wpk.kernels.cuda.epilogue_cuda import epilogue_kernel
from wpk.kernels.cuda.vendor_cublas import ConvGeometry, conv_geometry
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register

MAX_PLANS = 12
HEURISTIC_MODES = ("A", "FALLBACK")
# Engines whose numerics are not float32's: on Ampere and newer, cuDNN runs a float32
# convolution on tensor cores in TF32 (10-bit mantissa) unless these are deselected; on an
# H200 such plans were 1.1e-4 to 2.3e-4 relative L2 from the float64 reference, over the
# 1e-4 every plan must meet (first GPU run, 2026-11-27).
NOT_FLOAT32_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION")

# epilogue op -> (cudnn pygraph method, keyword arguments from the step's attributes)
_UNARY_FUSABLE = {"relu", "clip", "leaky_relu", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh",
                  "exp", "log", "sqrt", "reciprocal", "neg", "abs", "erf"}
_BINARY_FUSABLE = {"add", "sub", "mul", "max", "min"}


@dataclass(frozen=True)
class FusedOp:
    """One pointwise node of the cuDNN graph."""

    method: str                        # pygraph method name
    kwargs: tuple[tuple[str, float], ...] = ()
    operand: int | None = None         # node-input index of a binary step's operand
    swap: bool = False


def fused_op(step: EpilogueStep, operand_shape: tuple[int, ...] | None,
             out_shape: tuple[int, ...]) -> FusedOp | None:
    """The cuDNN pointwise node of an epilogue step, or None when cuDNN cannot fuse it."""
    op = step.op
    if op in _BINARY_FUSABLE:
        if operand_shape is None or operand_4d(operand_shape, out_shape) is None:
            return None
        if step.swap and op == "sub":
            return None
        return FusedOp({"max": "max", "min": "min"}.get(op, op), (), step.operand, step.swap)
    if op not in _UNARY_FUSABLE:
        return None
    if op == "clip":
        lo, hi = step.attr("min"), step.attr("max")
        if lo is None:
            return None
        kwargs = (("lower_clip", float(lo)),) + ((("upper_clip", float(hi)),)
                                                  if hi is not None else ())
        return FusedOp("relu", kwargs)
    if op == "leaky_relu":
        return FusedOp("leaky_relu", (("negative_slope", float(step.attr("alpha", 0.01))),))
    if op == "silu":
        return FusedOp("swish", (("swish_beta", 1.0),))
    if op == "gelu_tanh":
        return FusedOp("gelu_approx_tanh")
    return FusedOp(op)


def operand_4d(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[list, list] | None:
    """(dims, strides) of an operand broadcast against the NCHW output (stride 0 on broadcast
    axes), or None when it is not the full output or a per-channel vector."""
    shape = tuple(int(d) for d in shape)
    padded = (1,) * (4 - len(shape)) + shape if len(shape) <= 4 else None
    if padded is None:
        return None
    n, k, h, w = out_shape
    if padded == tuple(out_shape):
        return list(out_shape), [k * h * w, h * w, w, 1]
    if padded in ((1, k, 1, 1),):
        return [1, k, 1, 1], [k, 1, 1, 1]
    return None


def fusable_prefix(workload: Workload) -> list[FusedOp]:
    """The longest prefix of the workload's epilogue that cuDNN pointwise nodes express."""
    out_shape = workload.outputs[0].shape
    ops = []
    for step in workload.epilogue:
        shape = None
        if step.operand is not None and step.operand < len(workload.inputs) \
                and workload.inputs[step.operand] is not None:
            shape = workload.inputs[step.operand].shape
        fused = fused_op(step, shape, out_shape)
        if fused is None:
            break
        ops.append(fused)
    return ops


def fusion_levels(workload: Workload) -> list[int]:
    """Numbers of epilogue steps to fuse, most first, always ending with 0 (conv + bias)."""
    longest = len(fusable_prefix(workload))
    return sorted({longest, 0}, reverse=True)


def find_plan(names: Sequence[str | None], name: str | None, index: int | None) -> int | None:
    """The plan to execute: the one named `name` (stable across runs), else `index` when it
    builds, else None; with neither, the heuristics' first plan. `names[i]` is None for a
    plan that did not build."""
    if name is not None and name in names:
        return names.index(name)
    if index is not None and 0 <= index < len(names) and names[index] is not None:
        return index
    if name is None and index is None:
        return next((i for i, n in enumerate(names) if n is not None), None)
    return None


def plan_order(names: Sequence[str | None], config: Mapping) -> list[int]:
    """The plans `prepare` tries, in order: the one `config` names (`find_plan`), or, for a
    config naming none, every plan in the heuristics' order (a deselected or failing plan
    is skipped, so the first that builds runs)."""
    if config.get("plan") is None and config.get("index") is None:
        return [i for i, n in enumerate(names) if n is not None]
    index = find_plan(names, config.get("plan"), config.get("index"))
    return [] if index is None else [index]


def _build_first(graph, indices: Sequence[int]) -> int | None:
    """Build the first plan of `indices` that builds; its index, or None."""
    for index in indices:
        try:
            graph.build_plan_at_index(index)
        except Exception:  # barred (not float32) or not supported here: try the next
            continue
        return index
    return None


def plan_configs(level_plans: Mapping[int, Sequence[str | None]],
                 limit: int = MAX_PLANS) -> list[dict]:
    """Configs of every plan that built, per fusion level (most fused first), up to `limit`
    per level: {'fuse', 'plan', 'index'}."""
    configs = []
    for fuse in sorted(level_plans, reverse=True):
        built = [(i, n) for i, n in enumerate(level_plans[fuse]) if n is not None]
        configs += [{"fuse": fuse, "plan": n, "index": i} for i, n in built[:limit]]
    return configs


# ----------------------------------------------------------------------------- the graph


def _frontend():
    try:
        import cudnn
    except Exception as exc:  # ImportError, or a missing libcudnn raised at import
        return None, f"the cuDNN frontend does not import ({type(exc).__name__}: {exc})"
    return cudnn, ""


def _packed_strides(dims: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= int(d)
    return strides[::-1]


_HANDLES: dict = {}


def cudnn_handle(cudnn, cupy):
    """One cuDNN handle per device, created on first use."""
    device = cupy.cuda.Device().id
    if device not in _HANDLES:
        _HANDLES[device] = cudnn.create_handle()
    return _HANDLES[device]


@dataclass
class ConvGraph:
    """A built cuDNN graph and its tensors; `names[i]` is the name of plan i (None when it
    does not build)."""

    graph: object
    tensors: dict            # role ('x', 'w', 'b', 'y', or operand index) -> Tensor
    names: list
    fused: list


def build_conv_graph(workload: Workload, fuse: int, max_plans: int = MAX_PLANS,
                     try_build: bool = True) -> ConvGraph:
    """Build the graph of `workload` with `fuse` epilogue steps fused and rank the plans the
    heuristics offer. With `try_build`, build up to `max_plans` of them (a plan that does not
    build gets the name None); without, only name them (`prepare` builds the one it runs).
    DeviceError when cuDNN offers or builds none."""
    cupy = require_cupy("a cuDNN convolution")
    cudnn, why = _frontend()
    if cudnn is None:
        raise DeviceError(why, hint="install the nvidia-cudnn-frontend wheel with --no-deps")
    g: ConvGeometry = conv_geometry(workload)
    handle = cudnn_handle(cudnn, cupy)
    f32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=f32, intermediate_data_type=f32, compute_data_type=f32,
                          handle=handle)
    x_dims = [g.n, g.c, g.h, g.w]
    w_dims = list(workload.inputs[1].shape)
    out_dims = [g.n, g.k, g.oh, g.ow]
    tensors = {"x": graph.tensor(name="x", dim=x_dims, stride=_packed_strides(x_dims),
                                 data_type=f32),
               "w": graph.tensor(name="w", dim=w_dims, stride=_packed_strides(w_dims),
                                 data_type=f32)}
    value = graph.conv_fprop(image=tensors["x"], weight=tensors["w"],
                             pre_padding=[g.pads[0], g.pads[1]],
                             post_padding=[g.pads[2], g.pads[3]],
                             stride=list(g.strides), dilation=list(g.dilations))
    if len(workload.inputs) > 2 and workload.inputs[2] is not None:
        tensors["b"] = graph.tensor(name="b", dim=[1, g.k, 1, 1], stride=[g.k, 1, 1, 1],
                                    data_type=f32)
        value = graph.bias(input=value, bias=tensors["b"])
    fused = fusable_prefix(workload)[:fuse]
    for number, op in enumerate(fused):
        if op.operand is None:
            value = getattr(graph, op.method)(input=value, **dict(op.kwargs))
            continue
        if op.operand not in tensors:
            dims, strides = operand_4d(workload.inputs[op.operand].shape, out_dims)
            tensors[op.operand] = graph.tensor(name=f"operand{number}", dim=dims,
                                               stride=strides, data_type=f32)
        first, second = (tensors[op.operand], value) if op.swap else (value, tensors[op.operand])
        if op.method in ("max", "min"):
            value = getattr(graph, op.method)(input0=first, input1=second)
        else:
            value = getattr(graph, op.method)(a=first, b=second)
    value.set_output(True).set_data_type(f32).set_dim(out_dims) \
        .set_stride(_packed_strides(out_dims))
    tensors["y"] = value
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([getattr(cudnn.heur_mode, m) for m in HEURISTIC_MODES])
    graph.deselect_numeric_notes([getattr(cudnn.numerical_note, note)
                                  for note in NOT_FLOAT32_NOTES
                                  if hasattr(cudnn.numerical_note, note)])
    names: list = []
    built = 0
    for index in range(graph.get_execution_plan_count()):
        if try_build and built >= max_plans:
            names.append(None)
            continue
        try:
            if try_build:
                graph.build_plan_at_index(index)
            names.append(graph.get_plan_name_at_index(index))
            built += 1
        except Exception:  # a plan that does not build is not a candidate
            names.append(None)
    if not built:
        raise DeviceError(f"{workload.label}: cuDNN built no plan with {fuse} fused "
                          "epilogue steps", hint="a smaller fusion level may work")
    return ConvGraph(graph, tensors, names, fused)


_PLAN_CACHE: dict[tuple[str, int], list] = {}


class CudnnConv(Implementation):
    """2-D Conv (+bias, +fused epilogue) through cuDNN; one config per execution plan."""

    name = "cudnn"
    kind = VENDOR
    target = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        geometry = conv_geometry(workload)
        if isinstance(geometry, str):
            return geometry

        why = missing_reason()
        return why if why is not None else _frontend()[1] or None

    def configs(self, workload: Workload) -> list[dict]:
        """One config per plan that builds, for the most fused level cuDNN takes and for the
        plain convolution (the rest of the epilogue then runs as its own kernel)."""
        level_plans = {}
        for fuse in fusion_levels(workload):
            key = (workload.key, fuse)
            if key not in _PLAN_CACHE:
                try:
                    _PLAN_CACHE[key] = build_conv_graph(workload, fuse).names
                except Exception:
                    _PLAN_CACHE[key] = []
            if _PLAN_CACHE[key]:
                level_plans[fuse] = _PLAN_CACHE[key]
        return plan_configs(level_plans)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        cupy = require_cupy("a cuDNN convolution")
        cudnn, _ = _frontend()
        fuse = int(config.get("fuse", 0))
        built = build_conv_graph(workload, fuse, try_build=False)
        graph = built.graph
        index = _build_first(graph, plan_order(built.names, config))
        if index is None:
            raise DeviceError(f"{workload.label}: cuDNN plan {config.get('plan')!r} is not "
                              "available here", hint="rebuild or `wpk tune` the plan")
        workspace = cupy.empty(max(1, graph.get_workspace_size_plan_at_index(index)), cupy.uint8)
        handle = cudnn_handle(cudnn, cupy)
        rest = dataclasses.replace(workload, epilogue=workload.epilogue[len(built.fused):])
        epilogue = epilogue_kernel(rest)
        tensors = built.tensors

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            out = outputs[0]
            pack = {tensors["x"]: inputs[0].data.ptr, tensors["w"]: inputs[1].data.ptr,
                    tensors["y"]: out.data.ptr}
            if "b" in tensors:
                pack[tensors["b"]] = inputs[2].data.ptr
            for role, tensor in tensors.items():
                if isinstance(role, int):
                    pack[tensor] = inputs[role].data.ptr
            cudnn.set_stream(handle, cupy.cuda.get_current_stream().ptr)
            graph.execute_plan_at_index(pack, workspace.data.ptr, index=index, handle=handle)
            if epilogue is not None:
                epilogue(out, inputs)

        kernel.keep = (built, workspace)
        kernel.plan = {"fuse": fuse, "plan": built.names[index], "index": index}
        return kernel


CUDNN = register(CudnnConv())
