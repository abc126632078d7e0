"""Frontend: ONNX -> Graph on the light models, hand-built models and every error case."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

import wpk.frontend_shapes as frontend_shapes
from wpk.core.errors import ModelError, ShapeError, UnsupportedError
from wpk.frontend import load_model

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def make_model(nodes, inputs, outputs, inits=(), opset=17, name="m"):
    """A model from nodes, {input: shape} (shapes may hold strings), [(output, rank)]."""
    graph = h.make_graph(
        nodes, name,
        [h.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, [None] * rank) for n, rank in outputs],
        list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def relu_model(shape=("N", 3, 4, 4)):
    return make_model([h.make_node("Relu", ["x"], ["y"])], {"x": list(shape)}, [("y", 4)])


@pytest.mark.parametrize("filename", LIGHT_MODELS)
def test_light_models_load_with_static_shapes(filename):
    path = os.path.join(LIGHT_DIR, filename)
    graph = load_model(path)
    assert graph.source == path
    assert len(graph.inputs) == 1
    assert graph.tensors[graph.inputs[0]].shape == (1, 3, 224, 224)
    names = [n.name for n in graph.nodes]
    assert len(set(names)) == len(names)
    assert not any(n.op in ("Constant", "ConstantOfShape") for n in graph.nodes)
    for node in graph.nodes:
        for name in [*node.inputs, *node.outputs]:
            if name:
                info = graph.tensors[name]
                assert all(isinstance(d, int) and d >= 0 for d in info.shape)
                assert np.dtype(info.dtype).name == info.dtype
    for name, value in graph.constants.items():
        assert graph.tensors[name].shape == value.shape
        assert name not in graph.inputs


def test_weights_from_constant_of_shape_are_constants():
    graph = load_model(os.path.join(LIGHT_DIR, "light_resnet50.onnx"))
    conv = next(n for n in graph.nodes if n.op == "Conv")
    weight = graph.constants[conv.inputs[1]]
    assert weight.shape == graph.tensors[conv.inputs[1]].shape and weight.ndim == 4
    assert weight.dtype == np.float32


def test_bytes_and_modelproto_inputs():
    model = relu_model((1, 3, 4, 4))
    from_bytes = load_model(model.SerializeToString())
    from_proto = load_model(model)
    assert from_bytes.source == "<bytes>"
    assert from_bytes.tensors["y"].shape == from_proto.tensors["y"].shape == (1, 3, 4, 4)


def test_unnamed_nodes_get_stable_names():
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["b"], name="neg"),
             h.make_node("Relu", ["b"], ["y"])]
    graph = load_model(make_model(nodes, {"x": [2, 3]}, [("y", 2)]))
    assert [n.name for n in graph.nodes] == ["Relu_0", "neg", "Relu_2"]


def test_constant_nodes_and_initializer_inputs_become_constants():
    shift = h.make_tensor("shift", TensorProto.FLOAT, [3], [1, 2, 3])
    nodes = [h.make_node("Constant", [], ["c"],
                         value=h.make_tensor("v", TensorProto.FLOAT, [3], [2.0] * 3)),
             h.make_node("Mul", ["x", "c"], ["a"]), h.make_node("Add", ["a", "shift"], ["y"])]
    graph_proto = h.make_graph(
        nodes, "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         h.make_tensor_value_info("shift", TensorProto.FLOAT, [3])],  # old-style input + init
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [shift])
    graph = load_model(h.make_model(graph_proto, opset_imports=[h.make_opsetid("", 9)]))
    assert graph.inputs == ["x"]
    np.testing.assert_array_equal(graph.constants["c"], [2, 2, 2])
    np.testing.assert_array_equal(graph.constants["shift"], [1, 2, 3])
    assert [n.op for n in graph.nodes] == ["Mul", "Add"]


@pytest.mark.parametrize("declared_as_input", [False, True])
def test_big_initializers_load_intact(declared_as_input, rng):
    weight = rng.standard_normal((100, 100)).astype(np.float32)  # past the skeleton limit
    inputs = {"x": ["N", 100]}
    if declared_as_input:  # IR 3 style: every initializer is also a graph input
        inputs["w"] = [100, 100]
    model = make_model([h.make_node("MatMul", ["x", "w"], ["y"])], inputs, [("y", 2)],
                       [onnx.numpy_helper.from_array(weight, "w")])
    graph = load_model(model, input_shapes={"x": (3, 100)})
    assert graph.inputs == ["x"]
    np.testing.assert_array_equal(graph.constants["w"], weight)
    assert graph.tensors["y"].shape == (3, 100)
    assert len(model.graph.initializer) == 1 and len(model.graph.input) == len(inputs)


def test_malformed_initializer():
    bad = onnx.numpy_helper.from_array(np.zeros((100, 100), np.float32), "w")
    bad.raw_data = bad.raw_data[:100]
    model = make_model([h.make_node("MatMul", ["x", "w"], ["y"])], {"x": [3, 100]},
                       [("y", 2)], [bad])
    with pytest.raises(ModelError, match="'w'"):
        load_model(model)


def test_input_shapes_fix_symbolic_dims():
    model = relu_model()
    graph = load_model(model, input_shapes={"x": (2, 3, 4, 4)})
    assert graph.tensors["x"].shape == graph.tensors["y"].shape == (2, 3, 4, 4)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"  # untouched


def test_shape_left_open_by_inference_is_evaluated(monkeypatch):
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             h.make_node("Mul", ["sf", "two"], ["sf2"]),
             h.make_node("Cast", ["sf2"], ["si"], to=TensorProto.INT64),
             h.make_node("ConstantOfShape", ["si"], ["y"])]
    two = h.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    evaluated = []
    original = frontend_shapes._evaluate_shapes
    monkeypatch.setattr(frontend_shapes, "_evaluate_shapes",
                        lambda *a: evaluated.append(a[2]) or original(*a))
    graph = load_model(make_model(nodes, {"x": [2, 3]}, [("y", 2)], [two]))
    assert "y" in evaluated[0]
    assert graph.tensors["y"].shape == (4, 6) and graph.tensors["y"].dtype == "float32"


def placeholder_model(nodes, x_dims, y_dims, inits=(), opset=11):
    """A model whose input "x" and output "y" are declared with the given dims as
    `dim_value`s, -1 or 0 included (as paddle2onnx and tf2onnx declare dynamic dims)."""
    def value(name, dims):
        info = h.make_tensor_value_info(name, TensorProto.FLOAT, None)
        shape = info.type.tensor_type.shape
        for d in dims:
            shape.dim.add().dim_value = d
        return info
    graph = h.make_graph(nodes, "exported", [value("x", x_dims)], [value("y", y_dims)],
                         list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


@pytest.mark.parametrize("placeholder", [-1, 0])
def test_placeholder_dims_are_fixed_by_input_shapes(placeholder):
    """dim_value -1 or 0 means "dynamic" to paddle2onnx/tf2onnx: --input-shape fixes it, and
    the same placeholder on the declared output does not contradict the inferred shape."""
    model = placeholder_model([h.make_node("Relu", ["x"], ["y"])],
                              [placeholder, 3, placeholder, 8], [placeholder, 3, placeholder, 8])
    graph = load_model(model, input_shapes={"x": (2, 3, 5, 8)})
    assert graph.tensors["x"].shape == graph.tensors["y"].shape == (2, 3, 5, 8)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == placeholder


@pytest.mark.parametrize("placeholder", [-1, 0])
def test_placeholder_dims_without_input_shape(placeholder):
    model = placeholder_model([h.make_node("Relu", ["x"], ["y"])], [placeholder, 3],
                              [placeholder, 3])
    with pytest.raises(ShapeError, match=rf"input 'x'.*\[{placeholder}, 3\].*not all fixed") \
            as err:
        load_model(model)
    assert "--input-shape x=" in err.value.hint


def test_placeholder_dims_keep_fixed_dims_fixed():
    model = placeholder_model([h.make_node("Relu", ["x"], ["y"])], [-1, 3], [-1, 3])
    with pytest.raises(ShapeError, match="dim 3 at axis 1"):
        load_model(model, input_shapes={"x": (2, 4)})


def test_placeholder_batch_through_a_run_time_reshape():
    """paddle2onnx's Shape -> Gather -> Unsqueeze -> Concat -> Reshape on a -1 batch dim, and
    a ConstantOfShape of that run-time shape (left open by inference, evaluated)."""
    nodes = [h.make_node("Shape", ["x"], ["shape"]),
             h.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             h.make_node("Unsqueeze", ["batch"], ["batch1"], axes=[0]),
             h.make_node("Concat", ["batch1", "rest"], ["target"], axis=0),
             h.make_node("Reshape", ["x", "target"], ["r"]),
             h.make_node("ConstantOfShape", ["target"], ["ones"],
                         value=h.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
             h.make_node("Add", ["r", "ones"], ["y"])]
    inits = [h.make_tensor("zero", TensorProto.INT64, [], [0]),
             h.make_tensor("rest", TensorProto.INT64, [2], [2, 3])]
    graph = load_model(placeholder_model(nodes, [-1, 6], [-1, 2, 3], inits),
                       input_shapes={"x": (4, 6)})
    assert graph.tensors["r"].shape == graph.tensors["y"].shape == (4, 2, 3)


def test_placeholder_dims_in_shapes_left_open_by_inference(monkeypatch):
    """Shapes that inference leaves open are evaluated on the model as exported (still
    declaring -1), fed the fixed input shape."""
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             h.make_node("Mul", ["sf", "two"], ["sf2"]),
             h.make_node("Cast", ["sf2"], ["si"], to=TensorProto.INT64),
             h.make_node("ConstantOfShape", ["si"], ["y"])]
    two = h.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    evaluated = []
    original = frontend_shapes._evaluate_shapes
    monkeypatch.setattr(frontend_shapes, "_evaluate_shapes",
                        lambda *a: evaluated.append(a[2]) or original(*a))
    graph = load_model(placeholder_model(nodes, [-1, 3], [-1, -1], [two], opset=13),
                       input_shapes={"x": (2, 3)})
    assert "y" in evaluated[0]
    assert graph.tensors["y"].shape == (4, 6)


# ------------------------------------------------------------------ errors

def test_shape_that_depends_on_input_values():
    graph = h.make_graph(
        [h.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         h.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])
    with pytest.raises(ShapeError, match="'y'.*Reshape node 'reshape'.*values of the inputs"):
        load_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match=r"model file '.*nope\.onnx' not found") as err:
        load_model(tmp_path / "nope.onnx")
    assert err.value.hint


def test_truncated_file(tmp_path):
    with open(os.path.join(LIGHT_DIR, "light_squeezenet.onnx"), "rb") as handle:
        data = handle.read()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match=r"cannot parse '.*cut\.onnx' as an ONNX model") as err:
        load_model(path)
    assert err.value.hint


def test_garbage_bytes():
    with pytest.raises(ModelError, match="cannot parse '<bytes>'"):
        load_model(b"\xff\xfe not a model at all \x00\x01")


def test_checker_failure_names_the_node():
    node = h.make_node("Conv", ["x", "w"], ["y"], name="bad_conv", kernel_shape=[3])
    model = make_model([node], {"x": [1, 1, 4, 4]}, [("y", 4)],
                       [h.make_tensor("w", TensorProto.FLOAT, [1, 1, 3, 3], [0.0] * 9)])
    with pytest.raises(ModelError, match="bad_conv") as err:
        load_model(model)
    assert err.value.hint


def test_checker_failure_on_unknown_op_names_the_node():
    node = h.make_node("FooBar", ["x"], ["y"])
    with pytest.raises(ModelError, match="at node 'FooBar_0'.*FooBar"):
        load_model(make_model([node], {"x": [2]}, [("y", 1)]))


def test_checker_failure_on_undefined_input():
    node = h.make_node("Relu", ["missing"], ["y"], name="r")
    with pytest.raises(ModelError, match="checker"):
        load_model(make_model([node], {"x": [2]}, [("y", 1)]))


def test_symbolic_dim_without_input_shape():
    with pytest.raises(ShapeError, match=r"input 'x'.*\[N, 3, 4, 4\]") as err:
        load_model(relu_model())
    assert "--input-shape x=" in err.value.hint


def test_input_shape_for_unknown_input():
    with pytest.raises(ShapeError, match="'nope'") as err:
        load_model(relu_model(), input_shapes={"nope": (1, 3, 4, 4)})
    assert "x" in err.value.hint


def test_input_shape_rank_mismatch():
    with pytest.raises(ShapeError, match="rank 4"):
        load_model(relu_model(), input_shapes={"x": (1, 3, 4)})


def test_input_shape_disagrees_with_fixed_dim():
    with pytest.raises(ShapeError, match="axis 1"):
        load_model(relu_model(), input_shapes={"x": (1, 5, 4, 4)})


def unread_input_model(x):
    """A model of a Range of constants (4 values) beside graph input `x`, which no node
    reads: only the input's declaration is under test."""
    scalars = [h.make_tensor(name, TensorProto.FLOAT, [], [value])
               for name, value in (("start", 0.0), ("limit", 4.0), ("delta", 1.0))]
    graph = h.make_graph([h.make_node("Range", ["start", "limit", "delta"], ["y"])], "m",
                         [x], [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])], scalars)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("input_shapes", [None, {"x": (5,)}])
def test_an_input_without_an_element_type_is_refused(input_shapes):
    """A graph input of element type UNDEFINED that no node reads, beside a Range of
    constants (a damaged model the CLI fuzzer drew, `scripts/fuzz.py --seed 71`): the
    checker lets it through and the shape evaluation ended in `internal error: KeyError`.
    onnxruntime refuses it too ("Invalid tensor data type 0")."""
    model = unread_input_model(h.make_tensor_value_info("x", TensorProto.UNDEFINED, [5]))
    with pytest.raises(UnsupportedError, match=r"input 'x' .* no element type") as err:
        load_model(model, input_shapes=input_shapes)
    assert "FLOAT" in err.value.hint


def test_an_element_type_this_onnx_does_not_know_is_refused():
    """Element type 30 on a graph input that no node reads (a damaged model the CLI fuzzer
    drew, `scripts/fuzz.py --seed 72`): onnx's type table has no entry, and reading the
    declared types ended in `internal error: KeyError: 30`."""
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 1, 4])
    x.type.tensor_type.elem_type = 30
    with pytest.raises(UnsupportedError, match=r"'x' .* element type 30") as err:
        load_model(unread_input_model(x))
    assert "FLOAT" in err.value.hint


def test_missing_external_data(tmp_path):
    weight = np.arange(4096, dtype=np.float32).reshape(64, 64)
    init = onnx.numpy_helper.from_array(weight, "w")
    model = make_model([h.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 64]}, [("y", 2)],
                       [init])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.bin",
                    size_threshold=0)
    assert load_model(path).constants["w"].shape == (64, 64)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(ModelError, match="external data 'ext.bin'") as err:
        load_model(path)
    assert "ext.bin" in err.value.hint


def test_too_old_opset():
    model = make_model([h.make_node("Relu", ["x"], ["y"])], {"x": [2]}, [("y", 1)], opset=6)
    with pytest.raises(UnsupportedError, match="opset 6"):
        load_model(model)


def test_sequence_values_are_unsupported():
    nodes = [h.make_node("SequenceConstruct", ["x", "x"], ["s"]),
             h.make_node("SequenceAt", ["s", "i"], ["y"])]
    model = make_model(nodes, {"x": [2]}, [("y", 1)], [h.make_tensor("i", TensorProto.INT64,
                                                                      [], [0])])
    with pytest.raises(UnsupportedError, match="'s' .* is a sequence") as err:
        load_model(model)
    assert "tensor" in err.value.hint


def test_not_a_model_argument():
    with pytest.raises(ModelError):
        load_model(12345)
