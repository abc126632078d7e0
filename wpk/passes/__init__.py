"""Graph passes: simplify and fuse a `Graph` before its workloads are tuned.

    graph, report = optimize(load_model("model.onnx"), target="cpu")

`PIPELINE` is the ordered list of passes; an entry may be limited to some
targets (`PipelineEntry(make, targets=frozenset({"cpu"}))`), so a
target-specific pass is one more entry. Fusions are rules in
`wpk.passes.fusion_rules`, applied by `wpk.passes.fusion.FusionPass`.

Conventions of the optimized graph: fused Conv/Gemm/MatMul nodes carry an
`epilogue` whose operands are extra inputs after the op's own (absent
optional inputs padded with ''); chains of two or more elementwise ops become
one node `Elementwise` (domain 'wpk') whose input 0 is the chain's first
value (a step's `operand` may be 0 too: `x * f(x)` reads the chain's input
again); a single elementwise op stays the standard ONNX op, except activations
that ONNX spells with several ops (SiLU, erf-GELU, HardSwish before opset 14),
which become a one-step `Elementwise`. On the CPU and CUDA targets, scaled dot-product
attention becomes one node `Attention` (domain 'wpk', `wpk.passes.attention`), and
an inverted-residual block of blocked convs one node `InvertedResidual` (domain 'wpk',
`wpk.passes.inverted_residual`); on the CUDA target the same block of standard NCHW convs
becomes `InvertedResidualNCHW` (`wpk.passes.inverted_residual_nchw`).
`to_onnx` expands all of it back into standard ONNX.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wpk.core.graph import Graph
from wpk.passes.activation_chains import ActivationChains
from wpk.passes.attention import ATTENTION_HEADS_RULES, ATTENTION_RULES, MASKED_FILL_RULES
from wpk.passes.base import GraphPass
from wpk.passes.constant_folding import ConstantFolding
from wpk.passes.conv1d_lift import Conv1dAs2d
from wpk.passes.conv_transpose_gemm import ConvTransposeAsMatMul
from wpk.passes.dead_nodes import DeadNodeElimination
from wpk.passes.dilated_conv_phases import DilatedConvPhases
from wpk.passes.einsum import EinsumLowering
from wpk.passes.fusion import FusionPass
from wpk.passes.fusion_rules import (
    CHAIN_RULES,
    CHANNEL_NORM_RULES,
    CONV_TRANSPOSE_EPILOGUE_RULES,
    EPILOGUE_RULES,
    GROUP_NORM_EPILOGUE_RULES,
    GROUP_NORM_RULES,
    LINEAR_RULES,
    PATTERN_RULES,
    RMS_NORM_RULES,
)
from wpk.passes.inverted_residual import INVERTED_RESIDUAL_RULES
from wpk.passes.inverted_residual_nchw import INVERTED_RESIDUAL_NCHW_RULES
from wpk.passes.nchwc_layout import NchwcLayout
from wpk.passes.noop_removal import NoOpRemoval
from wpk.passes.packed_qkv import PackedQkvSplit
from wpk.passes.pad_into_conv import PadIntoConv
from wpk.passes.quantize_dequantize import QuantizeDequantize
from wpk.passes.reduce_to_pool import ReduceToPool
from wpk.passes.same_crop import SameCrop
from wpk.passes.softmax_nan_guard import SoftmaxNanGuard
from wpk.passes.sum_to_add import SumToAdd
from wpk.passes.to_onnx import ELEMENTWISE_OP, WPK_DOMAIN, to_onnx
from wpk.passes.transpose_sinking import TransposeSinking
from wpk.passes.window_attention import WINDOW_ATTENTION_RULES

__all__ = ["ELEMENTWISE_OP", "PIPELINE", "WPK_DOMAIN", "PassReport", "PipelineEntry",
           "optimize", "passes_for", "rule_docs", "to_onnx"]


@dataclass(frozen=True)
class PipelineEntry:
    """One pass of the pipeline: a factory for it and the targets it runs for (None: all)."""

    make: Callable[[], GraphPass]
    targets: frozenset[str] | None = None

    def applies_to(self, target: str) -> bool:
        return self.targets is None or target in self.targets


PIPELINE: list[PipelineEntry] = [
    # a correction, not an optimization: SAME padding below zero as onnxruntime reads it
    PipelineEntry(SameCrop),
    PipelineEntry(ConstantFolding),
    PipelineEntry(DeadNodeElimination),
    # after the weights' DequantizeLinear are folded, before the fusions that take its step in
    PipelineEntry(QuantizeDequantize),
    PipelineEntry(SumToAdd),
    # Einsum as MatMul and data movement, before the attention and GEMM fusions that take them
    PipelineEntry(EinsumLowering),
    # channels-last converters' Transposes around each conv, moved until they cancel;
    # before the reductions become pools (a ReduceMean over NHWC's H and W is one after it)
    PipelineEntry(TransposeSinking),
    PipelineEntry(ReduceToPool),
    PipelineEntry(NoOpRemoval),
    PipelineEntry(PadIntoConv),
    # 1-d convs to 2-d before the fusions, so they see the 2-d convs the layout has kernels for
    PipelineEntry(Conv1dAs2d, targets=frozenset({"cpu"})),
    # torch's NaN guard on attention probabilities moved past the context MatMul, so the
    # attention rule sees Softmax then MatMul
    PipelineEntry(SoftmaxNanGuard, targets=frozenset({"cpu", "cuda"})),
    # a masked_fill's Where as the mask Add the attention rule fuses
    PipelineEntry(lambda: FusionPass("masked_fill_mask", MASKED_FILL_RULES),
                  targets=frozenset({"cpu", "cuda"})),
    # Swin's shifted-window mask (added per image between two Reshapes) as that one Add,
    # Swin V2's per-head logit scale as a scale of the queries (both targets: a finite mask)
    PipelineEntry(lambda: FusionPass("window_attention", WINDOW_ATTENTION_RULES),
                  targets=frozenset({"cpu", "cuda"})),
    # before the elementwise fusions, which would take the scale and the mask Add apart
    PipelineEntry(lambda: FusionPass("attention_fusion", ATTENTION_RULES),
                  targets=frozenset({"cpu", "cuda"})),
    PipelineEntry(PackedQkvSplit, targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("attention_heads", ATTENTION_HEADS_RULES),
                  targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("fold_linear", LINEAR_RULES)),
    # after the BatchNorm folds (a generator's BN comes along in the weights)
    PipelineEntry(ConvTransposeAsMatMul, targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("channel_norm", CHANNEL_NORM_RULES),
                  targets=frozenset({"cpu"})),
    # while the affine Mul and Add after the normalization are nodes of their own
    PipelineEntry(lambda: FusionPass("group_norm", GROUP_NORM_RULES), targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("activation_patterns", PATTERN_RULES)),
    # after the LayerNorm rules (a centred x / sqrt(mean(x^2) + eps) is theirs)
    PipelineEntry(lambda: FusionPass("rms_norm", RMS_NORM_RULES), targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("elementwise_fusion", CHAIN_RULES)),
    PipelineEntry(ActivationChains),
    PipelineEntry(lambda: FusionPass("epilogue_fusion", EPILOGUE_RULES)),
    PipelineEntry(lambda: FusionPass("conv_transpose_epilogue", CONV_TRANSPOSE_EPILOGUE_RULES),
                  targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("group_norm_epilogue", GROUP_NORM_EPILOGUE_RULES),
                  targets=frozenset({"cpu"})),
    PipelineEntry(DeadNodeElimination),
    # target-specific passes go last
    PipelineEntry(NchwcLayout, targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("inverted_residual_fusion", INVERTED_RESIDUAL_RULES),
                  targets=frozenset({"cpu"})),
    # on the blocked convs the layout wrote
    PipelineEntry(DilatedConvPhases, targets=frozenset({"cpu"})),
    PipelineEntry(lambda: FusionPass("inverted_residual_nchw_fusion",
                                     INVERTED_RESIDUAL_NCHW_RULES), targets=frozenset({"cuda"})),
]


@dataclass
class PassReport:
    """What the passes did: op counts before/after, hits per pass and per rule, seconds per pass."""

    target: str
    ops_before: dict[str, int]
    ops_after: dict[str, int] = field(default_factory=dict)
    passes: dict[str, int] = field(default_factory=dict)
    rules: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    def to_json(self) -> dict:
        return {"target": self.target, "ops_before": self.ops_before,
                "ops_after": self.ops_after, "passes": self.passes, "rules": self.rules,
                "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
                "nodes_before": self.nodes_before, "nodes_after": self.nodes_after}


def rule_docs(target: str | None = None) -> dict[str, str]:
    """One line per fusion rule (name -> what it fuses), in pipeline order: the rules that
    run for `target`, or every rule (None)."""
    entries = [e for e in PIPELINE if target is None or e.applies_to(target)]
    passes = [entry.make() for entry in entries]
    return {rule.name: rule.doc for p in passes if isinstance(p, FusionPass) for rule in p.rules}


def passes_for(target: str) -> list[GraphPass]:
    """Fresh instances of the pipeline's passes that run for `target`."""
    return [entry.make() for entry in PIPELINE if entry.applies_to(target)]


def optimize(graph: Graph, target: str = "cpu") -> tuple[Graph, PassReport]:
    """Run the pass pipeline for `target` on a copy of `graph`; returns it and a report."""
    report = PassReport(target=target, ops_before=graph.op_counts())
    graph = graph.copy()
    for graph_pass in passes_for(target):
        start = time.perf_counter()
        graph = graph_pass.run(graph)
        report.seconds[graph_pass.name] = report.seconds.get(graph_pass.name, 0.0) + (
            time.perf_counter() - start)
        report.passes[graph_pass.name] = report.passes.get(graph_pass.name, 0) + sum(
            graph_pass.hits.values())
        if isinstance(graph_pass, FusionPass):
            for rule in graph_pass.rules:
                report.rules[rule.name] = report.rules.get(rule.name, 0) + \
                    graph_pass.hits.get(rule.name, 0)
    report.ops_after = graph.op_counts()
    return graph, report
