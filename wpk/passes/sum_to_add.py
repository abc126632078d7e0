"""Sum -> Add: a 2-input Sum becomes Add, a longer one a chain of Adds, a 1-input one Identity.

Add is what the fusion rules and the kernels know (a residual Add fuses into
the convolution before it); Sum is how Caffe2-era models spell it.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass


class SumToAdd(GraphPass):
    """Rewrite every Sum node with Add nodes."""

    name = "sum_to_add"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            inputs = [i for i in node.inputs if i]
            if node.op != "Sum" or node.domain not in ("", "ai.onnx"):
                nodes.append(node)
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
                nodes.append(Node("Add", [acc, operand], [target], name))
                acc = target
            self.hit()
        graph.nodes = nodes
        return graph
