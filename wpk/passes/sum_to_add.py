"""Sum -> Add: a 2-input Sum becomes Add, a longer one a chain of Adds, a 1-input one Identity;
and a float Add of a tensor to itself, x + x, becomes x * 2.

Add is what the fusion rules and the kernels know (a residual Add fuses into
the convolution before it); Sum is how Caffe2-era models spell it. An Add whose two
inputs are one tensor is no step of a chain (a chain step applies an operand to the
running value), so it cut elementwise chains and, in Keras' NASNet through tf2onnx
(where two identical average pools are merged into one), the blocked layout: x * 2 is
the same number in floating point (doubling is exact) and a step like any scale.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass, add_constant

DOUBLED_TYPES = frozenset({"float16", "float32", "float64"})


class SumToAdd(GraphPass):
    """Rewrite every Sum node with Add nodes."""

    name = "sum_to_add"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            inputs = [i for i in node.inputs if i]
            if node.op != "Sum" or node.domain not in ("", "ai.onnx"):
                nodes.append(self._doubled(graph, node) or node)
                continue
            if len(inputs) == 1:  # no-op removal (which runs next) drops the Identity
                nodes.append(Node("Identity", inputs, node.outputs, node.name))
                self.hit()
                continue
            out = node.outputs[0]
            dtype = graph.tensors[out].dtype
            acc = inputs[0]
            for k, operand in enumerate(inputs[1:], start=1):
                last = k == len(inputs) - 1
                target = out if last else graph.unique_name(f"{out}_sum{k}")
                if not last:
                    shape = np.broadcast_shapes(graph.tensors[acc].shape,
                                                graph.tensors[operand].shape)
                    graph.tensors[target] = TensorInfo(tuple(shape), dtype)
                name = node.name if last else graph.unique_name(f"{node.name}_add{k}")
                add = Node("Add", [acc, operand], [target], name)
                nodes.append(self._doubled(graph, add) or add)
                acc = target
            self.hit()
        graph.nodes = nodes
        return graph

    def _doubled(self, graph: Graph, node: Node) -> Node | None:
        """x * 2 for a float Add(x, x), else None."""
        if node.op != "Add" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 \
                or not node.inputs[0] or node.inputs[0] != node.inputs[1]:
            return None
        dtype = graph.tensors[node.inputs[0]].dtype
        if dtype not in DOUBLED_TYPES:
            return None
        two = add_constant(graph, f"{node.name}_two", np.array(2, dtype))
        self.hit()
        return Node("Mul", [node.inputs[0], two], node.outputs, node.name)
