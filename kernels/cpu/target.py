"""The CPU target: this host's CPU, timed by the wall clock, generated kernels in C.

    target = CpuTarget.create()
    target.candidates(workload)   # onnxruntime, BLAS/numpy and fallback implementations

An untuned build measures the registered CPU implementations (onnxruntime
kernels, wpk's numpy/BLAS routines, the onnxruntime fallback) and the default
config of each generated micro-kernel family that supports the workload; a search
tunes every family: `dsl.cpu` (DSL kernels), `micro.nchwc` (NCHWc convolutions),
`micro.winograd` (3x3 stride-1 NCHWc convolutions; an untuned build measures the
default of each tile size m, the search tunes m with the GEMM's tile),
`micro.inverted_residual` (the fused inverted-residual block) and `micro.gemm`
(MatMul and Gemm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from wpk.core.devices import cpu_fingerprint, host_cpu
from wpk.core.workload import Workload
from wpk.dsl.toolchain import c_compiler
from wpk.dsl.toolchain import compiler_version as tool_version
from wpk.kernels import registry
from wpk.kernels.cpu.microkernels.gemm import GemmKernels
from wpk.kernels.cpu.microkernels.inverted_residual import InvertedResidualKernels
from wpk.kernels.cpu.microkernels.kernel import MicroKernels
from wpk.kernels.cpu.microkernels.winograd import WinogradKernels
from wpk.kernels.generated import compile_job, template_of
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import Candidate
from wpk.kernels.target import GeneratedKernels, Target, TargetFingerprint, fingerprint_of


def compiler_version() -> str:
    """The C compiler generated kernels are built with, by its version line."""
    return tool_version(c_compiler())


class CpuGenerated(GeneratedKernels):
    """Generated C kernels (`dsl.cpu`), built for the host's ISA."""

    impl = "dsl.cpu"
    modules = ("wpk.kernels.generated",)

    def template(self, workload: Workload):
        return template_of(workload, "cpu")

    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list[CompileJob]:
        return [compile_job(workload, config) for config in configs]


class CpuTarget(Target):
    """This host's CPU (see the module docstring)."""

    name = "cpu"
    timer = "host"
    session = "wpk.runtime:Session"
    onnxruntime_peer = True

    @classmethod
    def create(cls, **options: Any) -> CpuTarget:
        return cls(host_cpu(), CpuGenerated(),
                   also=(MicroKernels(), WinogradKernels(), InvertedResidualKernels(),
                         GemmKernels()))

    def candidates(self, workload: Workload, generated: int | None = None) -> list[Candidate]:
        return registry.candidates(workload, self.name, last_resort=True)

    def fingerprint(self) -> TargetFingerprint:
        return fingerprint_of(self.hardware, compiler_version)

    def device(self) -> dict:
        return dict(cpu_fingerprint())
