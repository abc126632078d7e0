"""Floating-point operations of a workload, for GFLOP/s in reports and benchmarks.

    workload_flops(workload) -> int | None

The count is the usual one of the literature: two operations (a multiply and an
add) per multiply-accumulate of the op's contraction, nothing for the bias, the
fused epilogue or a softmax, whatever the algorithm (a Winograd or 1x1 kernel is
credited with the direct convolution's FLOPs, so GFLOP/s compare across
algorithms):

- Conv: 2 x N x K x prod(output spatial) x C/group x prod(kernel), also for the
  blocked `wpk.nchwc` Conv (logical channels, not the padding lanes, and the groups of a
  conv whose groups the layout pass widened: `group_width` or C/`sparse_groups`);
- ConvTranspose: 2 x N x C x prod(input spatial) x K/group x prod(kernel);
- MatMul: 2 x prod(output) x K; Gemm: 2 x M x N x K;
- wpk's fused Attention: 2 x batch x Sq x Sk x (D + Dv) (Q K^T, then P V);
- wpk's fused InvertedResidual (and InvertedResidualNCHW): the sum of its three convs'
  (expand, depthwise, project).

Every other op (elementwise, pooling, normalizations, layout changes) is None:
its time is memory traffic and a FLOP rate would mislead.
"""

from __future__ import annotations

import math

from wpk.core.workload import Workload
from wpk.kernels.cpu.attention_spec import attention_reason, attention_shape
from wpk.kernels.cpu.inverted_residual_spec import (
    inverted_residual_reason,
    is_inverted_residual,
    part_workloads,
)
from wpk.kernels.cuda.irb_spec import irb_reason, is_irb_nchw
from wpk.kernels.cuda.irb_spec import part_workloads as irb_part_workloads
from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS

STANDARD_DOMAINS = ("", "ai.onnx")
NCHWC_DOMAIN = "wpk.nchwc"


def _conv_flops(workload: Workload) -> int:
    weight = workload.inputs[1].shape              # K, C/group, *kernel
    out = workload.outputs[0].shape                # N, K, *spatial (blocked: N, Kb, *sp, b)
    spatial = out[2:-1] if workload.domain == NCHWC_DOMAIN else out[2:]
    # a blocked conv whose groups the layout pass widened counts its own groups' channels
    reduction = int(workload.attr(GROUP_WIDTH, 0) or 0) \
        or weight[1] // max(1, int(workload.attr(SPARSE_GROUPS, 0) or 0))
    return 2 * out[0] * weight[0] * math.prod(spatial) * reduction * math.prod(weight[2:])


def _conv_transpose_flops(workload: Workload) -> int:
    x = workload.inputs[0].shape                   # N, C, *spatial
    weight = workload.inputs[1].shape              # C, K/group, *kernel
    return 2 * math.prod(x) * math.prod(weight[1:])


def _matmul_flops(workload: Workload) -> int:
    a = workload.inputs[0].shape
    return 2 * math.prod(workload.outputs[0].shape) * a[-1]


def _gemm_flops(workload: Workload) -> int:
    a = workload.inputs[0].shape
    k = a[0] if int(workload.attr("transA", 0)) else a[1]
    return 2 * math.prod(workload.outputs[0].shape) * k


def _attention_flops(workload: Workload) -> int | None:
    if attention_reason(workload) is not None:
        return None
    shape = attention_shape(workload)
    return 2 * shape.batch * shape.sq * shape.sk * (shape.d + shape.dv)


def _inverted_residual_flops(workload: Workload) -> int | None:
    if inverted_residual_reason(workload) is not None:
        return None
    return sum(_conv_flops(part) for part in part_workloads(workload) if part.op == "Conv")


def _irb_nchw_flops(workload: Workload) -> int | None:
    if irb_reason(workload) is not None:
        return None
    return sum(_conv_flops(part) for part in irb_part_workloads(workload))


_STANDARD = {"Conv": _conv_flops, "ConvTranspose": _conv_transpose_flops,
             "MatMul": _matmul_flops, "Gemm": _gemm_flops}


def workload_flops(workload: Workload) -> int | None:
    """The FLOPs of one execution of the workload (see the module docstring), or None for
    an op that has no such count or a workload too malformed to count."""
    if workload.domain in STANDARD_DOMAINS:
        count = _STANDARD.get(workload.op)
    elif workload.domain == NCHWC_DOMAIN and workload.op == "Conv":
        count = _conv_flops
    elif is_inverted_residual(workload):
        count = _inverted_residual_flops
    elif is_irb_nchw(workload):
        count = _irb_nchw_flops
    else:
        count = _attention_flops
    needed = 1 if count is _inverted_residual_flops else 2   # a block may lack W1
    specs = workload.inputs[:needed]
    if count is None or len(specs) < needed or any(s is None for s in specs) or \
            not workload.outputs:
        return None
    try:
        return count(workload)
    except (IndexError, TypeError, ValueError):
        return None


def gflops_per_s(flops: int | None, seconds: float | None) -> float | None:
    """GFLOP/s of `flops` done in `seconds`; None when either is unknown (or no time)."""
    if flops is None or not seconds or seconds <= 0:
        return None
    return flops / seconds / 1e9
