"""Where the search's generated kernels run: the CPU (C) or a GPU preset (CUDA).

    target = generated_target("cpu")                 # dsl.cpu, the host's C kernels
    target = generated_target("cuda", gpu=preset)    # dsl.cuda, compiled for the preset
    space = target.space(workload)                   # the knobs the tuners search
    spec = target.spec(config)                       # what the measurement worker rebuilds
    jobs = target.compile_jobs(workload, configs)    # fill the compile cache in parallel

The search driver (`wpk.search.driver`) is the same for both targets; this
object is the only thing it needs to know about one. A CUDA config is the
template's knob dict plus `"gpu": PRESET` (see `wpk.kernels.cuda.generated`),
so records of one preset never match another's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wpk.core.workload import Workload
from wpk.kernels.registry import Candidate
from wpk.search.workers import CandidateSpec

CPU_IMPL = "dsl.cpu"
CUDA_IMPL = "dsl.cuda"
CPU_MODULES = ("wpk.kernels.generated",)
CUDA_MODULES = ("wpk.kernels.cuda.generated",)


@dataclass(frozen=True)
class GeneratedTarget:
    """The generated implementation of one target: name, worker modules and, for CUDA,
    the GPU preset (a `wpk.core.devices.HardwareSpec`) its kernels are validated and
    compiled for."""

    target: str = "cpu"
    gpu: Any = None

    @property
    def impl(self) -> str:
        return CUDA_IMPL if self.target == "cuda" else CPU_IMPL

    @property
    def modules(self) -> tuple[str, ...]:
        return CUDA_MODULES if self.target == "cuda" else CPU_MODULES

    def space(self, workload: Workload):
        """The `SearchSpace` of the workload's generated kernel on this target."""
        if self.target != "cuda":
            from wpk.kernels.generated import search_space

            return search_space(workload, self.target)
        from wpk.kernels.cuda.generated import cuda_template
        from wpk.search.space import SearchSpace

        return SearchSpace.from_template(cuda_template(workload, self.gpu),
                                         name=workload.label)

    def config(self, knobs: Mapping) -> dict:
        """The implementation's config of a point of the space (CUDA: plus the preset)."""
        if self.target != "cuda":
            return dict(knobs)
        from wpk.kernels.cuda.generated import GPU_KEY

        return {**dict(knobs), GPU_KEY: self.gpu.name}

    def spec(self, knobs: Mapping) -> CandidateSpec:
        """The worker-side spec of the generated kernel scheduled by `knobs`."""
        return CandidateSpec(self.impl, self.config(knobs), self.modules)

    def candidate(self, knobs: Mapping) -> Candidate:
        """The planner candidate of the generated kernel scheduled by `knobs`."""
        from wpk.kernels import registry

        for module in self.modules:
            __import__(module)
        return Candidate(registry.get(self.impl), self.config(knobs))

    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list:
        """`CompileJob`s that put the kernels of `configs` in the compile cache."""
        from wpk.search.compile_pool import CompileJob

        if self.target != "cuda":
            from wpk.kernels.generated import compile_job

            return [compile_job(workload, c) for c in configs]
        return [CompileJob("wpk.search.generated_target:compile_cuda",
                           {"workload": workload.to_json(), "config": self.config(c)},
                           label=f"{workload.label} {dict(c)}") for c in configs]


def generated_target(target: str = "cpu", gpu=None) -> GeneratedTarget:
    """The `GeneratedTarget` of a build target ('cpu', or 'cuda' with its preset)."""
    return GeneratedTarget(target, gpu if target == "cuda" else None)


def compile_cuda(workload: Mapping, config: Mapping) -> str:
    """Compile a workload's generated CUDA kernel for the preset named in `config` into the
    compile cache (a `CompileJob` function); returns the arch it was compiled for."""
    from wpk.kernels.cuda.generated import build_for

    built = build_for(Workload.from_json(workload), config)
    return built.binary.arch
