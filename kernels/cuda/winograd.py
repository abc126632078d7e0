"""`dsl.cuda.winograd`: Winograd F(2x2,3x3) and F(4x4,3x3) convolutions on CUDA, generated
from the DSL operators of `kernels/dsl/winograd.wpk`.

    WINOGRAD_CUDA.unsupported_reason(workload)      # None for a 3x3 s1 d1 ungrouped Conv
    space = winograd_space(workload, gpu)            # m and the stages' knobs (the search)
    configs = preferred_winograd_configs(workload, gpu, count=2)   # both m first
    built = WINOGRAD_CUDA.build(workload, config)    # BuiltCuda: three kernels, one module

A config is the stage knobs of `wpk.kernels.templates.winograd_cuda` plus `"m"` (2 or 4)
and `"gpu": PRESET`. The operator's parameters are the workload's input (`X`), bias (`B`)
and epilogue operands (`E{i}`), fed like `dsl.cuda`'s, and three constants computed once
from the filter before the kernel runs (like the CPU family `micro.winograd`): the
transformed filter `U` = G g G^T (in float64, stored as float32) and the transforms
`BT` = B^T and `AT` = A^T of F(m, 3). Their role in `launch.json` is `constant`.

The kernel is verified like every generated one (the GPU emulator against the float64
reference) with the Winograd error bound of the CPU family as its tolerance
(`Implementation.tolerance`); the analytical model counts the three stages' work
(`analytic.winograd_work`) instead of the direct convolution's.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.devices import gpu_preset
from wpk.core.errors import ScheduleError
from wpk.core.workload import Workload
from wpk.dsl import compute as C
from wpk.dsl.codegen_cuda import generate_cuda
from wpk.dsl.epilogue import with_epilogue
from wpk.dsl.toolchain_cuda import compile_cuda
from wpk.kernels.cpu.microkernels.winograd_space import (
    EPS32,
    SAFETY,
    amplification,
    filter_transform,
    transforms,
)
from wpk.kernels.cuda import analytic
from wpk.kernels.cuda.cupy_support import require_cupy
from wpk.kernels.cuda.generated import (
    GPU_KEY,
    BuiltCuda,
    CudaModuleImplementation,
    launch_description,
    load_cubin_kernel,
    split_config,
)
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.generated import map_workload
from wpk.kernels.generated_ops import bind
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import GENERATED, Kernel, register
from wpk.kernels.target import GeneratedKernels
from wpk.kernels.templates import lower_for, template_for
from wpk.kernels.templates.winograd_cuda import M_CHOICES, WinogradSpace

CONSTANTS = ("BT", "AT", "U")
UNIT_GEOMETRY = (1, 1, 1, 1, 1)     # strides, dilations, groups Winograd F(m, 3) computes


@dataclass(frozen=True)
class WinogradMapping:
    """A Conv workload as the Winograd operator of one m: the operator (epilogue fused),
    its bindings, the workload input feeding each non-constant parameter."""

    op: object
    bindings: dict
    feeds: dict
    output: str
    m: int


def winograd_reason(workload: Workload) -> str | None:
    """None when the workload is a float32 3x3 stride-1 dilation-1 ungrouped 2-D Conv with
    a constant filter (transformed once), else why Winograd does not compute it."""
    if workload.op != "Conv" or workload.domain not in ("", "ai.onnx"):
        return "Winograd computes standard Conv workloads"
    mapping = map_workload(workload)
    if isinstance(mapping, str):
        return mapping
    if tuple(workload.inputs[1].shape[2:]) != (3, 3):
        return "Winograd F(m, 3) computes 3x3 convolutions"
    b = mapping.bindings
    if (b["stride_h"], b["stride_w"], b["dil_h"], b["dil_w"], b["groups"]) != UNIT_GEOMETRY:
        return "Winograd F(m, 3) computes stride-1 dilation-1 convolutions of one group"
    if 1 not in workload.const_inputs:
        return "the filter must be a constant (it is transformed once, before the run)"
    return None


_MAPPINGS: dict[tuple[str, int], WinogradMapping] = {}


def winograd_mapping(workload: Workload, m: int) -> WinogradMapping:
    """The Winograd operator of `workload` for output tiles of m x m (cached)."""
    key = (workload.key, m)
    if key not in _MAPPINGS:
        _MAPPINGS[key] = _map(workload, m)
    return _MAPPINGS[key]


def _map(workload: Workload, m: int) -> WinogradMapping:
    reason = winograd_reason(workload)
    if reason is not None:
        raise ScheduleError(f"{workload.label}: {reason}", hint="Winograd is a candidate of "
                            "3x3 stride-1 convolutions only")
    conv = map_workload(workload)
    has_bias = "B" in conv.feeds
    op = load_operator("winograd_conv2d_bias" if has_bias else "winograd_conv2d")
    operands = sorted({s.operand for s in workload.epilogue if s.operand is not None})
    folded = {i: tuple(C.bind_dim(d, conv.bindings) for d in conv.op.param(f"E{i}").shape)
              for i in operands}
    op = with_epilogue(op, workload.epilogue, folded)
    k, c = workload.inputs[1].shape[:2]
    t = m + 2
    shapes = {"X": workload.inputs[0].shape, "BT": (t, t), "AT": (m, t), "U": (t * t, k, c)}
    feeds = {"X": 0}
    if has_bias:
        shapes["B"], feeds["B"] = (k,), 2
    shapes |= {f"E{i}": s for i, s in folded.items()}
    feeds |= {f"E{i}": i for i in operands}
    scalars = {p: conv.bindings[p] for p in ("pad_t", "pad_l", "pad_b", "pad_r")}
    return WinogradMapping(op, bind(op, shapes, scalars), feeds, op.outputs[0], m)


def winograd_constants(weight: np.ndarray, m: int) -> dict[str, np.ndarray]:
    """BT, AT (float32) and the transformed filter U = G g G^T, [(m+2)^2, K, C], computed
    in float64 and stored as float32."""
    bt, _, at = transforms(m)
    k, c = weight.shape[:2]
    u = filter_transform(weight, m)
    return {"BT": bt.astype(np.float32), "AT": at.astype(np.float32),
            "U": np.ascontiguousarray(u.reshape((m + 2) ** 2, k, c), np.float32)}


def error_bound(workload: Workload, m: int) -> float:
    """The relative L2 error F(m, 3) may have against float64 (the CPU family's bound):
    SAFETY * eps32 * (sqrt(9 C) + amplification(m))."""
    channels = int(workload.inputs[1].shape[1])
    return SAFETY * EPS32 * (math.sqrt(9 * channels) + amplification(m))


@functools.lru_cache(maxsize=256)
def _template(key: str, m: int, preset: str):
    mapping = _MAPPINGS[(key, m)]
    return template_for(C.specialize(mapping.op, mapping.bindings), "cuda", gpu_preset(preset))


def winograd_template(workload: Workload, m: int, gpu):
    """The CUDA `WinogradTemplate` of the workload's operator for m, on preset `gpu`."""
    winograd_mapping(workload, m)
    return _template(workload.key, m, gpu.name)


def winograd_space(workload: Workload, gpu) -> WinogradSpace:
    """The search space (m and the stages' knobs) of the workload on preset `gpu`."""
    reason = winograd_reason(workload)
    if reason is not None:
        raise ScheduleError(f"{workload.label}: {reason}",
                            hint="Winograd is a candidate of 3x3 stride-1 convolutions only")
    return WinogradSpace(lambda m: winograd_template(workload, m, gpu))


def preferred_winograd_configs(workload: Workload, gpu, count: int = 2) -> list[dict]:
    """Up to `count` valid configs for `gpu`, the best point of each m first."""
    configs = winograd_space(workload, gpu).preferred_configs(count)
    return [dict(c, **{GPU_KEY: gpu.name}) for c in configs]


def build_winograd(workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
    """Lower, print and (with `compile`) compile the Winograd module of `config` for its
    preset; ScheduleError when the config does not fit, ToolchainError when compiling
    fails."""
    knobs, preset = split_config(config)
    gpu = gpu_preset(preset or "auto")
    m = knobs.pop("m", None)
    if m not in M_CHOICES:
        raise ScheduleError(f"{workload.label}: Winograd config {dict(config)} has no m in "
                            f"{M_CHOICES}", hint="pick a point of winograd_space()")
    mapping = winograd_mapping(workload, m)
    reason = winograd_template(workload, m, gpu).validate(knobs)
    if reason is not None:
        raise ScheduleError(f"{workload.label}: Winograd config {dict(config)} does not fit "
                            f"{gpu.name}: {reason}", hint="pick a point of winograd_space()")
    func = lower_for(mapping.op, mapping.bindings, knobs, "cuda", gpu)
    source, launches = generate_cuda(func)
    binary = compile_cuda(source, gpu.arch) if compile else None
    return BuiltCuda(func, source, launches, binary, gpu)


def compile_winograd_for_cache(workload: Mapping, config: Mapping) -> str:
    """Compile a Winograd config into the compile cache (a `CompileJob` function)."""
    return build_winograd(Workload.from_json(workload), config).binary.arch


def parameter_table(func, mapping: WinogradMapping) -> list[dict]:
    """Pointer arguments in order, as `generated.parameter_table`, constants included."""
    table = []
    for buffer in func.params:
        size = math.prod(buffer.shape)
        if buffer.name == mapping.output:
            role, index = "output", 0
        elif buffer.name in mapping.feeds:
            role, index = "input", mapping.feeds[buffer.name]
        elif buffer.name in CONSTANTS:
            role, index = "constant", -1
        else:
            raise ValueError(f"Winograd kernel parameter {buffer.name} has no feed")
        table.append({"name": buffer.name, "role": role, "index": index, "size": size,
                      "dtype": buffer.dtype})
    for buffer in func.workspaces:
        table.append({"name": buffer.name, "role": "workspace", "index": -1,
                      "size": math.prod(buffer.shape), "dtype": buffer.dtype})
    return table


class DslCudaWinograd(CudaModuleImplementation):
    """Winograd F(m x m, 3x3) convolutions generated for a GPU preset (module docstring)."""

    name = "dsl.cuda.winograd"
    kind = GENERATED
    target = "cuda"
    pipeline = True

    def unsupported_reason(self, workload: Workload) -> str | None:
        return winograd_reason(workload)

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'winograd F(m x m,3x3)' with the config's output tile m."""
        m = int(config.get("m", 0) or 0)
        return f"winograd F({m}x{m},3x3)" if m else "winograd"

    def tolerance(self, workload: Workload, config: Mapping) -> float | None:
        """The Winograd error bound of the config's m (grows with the input channels)."""
        m = config.get("m")
        return error_bound(workload, int(m)) if m in M_CHOICES else None

    def configs(self, workload: Workload) -> list[dict]:
        """None by enumeration: configs come from the CUDA target (for a preset) or the
        search."""
        return []

    def build(self, workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
        return build_winograd(workload, config, compile)

    def emulator_feeds(self, workload: Workload, inputs: Sequence, config: Mapping
                       ) -> tuple[dict, str]:
        mapping = winograd_mapping(workload, int(config["m"]))
        feeds = {name: np.asarray(inputs[index]) for name, index in mapping.feeds.items()}
        return feeds | winograd_constants(np.asarray(inputs[1]), mapping.m), mapping.output

    def algorithm_work(self, workload: Workload, config: Mapping):
        return analytic.winograd_work(workload, int(config["m"]))

    def launch_document(self, workload: Workload, built: BuiltCuda, config: Mapping) -> dict:
        """launch.json with the Winograd parameter table and the tile size m."""
        mapping = winograd_mapping(workload, int(config["m"]))
        launch = launch_description(workload, built, parameter_table(built.func, mapping))
        return dict(launch, m=mapping.m)

    def prepare_from_artifacts(self, workload: Workload, consts: Mapping[int, np.ndarray],
                               config: Mapping, artifacts: Mapping[str, bytes]) -> Kernel:
        """Transform the filter on the host, upload the constants, load the cubin (cupy)."""
        cupy = require_cupy("a Winograd CUDA kernel")
        launch = json.loads(artifacts["launch.json"])
        weight = consts[1].get() if hasattr(consts[1], "get") else np.asarray(consts[1])
        constants = {name: cupy.asarray(value)
                     for name, value in winograd_constants(weight, int(launch["m"])).items()}
        kernel = load_cubin_kernel(artifacts["kernel.cubin"], launch, constants)
        kernel.constants = constants     # they live as long as the kernel
        return kernel


WINOGRAD_CUDA = register(DslCudaWinograd())


class CudaWinogradKernels(GeneratedKernels):
    """The Winograd kernels of one preset as a generated family the search tunes (m a
    knob); configs carry `"gpu": PRESET` like `dsl.cuda`'s."""

    impl = "dsl.cuda.winograd"
    modules = ("wpk.kernels.cuda.winograd",)

    def __init__(self, gpu):
        self.gpu = gpu

    def template(self, workload: Workload) -> WinogradSpace:
        return winograd_space(workload, self.gpu)

    def config(self, knobs: Mapping) -> dict:
        return {**dict(knobs), GPU_KEY: self.gpu.name}

    def supports(self, workload: Workload) -> bool:
        return winograd_reason(workload) is None

    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list[CompileJob]:
        return [CompileJob("wpk.kernels.cuda.winograd:compile_winograd_for_cache",
                           {"workload": workload.to_json(), "config": self.config(c)},
                           label=f"{workload.label} {dict(c)}") for c in configs]
