"""State of one NCHWc layout rewrite: blocked twins of tensors, reorders, elementwise chains.

Used by `wpk.passes.nchwc_layout`. Every logical (NCHW) tensor that gets a
blocked twin is recorded with its channel count; NCHW forms that only exist
blocked are re-created on demand by one shared ReorderOutput, and blocked
forms of NCHW tensors by one shared ReorderInput. Elementwise chains on
blocked values are planned before anything is emitted (their result's padding
lanes must be zero), so a node is either rewritten whole or left alone.

Padding lanes are zero, except in a *dirty* blocked tensor: a conv whose fused
activation does not map 0 to 0 (sigmoid, hard_sigmoid: a squeeze-excite gate)
writes it there, and pools pass it on. Convs never read padding lanes (the
packed filter is zero there) and ReorderOutput drops them; an elementwise chain
is blocked when its result is clean (`mul` by a clean tensor cleans, every other
step needs both sides clean), or when all its steps are unary maps with bounded
results (`BOUNDED_STEPS`: a QDQ model's hard sigmoid and its quantization), whose
dirty padding lanes are then finite, so a `mul` by a clean tensor still cleans.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.workload import EpilogueStep
from wpk.kernels import nchwc_format as fmt
from wpk.passes.elementwise import make_elementwise
from wpk.passes.nchwc_rules import constant_pad_value, per_channel_vector, step_keeps_zero

NCHWC_DOMAIN = "wpk.nchwc"
# Unary steps whose result is bounded whatever their input: a chain of only these may
# leave its padding lanes dirty (finite), see the module docstring.
BOUNDED_STEPS = frozenset({"sigmoid", "hard_sigmoid", "tanh", "fake_quant"})
Chain = list[tuple[EpilogueStep, str | None]]


@dataclass
class Blocked:
    name: str            # the blocked tensor
    channels: int        # logical channel count
    dirty: bool = False  # padding lanes may hold non-zero values (module docstring)


@dataclass
class Rewrite:
    """The node list being built and the blocked twins of logical tensors."""

    graph: Graph
    block: int
    nodes: list[Node] = field(default_factory=list)
    blocked: dict[str, Blocked] = field(default_factory=dict)   # logical name -> blocked
    missing: set[str] = field(default_factory=set)   # logical names that exist only blocked
    taken: set[str] = field(default_factory=set)
    constants: dict[tuple[str, float], str] = field(default_factory=dict)  # re-blocked ones

    def __post_init__(self) -> None:
        self.taken = set(self.graph.tensors) | {n.name for n in self.graph.nodes}

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.graph.tensors[name].shape)

    def blocked_tensor(self, base: str, logical_shape: tuple[int, ...], channels: int) -> str:
        """A fresh blocked tensor (TensorInfo added) for a logical (N, *, H, W) shape."""
        name = self.fresh(base)
        n, _, h, w = logical_shape
        self.graph.tensors[name] = TensorInfo(fmt.blocked_shape((n, channels, h, w), self.block),
                                              "float32")
        return name

    def new_blocked(self, logical: str, channels: int, replaces_producer: bool = True,
                    dirty: bool = False) -> str:
        """The blocked twin of `logical`; its producer now writes only the twin unless told."""
        name = self.blocked_tensor(f"{logical}_nchwc", self.shape(logical), channels)
        self.blocked[logical] = Blocked(name, channels, dirty and channels % self.block != 0)
        if replaces_producer:
            self.missing.add(logical)
        return name

    def as_blocked(self, logical: str) -> str:
        """The blocked form of `logical`, inserting a shared ReorderInput when needed."""
        if logical in self.blocked:
            return self.blocked[logical].name
        channels = self.shape(logical)[1]
        out = self.new_blocked(logical, channels, replaces_producer=False)
        self.nodes.append(Node("ReorderInput", [logical], [out],
                               self.fresh(f"reorder_in_{logical}"),
                               {"block": self.block, "channels": channels}, NCHWC_DOMAIN))
        return out

    def as_nchw(self, logical: str) -> str:
        """Make sure `logical` exists in NCHW form, inserting a shared ReorderOutput."""
        if logical in self.missing:
            entry = self.blocked[logical]
            self.nodes.append(Node("ReorderOutput", [entry.name], [logical],
                                   self.fresh(f"reorder_out_{logical}"),
                                   {"block": self.block, "channels": entry.channels},
                                   NCHWC_DOMAIN))
            self.missing.discard(logical)
        return logical

    # --- elementwise chains -------------------------------------------------------------------

    def is_dirty(self, logical: str) -> bool:
        """Whether the blocked twin of `logical` may hold non-zero padding lanes."""
        entry = self.blocked.get(logical)
        return entry is not None and entry.dirty

    def chain_may_dirty(self, chain: Chain) -> bool:
        """Whether `chain` may run blocked with dirty padding lanes in its result: only
        unary steps with bounded results (`BOUNDED_STEPS`, or a clip of finite bounds)."""
        return bool(chain) and all(operand is None and (
            step.op in BOUNDED_STEPS or step.op == "clip" and step.attr("min") is not None
            and step.attr("max") is not None) for step, operand in chain)

    def chain_is_blockable(self, chain: Chain, channels: int, out_shape: tuple[int, ...],
                           value_dirty: bool = False) -> bool:
        """Whether every step can run on blocked tensors and the result's padding lanes are
        zero (the value's may be dirty: see the module docstring).

        Tensor operands must already be blocked, of the value's logical shape or
        (N, C, 1, 1); constant operands scalar or per channel.
        """
        g = self.graph
        per_channel = (out_shape[0], channels, 1, 1)
        clean = not value_dirty
        for step, operand in chain:
            if operand is None:
                clean = clean and step_keeps_zero(step, None)
            elif operand in g.constants:
                value = np.asarray(g.constants[operand])
                if constant_pad_value(step) is None or per_channel_vector(value,
                                                                          channels) is None:
                    return False
            else:
                if operand not in self.blocked or self.blocked[operand].channels != channels \
                        or self.shape(operand) not in (out_shape, per_channel):
                    return False
                operand_clean = not self.blocked[operand].dirty
                if step.op == "mul":
                    clean = clean or operand_clean
                else:
                    clean = clean and operand_clean and step_keeps_zero(step, False)
        return clean

    def emit_chain(self, name: str, value: str, chain: Chain, channels: int, out: str) -> None:
        """Append an `Elementwise` node applying a blockable chain to the blocked `value`."""
        blocked_chain = []
        for step, operand in chain:
            if operand is None:
                blocked_chain.append((step, None))
            elif operand in self.graph.constants:
                blocked_chain.append((step, self.blocked_constant(operand, step, channels)))
            else:
                blocked_chain.append((step, self.blocked[operand].name))
        self.nodes.append(make_elementwise(name, value, blocked_chain, [out]))

    def blocked_constant(self, name: str, step: EpilogueStep, channels: int) -> str:
        """A (1, Cb, 1, 1, b) copy of a per-channel or scalar constant, padding lanes neutral
        (one per channel count: a scalar shared by tensors of several widths has a copy for
        each)."""
        pad = constant_pad_value(step)
        key = (name, pad, channels)
        if key not in self.constants:
            vector = per_channel_vector(np.asarray(self.graph.constants[name]), channels)
            padded = np.full(fmt.round_up(channels, self.block), pad, dtype=np.float32)
            padded[:channels] = vector
            value = padded.reshape(1, -1, 1, 1, self.block)
            blocked = self.fresh(f"{name}_nchwc")
            self.graph.constants[blocked] = value
            self.graph.tensors[blocked] = TensorInfo(tuple(value.shape), "float32")
            self.constants[key] = blocked
        return self.constants[key]
