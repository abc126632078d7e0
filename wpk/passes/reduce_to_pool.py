"""ReduceMean/ReduceMax over H and W of an NCHW tensor -> GlobalAveragePool/GlobalMaxPool.

Exporters spell a global pool as a reduction: torch's `x.mean((2, 3),
keepdim=True)` (squeeze-excite in MobileNetV3, the classifier head of many
CNNs) becomes `ReduceMean(axes=[2, 3])`. As a pool it stays inside the blocked
NCHWc layout and onnxruntime's MLAS pools it there; as a reduction the layout
ends before it and starts again after, with a reorder on each side. With
keepdims=0 the pool is followed by a Flatten to (N, C). The axes come from the
attribute (opset < 18) or from a constant second input (opset 18+).
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import FLOAT_DTYPES, GraphPass

POOLS = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def reduced_axes(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The reduced axes, or None when they are not known constants."""
    if len(node.inputs) > 1 and node.inputs[1]:
        value = graph.constants.get(node.inputs[1])
        return None if value is None else tuple(int(a) for a in np.asarray(value).ravel())
    axes = node.attr("axes")
    return None if axes is None else tuple(int(a) for a in axes)


def spatial_reduction(graph: Graph, node: Node) -> bool:
    """Whether `node` reduces exactly H and W of a 4-d float tensor."""
    if node.op not in POOLS or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    info = graph.tensors.get(node.inputs[0])
    if info is None or len(info.shape) != 4 or info.dtype not in FLOAT_DTYPES:
        return False
    axes = reduced_axes(graph, node)
    return axes is not None and sorted(a % 4 for a in axes) == [2, 3]


class ReduceToPool(GraphPass):
    """Rewrite spatial ReduceMean/ReduceMax nodes as global pools (module docstring)."""

    name = "reduce_to_pool"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            if not spatial_reduction(graph, node):
                nodes.append(node)
                continue
            x, out = node.inputs[0], node.outputs[0]
            pool = POOLS[node.op]
            if int(node.attr("keepdims", 1)):
                nodes.append(Node(pool, [x], [out], node.name))
            else:
                n, c = graph.tensors[x].shape[:2]
                pooled = graph.unique_name(f"{out}_pooled")
                graph.tensors[pooled] = TensorInfo((n, c, 1, 1), graph.tensors[x].dtype)
                nodes.append(Node(pool, [x], [pooled], graph.unique_name(f"{node.name}_pool")))
                nodes.append(Node("Flatten", [pooled], [out], node.name, {"axis": 1}))
            self.hit(node.op)
        graph.nodes = nodes
        return graph
