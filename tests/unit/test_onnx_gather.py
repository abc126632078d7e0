"""wpk's GatherElements for onnx.reference (`wpk.core.onnx_gather`) against onnxruntime:
axes longer than 64 (where onnx.reference's np.choose fails), negative indices, indices
smaller than the data along the other axes; and the Hugging Face BERT embedding chain it
made foldable."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from wpk.core.onnx_quantize import REFERENCE_OPS
from wpk.frontend import load_model


def _model(data_shape, index_shape, axis):
    node = h.make_node("GatherElements", ["data", "index"], ["y"], axis=axis)
    graph = h.make_graph([node], "gather",
                         [h.make_tensor_value_info("data", TensorProto.FLOAT, data_shape),
                          h.make_tensor_value_info("index", TensorProto.INT64, index_shape)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, index_shape)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("data_shape, index_shape, axis", [
    ((1, 512), (1, 128), 1),        # BERT's token type ids: 512 choices
    ((3, 100, 4), (3, 70, 4), -2),  # a negative axis, 3-d
    ((5, 6), (3, 6), 0),            # fewer index rows than data rows along another axis
    ((4, 9, 7), (2, 9, 3), 1),      # the indices smaller along both other axes
])
def test_gather_elements_matches_onnxruntime(data_shape, index_shape, axis, rng):
    model = _model(data_shape, index_shape, axis)
    size = data_shape[axis]
    feeds = {"data": rng.standard_normal(data_shape).astype(np.float32),
             "index": rng.integers(-size, size, index_shape).astype(np.int64)}
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    actual = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(None, feeds)[0]
    np.testing.assert_array_equal(actual, expected)


def test_a_model_gathering_position_ids_from_a_long_buffer_loads():
    """transformers' BERT embedding as torch.onnx exports it: token type ids gathered from
    a [1, 512] zero buffer by the [1, 128] position ids, then expanded to a shape computed by
    Where (which shape inference cannot follow, so loading evaluates the model)."""
    def const(name, value):
        value = np.asarray(value, np.int64)
        return h.make_tensor(name, TensorProto.INT64, value.shape, value.ravel())
    inits = [const("buffer", np.zeros((1, 512))), const("positions", [np.arange(128)]),
             const("target", [1, 128]), const("minus_one", [-1, -1]), const("ones", [1, 1])]
    nodes = [h.make_node("GatherElements", ["buffer", "positions"], ["types"], axis=1),
             h.make_node("Equal", ["target", "minus_one"], ["open"]),
             h.make_node("Where", ["open", "ones", "target"], ["shape"]),
             h.make_node("Expand", ["types", "shape"], ["expanded"]),
             h.make_node("Add", ["ids", "expanded"], ["y"])]
    graph = h.make_graph(nodes, "bert_types",
                         [h.make_tensor_value_info("ids", TensorProto.INT64, [1, 128])],
                         [h.make_tensor_value_info("y", TensorProto.INT64, [None, None])],
                         inits)
    loaded = load_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    assert loaded.tensors["y"].shape == (1, 128)
