"""A small `onnx.helper` graph writer for models in the style of paddle2onnx and tf2onnx.

Those exporters do not emit what torch does: old opsets (11-13), batch (and
sometimes spatial) dims declared as `dim_value: -1`, a `Constant` node for
every scalar, activations and normalizations spelled out as elementwise
chains, and shapes computed at run time with Shape -> Gather -> Concat ->
Reshape. `GraphWriter` keeps the bookkeeping (unique names, seeded weights)
out of the model definitions in `paddle_style.py` and `tf_style.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

UNKNOWN_DIM = -1  # how paddle2onnx (and some tf2onnx versions) declare a dynamic dim


class GraphWriter:
    """Accumulates nodes and seeded initializers under exporter-like names.

    `constant_nodes`: scalars and small int vectors become `Constant` nodes (as
    paddle2onnx writes them) instead of initializers (as tf2onnx does).
    """

    def __init__(self, seed: int, opset: int, constant_nodes: bool):
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.constant_nodes = constant_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def name(self, base: str) -> str:
        """`base_<n>`, numbered per base as the exporters number their tensors."""
        index = self._counts.get(base, 0)
        self._counts[base] = index + 1
        return f"{base}_{index}"

    def op(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs) -> str:
        """Append a node; returns its first output (all outputs via `op_multi`)."""
        return self.op_multi(op_type, inputs, outputs, **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], outputs: int, **attrs) -> list[str]:
        """Append a node with `outputs` outputs; returns their names."""
        base = op_type.lower()
        names = [self.name(f"{base}.tmp") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names,
                                           name=self.name(op_type), **attrs))
        return names

    # Constants ------------------------------------------------------------------------

    def constant(self, value, dtype=np.float32) -> str:
        """A small constant (scalar, shape, axes) as a Constant node or an initializer."""
        array = np.asarray(value, dtype=dtype)
        if self.constant_nodes:
            out = self.name("constant.tmp")
            self.nodes.append(helper.make_node(
                "Constant", [], [out], name=self.name("Constant"),
                value=numpy_helper.from_array(array, out)))
            return out
        return self.initializer("const", array)

    def ints(self, values: Sequence[int]) -> str:
        """An int64 vector constant (shapes, axes, split sizes, pads)."""
        return self.constant(list(values), np.int64)

    def initializer(self, base: str, array: np.ndarray) -> str:
        name = self.name(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], fan_in: int) -> str:
        """He-normal weights (scale sqrt(2 / fan_in)), so activations keep their size."""
        scale = math.sqrt(2.0 / max(1, fan_in))
        return self.initializer(base, (self.rng.standard_normal(shape) * scale)
                                .astype(np.float32))

    def uniform(self, base: str, shape, low: float, high: float) -> str:
        return self.initializer(base, self.rng.uniform(low, high, shape).astype(np.float32))

    # Opset-dependent spellings ----------------------------------------------------------

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        """Unsqueeze with axes as attribute (opset < 13) or input (13+)."""
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)])
        return self.op("Unsqueeze", [x], axes=list(axes))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        """Squeeze with axes as attribute (opset < 13) or input (13+)."""
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)])
        return self.op("Squeeze", [x], axes=list(axes))

    def split(self, x: str, sizes: Sequence[int], axis: int) -> list[str]:
        """Split with sizes as attribute (opset < 13) or input (13+)."""
        if self.opset >= 13:
            return self.op_multi("Split", [x, self.ints(sizes)], len(sizes), axis=axis)
        return self.op_multi("Split", [x], len(sizes), axis=axis, split=list(sizes))

    def reduce_mean(self, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """ReduceMean with axes as attribute (opset < 18) or input (18+)."""
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.ints(axes)], keepdims=keepdims)
        return self.op("ReduceMean", [x], axes=list(axes), keepdims=keepdims)

    def clip(self, x: str, low: float, high: float) -> str:
        """Clip with bounds as (Constant) inputs, opset 11+."""
        return self.op("Clip", [x, self.constant(low), self.constant(high)])

    def dim_of(self, x: str, axis: int) -> str:
        """The run-time size of one axis as a 1-element int64 tensor (Shape -> Gather ->
        Unsqueeze), to be Concat'ed into a Reshape shape."""
        shape = self.op("Shape", [x])
        return self.unsqueeze(self.op("Gather", [shape, self.constant(axis, np.int64)], axis=0),
                              [0])

    def run_time_shape(self, parts: Sequence[str | int]) -> str:
        """A shape vector from run-time dims (names from `dim_of`) and fixed ints (Concat)."""
        inputs = [part if isinstance(part, str) else self.ints([part]) for part in parts]
        return self.op("Concat", inputs, axis=0)

    # Model ------------------------------------------------------------------------------

    def model(self, name: str, inputs: dict[str, Sequence[int]],
              outputs: dict[str, Sequence[int]], producer: str) -> onnx.ModelProto:
        """The checked model, float32 inputs/outputs declared with the given dims."""
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(d))
             for n, d in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(d))
             for n, d in outputs.items()],
            self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name=producer)
        model.ir_version = 7 if self.opset <= 13 else 8
        onnx.checker.check_model(model)
        return model
