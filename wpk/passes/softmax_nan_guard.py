"""The NaN guard of torch's exported attention, moved past the context product.

torch.onnx exports `scaled_dot_product_attention` (Hugging Face's BERT, ViT, ... at
opset 14 and later) with a guard on the probabilities, so that a row whose keys are all
masked (a softmax of -inf only, NaN) gives zeros:

    P = Softmax(logits);  P' = Where(IsNaN(P), 0, P);  Y = MatMul(P', V)

The guard stands between the Softmax and the MatMul, so the attention rule (which fuses
Softmax and MatMul) did not fire. A softmax row is either NaN in every entry (all -inf,
or a NaN or +inf logit) or finite in every entry, so the guard can act on the product:

    Y0 = MatMul(P, V);  Y = Where(IsNaN(Y0), 0, Y0)

A NaN row of P gives a NaN row of Y0 and then zeros, as before; a finite row gives the
same product. The two differ only where V itself holds NaN or infinite values that make a
finite row's product NaN (then zeros instead of NaN). The guard's Where and IsNaN then read
the [..., S, D] output instead of the [..., S, S] probabilities.
"""

from __future__ import annotations

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass, pinned_names, readers_of


def _is_zero(graph: Graph, name: str) -> bool:
    value = graph.constants.get(name)
    return value is not None and value.size == 1 and value.dtype.kind == "f" \
        and float(value.reshape(-1)[0]) == 0.0


class SoftmaxNanGuard(GraphPass):
    """Move `Where(IsNaN(P), 0, P)` between a Softmax and its MatMul past the MatMul."""

    name = "softmax_nan_guard"

    def run(self, graph: Graph) -> Graph:
        readers, pinned = readers_of(graph), pinned_names(graph)
        producers = {o: n for n in graph.nodes for o in n.outputs if o}
        moved: dict[int, tuple[Node, Node]] = {}   # id of the MatMul -> the guard after it
        dropped: set[int] = set()
        for where in graph.nodes:
            found = self._match(graph, where, readers, producers, pinned)
            if found is None:
                continue
            isnan, matmul = found
            probabilities = where.inputs[2]
            product = graph.unique_name(f"{matmul.outputs[0]}_unguarded")
            graph.tensors[product] = TensorInfo(graph.tensors[matmul.outputs[0]].shape,
                                                graph.tensors[matmul.outputs[0]].dtype)
            nan = graph.unique_name(f"{isnan.outputs[0]}_of_product")
            graph.tensors[nan] = TensorInfo(graph.tensors[product].shape, "bool")
            for name in (isnan.outputs[0], where.outputs[0]):
                graph.tensors.pop(name, None)
            output = matmul.outputs[0]
            matmul.inputs = [probabilities, matmul.inputs[1]]
            matmul.outputs = [product]
            moved[id(matmul)] = (Node("IsNaN", [product], [nan], isnan.name),
                                 Node("Where", [nan, where.inputs[1], product], [output],
                                      where.name))
            dropped.update((id(isnan), id(where)))
            self.hit()
        if moved:
            nodes = []
            for node in graph.nodes:
                if id(node) in dropped:
                    continue
                nodes.append(node)
                nodes.extend(moved.get(id(node), ()))
            graph.nodes = nodes
        return graph

    @staticmethod
    def _match(graph: Graph, where: Node, readers, producers, pinned):
        """(the IsNaN, the MatMul) of a guard `where` = Where(IsNaN(P), 0, P) between a
        Softmax P and a MatMul(guard, V), each tensor read only along the pattern."""
        if where.op != "Where" or where.domain not in ("", "ai.onnx") \
                or len(where.inputs) != 3 or where.epilogue:
            return None
        condition, zero, probabilities = where.inputs
        isnan, softmax = producers.get(condition), producers.get(probabilities)
        if isnan is None or isnan.op != "IsNaN" or isnan.inputs != [probabilities] \
                or softmax is None or softmax.op != "Softmax" or not _is_zero(graph, zero):
            return None
        users = readers.get(where.outputs[0], [])
        if len(users) != 1 or users[0].op != "MatMul" or users[0].epilogue \
                or users[0].inputs[0] != where.outputs[0] \
                or users[0].inputs[1] == where.outputs[0]:
            return None
        if {id(n) for n in readers.get(probabilities, [])} != {id(isnan), id(where)} \
                or len(readers.get(condition, [])) != 1 \
                or pinned.intersection((probabilities, condition, where.outputs[0])):
            return None
        if graph.tensors[where.outputs[0]].shape != graph.tensors[probabilities].shape \
                or np.dtype(graph.tensors[probabilities].dtype).kind != "f":
            return None
        return isnan, users[0]
