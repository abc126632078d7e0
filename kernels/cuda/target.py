"""The CUDA target: a GPU preset, timed with CUDA events or, offline, predicted.

    target = CudaTarget.create(gpu="h100")                 # the GPU must be present
    target = CudaTarget.create(gpu="p100", offline=True)   # any machine: predicted
    target.candidates(workload)    # generated configs, cuDNN/cuBLAS, device copy, host step

`--gpu NAME` without `--offline` needs that GPU to be present: otherwise a
DeviceError names the preset and what is present ("no GPU present" or "found
NVIDIA A100 (sm_80), not h100") and hints at `--offline`.

Candidates of a workload: the generated kernel in a few preferred configs
for the preset (and, for 3x3 stride-1 convolutions, the Winograd kernel of
`wpk.kernels.cuda.winograd` in one config per output tile size), cuDNN or
cuBLAS (offline: a placeholder whose time the analytical model predicts,
which hands over to the real library on the GPU), a device copy for data
movement, and the host step only where nothing runs the workload on the
device. Tuning records of a preset carry its name in the device fingerprint
(h100 and h200 share sm_90, not their timings), and predictions carry a
fingerprint of their own ('predicted:...'), so they never stand in for
measurements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from wpk.core.devices import GPU_PRESETS, HardwareSpec, detect_gpus, gpu_preset
from wpk.core.errors import DeviceError, OptionError, ScheduleError
from wpk.core.workload import Workload
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_version, tool_version
from wpk.kernels import registry
from wpk.kernels.cuda.fused import fused_candidates
from wpk.kernels.cuda.generated import (
    DSL_CUDA,
    GPU_KEY,
    cuda_template,
    preferred_configs,
)
from wpk.kernels.cuda.predicted import (
    CUBLAS,
    CUDNN,
    DEVICE_COPY,
    HOST_STEP,
    host_config,
    vendor_library,
)
from wpk.kernels.cuda.winograd import (
    WINOGRAD_CUDA,
    CudaWinogradKernels,
    preferred_winograd_configs,
    winograd_reason,
)
from wpk.kernels.generated import map_workload
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import VENDOR, Candidate
from wpk.kernels.target import GeneratedKernels, Target, TargetFingerprint, fingerprint_of

PREDICTED_PREFIX = "predicted:"
WINOGRAD_CONFIGS = 2      # an untuned build tries the preferred config of each m


def compiler_version() -> str:
    """The CUDA compiler generated kernels are built with: nvcc, else NVRTC."""
    nvcc = find_nvcc()
    return tool_version(nvcc) if nvcc else f"nvrtc {nvrtc_version()}"


def describe_present(gpus) -> str:
    """'no GPU present' or 'found NVIDIA A100 (sm_80)[, ...]'."""
    if not gpus:
        return "no GPU present"
    return "found " + ", ".join(f"{g.name} (sm_{g.compute_capability[0]}"
                                f"{g.compute_capability[1]})" for g in gpus)


def preset_to_build_for(gpu_name: str | None, offline: bool, present=None) -> HardwareSpec:
    """The preset to build for; DeviceError when it is absent and the build is not offline.
    `present` is the list of detected GPUs (default: `detect_gpus()`)."""
    name = (gpu_name or "auto").strip().lower()
    present = detect_gpus() if present is None else present
    if name == "auto":
        if offline:
            raise OptionError("--gpu auto --offline: auto means the GPU present; an offline "
                              "build needs a named preset",
                              hint=f"name one of: {', '.join(GPU_PRESETS)}")
        matching = [g for g in present if g.preset is not None]
        if not matching:
            what = describe_present(present) + (", none of them a wpk preset" if present
                                                 else "")
            raise DeviceError(f"target cuda (--gpu auto): {what}",
                              hint=f"name a preset ({', '.join(GPU_PRESETS)}) and add "
                              "--offline to build without the GPU, or build with --cpu")
        return GPU_PRESETS[matching[0].preset]
    gpu = gpu_preset(name)
    if not offline and not any(g.preset == gpu.name for g in present):
        raise DeviceError(f"--gpu {gpu.name}: {describe_present(present)}, not {gpu.name} "
                          f"({gpu.description}, {gpu.arch})",
                          hint=f"add --offline to compile and check kernels for {gpu.name} "
                               "without it (choices are then predicted, not measured), or "
                               "build with --cpu")
    return gpu


def device_of(gpu: HardwareSpec) -> dict:
    """The plan's device entry of a preset."""
    return {"kind": "cuda", "name": gpu.name, "arch": gpu.arch,
            "description": gpu.description, "fingerprint": gpu.fingerprint}


class CudaGenerated(GeneratedKernels):
    """Generated CUDA kernels (`dsl.cuda`) for one preset: a config is the template's knobs
    plus `"gpu": PRESET`, so records of one preset never match another's."""

    impl = "dsl.cuda"
    modules = ("wpk.kernels.cuda.generated",)

    def __init__(self, gpu: HardwareSpec):
        self.gpu = gpu

    def template(self, workload: Workload):
        return cuda_template(workload, self.gpu)

    def config(self, knobs: Mapping) -> dict:
        return {**dict(knobs), GPU_KEY: self.gpu.name}

    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list[CompileJob]:
        return [CompileJob("wpk.kernels.cuda.generated:compile_for_cache",
                           {"workload": workload.to_json(), "config": self.config(c)},
                           label=f"{workload.label} {dict(c)}") for c in configs]


class CudaTarget(Target):
    """A GPU preset (see the module docstring); `predicted` for an offline build."""

    name = "cuda"
    timer = "cuda-events"
    streams = True
    session = "wpk.runtime_cuda:CudaSession"
    default_generated = 3

    @classmethod
    def create(cls, gpu: str | None = None, offline: bool = False, present=None,
               **options: Any) -> CudaTarget:
        return cls.for_preset(preset_to_build_for(gpu, offline, present), predicted=offline)

    @classmethod
    def for_preset(cls, gpu: HardwareSpec, predicted: bool = False) -> CudaTarget:
        """The target of preset `gpu` without the presence check."""
        return cls(gpu, CudaGenerated(gpu), predicted, also=(CudaWinogradKernels(gpu),))

    def candidates(self, workload: Workload, generated: int | None = None) -> list[Candidate]:
        count = self.default_generated if generated is None else generated
        found = [Candidate(DSL_CUDA, config) for config in self._configs(workload, count)]
        found += [Candidate(WINOGRAD_CUDA, c) for c in self._winograd_configs(workload, count)]
        # no search family tunes the fused kernels (Attention, ...): always offered
        found += fused_candidates(workload, self.hardware, count or self.default_generated)
        library = vendor_library(workload)
        if self.predicted and library is not None:
            found.append(Candidate(CUDNN if library == "cudnn" else CUBLAS, {}))
        if DEVICE_COPY.unsupported_reason(workload) is None:
            found.append(Candidate(DEVICE_COPY, {}))
        if not self.predicted:  # the real vendor implementations registered for cuda
            labels = {c.label for c in found}
            found += [c for c in registry.candidates(workload, self.name)
                      if c.label not in labels and c.implementation.kind == VENDOR]
        if not found:  # nothing runs it on the device: the host computes it
            config = host_config(workload)
            if config is not None:
                found.append(Candidate(HOST_STEP, config))
        return found

    def _configs(self, workload: Workload, count: int) -> list[dict]:
        if count <= 0 or isinstance(map_workload(workload), str):
            return []
        try:
            return preferred_configs(workload, self.hardware, count)
        except ScheduleError:
            return []

    def _winograd_configs(self, workload: Workload, count: int) -> list[dict]:
        """One preferred Winograd config per output tile size m (3x3 stride-1 convs)."""
        if count <= 0 or winograd_reason(workload) is not None:
            return []
        try:
            return preferred_winograd_configs(workload, self.hardware, WINOGRAD_CONFIGS)
        except ScheduleError:
            return []

    def fingerprint(self) -> TargetFingerprint:
        device = f"{self.hardware.fingerprint}:{self.hardware.name}"
        return fingerprint_of(self.hardware, compiler_version,
                              (PREDICTED_PREFIX + device) if self.predicted else device)

    def device(self) -> dict:
        return device_of(self.hardware)

    def create_options(self) -> dict:
        return {"gpu": self.hardware.name, "offline": self.predicted}
