"""What the micro-kernel families share as a target's generated kernels (`GeneratedKernels`).

    class WinogradKernels(MicroFamily):
        implementation = MICRO_WINOGRAD
        compile_function = "wpk.kernels.cpu.microkernels.winograd:compile_winograd"
        def template(self, workload): return WinogradSpace(_geometry(workload))

A family is named after its registered implementation (`impl`), imports that
implementation's module in measuring processes (`modules`), supports what it
computes on this host, and
compiles a config by calling `compile_function(workload=..., config=...)` in the
compile pool (`CompileJob`), as `wpk.search.driver` asks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wpk.core.workload import Workload
from wpk.kernels.jobs import CompileJob
from wpk.kernels.registry import Implementation
from wpk.kernels.target import GeneratedKernels


class MicroFamily(GeneratedKernels):
    """A micro-kernel family: `implementation` decides support, `compile_function`
    ('module:function') compiles one config of a workload."""

    implementation: Implementation
    compile_function: str

    @property
    def impl(self) -> str:
        return self.implementation.name

    @property
    def modules(self) -> tuple[str, ...]:
        return (type(self.implementation).__module__,)

    def supports(self, workload: Workload) -> bool:
        """The workloads the family's implementation computes on this host."""
        return self.implementation.unsupported_reason(workload) is None

    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list[CompileJob]:
        return [CompileJob(self.compile_function,
                           {"workload": workload.to_json(), "config": dict(config)},
                           label=f"{workload.label} {dict(config)}") for config in configs]
