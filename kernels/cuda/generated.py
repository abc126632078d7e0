"""Generated CUDA kernels: workloads mapped onto DSL operators, compiled for a GPU preset.

    DSL_CUDA = registry.get("dsl.cuda")
    configs = preferred_configs(workload, gpu, count=3)     # valid knob dicts for the preset
    built = build_for(workload, config)                     # BuiltCuda: func, source, binary
    files = DSL_CUDA.artifacts(workload, config)            # stored in the plan's kernels/

The mapping (which DSL operator, bindings, which workload tensor feeds each
parameter) is the CPU bridge's, `wpk.kernels.generated.map_workload`. A
config is the template's knob dict plus `"gpu": PRESET` (the preset it was
validated and compiled for; `split_config` separates the two). Artifacts:

* `kernel.cubin`: the module compiled for the preset's arch,
* `kernel.cu` (always) and `kernel.ptx` (NVRTC path): for JIT loading on a
  newer GPU of the same family,
* `launch.json`: arch, preset, the kernels in launch order with grid, block,
  shared memory and ptxas usage, and the parameter order (which input or
  output of the step each pointer is, and the workspaces to allocate).

`prepare` / `prepare_from_artifacts` load the cubin with cupy and return
`kernel(inputs, outputs)` over cupy arrays. cupy is imported only there, so
this module imports (and offline builds run) without cupy or a GPU.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from wpk.core.devices import gpu_preset
from wpk.core.errors import DeviceError, ScheduleError, UnsupportedError
from wpk.core.workload import Workload
from wpk.dsl.codegen_cuda import generate_cuda
from wpk.dsl.compute import specialize
from wpk.dsl.toolchain_cuda import compile_cuda
from wpk.kernels.generated import _MAPPINGS, map_workload
from wpk.kernels.registry import GENERATED, Implementation, Kernel, register
from wpk.kernels.templates import lower_for, template_for

GPU_KEY = "gpu"
DEFAULT_CONFIG_COUNT = 3


def split_config(config: Mapping) -> tuple[dict, str | None]:
    """(template knobs, preset name or None) of a `dsl.cuda` config."""
    knobs = {k: v for k, v in config.items() if k != GPU_KEY}
    return knobs, config.get(GPU_KEY)


def _preset(name: str | None):
    return gpu_preset(name or "auto")


def workload_mapping(workload: Workload):
    """The DSL mapping of a workload (UnsupportedError when it has none)."""
    mapping = map_workload(workload)
    if isinstance(mapping, str):
        raise UnsupportedError(f"{workload.label}: {mapping}",
                               hint="only workloads that map to DSL operators have a "
                                    "generated CUDA kernel")
    return mapping


@functools.lru_cache(maxsize=512)
def _template(key: str, preset: str):
    mapping = _MAPPINGS[key]
    return template_for(specialize(mapping.op, mapping.bindings), "cuda", _preset(preset))


def cuda_template(workload: Workload, gpu):
    """The CUDA schedule template of a mapped workload, validated against preset `gpu`."""
    workload_mapping(workload)
    return _template(workload.key, gpu.name)


def preferred_configs(workload: Workload, gpu, count: int = DEFAULT_CONFIG_COUNT,
                      scan: int = 400) -> list[dict]:
    """Up to `count` valid configs of the template for `gpu`: the template's first valid
    point, then the first valid point staging through shared memory (each `cache_*`
    knob) and the first with a reduction split otherwise (`reduce_parts`), then further
    points differing in block shape, so the analytical model ranks
    real alternatives and the checks cover shared memory and barriers."""
    template = cuda_template(workload, gpu)
    points = list(itertools.islice(template.preferred_points(), scan))  # spaces reach 10^5
    valid: list[dict] = []
    fits: dict[tuple, bool] = {}    # the passes below meet the same points again

    def fitting(point: dict) -> bool:
        key = tuple(sorted(point.items()))
        if key not in fits:
            fits[key] = template.validate(point) is None   # lowers the whole operator
        return fits[key]

    def take(candidates) -> None:
        for index, point in enumerate(candidates):
            if index >= scan or len(valid) >= count:
                return
            if all(_distinct(point, other) for other in valid) and fitting(point):
                valid.append(point)
                return

    take(points)
    space = template.space()
    for flag in [k for k in space if k.startswith("cache_")]:
        take([p for p in points if p[flag]])
    for parts in space.get("reduce_parts", []):    # a reduction split and one not split
        take([p for p in points if p["reduce_parts"] == parts])
    while len(valid) < count:
        before = len(valid)
        take(points)
        if len(valid) == before:
            break
    return [dict(point, **{GPU_KEY: gpu.name}) for point in valid]


def _distinct(a: Mapping, b: Mapping) -> bool:
    """Whether two points differ in their block shape, in how a reduction is split or in
    at least two knobs."""
    shape = [k for k in a if k.startswith("threads") or k in ("block_k", "reduce_parts")]
    return any(a[k] != b[k] for k in shape) or sum(a[k] != b[k] for k in a) >= 2


@dataclass(frozen=True)
class KernelIo:
    """Which step input feeds each kernel parameter (name -> index), and the output's name;
    a DSL mapping has the same two attributes."""

    feeds: Mapping[str, int]
    output: str


@dataclass
class BuiltCuda:
    """A workload's CUDA module for one config: loop IR, launches, binary (with usage)."""

    func: object            # wpk.dsl.loopir.PrimFunc
    source: str
    launches: list          # codegen_cuda.KernelLaunch
    binary: object | None   # toolchain_cuda.CudaBinary (None when not compiled)
    gpu: object             # the preset HardwareSpec


def build_for(workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
    """Lower, print and (with `compile`) compile the workload's kernel for the config's
    preset. Raises ScheduleError when the config does not fit the preset (before any
    compilation) and ToolchainError when compilation fails."""
    knobs, preset = split_config(config)
    gpu = _preset(preset)
    mapping = workload_mapping(workload)
    template = cuda_template(workload, gpu)
    reason = template.validate(knobs)
    if reason is not None:
        raise ScheduleError(f"{workload.label}: config {knobs} does not fit {gpu.name}: "
                            f"{reason}", hint="pick a point of the template's knob space")
    func = lower_for(mapping.op, mapping.bindings, knobs, "cuda", gpu)
    source, launches = generate_cuda(func)
    binary = None
    if compile:
        binary = compile_cuda(source, gpu.arch)
    return BuiltCuda(func, source, launches, binary, gpu)


def compile_for_cache(workload: Mapping, config: Mapping) -> str:
    """Compile a workload's generated CUDA kernel for the preset named in `config` into the
    compile cache (a `CompileJob` function); returns the arch it was compiled for."""
    return build_for(Workload.from_json(workload), config).binary.arch


def parameter_table(func, mapping) -> list[dict]:
    """Pointer arguments in order: {'name', 'role' (input|output|workspace), 'index',
    'size', 'dtype'}; `index` is the step's input/output index."""
    table = []
    for buffer in func.params:
        size = math.prod(buffer.shape)
        if buffer.name == mapping.output:
            table.append({"name": buffer.name, "role": "output", "index": 0, "size": size,
                          "dtype": buffer.dtype})
        elif buffer.name in mapping.feeds:
            table.append({"name": buffer.name, "role": "input",
                          "index": mapping.feeds[buffer.name], "size": size,
                          "dtype": buffer.dtype})
        else:
            raise ValueError(f"generated kernel parameter {buffer.name} has no feed")
    for buffer in func.workspaces:
        table.append({"name": buffer.name, "role": "workspace", "index": -1,
                      "size": math.prod(buffer.shape), "dtype": buffer.dtype})
    return table


def launch_description(workload: Workload, built: BuiltCuda, params: list[dict] | None = None
                       ) -> dict:
    """The `launch.json` document of a built module (see the module docstring); `params`
    defaults to the `parameter_table` of the workload's DSL mapping."""
    usage = built.binary.kernels if built.binary is not None else {}
    kernels = []
    for item in built.launches:
        used = usage.get(item.name)
        kernels.append({"name": item.name, "grid": list(item.launch.grid),
                        "block": list(item.launch.block),
                        "shared_bytes": item.launch.shared_bytes,
                        "usage": asdict(used) if used is not None else None})
    return {"format": 1, "gpu": built.gpu.name, "arch": built.gpu.arch,
            "compiler": built.binary.compiler if built.binary is not None else None,
            "kernels": kernels,
            "params": params if params is not None
            else parameter_table(built.func, workload_mapping(workload))}


class CudaModuleImplementation(Implementation):
    """A generated implementation whose config builds one CUDA module for a preset: what
    an offline build compiles, checks, emulates and predicts (`wpk.search.predicted`).
    `pipeline`: its kernels before the last compute intermediates every output needs, so
    the emulator runs them fully (`offline.emulate_sampled`); `is_pipeline(config)` says
    so per config."""

    pipeline = False

    def is_pipeline(self, config: Mapping) -> bool:
        """Whether the kernels before the last of `config`'s module compute intermediates
        every output needs (the emulator then runs them fully)."""
        return self.pipeline

    def build(self, workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
        """The module of `config` (compiled for its preset with `compile`)."""
        raise NotImplementedError

    def emulator_feeds(self, workload: Workload, inputs: Sequence, config: Mapping
                       ) -> tuple[dict, str]:
        """(arrays by parameter name, output parameter) for emulating the module on the
        workload's `inputs`."""
        raise NotImplementedError

    def algorithm_work(self, workload: Workload, config: Mapping) -> tuple[float, float] | None:
        """(flops, minimum bytes) of the algorithm when it is not the workload's own
        (`analytic.workload_work`), else None."""
        return None

    def launch_document(self, workload: Workload, built: BuiltCuda, config: Mapping) -> dict:
        """The module's `launch.json` (default: the DSL mapping's parameter table)."""
        return launch_description(workload, built)

    def artifacts(self, workload: Workload, config: Mapping) -> dict[str, bytes]:
        """cubin, CUDA source (+ PTX on the NVRTC path) and launch.json of the config."""
        built = self.build(workload, config)
        launch = self.launch_document(workload, built, config)
        files = {"kernel.cubin": built.binary.cubin, "kernel.cu": built.source.encode(),
                 "launch.json": json.dumps(launch, indent=1).encode()}
        if built.binary.ptx:
            files["kernel.ptx"] = built.binary.ptx.encode()
        return files

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        return self.prepare_from_artifacts(workload, consts, config,
                                           self.artifacts(workload, config))

    def prepare_from_artifacts(self, workload: Workload, consts: Mapping[int, np.ndarray],
                               config: Mapping, artifacts: Mapping[str, bytes]) -> Kernel:
        """Load the stored cubin with cupy; kernel(inputs, outputs) takes cupy arrays."""
        return load_cubin_kernel(artifacts["kernel.cubin"], json.loads(artifacts["launch.json"]))


class DslCuda(CudaModuleImplementation):
    """Generated CUDA kernels of DSL operators, for the preset named in the config."""

    name = "dsl.cuda"
    kind = GENERATED
    target = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        mapping = map_workload(workload)
        return mapping if isinstance(mapping, str) else None

    def configs(self, workload: Workload) -> list[dict]:
        """None by enumeration: configs come from the offline planner (for a preset) or the
        search."""
        return []

    def io(self, workload: Workload):
        """Which step input feeds each kernel parameter, and the output parameter."""
        return workload_mapping(workload)

    def build(self, workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
        return build_for(workload, config, compile)

    def is_pipeline(self, config: Mapping) -> bool:
        # a reduction cut into parts: every output of a row needs all of the row's parts
        return config.get("reduce_parts", 1) > 1

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'split reduction, up to N parts' for a config with `reduce_parts` N > 1."""
        parts = config.get("reduce_parts", 1)
        return f"split reduction, up to {parts} parts" if parts > 1 else self.name

    def emulator_feeds(self, workload: Workload, inputs: Sequence, config: Mapping
                       ) -> tuple[dict, str]:
        mapping = workload_mapping(workload)
        return ({name: np.asarray(inputs[index]) for name, index in mapping.feeds.items()},
                mapping.output)



def load_cubin_kernel(cubin: bytes, launch: Mapping, constants: Mapping | None = None
                      ) -> Kernel:
    """A kernel(inputs, outputs) launching every kernel of `launch` from `cubin` (cupy);
    parameters of role `constant` are the device arrays of `constants` by name."""
    try:
        import cupy
    except ImportError:
        raise DeviceError(f"running a {launch['gpu']} kernel needs cupy and an NVIDIA GPU",
                          hint="install cupy-cuda12x or cupy-cuda13x on the GPU machine"
                          ) from None
    module = cupy.cuda.function.Module()
    module.load(bytes(cubin))
    functions = [(module.get_function(k["name"]), tuple(k["grid"]), tuple(k["block"]))
                 for k in launch["kernels"]]
    params = launch["params"]
    dtypes = {"f32": cupy.float32, "f64": cupy.float64, "i32": cupy.int32, "i64": cupy.int64}
    workspaces = {p["name"]: cupy.empty(p["size"], dtypes[p["dtype"]])
                  for p in params if p["role"] == "workspace"}

    def kernel(inputs: Sequence, outputs: Sequence) -> None:
        args = []
        for p in params:
            if p["role"] == "workspace":
                args.append(workspaces[p["name"]])
                continue
            if p["role"] == "constant":
                args.append(constants[p["name"]])
                continue
            array = outputs[p["index"]] if p["role"] == "output" else inputs[p["index"]]
            if array.size != p["size"]:
                raise ValueError(f"{p['name']}: {array.size} elements where {p['size']} "
                                 "are expected")
            if p["role"] == "input":
                array = cupy.ascontiguousarray(cupy.asarray(array, dtypes[p["dtype"]]))
            args.append(array)
        for function, grid, block in functions:
            function(grid, block, tuple(args))

    kernel.module = module   # keep the module alive as long as the kernel
    return kernel


DSL_CUDA = register(DslCuda())
