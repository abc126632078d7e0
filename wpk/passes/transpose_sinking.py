"""Transposes moved down through the layout-agnostic nodes after them until they cancel
(pass `transpose_sinking`, both targets).

Converters from channels-last frameworks wrap every convolution in layout changes: tf2onnx
leaves Keras' MobileNetV3 as

    Conv -> Transpose(NCHW to NHWC) -> Mul(scale [C]) -> Relu -> Pad
         -> Transpose(NHWC to NCHW) -> Conv

128 Transposes in 369 nodes, each cutting the blocked layout's chain of convolutions (two
reorders per conv). The elementwise nodes between them do not care about the layout: a
node whose tensor operands all come transposed by the same permutation P computes the
transpose of what it computes on the untransposed tensors, so

    Op(T_P(a), T_P(b), c) = T_P(Op(a, b, c'))

with a constant operand c made c' (broadcast to the rank, transposed by P's inverse),
and Pad's widths, a reduction's axes, a Softmax's or Concat's axis mapped through P (a
reduction that drops axes leaves the others in their order, often none transposed).
The pass walks the graph in order and defers each Transpose: its output is remembered
as "a, transposed by P"; a node that can take its operands untransposed (`SINKABLE`)
runs on them and its outputs are deferred in turn; a Transpose of a deferred tensor
composes the two permutations, and where they cancel the tensor is `a` itself; a node
that cannot (a Conv, a MatMul, a Reshape, a graph output) gets the Transpose written just
before it. In MobileNetV3 every pair cancels but the input's.

Deferring can also cost: a tensor read both by a node that takes it untransposed and by
one that does not is transposed twice. So the deferred tensors are grouped by the
Transposes they come from (the groups merge where a node reads several), and a group's
Transposes are moved only when that lowers the number of elements the group transposes
(unknown dims count as 1). A Transpose followed by nothing that cancels it, as the head
split of attention before its MatMul, stays where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass, add_constant, pinned_names

ONNX_DOMAINS = ("", "ai.onnx")
# one tensor operand (input 0); any other inputs (Clip's bounds) are left as they are
UNARY = frozenset({
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Shrink", "Neg",
    "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil", "Round", "Sign", "Not",
    "Identity", "Cast", "Clip", "Sin", "Cos", "IsNaN", "IsInf"})
# every input a broadcast operand
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod"})
REDUCTIONS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
SINKABLE = UNARY | BROADCASTING | REDUCTIONS | AXIS_OPS | {"Pad", "Concat"}


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes `perm` (ONNX Transpose semantics)."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def compose(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """The one permutation of Transpose(second) after Transpose(first)."""
    return tuple(first[i] for i in second)


@dataclass
class _Deferred:
    """Tensor `source` transposed by `perm` stands for the graph's tensor; `group` is the
    union-find id of the Transposes it comes from."""

    source: str
    perm: tuple[int, ...]
    group: int


@dataclass
class _Groups:
    """Union-find over the deferred Transposes, with what each group saves and costs."""

    parent: list[int] = field(default_factory=list)
    seeds: list[list[Node]] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)
    spent: list[int] = field(default_factory=list)

    def new(self, seed: Node, elements: int) -> int:
        self.parent.append(len(self.parent))
        self.seeds.append([seed])
        self.saved.append(elements)
        self.spent.append(0)
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def union(self, groups: list[int]) -> int:
        roots = sorted({self.find(g) for g in groups})
        root = roots[0]
        for other in roots[1:]:
            self.parent[other] = root
            self.seeds[root] += self.seeds[other]
            self.saved[root] += self.saved[other]
            self.spent[root] += self.spent[other]
        return root


class _Sinker:
    """One walk over the graph deferring the Transposes that are `movable` (by identity;
    None: every one)."""

    def __init__(self, graph: Graph, movable: set[int] | None):
        self.graph, self.movable = graph, movable
        self.pinned = pinned_names(graph)
        self.deferred: dict[str, _Deferred] = {}
        self.renamed: dict[str, str] = {}
        self.written: set[str] = set()
        self.groups = _Groups()
        self.nodes: list[Node] = []
        self.moved = 0

    def run(self) -> list[Node]:
        for node in self.graph.nodes:
            node.inputs = [self.renamed.get(i, i) for i in node.inputs]
            if self._defer_transpose(node) or self._sink(node):
                continue
            node.inputs = [self._materialize(i) for i in node.inputs]
            self.nodes.append(node)
        return self.nodes

    # -- the Transposes themselves ----------------------------------------------------
    def _defer_transpose(self, node: Node) -> bool:
        if node.op != "Transpose" or node.domain not in ONNX_DOMAINS or node.epilogue \
                or len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        x, out = node.inputs[0], node.outputs[0]
        rank = self._rank(x)
        perm = tuple(int(p) for p in node.attr("perm", ())) or tuple(reversed(range(rank or 0)))
        if rank is None or len(perm) != rank:
            return False
        if x in self.deferred:
            earlier = self.deferred[x]
            perm = compose(earlier.perm, perm)
            source, group = earlier.source, self.groups.find(earlier.group)
            self.groups.saved[group] += self._elements(out)
        elif self.movable is None or id(node) in self.movable:
            source, group = x, self.groups.new(node, self._elements(out))
        else:
            return False
        self.moved += 1
        if perm == tuple(range(rank)):
            if out in self.pinned:
                self.nodes.append(Node("Identity", [source], [out], node.name))
            else:
                self.renamed[out] = source
            return True
        self.deferred[out] = _Deferred(source, perm, group)
        if out in self.pinned:
            self._materialize(out)
        return True

    def _materialize(self, name: str) -> str:
        """Write the deferred transpose of `name` (once) and return the name to read."""
        entry = self.deferred.get(name)
        if entry is None or name in self.written:
            return name
        self.groups.spent[self.groups.find(entry.group)] += self._elements(name)
        self.nodes.append(Node("Transpose", [entry.source], [name],
                               self.graph.unique_name(f"{name}_transposed"),
                               {"perm": list(entry.perm)}))
        self.written.add(name)
        return name

    # -- the nodes that take their operands untransposed ----------------------------------
    def _sink(self, node: Node) -> bool:
        if node.op not in SINKABLE or node.domain not in ONNX_DOMAINS or node.epilogue:
            return False
        operands = self._operands(node)
        entries = [self.deferred.get(node.inputs[i]) for i in operands]
        if not any(entries):
            return False
        perm = next(e.perm for e in entries if e)
        if not self._can_sink(node, operands, entries, perm):
            return False
        inputs = list(node.inputs)
        for i, entry in zip(operands, entries):
            inputs[i] = entry.source if entry is not None else self._constant_for(
                node.inputs[i], np.asarray(self.graph.constants[node.inputs[i]]), perm)
        out_perm = self._output_perm(node, perm)
        attrs = self._attrs_for(node, inputs, perm)
        group = self.groups.union([e.group for e in entries if e])
        outputs = []
        for out in node.outputs:
            if not out or out_perm == tuple(range(len(out_perm))):
                outputs.append(out)     # e.g. a reduction to [N, C] of NHWC's H and W
                continue
            inner = self.graph.unique_name(f"{out}_untransposed")
            info = self.graph.tensors[out]
            self.graph.tensors[inner] = TensorInfo(
                tuple(info.shape[p] for p in inverse(out_perm)), info.dtype)
            self.deferred[out] = _Deferred(inner, out_perm, group)
            outputs.append(inner)
        self.nodes.append(Node(node.op, inputs, outputs, node.name, attrs, node.domain))
        for out in node.outputs:
            if out and out in self.pinned:
                self._materialize(out)
        return True

    def _can_sink(self, node: Node, operands: list[int], entries: list, perm) -> bool:
        """Whether `node` can read its operands untransposed: every deferred one by the
        same permutation, the others constants (not for Concat) of at most its rank, the
        outputs of its rank, and its axes or widths known."""
        rank = len(perm)
        if any(e is not None and e.perm != perm for e in entries):
            return False
        for i, entry in zip(operands, entries):
            value = None if entry else self.graph.constants.get(node.inputs[i])
            if entry is None and (value is None or node.op == "Concat"
                                  or np.ndim(value) > rank):
                return False
        inputs = node.inputs
        if node.op in AXIS_OPS:         # the older ones flatten from their axis on
            return self.graph.opset >= 13
        if node.op in REDUCTIONS and not ("axes" in node.attrs or len(inputs) < 2
                                          or not inputs[1] or inputs[1] in self.graph.constants):
            return False
        out_rank = len(self._output_perm(node, perm))
        if any(self._rank(o) != out_rank for o in node.outputs if o):
            return False
        if node.op == "Pad":
            if len(inputs) > 3 and inputs[3]:       # pads of some axes only (opset 18)
                return False
            pads = node.attr("pads") if "pads" in node.attrs else (
                self.graph.constants.get(inputs[1]) if len(inputs) > 1 and inputs[1] else None)
            return pads is not None and np.size(pads) == 2 * rank
        return True

    def _output_perm(self, node: Node, perm: tuple[int, ...]) -> tuple[int, ...]:
        """The permutation the outputs come transposed by: the operands' one, but for a
        reduction that drops its axes the order of the axes it keeps."""
        if node.op not in REDUCTIONS or int(node.attr("keepdims", 1)):
            return perm
        axes = self._reduction_axes(node, len(perm))
        if axes is None:
            return perm if int(node.attr("noop_with_empty_axes", 0)) else ()
        kept = [perm[i] for i in range(len(perm)) if i not in axes]
        order = sorted(kept)
        return tuple(order.index(k) for k in kept)

    def _reduction_axes(self, node: Node, rank: int) -> set[int] | None:
        """The reduced axes (of the transposed operand), None where none are given."""
        if "axes" in node.attrs:
            values = node.attr("axes")
        elif len(node.inputs) > 1 and node.inputs[1] in self.graph.constants:
            values = np.ravel(self.graph.constants[node.inputs[1]])
        else:
            return None
        return {int(a) % rank for a in values} if len(values) else None

    def _operands(self, node: Node) -> list[int]:
        """The inputs that carry the layout (the others are scalars or parameters)."""
        if node.op in BROADCASTING or node.op == "Concat":
            return [i for i, name in enumerate(node.inputs) if name]
        return [0]

    def _constant_for(self, name: str, value: np.ndarray, perm: tuple[int, ...]) -> str:
        """A constant operand as the untransposed node reads it."""
        if value.ndim == 0:
            return name
        full = value.reshape((1,) * (len(perm) - value.ndim) + value.shape)
        return add_constant(self.graph, f"{name}_untransposed",
                            np.ascontiguousarray(np.transpose(full, inverse(perm))))

    def _attrs_for(self, node: Node, inputs: list[str], perm: tuple[int, ...]) -> dict:
        """The node's attributes (and axis or width inputs, in `inputs`) for untransposed
        operands (`_can_sink` said it can take them)."""
        rank, attrs = len(perm), dict(node.attrs)
        if node.op in AXIS_OPS:
            attrs["axis"] = perm[int(node.attr("axis", -1)) % rank]
        elif node.op == "Concat":
            attrs["axis"] = perm[int(node.attr("axis")) % rank]
        elif node.op in REDUCTIONS:
            self._map_reduction_axes(node, inputs, perm, attrs)
        elif node.op == "Pad":
            self._map_pads(inputs, perm, attrs)
        return attrs

    def _map_reduction_axes(self, node: Node, inputs: list[str], perm, attrs: dict) -> None:
        axes = self._reduction_axes(node, len(perm))
        if axes is None:    # all axes, or none with noop_with_empty_axes: nothing to map
            return
        mapped = sorted(perm[a] for a in axes)
        if "axes" in attrs:
            attrs["axes"] = mapped
        else:
            inputs[1] = add_constant(self.graph, f"{inputs[1]}_untransposed",
                                     np.array(mapped, np.int64))

    def _map_pads(self, inputs: list[str], perm, attrs: dict) -> None:
        """Pad's widths [begins..., ends...] of the transposed axes, for the untransposed."""
        rank, back = len(perm), inverse(perm)
        flat = [int(p) for p in np.ravel(attrs["pads"] if "pads" in attrs
                                         else self.graph.constants[inputs[1]])]
        mapped = [flat[back[j]] for j in range(rank)] + [flat[rank + back[j]]
                                                         for j in range(rank)]
        if "pads" in attrs:
            attrs["pads"] = mapped
        else:
            inputs[1] = add_constant(self.graph, f"{inputs[1]}_untransposed",
                                     np.array(mapped, np.int64))

    # -- shapes ---------------------------------------------------------------------------
    def _rank(self, name: str) -> int | None:
        info = self.graph.tensors.get(name)
        return None if info is None else len(info.shape)

    def _elements(self, name: str) -> int:
        info = self.graph.tensors.get(name)
        if info is None:
            return 1
        return int(np.prod([d if isinstance(d, (int, np.integer)) and d > 0 else 1
                            for d in info.shape]))


class TransposeSinking(GraphPass):
    """Move Transposes down through layout-agnostic nodes where they then cancel."""

    name = "transpose_sinking"

    def run(self, graph: Graph) -> Graph:
        if not any(n.op == "Transpose" for n in graph.nodes):
            return graph
        trial = _Sinker(graph.copy(), None)
        trial.run()
        groups = trial.groups
        roots = {groups.find(g) for g in range(len(groups.parent))}
        worth = [r for r in roots if groups.spent[r] < groups.saved[r]]
        if not worth:
            return graph
        index = {id(n): k for k, n in enumerate(trial.graph.nodes)}
        movable = {id(graph.nodes[index[id(seed)]]) for r in worth for seed in groups.seeds[r]}
        sinker = _Sinker(graph, movable)
        graph.nodes = sinker.run()
        self.hit(count=sinker.moved)
        return graph
