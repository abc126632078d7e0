"""Models whose last nodes have value-dependent shapes: a static head, an onnxruntime tail.

Detection and segmentation models end in NonMaxSuppression, NonZero, a TopK whose k
is computed, a Slice up to a count: the shapes of those nodes' outputs depend on the
values of the model's inputs, so no static plan can hold them. The build splits such a
model where it must (`split_value_tail`):

- the **tail**: every node whose output shape depends on input values (the rule of
  `wpk.frontend_shapes`: an op such as NonZero on input-dependent data, or a Reshape,
  Slice, TopK, ... whose shape-defining input is computed from input values), every node
  after it that reads a tail tensor, and the constant nodes only the tail reads;
- the **head**: every other node, a model with static shapes, whose outputs are the
  model's outputs it computes and the tensors the tail reads from it (the boundary).

The head is built like any model (tuned, fused, measured against onnxruntime's own run of
it); the tail becomes one onnxruntime session that the runtime runs after the head's plan
on the boundary tensors and the graph inputs it reads (`wpk.runtime_tail`). The plan
holds it as `kernels/tail.onnx` and describes it in the manifest's `tail` entry; the
report says which nodes it holds and why. `--strict` refuses such a model, naming the
first node whose shape depends on values.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from wpk.core.errors import UnsupportedError, ValueShapeError
from wpk.core.graph import Graph
from wpk.frontend import load_model, node_names, read_model
from wpk.frontend_shapes import SHAPE_INPUTS, VALUE_SHAPED_OPS

TAIL_MEMBER = "tail.onnx"
# Ops whose outputs are not constant though their inputs are (none or constants).
_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                           "RandomUniformLike", "Multinomial", "Bernoulli"})


@dataclass
class ValueTail:
    """The nodes of a model that run in onnxruntime after the plan, and how they connect.

    `head_inputs`: tensors the tail reads from the head's outputs; `graph_inputs`: graph
    inputs it reads; `outputs`: the model's outputs it computes (names, in model order);
    `seeds`: (op, node name) of the nodes whose output shapes depend on input values."""

    nodes: list[onnx.NodeProto]
    head_inputs: list[str]
    graph_inputs: list[str]
    outputs: list[str]
    seeds: list[tuple[str, str]]
    proto: onnx.ModelProto   # the original model: opsets, initializers, output types

    def model(self, graph: Graph) -> onnx.ModelProto:
        """The tail as a model whose inputs have the static shapes of `graph` (the loaded
        head, which knows every boundary tensor's and graph input's shape)."""
        inputs = [helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(graph.tensors[name].dtype)),
            list(graph.tensors[name].shape)) for name in [*self.graph_inputs, *self.head_inputs]]
        declared = {v.name: v for v in self.proto.graph.output}
        reads = set().union(*(_reads(n) for n in self.nodes))
        initializers = [t for t in self.proto.graph.initializer if t.name in reads]
        body = helper.make_graph(self.nodes, f"{self.proto.graph.name or 'model'}_tail", inputs,
                                 [declared[name] for name in self.outputs], initializers)
        body.sparse_initializer.extend(t for t in self.proto.graph.sparse_initializer
                                       if t.values.name in reads)
        model = helper.make_model(body, opset_imports=list(self.proto.opset_import),
                                  producer_name="wpk")
        model.ir_version = self.proto.ir_version
        model.functions.extend(self.proto.functions)
        return model

    def summary(self) -> dict:
        """What the report says of the tail: its nodes by op, the nodes that put it there,
        what it reads and computes."""
        ops = collections.Counter(n.op_type for n in self.nodes)
        return {"nodes": len(self.nodes), "ops": dict(sorted(ops.items())),
                "value_shaped": [{"op": op, "node": name} for op, name in self.seeds],
                "reads": [*self.graph_inputs, *self.head_inputs], "outputs": list(self.outputs)}

    def describe(self) -> str:
        """One line: how many nodes run in onnxruntime, and from which node on."""
        op, name = self.seeds[0]
        return (f"{len(self.nodes)} node(s) from {op} node '{name}' on run in onnxruntime "
                "after the plan (their output shapes depend on the input values)")


def load_head(model: Any, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
              max_memory: Any = None, strict: bool = False
              ) -> tuple[Graph, Any, ValueTail | None]:
    """(graph, `model`, None) of a model with static shapes (`wpk.frontend.load_model`);
    for one whose shapes depend on input values from some node on, (the graph of its
    static head, the head's ModelProto, the tail to run after it in onnxruntime). With
    `strict` such a model is an UnsupportedError."""
    proto, source = read_model(model)
    try:
        return load_model(proto, input_shapes, max_memory, source=source), model, None
    except ValueShapeError as first:
        error = first
    found: list[str] = []   # tensors the frontend's evaluation found value-shaped
    while True:   # each round moves at least one more node to the tail
        if error.tensor is not None and error.tensor not in found:
            found.append(error.tensor)
        split = split_value_tail(proto, source, found)
        if split is None:
            raise error
        if strict:
            raise UnsupportedError(
                f"{error.message}: without --strict its nodes from there on would run in "
                "onnxruntime after the plan",
                hint="drop --strict, or export the model without its value-dependent end "
                     "(e.g. without NMS)") from None
        head, tail = split
        try:
            return load_model(head, input_shapes, max_memory, source=source), head, tail
        except ValueShapeError as again:
            if again.tensor is None or again.tensor in found:
                raise
            error = again


# The name suffix of the one output of an all-tail model's head (an Identity of an input)
HEAD_COPY = "__wpk_head_copy"


def split_value_tail(proto: onnx.ModelProto, source: str, value_shaped: Sequence[str] = ()
                     ) -> tuple[onnx.ModelProto, ValueTail] | None:
    """(head model, tail) of `proto` split before its value-dependent shapes, or None when
    no node's output shape depends on input values: by the frontend's rule, or because
    its output is one of `value_shaped` (tensors whose shape differed between the
    frontend's two evaluations, e.g. a Loop's scan output with a computed trip count).
    When every output comes from the tail, which then reads only the graph's inputs, the
    head is one Identity of the first input the tail reads (`HEAD_COPY`): a plan has a
    static part to run, and the model runs in onnxruntime after it, as any tail does
    (`UnsupportedError` for a model without inputs)."""
    graph = proto.graph
    nodes = []
    for node, name in zip(graph.node, node_names(proto)):   # the names the report gives
        named = onnx.NodeProto()
        named.CopyFrom(node)
        named.name = name
        nodes.append(named)
    initializers = {t.name for t in graph.initializer} | {
        t.values.name for t in graph.sparse_initializer}
    inputs = [v.name for v in graph.input if v.name not in initializers]
    reads = [_reads(node) for node in nodes]   # each node's, subgraphs included
    seeds = sorted({*_seeds(nodes, reads, inputs),
                    *(i for i, n in enumerate(nodes) if set(n.output) & set(value_shaped))})
    if not seeds:
        return None
    tail = _downstream(nodes, reads, seeds)
    tail |= _constants_only_the_tail_reads(nodes, reads, tail, initializers, graph.output)
    in_tail = [i for i, _ in enumerate(nodes) if i in tail]
    produced_by_tail = {o for i in in_tail for o in nodes[i].output if o}
    outputs = [v.name for v in graph.output if v.name in produced_by_tail]
    boundary = _unique(n for i in in_tail for n in reads[i] if n not in produced_by_tail
                       and n not in initializers)
    graph_inputs = [n for n in boundary if n in inputs]
    head_inputs = [n for n in boundary if n not in inputs]
    head_outputs = _unique([*(v.name for v in graph.output if v.name not in produced_by_tail),
                            *head_inputs])
    kept = [i for i in range(len(nodes)) if i not in tail]
    head_nodes, head_reads = [nodes[i] for i in kept], {n for i in kept for n in reads[i]}
    copied = None
    if not head_outputs:   # all tail: the head only copies an input the tail reads
        if not graph_inputs:
            op, name = nodes[seeds[0]].op_type, nodes[seeds[0]].name
            raise UnsupportedError(
                f"every output of '{source}' comes after {op} node '{name}', whose output "
                "shape depends on the input values, and the model has no input to plan",
                hint="run this model with onnxruntime")
        copy = f"{graph_inputs[0]}{HEAD_COPY}"
        head_nodes.append(helper.make_node("Identity", [graph_inputs[0]], [copy],
                                           name=copy))
        head_outputs, head_reads = [copy], head_reads | {graph_inputs[0]}
        copied = next(v for v in graph.input if v.name == graph_inputs[0])
    head = _head_model(proto, head_nodes, head_outputs, head_reads)
    if copied is not None:   # the copy is typed as the input it copies
        head.graph.output[0].CopyFrom(copied)
        head.graph.output[0].name = head_outputs[0]
    value_tail = ValueTail([nodes[i] for i in in_tail], head_inputs, graph_inputs, outputs,
                           [(nodes[i].op_type, nodes[i].name) for i in seeds], proto)
    return head, value_tail


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _reads(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs and the outer names its subgraphs use."""
    names = [n for n in node.input if n]
    for attribute in node.attribute:
        for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH \
                else list(attribute.graphs):
            defined = {v.name for v in body.input} | {t.name for t in body.initializer}
            for inner in body.node:
                names += [n for n in _reads(inner) if n not in defined]
                defined.update(inner.output)
    return names


def _seeds(nodes: Sequence[onnx.NodeProto], reads: Sequence[list[str]],
           inputs: Sequence[str]) -> list[int]:
    """Indices of the nodes whose output shapes depend on graph input values: the rule
    of `wpk.frontend_shapes` (a value-shaped op on input-valued data, or a shape-defining
    input computed from input values), in one pass in topological order."""
    valued = dict.fromkeys(inputs, True)
    seeds = []
    for index, node in enumerate(nodes):
        reads_values = [valued.get(n, False) for n in reads[index]]
        shape_inputs = SHAPE_INPUTS.get(node.op_type, ())
        if (node.domain in ("", "ai.onnx") and (
                (node.op_type in VALUE_SHAPED_OPS and any(reads_values))
                or any(i < len(node.input) and valued.get(node.input[i], False)
                       for i in shape_inputs))):
            seeds.append(index)
        result = node.op_type not in ("Shape", "Size") and any(reads_values)
        for output in node.output:
            valued[output] = result
    return seeds


def _downstream(nodes: Sequence[onnx.NodeProto], reads: Sequence[list[str]],
                seeds: Sequence[int]) -> set[int]:
    """The seeds and every node that reads, directly or not, one of their outputs."""
    tail = set(seeds)
    tainted = {o for i in seeds for o in nodes[i].output}
    for index, node in enumerate(nodes):
        if index not in tail and any(n in tainted for n in reads[index]):
            tail.add(index)
            tainted.update(node.output)
    return tail


def _constants_only_the_tail_reads(nodes: Sequence[onnx.NodeProto],
                                   reads: Sequence[list[str]], tail: set[int],
                                   initializers: set[str], outputs) -> set[int]:
    """Nodes computed from constants alone (a Constant, a Cast of an initializer) whose
    outputs only the tail reads: they move with it, so that the head does not output a
    constant (onnxruntime's run of the head stays comparable to the plan)."""
    constant = set(initializers)
    for index, node in enumerate(nodes):
        if node.op_type not in _NOT_CONSTANT and all(n in constant for n in reads[index]):
            constant.update(o for o in node.output if o)
    readers: dict[str, set[int]] = collections.defaultdict(set)
    for index, names in enumerate(reads):
        for name in names:
            readers[name].add(index)
    graph_outputs = {v.name for v in outputs}
    moved: set[int] = set()
    for index in reversed(range(len(nodes))):
        node = nodes[index]
        if index in tail or not node.output:
            continue
        outs = [o for o in node.output if o]
        if all(o in constant and o not in graph_outputs for o in outs) and all(
                readers[o] and readers[o] <= tail | moved for o in outs):
            moved.add(index)
    return moved


def _head_model(proto: onnx.ModelProto, nodes: list[onnx.NodeProto],
                outputs: Sequence[str], head_reads: set[str]) -> onnx.ModelProto:
    """`proto` without the tail's nodes, its outputs `outputs` (every graph input kept;
    the initializers in `head_reads`, what its nodes read)."""
    declared = {**_inferred_values(proto), **{v.name: v for v in proto.graph.output}}
    reads = head_reads | set(outputs) | {v.name for v in proto.graph.input}
    head = onnx.ModelProto()
    head.CopyFrom(proto)
    graph = head.graph
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in proto.graph.initializer if t.name in reads]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.output[:]
    graph.output.extend(declared[name] if name in declared else
                        helper.make_tensor_value_info(name, 0, None) for name in outputs)
    return head


def _inferred_values(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The type and shape of every tensor ONNX's (lenient) shape inference can tell."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - the frontend reports a model inference fails on
        inferred = proto
    return {v.name: v for v in inferred.graph.value_info if v.type.HasField("tensor_type")}


def attach_tail(plan, tail: ValueTail, graph: Graph) -> None:
    """Give the built head `plan` its tail: the model as `kernels/tail.onnx`, the
    manifest's `tail` entry (what it reads, what it computes: names, dtypes and shapes,
    None for a dim that depends on values; every output of the model in order) and the
    report's. The tail is loaded in onnxruntime first: a model it cannot load is an
    `UnsupportedError` naming the node that put it there."""
    import onnxruntime as ort

    model = tail.model(graph).SerializeToString()
    try:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types here
        op, name = tail.seeds[0]
        raise UnsupportedError(
            f"the nodes from {op} node '{name}' on (their shapes depend on the input values) "
            f"do not load in onnxruntime: {str(exc).strip().splitlines()[0]}",
            hint="wpk runs a model's value-dependent end in onnxruntime; check that "
                 "onnxruntime runs the model") from exc
    computed = {o.name: {"name": o.name, "dtype": _dtype_of(o.type),
                         "shape": [d if isinstance(d, int) else None for d in o.shape or ()]}
                for o in session.get_outputs()}
    head_outputs = {entry["name"]: entry for entry in plan.manifest["outputs"]}
    plan.kernels[TAIL_MEMBER] = model
    plan.manifest["tail"] = {
        "model": TAIL_MEMBER,
        "reads": [*tail.graph_inputs, *tail.head_inputs],
        "outputs": [computed[name] for name in tail.outputs],
        "graph_outputs": [computed.get(name) or head_outputs[name]
                          for name in (v.name for v in tail.proto.graph.output)],
    }
    plan.report["tail"] = {**tail.summary(), "text": tail.describe()}


def _dtype_of(ort_type: str) -> str:
    """numpy's name of an onnxruntime type string ('tensor(int64)' -> 'int64')."""
    name = ort_type[len("tensor("):-1] if ort_type.startswith("tensor(") else ort_type
    return {"float": "float32", "double": "float64"}.get(name, name)
