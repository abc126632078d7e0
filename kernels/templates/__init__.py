"""The operators' schedule templates, and building a DSL operator with one.

    template = template_for(op, "cpu")                # ConvTemplate, MatmulTemplate, generic
    func = lower_for(op, bindings, config, "cuda", gpu)          # loop IR under `config`
    kernel = build_cpu(op, bindings, config)          # C, compiled and loaded: CpuKernel
    kernel = build_cuda(op, bindings, config, gpu=gpu, arch="sm_90")   # CudaKernel
    outputs = emulate_cuda(op, bindings, config, arrays)        # on the GPU emulator

`template_for` picks: `ConvTemplate` (`conv`, with the CUDA implicit GEMM of
`conv_cuda`) for a stage shaped like a 2-D convolution (4 spatial axes n, k, y,
x and reduction axes c, r, s); on CUDA, `MatmulTemplate` (`matmul`, the tiled
GEMM of `gemm_cuda`) for a matmul-like stage, `WinogradTemplate` (`winograd_cuda`)
for the Winograd convolution operators; `wpk.dsl.templates.GenericTemplate`
for everything else. `config` is a knob dict of that template; it is validated
against the target before anything is generated.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.build import CpuKernel, CudaKernel, compile_c
from wpk.dsl.codegen_c import generate_c
from wpk.dsl.codegen_cuda import generate_cuda
from wpk.dsl.emulator import emulate
from wpk.dsl.lower import lower
from wpk.dsl.templates import GenericTemplate, Template
from wpk.dsl.toolchain_cuda import compile_cuda
from wpk.kernels.templates.conv import ConvTemplate, is_conv_stage
from wpk.kernels.templates.gemm_cuda import is_matmul_like
from wpk.kernels.templates.matmul import MatmulTemplate
from wpk.kernels.templates.winograd_cuda import WinogradTemplate, is_winograd

TARGETS = ("cpu", "cuda")


def template_for(op: C.Operator, target: str = "cpu", hw=None) -> Template:
    """The schedule template of a specialised operator for `target` ('cpu' or 'cuda')."""
    if target not in TARGETS:
        raise ScheduleError(f"unknown target {target!r}", hint="use cpu or cuda")
    if target == "cuda" and is_winograd(op):
        return WinogradTemplate(op, target, hw)
    reduces = [s for s in op.stages if s.reduce is not None]
    if len(reduces) == 1 and is_conv_stage(reduces[0]):
        return ConvTemplate(op, target, hw)
    template = GenericTemplate(op, target, hw)
    if target == "cuda" and is_matmul_like(template.main_stage):
        return MatmulTemplate(op, target, hw)
    return template


def plan(op: C.Operator, bindings, config: Mapping | None, target: str, hw=None):
    """(specialised operator, template, validated schedule) for `target`."""
    spec = C.specialize(op, bindings)
    template = template_for(spec, target, hw)
    config = dict(template.default_config() if config is None else config)
    reason = template.validate(config)
    if reason is not None:
        raise ScheduleError(f"config {config} is invalid for {op.name} on {template.target_name}: "
                            f"{reason}", hint="pick a point of the template's knob space")
    return spec, template, template.apply(config)


def lower_for(op: C.Operator, bindings, config=None, target: str = "cpu", hw=None) -> L.PrimFunc:
    """Loop IR of the operator for `target` ('cpu' or 'cuda') under `config`."""
    _, _, schedule = plan(op, bindings, config, target, hw)
    func = lower(schedule.op, schedule, target)
    func.meta["bindings"] = dict(bindings)     # the scalars, for the reference interpreter
    return func


def build_cpu(op: C.Operator, bindings, config: Mapping | None = None, hw=None) -> CpuKernel:
    """Generate, compile and load the C kernel of `op` for `bindings` under `config`
    (validated against `hw`, a CPU HardwareSpec; None: this host)."""
    func = lower_for(op, bindings, config, "cpu", hw)
    source = generate_c(func)
    return CpuKernel(func, source, compile_c(source))


def build_cuda(op: C.Operator, bindings, config: Mapping | None = None, gpu=None,
               arch: str | None = None, compile: bool = True, compiler: str = "auto"
               ) -> CudaKernel:
    """Generate the CUDA kernels of `op` for `bindings` under `config`, validated against the
    GPU spec `gpu` (a HardwareSpec or None for generic limits). With `compile` and an
    `arch` ('sm_90', 'sm_60', ...), also compile to a cubin with its resource usage."""
    func = lower_for(op, bindings, config, "cuda", gpu)
    source, launches = generate_cuda(func)
    kernel = CudaKernel(func, source, launches, arch)
    if compile and arch is not None:
        binary = compile_cuda(source, arch, compiler=compiler)
        kernel.cubin = binary.cubin
        kernel.usage = dict(binary.kernels)
    return kernel


def emulate_cuda(op: C.Operator, bindings, config: Mapping | None, arrays, gpu=None
                 ) -> dict[str, np.ndarray]:
    """Lower `op` for CUDA under `config` and run it on the CPU with the GPU emulator."""
    return emulate(lower_for(op, bindings, config, "cuda", gpu), arrays)
