"""1-d convolutions as 2-d ones: speech, audio and time-series models in the blocked layout.

A wav2vec2-style feature encoder, a TCN or a 1-d CNN over signals is a stack of
`Conv` nodes on (N, C, L) tensors with activations, BatchNorm and residual adds
between them. wpk's convolution kernels (`micro.nchwc`, the NCHWc layout) are
2-d: left 1-d, every such conv runs as onnxruntime's node and the plan is
onnxruntime's. This pass lifts each connected region of 1-d work that holds a
convolution or pool to 2-d: its tensors (N, C, L) become (N, C, 1, L), a Conv's
(and MaxPool's, AveragePool's) kernel, strides, dilations and pads gain a leading
1 (pads (b, e) -> (0, b, 0, e)), a constant operand of an elementwise op gains the
same unit axis in the position that broadcasts it as before ((C, 1) -> (C, 1, 1)),
and a `Reshape` adds the axis where the region reads a 1-d tensor from outside and
removes it where a tensor leaves it (a graph output keeps its name and shape).

Lifted: Conv and ConvTranspose (a vocoder's upsampling) with a 3-d input and constant
3-d weights (any group, dilation, auto_pad, output padding), MaxPool and AveragePool
over L, GlobalAveragePool, GlobalMaxPool, BatchNormalization, ReduceMean and ReduceMax
over L (torch's `x.mean(2)`: a global pool), the unary activations of the epilogue table
(Relu, Erf, Sigmoid, Clip with constant bounds, ...), Add/Sub/Mul/Div/Pow/Max/Min whose
other operand is in the region, a constant or a tensor of rank <= 1, Concat and Split
over channels. A region without a Conv or pool over L (a transformer's (B, S, D)
elementwise ops and the reductions of its written-out LayerNorm) is left alone, as is
anything but float tensors.
"""

from __future__ import annotations

import numpy as np

from wpk.core.epilogue import ONNX_BINARY_STEPS
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import FLOAT_DTYPES, GraphPass, add_constant
from wpk.passes.elementwise import unary_step
from wpk.passes.reduce_to_pool import POOLS as REDUCE_POOLS
from wpk.passes.reduce_to_pool import reduced_axes

# Ops with a kernel over L whose attributes gain a leading unit axis
WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool"})
CONVS = frozenset({"Conv", "ConvTranspose"})
# Ops that make a region worth lifting: the convs and pools over L the blocked layout has
# kernels for (not a reduction or a global pool alone: a transformer's LayerNorm reduces
# its (B, S, D) tensors over D, and its rules want the reduction as it is)
ANCHOR_OPS = WINDOW_OPS
SAME_RANK_OPS = frozenset({"BatchNormalization", "GlobalAveragePool", "GlobalMaxPool"})


def _rank3_float(graph: Graph, name: str) -> bool:
    info = graph.tensors.get(name)
    return info is not None and len(info.shape) == 3 and info.dtype in FLOAT_DTYPES


def _window_ok(graph: Graph, node: Node) -> bool:
    """A 1-d Conv or ConvTranspose (constant 3-d weights, constant bias) or pool over L."""
    if node.op in CONVS:
        weight = graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        bias_ok = len(node.inputs) < 3 or not node.inputs[2] or node.inputs[2] in graph.constants
        return weight is not None and weight.ndim == 3 and bias_ok
    return len(node.outputs) == 1   # MaxPool's Indices output stays 1-d: not lifted


def _binary_ok(graph: Graph, node: Node) -> bool:
    """An elementwise binary op of (N, C, L) values: each operand 3-d (in the region or
    lifted from outside), a constant, or a tensor that broadcasts over L alone (rank
    <= 1)."""
    if len(node.inputs) != 2 or not any(_rank3_float(graph, i) for i in node.inputs):
        return False
    return all(_rank3_float(graph, name) or name in graph.constants
               or len(graph.tensors[name].shape) <= 1 for name in node.inputs)


def time_reduction(graph: Graph, node: Node) -> bool:
    """Whether `node` is a ReduceMean or ReduceMax over L of an (N, C, L) float tensor
    (torch's `x.mean(2)`, the average over time): a global pool once lifted."""
    if node.op not in REDUCE_POOLS or node.domain not in ("", "ai.onnx") \
            or len(node.outputs) != 1 or not _rank3_float(graph, node.inputs[0]):
        return False
    axes = reduced_axes(graph, node)
    return axes is not None and [a % 3 for a in axes] == [2]


def liftable(graph: Graph, node: Node) -> bool:
    """Whether `node` computes on (N, C, L) float tensors in a way that has a 2-d form."""
    if time_reduction(graph, node):
        return True
    if node.domain not in ("", "ai.onnx") or not node.outputs or not node.inputs \
            or node.epilogue or not all(_rank3_float(graph, o) for o in node.outputs if o):
        return False
    if node.op in ONNX_BINARY_STEPS:
        return _binary_ok(graph, node)
    if not _rank3_float(graph, node.inputs[0]):
        return False
    if node.op in WINDOW_OPS:
        return _window_ok(graph, node)
    if node.op in SAME_RANK_OPS:
        return node.op != "BatchNormalization" or all(
            i in graph.constants for i in node.inputs[1:] if i)
    if node.op in ("Concat", "Split"):
        axis = int(node.attr("axis", 0))
        return axis % 3 == 1 and all(_rank3_float(graph, i) for i in node.inputs[:1 if
                                     node.op == "Split" else None] if i) and (
            node.op == "Concat" or len(node.inputs) < 2 or not node.inputs[1]
            or node.inputs[1] in graph.constants)
    return len(node.outputs) == 1 and unary_step(graph, node) is not None


def _components(graph: Graph) -> list[list[Node]]:
    """The liftable nodes, grouped by the tensors they share, keeping the groups that
    hold a conv or pool."""
    nodes = [n for n in graph.nodes if liftable(graph, n)]
    parent = {id(n): id(n) for n in nodes}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    producer = {o: n for n in nodes for o in n.outputs if o}
    for node in nodes:
        for name in node.inputs:
            if name in producer:
                parent[root(id(node))] = root(id(producer[name]))
    groups: dict[int, list[Node]] = {}
    for node in nodes:
        groups.setdefault(root(id(node)), []).append(node)
    return [g for g in groups.values() if any(n.op in ANCHOR_OPS for n in g)]


def lifted_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against (N, C, L), with the unit H axis inserted where it
    broadcasts against (N, C, 1, L): before the last axis (rank >= 2)."""
    return tuple(shape) if len(shape) < 2 else (*shape[:-1], 1, shape[-1])


def _insert_reshape(graph: Graph, source: str, target: str, shape: tuple[int, ...],
                    name: str) -> None:
    """`target` = Reshape(`source`, `shape`), placed right after `source`'s producer (first,
    for a graph input)."""
    shape_name = add_constant(graph, f"{target}/shape", np.array(shape, np.int64))
    index = next((i + 1 for i, n in enumerate(graph.nodes) if source in n.outputs), 0)
    graph.nodes.insert(index, Node("Reshape", [source, shape_name], [target],
                                   graph.unique_name(name)))


def _window_attrs(node: Node) -> dict:
    """The 2-d attributes of a 1-d conv or pool: a unit leading axis everywhere (a
    ConvTranspose's output_padding and output_shape too)."""
    attrs = dict(node.attrs)
    for key, unit in (("kernel_shape", 1), ("strides", 1), ("dilations", 1),
                      ("output_padding", 0), ("output_shape", 1)):
        if node.attrs.get(key) is not None:
            attrs[key] = (unit, *tuple(node.attrs[key]))
    if node.attrs.get("pads") is not None:
        begin, end = tuple(node.attrs["pads"])
        attrs["pads"] = (0, begin, 0, end)
    return attrs


class Conv1dAs2d(GraphPass):
    """Lift regions of 1-d convolutions to 2-d ones (module docstring)."""

    name = "conv1d_as_2d"

    def run(self, graph: Graph) -> Graph:
        for component in _components(graph):
            self._lift(graph, component)
        return graph

    def _lift(self, graph: Graph, component: list[Node]) -> None:
        # the region's 3-d tensors (not a reduction's (N, C) without keepdims)
        produced = {o for n in component for o in n.outputs
                    if o and len(graph.tensors[o].shape) == 3}
        lifted: dict[str, str] = {}   # 3-d name -> its 2-d name

        def to_2d(name: str) -> str:
            """The 2-d form of a 3-d tensor the region reads from outside (a Reshape, made
            once, placed right after its producer)."""
            if name not in lifted:
                shape = lifted_shape(graph.tensors[name].shape)
                target = graph.unique_name(f"{name}/2d")
                graph.tensors[target] = TensorInfo(shape, graph.tensors[name].dtype)
                _insert_reshape(graph, name, target, shape, f"{name}/lift")
                lifted[name] = target
            return lifted[name]

        for name in produced:
            target = graph.unique_name(f"{name}/2d")
            graph.tensors[target] = TensorInfo(lifted_shape(graph.tensors[name].shape),
                                               graph.tensors[name].dtype)
            lifted[name] = target
        for node in component:
            if time_reduction(graph, node):
                self._pool(graph, node, lifted, to_2d)
                continue
            node.inputs = [self._operand(graph, node, i, name, produced, lifted, to_2d)
                           for i, name in enumerate(node.inputs)]
            node.outputs = [lifted.get(o, o) for o in node.outputs]
            if node.op in WINDOW_OPS:
                node.attrs = _window_attrs(node)
            if node.op in ("Concat", "Split"):
                node.attrs = {**node.attrs, "axis": 1}   # -2, the channels, would be H
        self._lower_outputs(graph, produced, lifted)
        self.hit(count=len(component))

    def _pool(self, graph: Graph, node: Node, lifted: dict[str, str], to_2d) -> None:
        """A reduction over L as the global pool of the lifted tensor: (N, C, 1, 1), the
        region's form of a kept (N, C, 1); without keepdims a Reshape to (N, C) follows."""
        source = node.inputs[0]
        node.op, node.attrs = REDUCE_POOLS[node.op], {}
        node.inputs = [lifted[source] if source in lifted else to_2d(source)]
        out = node.outputs[0]
        if out in lifted:   # keepdims: the region's (N, C, 1, 1)
            node.outputs = [lifted[out]]
            return
        pooled = graph.unique_name(f"{out}/pooled")
        n, c = graph.tensors[out].shape[:2]
        graph.tensors[pooled] = TensorInfo((n, c, 1, 1), graph.tensors[out].dtype)
        node.outputs = [pooled]
        _insert_reshape(graph, pooled, out, (n, c), f"{node.name}/flatten")

    def _operand(self, graph: Graph, node: Node, index: int, name: str, produced: set[str],
                 lifted: dict[str, str], to_2d) -> str:
        if not name:
            return name
        if name in produced:
            return lifted[name]
        if node.op in CONVS and index == 1:   # weights (O, I/g, K) -> (O, I/g, 1, K)
            weight = graph.constants[name]
            return add_constant(graph, f"{name}/2d", weight.reshape(*weight.shape[:2], 1,
                                                                     weight.shape[2]))
        if index > 0 and (node.op in WINDOW_OPS or node.op in SAME_RANK_OPS
                          or node.op == "Split"):
            return name   # bias, BatchNorm's per-channel vectors, split sizes
        if name in graph.constants:
            value = graph.constants[name]
            if value.ndim < 2:
                return name
            return add_constant(graph, f"{name}/2d", value.reshape(lifted_shape(value.shape)))
        if len(graph.tensors[name].shape) <= 1:
            return name
        return to_2d(name)

    def _lower_outputs(self, graph: Graph, produced: set[str],
                       lifted: dict[str, str]) -> None:
        """A Reshape back to 3-d for every region tensor still read by its 3-d name (the
        region's own nodes read the 2-d ones now) or a graph output (under its own name,
        right after its producer)."""
        readers = graph.consumers()
        for name in sorted(produced):
            if name not in readers and name not in graph.outputs:
                graph.tensors.pop(name, None)
                continue
            _insert_reshape(graph, lifted[name], name, graph.tensors[name].shape,
                            f"{name}/lower")
