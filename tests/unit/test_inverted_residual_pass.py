"""The inverted-residual fusion pass (`wpk.passes.inverted_residual`): where it fires, what
the fused graph computes (the plan's float64 references of every node, chained, against
onnxruntime on the original model), and every case where it must not fire."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep
from wpk.frontend import load_model
from wpk.kernels.reference import reference
from wpk.passes import optimize, passes_for, rule_docs, to_onnx
from wpk.passes.fusion import FusionPass
from wpk.passes.inverted_residual import INVERTED_RESIDUAL_RULES
from wpk.workloads import workload_of

C, E, H = 16, 64, 10


def block_model(*, stride: int = 1, residual: bool = True, kernel: int = 3, cout: int = C,
                dw_group: int | None = None, extra_output: str = "", weight_input: bool = False,
                act: str = "Clip", blocks: int = 2) -> onnx.ModelProto:
    """`blocks` inverted-residual blocks on x [1, C, H, H] (the first as configured, the rest
    stride-1 residual blocks), as exporters write them after BN folding: Conv (bias), Clip
    (or Relu), depthwise Conv, Clip, Conv [, Add]."""
    rng = np.random.default_rng(0)
    nodes, inits, inputs = [], [], [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [1, C, H, H])]
    zero, six = "zero", "six"
    inits += [numpy_helper.from_array(np.array(0, np.float32), zero),
              numpy_helper.from_array(np.array(6, np.float32), six)]

    def const(name, shape):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    def activation(x, name):
        if act == "Clip":
            nodes.append(h.make_node("Clip", [x, zero, six], [name]))
        else:
            nodes.append(h.make_node(act, [x], [name]))
        return name

    x, channels = "x", C
    for b in range(blocks):
        first = b == 0
        s, out, res = (stride, cout, residual) if first else (1, channels, True)
        group = (dw_group or E) if first else E
        w1 = f"w1_{b}"
        if first and weight_input:
            inputs.append(h.make_tensor_value_info(w1, TensorProto.FLOAT, [E, channels, 1, 1]))
        else:
            const(w1, (E, channels, 1, 1))
        nodes.append(h.make_node("Conv", [x, w1, const(f"b1_{b}", (E,))], [f"e_{b}"]))
        h1 = activation(f"e_{b}", f"h1_{b}")
        k = kernel if first else 3
        nodes.append(h.make_node("Conv", [h1, const(f"w2_{b}", (E, E // group, k, k)),
                                          const(f"b2_{b}", (E,))], [f"d_{b}"], group=group,
                                 strides=[s, s], pads=[k // 2] * 4))
        h2 = activation(f"d_{b}", f"h2_{b}")
        nodes.append(h.make_node("Conv", [h2, const(f"w3_{b}", (out, E, 1, 1)),
                                          const(f"b3_{b}", (out,))], [f"p_{b}"]))
        y = f"p_{b}"
        if res:
            nodes.append(h.make_node("Add", [x, y], [f"y_{b}"]))
            y = f"y_{b}"
        x, channels = y, out
    graph = h.make_graph(nodes, "blocks", inputs, [], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    shapes = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend([shapes[x]] + ([shapes[extra_output]] if extra_output else []))
    return model


def fused(model) -> list:
    graph, report = optimize(load_model(model), "cpu")
    return [n for n in graph.nodes if n.op == "InvertedResidual"], graph, report


def _run_graph(graph, feeds: dict) -> dict:
    """Every node's float64 reference in graph order: what the optimized graph computes."""
    values = {k: np.asarray(v, np.float64) for k, v in feeds.items()}
    values.update({k: np.asarray(v) for k, v in graph.constants.items()})
    for node in graph.nodes:
        workload = workload_of(graph, node)
        outs = reference(workload, [values.get(i) if i else None for i in node.inputs])
        values.update(zip(node.outputs, outs))
    return values


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, residual=False),
                                    dict(kernel=5, residual=False, cout=24),
                                    dict(act="Relu")])
def test_fires_and_keeps_what_the_model_computes(kwargs):
    model = block_model(**kwargs)
    nodes, graph, report = fused(model)
    assert len(nodes) == 2 and report.rules["inverted_residual"] == 2
    assert not [n for n in graph.nodes if n.op == "Conv"]   # every conv went into a block
    first = nodes[0]
    assert first.attrs["stride"] == kwargs.get("stride", 1)
    assert first.attrs["residual"] == int(kwargs.get("residual", True))
    assert first.attrs["kernel"] == kwargs.get("kernel", 3)
    x = np.random.default_rng(1).standard_normal((1, C, H, H)).astype(np.float32)
    values = _run_graph(graph, {"x": x})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    assert relative_l2(values[graph.outputs[0]], expected) < 1e-5


def test_to_onnx_expands_the_block_into_its_three_convs():
    model = block_model()
    _, graph, _ = fused(model)
    exported = to_onnx(graph)
    convs = [n for n in exported.graph.node if n.op_type == "Conv" and n.domain == "wpk.nchwc"]
    assert len(convs) == 6
    assert not [n for n in exported.graph.node if n.op_type == "InvertedResidual"]
    names = {n.name for n in exported.graph.node}
    assert {n.name for n in graph.nodes} <= names   # a fused node's first part keeps its name
    parts = [n for n in exported.graph.node if f"'{nodes_of(graph)[0].name}'" in n.doc_string]
    assert [n.op_type for n in parts if n.op_type == "Conv"] == ["Conv"] * 3
    assert "inverted_residual" in rule_docs("cpu")


def nodes_of(graph) -> list:
    return [n for n in graph.nodes if n.op == "InvertedResidual"]


def _fires(model) -> int:
    return len(fused(model)[0])


def test_not_when_the_expanded_tensor_is_read_elsewhere():
    assert _fires(block_model(extra_output="h1_0")) == 1   # only the second block
    assert _fires(block_model(extra_output="h2_0")) == 1


def test_not_on_a_grouped_conv_that_is_not_depthwise():
    assert _fires(block_model(dw_group=E // 16)) == 1


def test_not_on_a_dense_conv_of_sparse_groups():
    """The layout pass's dense conv of groups that are not whole blocks (ShuffleNet's) is
    a 1x1 group-1 conv whose filter is mostly zeros: the block kernel would multiply them
    all, so it is no block's expand or project conv."""
    from wpk.core.graph import Node
    from wpk.passes.inverted_residual import _pointwise

    attrs = {"kernel_shape": (1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0),
             "dilations": (1, 1), "group": 1, "block": 16, "channels": 68}
    dense = Node("Conv", ["x", "w", "b"], ["y"], "c", attrs, "wpk.nchwc")
    sparse = Node("Conv", ["x", "w", "b"], ["y"], "c", {**attrs, "sparse_groups": 4},
                  "wpk.nchwc")
    assert _pointwise(dense) and not _pointwise(sparse)


def test_not_with_a_weight_that_is_not_constant():
    assert _fires(block_model(weight_input=True)) == 1


def test_residual_only_when_it_is_the_block_input():
    """An Add of another tensor stays outside: the block fuses without its residual."""
    model = block_model(blocks=1)
    graph = model.graph
    add = next(n for n in graph.node if n.op_type == "Add")
    # add the expanded block's input scaled by 2: a residual, but not of X itself
    graph.initializer.append(numpy_helper.from_array(np.array(2, np.float32), "two"))
    graph.node.insert(0, h.make_node("Mul", ["x", "two"], ["x2"]))
    add.input[0] = "x2"
    nodes, graph, _ = fused(model)
    assert len(nodes) == 1 and nodes[0].attrs["residual"] == 0
    x = np.random.default_rng(2).standard_normal((1, C, H, H)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = _run_graph(graph, {"x": x})[graph.outputs[0]]
    assert relative_l2(got, session.run(None, {"x": x})[0]) < 1e-5


def test_not_at_stride_2_with_a_residual():
    """A stride-2 block whose project conv adds X (a graph only a bad rewrite could make:
    the shapes differ): the rule checks the stride itself."""
    model = block_model(stride=2, residual=False, blocks=1)
    assert _fires(model) == 1
    graph = load_model(model)
    for graph_pass in passes_for("cpu"):
        if graph_pass.name == "inverted_residual_fusion":
            break
        graph = graph_pass.run(graph)
    convs = [n for n in graph.nodes if n.op == "Conv"]
    convs[-1].inputs.append(convs[0].inputs[0])
    convs[-1].epilogue = (EpilogueStep("add", (), 3),)
    result = FusionPass("inverted_residual_fusion", INVERTED_RESIDUAL_RULES).run(graph)
    assert not [n for n in result.nodes if n.op == "InvertedResidual"]


def gated_model(*, expand: bool = True, act: str = "HardSwish", extra_output: str = "",
                weight_input: str = "", pool_other: bool = False) -> onnx.ModelProto:
    """One MobileNetV3 block on x [1, C, H, H]: [Conv 1x1 + act,] depthwise 3x3 + act,
    squeeze-excite (GlobalAveragePool, Conv + Relu, Conv + HardSigmoid, Mul), Conv 1x1, Add x;
    `act` HardSwish or SiLU (x * Sigmoid(x)); `weight_input` makes that filter a graph input;
    `pool_other` pools X instead of the depthwise output (no squeeze-excite of H2)."""
    rng = np.random.default_rng(0)
    e = E if expand else C
    nodes, inits = [], []
    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])]

    def const(name, shape):
        if name == weight_input:
            inputs.append(h.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        else:
            inits.append(numpy_helper.from_array(
                (rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    def activation(x, name):
        if act == "HardSwish":
            nodes.append(h.make_node("HardSwish", [x], [name]))
        else:
            nodes.append(h.make_node("Sigmoid", [x], [name + "_s"]))
            nodes.append(h.make_node("Mul", [x, name + "_s"], [name]))
        return name

    x = "x"
    if expand:
        nodes.append(h.make_node("Conv", [x, const("w1", (e, C, 1, 1)), const("b1", (e,))],
                                 ["e"]))
        x = activation("e", "h1")
    nodes.append(h.make_node("Conv", [x, const("w2", (e, 1, 3, 3)), const("b2", (e,))], ["d"],
                             group=e, pads=[1] * 4))
    h2 = activation("d", "h2")
    nodes.append(h.make_node("GlobalAveragePool", ["x" if pool_other else h2], ["pool"]))
    squeezed = 8
    nodes.append(h.make_node("Conv", ["pool", const("wr", (squeezed, e if not pool_other
                                                            else C, 1, 1)),
                                      const("br", (squeezed,))], ["r"]))
    nodes.append(h.make_node("Relu", ["r"], ["s"]))
    nodes.append(h.make_node("Conv", ["s", const("we", (e, squeezed, 1, 1)),
                                      const("be", (e,))], ["g0"]))
    nodes.append(h.make_node("HardSigmoid", ["g0"], ["gate"], alpha=1 / 6, beta=0.5))
    nodes.append(h.make_node("Mul", [h2, "gate"], ["scaled"]))
    nodes.append(h.make_node("Conv", ["scaled", const("w3", (C, e, 1, 1)), const("b3", (C,))],
                             ["p"]))
    nodes.append(h.make_node("Add", ["x", "p"], ["y"]))
    graph = h.make_graph(nodes, "gated", inputs, [], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    shapes = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend([shapes["y"]] + ([shapes[extra_output]] if extra_output else []))
    return model


def _check_against_onnxruntime(model, graph) -> None:
    feeds = {"x": np.random.default_rng(1).standard_normal((1, C, H, H)).astype(np.float32)}
    values = _run_graph(graph, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, expected in zip(graph.outputs, session.run(None, feeds)):
        assert relative_l2(values[name], expected) < 1e-5, name


@pytest.mark.parametrize("kwargs", [dict(), dict(act="SiLU"), dict(expand=False),
                                    dict(expand=False, act="SiLU")])
def test_fires_on_gated_blocks_and_keeps_what_the_model_computes(kwargs):
    model = gated_model(**kwargs)
    nodes, graph, _ = fused(model)
    assert len(nodes) == 1
    [node] = nodes
    assert node.attrs["se"] == 1 and node.attrs["squeezed"] == 8
    assert node.attrs["se_act1"] == "relu" and node.attrs["se_act2"] == "hard_sigmoid"
    assert node.attrs["act2"] == ("hard_swish" if kwargs.get("act", "HardSwish") == "HardSwish"
                                  else "silu")
    assert bool(node.inputs[1]) == kwargs.get("expand", True)
    assert node.attrs["residual"] == 1
    assert [n.op for n in graph.nodes].count("Conv") == 0   # every conv went into the block
    _check_against_onnxruntime(model, graph)


def test_to_onnx_expands_a_gated_block_into_its_separate_steps():
    _, graph, _ = fused(gated_model())
    ops = [n.op_type for n in to_onnx(graph).graph.node]
    assert "InvertedResidual" not in ops
    assert ops.count("Conv") == 5 and "GlobalAveragePool" in ops


@pytest.mark.parametrize("kwargs", [dict(extra_output="gate"), dict(extra_output="s"),
                                    dict(extra_output="h2"), dict(weight_input="wr"),
                                    dict(weight_input="we"), dict(pool_other=True)])
def test_not_when_the_gate_is_read_elsewhere_or_not_constant(kwargs):
    """A gate (or its squeezed values, or H2) that is also a graph output, a gate conv whose
    filter is not a constant, a pool of another tensor: no block fuses (H2 has a reader
    outside it), and the graph still computes the model."""
    model = gated_model(**kwargs)
    nodes, graph, _ = fused(model)
    assert not nodes
    if not kwargs.get("weight_input"):
        _check_against_onnxruntime(model, graph)
