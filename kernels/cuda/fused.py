"""Fused CUDA kernels (`cuda.fused`): blocks the vendor libraries run as several calls.

    FUSED_CUDA.unsupported_reason(workload)      # None for a fused op this module lowers
    configs = fused_configs(workload, gpu, 3)    # valid schedules for the preset
    built = FUSED_CUDA.build(workload, config)   # BuiltCuda, as `dsl.cuda`'s build_for

Each fused op has a *family*: its knob space, a validity check for a preset
and a loop-IR lowering (`fused_attention`, `fused_irb`). A config is the family's knobs
plus `"gpu": PRESET`, like `dsl.cuda`'s, and the module's artifacts
(cubin, source, PTX, launch.json) are the same, so the offline runner
checks, emulates and predicts a fused kernel exactly as a DSL one, and the
GPU runtime loads it the same way.

`cuda.attention.unfused` (kind vendor) is the fused attention's peer: the
steps the graph had before the fusion (cuBLAS batched GEMM, a softmax
kernel over the [heads, seq, seq] scores, cuBLAS batched GEMM), predicted
offline by the analytical model from those three steps, run on the GPU with
the arrays' module (cupy's matmul is cuBLAS), so the planner keeps the fused
kernel only where it is predicted (offline) or measured faster.
`cuda.inverted_residual.unfused` is the NCHW inverted-residual block's peer:
its three convs as three cuDNN calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.devices import gpu_preset
from wpk.core.errors import ScheduleError
from wpk.core.workload import Workload
from wpk.dsl.codegen_cuda import generate_cuda
from wpk.dsl.toolchain_cuda import compile_cuda
from wpk.kernels.cpu.attention_spec import (
    attention_reason,
    attention_shape,
    bshd_flags,
    is_attention,
)
from wpk.kernels.cuda import analytic
from wpk.kernels.cuda.fused_attention import (
    attention_config_reason,
    attention_feeds,
    attention_space,
    lower_attention,
)
from wpk.kernels.cuda.fused_irb import irb_config_reason, irb_feeds, irb_space, lower_irb
from wpk.kernels.cuda.generated import (
    GPU_KEY,
    BuiltCuda,
    CudaModuleImplementation,
    KernelIo,
    launch_description,
    parameter_table,
    split_config,
)
from wpk.kernels.cuda.irb_spec import irb_reason, part_inputs, part_workloads
from wpk.kernels.cuda.predicted import CUDNN, PLACEHOLDER_TARGET, array_module
from wpk.kernels.registry import GENERATED, VENDOR, Candidate, Implementation, Kernel, register


@dataclass(frozen=True)
class FusedFamily:
    """One fused op: which workloads, its knob points, their validity and lowering."""

    name: str
    reason: Callable[[Workload], str | None]          # None when the family lowers it
    space: Callable[[Workload], list[dict]]           # knob points, preferred first
    config_reason: Callable[[Workload, Mapping, object], str | None]
    lower: Callable[[Workload, Mapping], object]      # -> loop IR PrimFunc (cuda)
    io: Callable[[Workload], KernelIo]


def _device_attention_reason(workload: Workload) -> str | None:
    """attention_reason, and only the [B, H, S, D] layout (the `bshd` operands are the CPU
    pass's)."""
    if is_attention(workload) and any(bshd_flags(workload)):
        return "the CUDA attention kernels read [B, H, S, D] operands only"
    return attention_reason(workload)


ATTENTION = FusedFamily(
    "attention", _device_attention_reason,
    lambda w: attention_space(attention_shape(w)),
    lambda w, c, gpu: attention_config_reason(attention_shape(w), c, gpu),
    lower_attention, lambda w: KernelIo(attention_feeds(w), "Y"))

INVERTED_RESIDUAL = FusedFamily(
    "inverted_residual", irb_reason, irb_space, irb_config_reason, lower_irb,
    lambda w: KernelIo(irb_feeds(w), "Y"))

FAMILIES: list[FusedFamily] = [ATTENTION, INVERTED_RESIDUAL]


def family_of(workload: Workload) -> FusedFamily | None:
    """The family that lowers `workload`, or None."""
    for family in FAMILIES:
        if family.reason(workload) is None:
            return family
    return None


def fused_configs(workload: Workload, gpu, count: int = 3) -> list[dict]:
    """Up to `count` valid configs for preset `gpu`, preferred first and differing in two
    knobs or more where the space allows ([] when no family lowers the workload)."""
    family = family_of(workload)
    if family is None:
        return []
    valid = [p for p in family.space(workload) if family.config_reason(workload, p, gpu) is None]
    chosen: list[dict] = []
    for point in valid:      # the first valid point, then ones differing in two knobs or more
        if len(chosen) < count and all(sum(point[k] != c[k] for k in point) >= 2
                                       for c in chosen):
            chosen.append(point)
    chosen += [p for p in valid if p not in chosen][:count - len(chosen)]
    return [dict(p, **{GPU_KEY: gpu.name}) for p in chosen]


class FusedCuda(CudaModuleImplementation):
    """Fused kernels written in loop IR, for the preset named in the config."""

    name = "cuda.fused"
    kind = GENERATED
    target = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        return None if family_of(workload) is not None else "not a fused op with a CUDA kernel"

    def configs(self, workload: Workload) -> list[dict]:
        """None by enumeration: the CUDA target offers configs for its preset."""
        return []

    def io(self, workload: Workload) -> KernelIo:
        """Which step input feeds each kernel parameter, and the output parameter."""
        return self._family(workload).io(workload)

    def emulator_feeds(self, workload: Workload, inputs: Sequence, config: Mapping
                       ) -> tuple[dict, str]:
        io = self.io(workload)
        return ({name: np.asarray(inputs[index]) for name, index in io.feeds.items()},
                io.output)

    def build(self, workload: Workload, config: Mapping, compile: bool = True) -> BuiltCuda:
        """Lower, print and (with `compile`) compile for the config's preset; ScheduleError
        when the config does not fit the preset, ToolchainError when compiling fails."""
        family = self._family(workload)
        knobs, preset = split_config(config)
        gpu = gpu_preset(preset or "auto")
        reason = family.config_reason(workload, knobs, gpu)
        if reason is not None:
            raise ScheduleError(f"{workload.label}: config {knobs} does not fit {gpu.name}: "
                                f"{reason}", hint="pick a point of the family's knob space")
        func = family.lower(workload, knobs)
        source, launches = generate_cuda(func)
        binary = compile_cuda(source, gpu.arch) if compile else None
        return BuiltCuda(func, source, launches, binary, gpu)

    def _family(self, workload: Workload) -> FusedFamily:
        family = family_of(workload)
        if family is None:
            raise ScheduleError(f"{workload.label}: no fused CUDA kernel",
                                hint="only fused ops (Attention, ...) have one")
        return family

    def launch_document(self, workload: Workload, built: BuiltCuda, config: Mapping) -> dict:
        """launch.json with the fused op's own parameter table."""
        return launch_description(workload, built,
                                  parameter_table(built.func, self.io(workload)))


class UnfusedAttention(Implementation):
    """The separate steps of an attention (see the module docstring), as one step."""

    name = "cuda.attention.unfused"
    kind = VENDOR
    target = PLACEHOLDER_TARGET

    def unsupported_reason(self, workload: Workload) -> str | None:
        return _device_attention_reason(workload) if is_attention(workload) \
            else "not an Attention"

    def predict(self, workload: Workload, gpu) -> analytic.Prediction:
        """cuBLAS Q K^T, one softmax pass over the scores (read scores and mask, write the
        probabilities) and cuBLAS P V, each a roofline at its efficiency plus a launch."""
        s = attention_shape(workload)
        scores = 4.0 * s.batch * s.sq * s.sk
        mask = 4.0 * int(np.prod(s.mask_shape)) if s.mask_shape else 0.0
        gemms = [(2.0 * s.batch * s.sq * s.sk * s.d,
                  4.0 * s.batch * (s.sq + s.sk) * s.d + scores),
                 (2.0 * s.batch * s.sq * s.sk * s.dv,
                  scores + 4.0 * s.batch * (s.sk + s.sq) * s.dv)]
        seconds = roof = flops = nbytes = 0.0
        for f, b in gemms:
            part = analytic.roofline_seconds(f, b, gpu)
            seconds += part / analytic.VENDOR_EFFICIENCY["cublas"] + analytic.LAUNCH_OVERHEAD_S
            roof, flops, nbytes = roof + part, flops + f, nbytes + b
        softmax_bytes = 2.0 * scores + mask
        part = analytic.roofline_seconds(5.0 * scores / 4.0, softmax_bytes, gpu)
        seconds += part / analytic.COPY_EFFICIENCY + analytic.LAUNCH_OVERHEAD_S
        roof, flops, nbytes = roof + part, flops + 5.0 * scores / 4.0, nbytes + softmax_bytes
        return analytic.Prediction(seconds, roof, roof / seconds, flops, nbytes,
                                   "cublas+softmax+cublas")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        shape = attention_shape(workload)

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            xp = array_module([*inputs, *outputs])
            q, k, v = (xp.asarray(a, xp.float32) for a in inputs[:3])
            kt = k if shape.k_transposed else xp.swapaxes(k, -1, -2)
            logits = xp.matmul(q, kt) * xp.float32(shape.scale)
            if len(inputs) > 3 and inputs[3] is not None:
                logits = logits + xp.asarray(inputs[3], xp.float32)
            logits -= logits.max(axis=-1, keepdims=True)
            probs = xp.exp(logits)
            probs /= probs.sum(axis=-1, keepdims=True)
            outputs[0][...] = xp.matmul(probs, v)

        return kernel


class UnfusedInvertedResidual(Implementation):
    """The block's three convs as three cuDNN calls (H1 and H2 through global memory):
    predicted offline as the cuDNN placeholders of the three convs; on the GPU each part is
    the cuDNN implementation `cuda.cudnn.predicted` hands over to."""

    name = "cuda.inverted_residual.unfused"
    kind = VENDOR
    target = PLACEHOLDER_TARGET

    def unsupported_reason(self, workload: Workload) -> str | None:
        return irb_reason(workload)

    def predict(self, workload: Workload, gpu) -> analytic.Prediction:
        """The sum of the three convs' cuDNN predictions."""
        parts = [analytic.predict_vendor(p, gpu, "cudnn") for p in part_workloads(workload)]
        seconds, roof = sum(p.seconds for p in parts), sum(p.roofline_s for p in parts)
        return analytic.Prediction(seconds, roof, roof / seconds, sum(p.flops for p in parts),
                                   sum(p.bytes for p in parts), "cudnn x3")

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        parts = part_workloads(workload)
        kernels = []
        for index, part in enumerate(parts):
            own = part_inputs(workload, [consts.get(i) for i in range(7)], index)
            kernels.append(CUDNN.prepare(part, {i: own[i] for i in part.const_inputs}, {}))

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            xp = array_module([*inputs, *outputs])
            value = None
            for index, (part, run) in enumerate(zip(parts, kernels)):
                out = outputs[0] if index == 2 else xp.empty(part.outputs[0].shape, xp.float32)
                run(part_inputs(workload, inputs, index, value), [out])
                value = out

        return kernel


FUSED_CUDA = register(FusedCuda())
UNFUSED_ATTENTION = register(UnfusedAttention())
UNFUSED_INVERTED_RESIDUAL = register(UnfusedInvertedResidual())


def fused_candidates(workload: Workload, gpu, count: int) -> list:
    """The fused kernel in up to `count` configs for `gpu`, and its unfused peer."""
    found = [Candidate(FUSED_CUDA, config) for config in fused_configs(workload, gpu, count)]
    found += [Candidate(peer, {}) for peer in (UNFUSED_ATTENTION, UNFUSED_INVERTED_RESIDUAL)
              if peer.unsupported_reason(workload) is None]
    return found
