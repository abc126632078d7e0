"""NCHWc blocked layout: filter packing, blocked kernels, the layout pass, whole models."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.unit.nchwc_support import (
    evaluate,
    load_light,
    ort_outputs,
)
from tests.unit.onnx_pad import pad_node
from wpk.core.numerics import relative_l2 as rel_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.constant_folding import ConstantFolding
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions
from wpk.workloads import workload_of

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
IMPLS = ("ort.nchwc", "numpy.nchwc")


# --- layout and packing ------------------------------------------------------------------------

def test_block_unblock_round_trip_with_zero_padding(rng):
    x = rng.standard_normal((2, B + 4, 3, 5)).astype(np.float32)
    blocked = fmt.block(x, B)
    assert blocked.shape == (2, 2, 3, 5, B)
    assert np.array_equal(blocked[:, 1, :, :, 4:], np.zeros((2, 3, 5, B - 4), np.float32))
    assert blocked[1, 1, 2, 3, 3] == x[1, B + 3, 2, 3]
    assert np.array_equal(fmt.unblock(blocked, B + 4), x)


def _conv_chain_model(rng) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    weights = {"w1": (32, 3, 7, 7), "w2": (48, 32, 3, 3), "w3": (48, 1, 3, 3),
               "w5": (20, 48, 3, 3)}
    values = {k: rng.standard_normal(s).astype(np.float32) for k, s in weights.items()}
    values["b5"] = rng.standard_normal(20).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], pads=[3, 3, 3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["y1", "w2"], ["y2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["y2", "w3"], ["y3"], pads=[1, 1, 1, 1], group=48),
             helper.make_node("Conv", ["y3", "w5", "b5"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", 1, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(v, k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, values


def test_filter_packing_matches_onnxruntime_optimized_model(rng, tmp_path):
    model, weights = _conv_chain_model(rng)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in optimized.graph.initializer}
    convs = [n for n in optimized.graph.node
             if n.op_type == "Conv" and n.domain == "com.microsoft.nchwc"]
    assert len(convs) == 4, "onnxruntime did not rewrite the convs to NCHWc"
    expected = [fmt.pack_filter_oihwbo(weights["w1"], B),      # NCHW input, 3 channels
                fmt.pack_filter_oihwbibo(weights["w2"], B),    # regular
                fmt.pack_filter_oihwbo(weights["w3"], B),      # depthwise
                fmt.pack_filter_oihwbibo(weights["w5"], B)]    # 20 outputs: padded
    for conv, packed in zip(convs, expected):
        assert np.array_equal(inits[conv.input[1]], packed)
    assert np.array_equal(inits[convs[3].input[2]], fmt.pad_channels(weights["b5"], B))


# --- blocked ops against the float64 reference -------------------------------------------------

def _blocked(n, c, h, w) -> TensorSpec:
    return TensorSpec((n, -(-c // B), h, w, B))


def _conv_workload(cin, cout, size, k, stride, pad, group=1, bias=True, epilogue=(),
                   nchw_input=False, residual=False) -> Workload:
    out = (size + 2 * pad - k) // stride + 1
    x = TensorSpec((1, cin, size, size)) if nchw_input else _blocked(1, cin, size, size)
    y = _blocked(1, cout, out, out)
    inputs = [x, TensorSpec((cout, cin // group, k, k)), TensorSpec((cout,)) if bias else None]
    if residual:
        inputs.append(y)
    attrs = {"kernel_shape": (k, k), "strides": (stride, stride), "pads": (pad,) * 4,
             "dilations": (1, 1), "group": group, "block": B, "channels": cout}
    return Workload("Conv", tuple(inputs), (y,), tuple(sorted(attrs.items())), tuple(epilogue),
                    "wpk.nchwc", (1, 2) if bias else (1,))


def _pool_workload(op, channels, size, out, **attrs) -> Workload:
    attrs.update(block=B, channels=channels)
    return Workload(op, (_blocked(1, channels, size, size),), (_blocked(1, channels, out, out),),
                    tuple(sorted(attrs.items())), domain="wpk.nchwc")


RELU = EpilogueStep("relu")
ADD3 = EpilogueStep("add", operand=3)
WORKLOADS = {
    "conv3x3": _conv_workload(2 * B, 2 * B, 9, 3, 1, 1),
    "conv_first_layer": _conv_workload(3, 2 * B, 16, 7, 2, 3, epilogue=(RELU,), nchw_input=True),
    "conv_depthwise": _conv_workload(3 * B, 3 * B, 9, 3, 1, 1, group=3 * B, epilogue=(RELU,)),
    "conv_padded_io": _conv_workload(20, 20, 8, 3, 1, 1, epilogue=(RELU,)),
    "conv_residual_relu": _conv_workload(B, 2 * B, 8, 1, 1, 0, epilogue=(ADD3, RELU),
                                         residual=True),
    "conv_residual_clip": _conv_workload(B, 24, 8, 1, 1, 0, residual=True, epilogue=(
        ADD3, EpilogueStep("clip", (("max", 6.0), ("min", 0.0))))),
    "conv_grouped_stride2": _conv_workload(4 * B, 4 * B, 9, 3, 2, 1, group=2, bias=False),
    "conv_sigmoid_full_blocks": _conv_workload(B, 2 * B, 6, 1, 1, 0,
                                               epilogue=(EpilogueStep("sigmoid"),)),
    # squeeze-excite expand: 6 input channels in one zero-padded block (not a multiple of 4)
    "conv_pooled_6_channels": _conv_workload(6, 3 * B, 1, 1, 1, 0,
                                             epilogue=(EpilogueStep("sigmoid"),)),
    "conv_sigmoid_padded": _conv_workload(B, 20, 6, 1, 1, 0,
                                          epilogue=(EpilogueStep("sigmoid"),)),  # pads 0.5
    # MLAS activation parameters: defaults filled in, open clip bounds
    "conv_leaky_relu_default": _conv_workload(B, 2 * B, 6, 1, 1, 0,
                                              epilogue=(EpilogueStep("leaky_relu"),)),
    "conv_hard_sigmoid_alpha": _conv_workload(B, 2 * B, 6, 1, 1, 0, epilogue=(
        EpilogueStep("hard_sigmoid", (("alpha", 0.3),)),)),
    "conv_clip_max_only": _conv_workload(B, 2 * B, 6, 1, 1, 0, epilogue=(
        EpilogueStep("clip", (("max", 0.5),)),)),
    # activations MLAS has no form of: onnxruntime's candidate runs their nodes after its conv
    # (QuickGelu for SiLU and QuickGELU, Gelu, HardSwish, Mish as its formula)
    **{f"conv_residual_{step.op}": _conv_workload(B, 20, 6, 3, 1, 1, residual=True,
                                                  epilogue=(ADD3, step))
       for step in (EpilogueStep("silu"), EpilogueStep("gelu"), EpilogueStep("hard_swish"),
                    EpilogueStep("quick_gelu", (("alpha", 1.702),)), EpilogueStep("mish"))},
    "maxpool": _pool_workload("MaxPool", 40, 9, 5, kernel_shape=(3, 3), strides=(2, 2),
                              pads=(1, 1, 1, 1)),
    "maxpool_ceil": _pool_workload("MaxPool", 32, 8, 4, kernel_shape=(3, 3), strides=(2, 2),
                                   pads=(0, 0, 0, 0), ceil_mode=1),
    "avgpool": _pool_workload("AveragePool", 40, 9, 9, kernel_shape=(3, 3), strides=(1, 1),
                              pads=(1, 1, 1, 1), count_include_pad=0),
    "global_avgpool": _pool_workload("GlobalAveragePool", 40, 7, 1),
    "global_maxpool": _pool_workload("GlobalMaxPool", 40, 7, 1),
    "reorder_input": Workload("ReorderInput", (TensorSpec((1, 20, 5, 5)),),
                              (_blocked(1, 20, 5, 5),), (("block", B), ("channels", 20)),
                              domain="wpk.nchwc"),
    "reorder_output": Workload("ReorderOutput", (_blocked(1, 20, 5, 5),),
                               (TensorSpec((1, 20, 5, 5)),), (("block", B), ("channels", 20)),
                               domain="wpk.nchwc"),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(WORKLOADS))
def test_blocked_op_matches_float64_reference(case, impl, rng):
    workload = WORKLOADS[case]
    implementation = registry.get(impl)
    assert implementation.unsupported_reason(workload) is None
    # random padding lanes too: the ops define what they do with them
    inputs = [None if s is None else rng.standard_normal(s.shape).astype(np.float32)
              for s in workload.inputs]
    consts = {i: inputs[i] for i in workload.const_inputs}
    kernel = implementation.prepare(workload, consts, {})
    for attempt in range(2):
        outputs = [np.full(s.shape, np.nan, np.float32) for s in workload.outputs]
        kernel(inputs, outputs)
        expected = nchwc_reference(workload, inputs)
        assert rel_l2(outputs[0], expected[0]) <= 1e-5, (case, attempt)
        inputs = [x if i in consts or x is None else rng.standard_normal(x.shape).astype(
            np.float32) for i, x in enumerate(inputs)]


def test_zero_padding_in_gives_zero_padding_out(rng):
    workload = _conv_workload(B, 20, 8, 1, 1, 0, epilogue=(ADD3, RELU), residual=True)
    x = fmt.block(rng.standard_normal((1, B, 8, 8)).astype(np.float32), B)
    residual = fmt.block(rng.standard_normal((1, 20, 8, 8)).astype(np.float32), B)
    w = rng.standard_normal((20, B, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(20).astype(np.float32)
    for impl in IMPLS:
        kernel = registry.get(impl).prepare(workload, {1: w, 2: bias}, {})
        out = np.full(workload.outputs[0].shape, np.nan, np.float32)
        kernel([x, w, bias, residual], [out])
        lanes = out.transpose(0, 1, 4, 2, 3).reshape(1, -1, 8, 8)
        assert lanes.shape[1] > 20 and not lanes[:, 20:].any(), impl
        assert np.array_equal(fmt.unblock(out, 20) > 0, lanes[:, :20] > 0)


def test_a_large_packed_filter_reaches_a_region_beside_its_parts_model(rng):
    """ort.nchwc's ONNX form keeps a packed filter of PART_EXTERNAL_MIN_BYTES or more out
    of its model (an external initializer, the packed values in `OnnxPart.external`); the
    region session built from it answers as the step's own session does."""
    from wpk.kernels.cpu.node_model import PART_EXTERNAL_MIN_BYTES
    from wpk.kernels.cpu.ort_region import RegionMember, region_kernel

    workload = _conv_workload(4 * B, 4 * B, 7, 3, 1, 1, epilogue=(RELU,))
    w = rng.standard_normal((4 * B, 4 * B, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4 * B).astype(np.float32)
    ort_nchwc = registry.get("ort.nchwc")
    part = ort_nchwc.onnx_part(workload, {1: w, 2: bias})
    (filter_,) = [t for t in part.model.graph.initializer if t.name in part.external]
    assert part.external[filter_.name].nbytes >= PART_EXTERNAL_MIN_BYTES
    assert filter_.data_location == onnx.TensorProto.EXTERNAL and not filter_.raw_data
    np.testing.assert_array_equal(part.external[filter_.name],
                                  fmt.pack_filter_oihwbibo(w, B))   # packed as MLAS reads it
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    step, merged = (np.full(workload.outputs[0].shape, np.nan, np.float32) for _ in range(2))
    ort_nchwc.prepare(workload, {1: w, 2: bias}, {})([x, w, bias], [step])
    kernel, _, _ = region_kernel([RegionMember(ort_nchwc, workload, {1: w, 2: bias},
                                               ("x", "w", "b"), ("y",))])
    kernel([x], [merged])
    np.testing.assert_array_equal(merged, step)


def test_kernel_rebinds_moved_and_non_contiguous_buffers(rng):
    workload = WORKLOADS["reorder_output"]
    kernel = registry.get("ort.nchwc").prepare(workload, {}, {})
    blocks = fmt.round_up(20, B) // B  # 2 blocks of 16 (AVX-512), 3 of 8 (AVX2)
    for _ in range(2):
        wide = rng.standard_normal((1, blocks, 5, 10, B)).astype(np.float32)
        for x in (np.ascontiguousarray(wide[:, :, :, :5]), wide[:, :, :, ::2]):
            out = np.full((1, 20, 5, 5), np.nan, np.float32)
            kernel([x], [out])
            assert np.array_equal(out, fmt.unblock(np.ascontiguousarray(x), 20))


def test_onnxruntime_kernels_refuse_what_mlas_cannot_do():
    ort_nchwc = registry.get("ort.nchwc")
    other_block = Workload("ReorderOutput", (TensorSpec((1, 1, 2, 2, 2 * B)),),
                           (TensorSpec((1, 20, 2, 2)),), (("block", 2 * B), ("channels", 20)),
                           domain="wpk.nchwc")
    assert "block" in ort_nchwc.unsupported_reason(other_block)
    assert registry.get("numpy.nchwc").unsupported_reason(other_block) is None
    relu_then_add = _conv_workload(B, 2 * B, 8, 1, 1, 0, epilogue=(RELU, ADD3), residual=True)
    assert ort_nchwc.unsupported_reason(relu_then_add) is not None


# --- the layout pass ---------------------------------------------------------------------------

def _small_cnn(rng) -> onnx.ModelProto:
    """First-layer conv, BN (unfolded), residual add, depthwise, concat, pool, GAP, Gemm."""
    def const(name, shape, low=None):
        value = (rng.uniform(0.5, 1.5, shape) if low else rng.standard_normal(shape) * 0.3)
        return numpy_helper.from_array(value.astype(np.float32), name)

    c = 2 * B
    inits = [const("w1", (c, 3, 3, 3)), const("b1", (c,)),
             const("s", (c,), 1), const("t", (c,)), const("m", (c,)), const("v", (c,), 1),
             const("w2", (c, c, 3, 3)), const("w3", (c, 1, 3, 3)), const("w4", (c, c, 1, 1)),
             const("k", (1, c, 1, 1)), const("wfc", (10, 2 * c)),
             const("w6", (4, 2 * c, 1, 1)),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["a", "s", "t", "m", "v"], ["bn"]),
             n("Relu", ["bn"], ["r"]),
             n("Conv", ["r", "w2"], ["c2"], auto_pad="SAME_UPPER"),
             n("Add", ["c2", "r"], ["res"]),
             n("Conv", ["res", "w3"], ["dw"], pads=[1, 1, 1, 1], group=c),
             n("Mul", ["dw", "k"], ["scaled"]),
             n("Mul", ["scaled", "half"], ["halved"]),
             n("Conv", ["halved", "w4"], ["pw"]),
             n("Concat", ["pw", "res"], ["cat"], axis=1),
             n("MaxPool", ["cat"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["mp", "w6"], ["tiny"]),
             n("GlobalAveragePool", ["mp"], ["gap"]),
             n("Flatten", ["gap"], ["flat"]),
             n("Gemm", ["flat", "wfc"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "small",
                              [helper.make_tensor_value_info("x", 1, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("logits", 1, [1, 10]),
                               helper.make_tensor_value_info("cat", 1, [1, 2 * c, 12, 12]),
                               helper.make_tensor_value_info("tiny", 1, [1, 4, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ops(graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph.nodes:
        key = f"{node.domain}:{node.op}" if node.domain else node.op
        counts[key] = counts.get(key, 0) + 1
    return counts


def _laid_out(model: onnx.ModelProto, x_shape, rng):
    """(the pass, the checked blocked graph, its op counts, random feeds of x, onnxruntime's
    outputs on them) of the layout pass run on `model`."""
    graph = load_model(model)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    layout = NchwcLayout()
    optimized = layout.run(graph.copy())
    check_graph(optimized)
    return layout, optimized, _ops(optimized), feeds, expected


@pytest.mark.parametrize("impl", IMPLS)
def test_pass_on_small_cnn_keeps_the_function(impl, rng):
    layout, optimized, ops, feeds, expected = _laid_out(_small_cnn(rng), (1, 3, 12, 12), rng)
    # 5 convs + the BN + the classifier Gemm; the 4-channel conv (6x6 output: a YOLO
    # box head's shape) is blocked too, its 4 channels padded to one block
    assert ops["wpk.nchwc:Conv"] == 7 and "Gemm" not in ops
    assert "Conv" not in ops
    assert ops["wpk.nchwc:MaxPool"] == 1 and ops["wpk.nchwc:GlobalAveragePool"] == 1
    assert ops["wpk:Elementwise"] == 3 and ops["Concat"] == 1
    assert "wpk.nchwc:ReorderInput" not in ops  # the first conv reads NCHW directly
    # NCHW is restored for the classifier's Flatten, the 4-channel conv's output and `cat`
    assert ops["wpk.nchwc:ReorderOutput"] == 3 and ops["Flatten"] == 1
    assert layout.hits["classifier"] == 1
    assert layout.hits["BatchNormalization"] == 1
    assert layout.hits["activation_into_conv"] == 1  # the ReLU after the BN
    actual = evaluate(optimized, feeds, impl)
    for name in expected:
        assert rel_l2(actual[name], expected[name]) <= 1e-4, name


def test_pass_with_another_block_size_through_the_library_kernels(rng):
    """An AVX2 host's block (8) here: onnxruntime refuses it, numpy.nchwc computes it."""
    graph = load_model(_small_cnn(rng))
    feeds = {"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    other = 8 if B != 8 else 16
    optimized = NchwcLayout(NchwcOptions(block=other)).run(graph.copy())
    check_graph(optimized)
    assert {info.shape[-1] for info in optimized.tensors.values() if len(info.shape) == 5} \
        == {other}
    actual = evaluate(optimized, feeds, "numpy.nchwc")
    for name in expected:
        assert rel_l2(actual[name], expected[name]) <= 1e-4, name


def test_pass_options_and_small_graphs_left_alone(rng):
    graph = load_model(_small_cnn(rng))
    before = _ops(graph)
    assert _ops(NchwcLayout(NchwcOptions(enabled=False)).run(graph.copy())) == before
    assert _ops(NchwcLayout(NchwcOptions(min_convs=99)).run(graph.copy())) == before


def test_a_lone_stem_conv_is_blocked_but_not_a_lone_inner_conv(rng):
    """A ViT's patch embedding (kernel = stride, 3 input channels) is its graph's only
    conv: it reads the NCHW input as it is, so its one reorder is of its output, and it
    takes the layout (the blocked kernels then compete for it); a lone conv of more input
    channels would add a reorder of its input too, and a lone padded 3x3 stem is no patch
    embedding: both are left alone."""
    for cin, kernel, blocked in ((3, 4, True), (2 * B, 4, False), (3, 3, False)):
        w = numpy_helper.from_array(
            (rng.standard_normal((2 * B, cin, kernel, kernel)) * 0.3).astype(np.float32), "w")
        b = numpy_helper.from_array(rng.standard_normal(2 * B).astype(np.float32), "b")
        graph = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["p"], kernel_shape=[kernel, kernel],
                              strides=[4, 4]),
             helper.make_node("Flatten", ["p"], ["y"], axis=2)], "patches",
            [helper.make_tensor_value_info("x", 1, [1, cin, 16, 12])],
            [helper.make_tensor_value_info("y", 1, [2 * B, 12])], [w, b])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        _, optimized, ops, feeds, expected = _laid_out(model, (1, cin, 16, 12), rng)
        assert ops.get("wpk.nchwc:Conv", 0) == int(blocked)
        actual = evaluate(optimized, feeds)
        assert rel_l2(actual["y"], expected["y"]) <= 1e-5


LIGHT_MODELS = ["light_resnet50", "light_densenet121", "light_squeezenet", "light_shufflenet",
                "light_inception_v1"]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_pass_keeps_light_models_function(name, rng):
    graph, feeds = load_light(name, rng)
    expected = ort_outputs(graph, feeds)
    optimized = NchwcLayout().run(ConstantFolding().run(graph.copy()))
    check_graph(optimized)
    assert _ops(optimized).get("wpk.nchwc:Conv", 0) >= 10
    actual = evaluate(optimized, feeds)
    for output in expected:
        assert rel_l2(actual[output], expected[output]) <= 1e-4, output


def test_node_workloads_of_blocked_graph_have_candidates(rng):
    graph, _ = load_light("light_squeezenet", rng)
    optimized = NchwcLayout().run(ConstantFolding().run(graph))
    for node in optimized.nodes:
        if node.domain == "wpk.nchwc":
            names = {c.implementation.name
                     for c in registry.candidates(workload_of(optimized, node))}
            assert {"ort.nchwc", "numpy.nchwc"} <= names, node.name


@pytest.mark.parametrize("name", ["light_resnet50", "light_densenet121"])
def test_full_cpu_pipeline_keeps_function(name, rng):
    """Fusion first (conv + residual add + relu epilogues, folded BN), NCHWc last."""
    graph, feeds = load_light(name, rng)
    expected = ort_outputs(graph, feeds)
    optimized, report = optimize(graph, "cpu")
    check_graph(optimized)
    assert report.passes["nchwc_layout"] > 0
    convs = [n for n in optimized.nodes if n.domain == "wpk.nchwc" and n.op == "Conv"]
    if name == "light_resnet50":  # every residual add rides on a conv, as in onnxruntime
        assert sum(1 for n in convs if n.epilogue and n.epilogue[0].op == "add") == 16
    assert "Conv" not in _ops(optimized)
    actual = evaluate(optimized, feeds)
    for output in expected:
        assert rel_l2(actual[output], expected[output]) <= 1e-4, output


@pytest.mark.parametrize("name", ["mobilenet_v2_like", "efficientnet_like"])
def test_full_cpu_pipeline_on_depthwise_and_silu_models(name, rng):
    """SiLU convs split: MLAS runs the conv, a blocked Elementwise the rest; SE blocks blocked."""
    from tests import models

    graph = load_model(models.load_model(name))
    feeds = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32)
             for n in graph.inputs}
    expected = ort_outputs(graph, feeds)
    optimized, _ = optimize(graph, "cpu")
    check_graph(optimized)
    ops = _ops(optimized)
    assert ops["wpk.nchwc:Conv"] > 3 * ops.get("Conv", 0)
    assert ops.get("wpk.nchwc:ReorderInput", 0) + ops["wpk.nchwc:ReorderOutput"] <= 8
    actual = evaluate(optimized, feeds)
    for output in expected:
        assert rel_l2(actual[output], expected[output]) <= 1e-4, output


def _optimize_with_block(graph, block: int):
    """The CPU pass pipeline with the NCHWc layout at `block` (8: AVX2, 16: AVX-512)."""
    from wpk.passes import passes_for

    for graph_pass in passes_for("cpu"):
        if isinstance(graph_pass, NchwcLayout):
            graph_pass = NchwcLayout(NchwcOptions(block=block))
        graph = graph_pass.run(graph)
    return graph


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("name", ["mobilenet_v2_like", "efficientnet_like"])
def test_layout_of_both_isas_blocks_squeeze_excite_and_keeps_function(name, block, rng):
    """Both hosts' blocks on any host (numpy.nchwc runs the block MLAS does not use here):
    the squeeze-excite convs read their pooled, blocked input blocked whatever its
    channel count (10 is neither a multiple of 4 nor of 8), so no reorder sits in a block."""
    from tests import models

    graph = load_model(models.load_model(name))
    feeds = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32)
             for n in graph.inputs}
    expected = ort_outputs(graph, feeds)
    optimized = _optimize_with_block(graph.copy(), block)
    check_graph(optimized)
    ops = _ops(optimized)
    assert "Conv" not in ops and "wpk.nchwc:ReorderInput" not in ops
    assert ops["wpk.nchwc:ReorderOutput"] == 1  # before the classifier's output only
    impl = "ort.nchwc" if block == B else "numpy.nchwc"
    actual = evaluate(optimized, feeds, impl)
    for output in expected:
        assert rel_l2(actual[output], expected[output]) <= 1e-4, output


def test_tensors_read_by_subgraphs_are_restored_before_the_node(rng):
    c = 2 * B
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (c, 3, 3, 3)), ("w2", (c, c, 3, 3)))]
    branch = helper.make_graph([helper.make_node("Identity", ["y2"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", 1, [1, c, 8, 8])])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["y1", "w2"], ["y2"], pads=[1, 1, 1, 1]),
             helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8]),
                                            helper.make_tensor_value_info("cond", 9, [])],
                              [helper.make_tensor_value_info("out", 1, [1, c, 8, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    optimized = NchwcLayout().run(load_model(model))
    check_graph(optimized)
    order = [n.op for n in optimized.nodes]
    assert order == ["Conv", "Conv", "ReorderOutput", "If"]
    assert optimized.nodes[2].outputs == ["y2"]


# --- Pad inside the blocked layout ------------------------------------------------------------

def _padded_convs(rng, mode: str, widths, value=None, opset: int = 13) -> onnx.ModelProto:
    """conv 3->24 (24: padding lanes in the last block) -> Pad -> conv 24->20."""
    inits = [numpy_helper.from_array(rng.standard_normal((24, 3, 3, 3)).astype(np.float32)
                                     * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal(
                 (20, 24 + widths[1] + widths[5], 3, 3)).astype(np.float32) * 0.1, "w2")]
    out_hw = [11 + widths[2] + widths[6] - 2, 12 + widths[3] + widths[7] - 2]
    pad, pad_inits = pad_node("y1", "p", widths, opset, mode, value)
    inits += pad_inits
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], pads=[1, 1, 1, 1]),
             pad,
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "padded",
                              [helper.make_tensor_value_info("x", 1, [1, 3, 11, 12])],
                              [helper.make_tensor_value_info("y", 1, [1, 20, *out_hw])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("mode, widths, value, opset", [
    ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], None, 13),
    ("edge", [0, 0, 1, 0, 0, 0, 2, 2], None, 13),
    ("constant", [0, 0, 1, 2, 0, 0, 2, 1], 0.0, 13),
    ("reflect", [0, 0, 1, 1, 0, 0, 1, 1], None, 10),
    # writes 1.5 into the padding lanes of the border (24 channels): a dirty result,
    # which the next conv never reads
    ("constant", [0, 0, 1, 1, 0, 0, 2, 1], 1.5, 13),
    ("constant", [0, 0, 1, 0, 0, 0, 1, 2], -2.0, 10),
    ("constant", [0, 0, -1, 1, 0, 0, 0, -2], 0.0, 13),     # a crop of H, W padded
    # zero channels (the next conv reads a multiple of 4): 12 after the 24 (into the last
    # block's padding lanes and a new block), and a whole block before
    ("constant", [0, 0, 0, 0, 0, 12, 0, 0], 0.0, 13),
    ("constant", [0, B, 1, 0, 0, 4, 0, 1], 0.0, 13),
], ids=["reflect", "edge", "zeros", "reflect-opset10", "non-zero value",
        "non-zero value opset10", "crop", "channels after", "a block of channels before"])
def test_a_spatial_pad_stays_in_the_blocked_layout(mode, widths, value, opset, rng):
    # a reflect-padded conv (style transfer, paddle2onnx's reflect pads): before, the
    # layout reordered to NCHW for the Pad and back for the next conv
    layout, optimized, ops, feeds, expected = _laid_out(
        _padded_convs(rng, mode, widths, value, opset), (1, 3, 11, 12), rng)
    assert layout.hits["Pad"] == 1 and ops["wpk.nchwc:Conv"] == 2
    assert ops["wpk.nchwc:ReorderOutput"] == 1     # only for the graph output
    (pad,) = [n for n in optimized.nodes if n.op == "Pad"]
    assert len(optimized.tensors[pad.inputs[0]].shape) == 5
    for impl in IMPLS:
        actual = evaluate(optimized, feeds, impl)
        assert rel_l2(actual["y"], expected["y"]) <= 1e-5, impl


@pytest.mark.parametrize("mode, widths, value", [
    ("constant", [0, 0, 1, 1, 0, 0, 1, 1], float("inf")),  # inf x a zero weight is NaN
    ("reflect", [0, 2, 1, 1, 0, 2, 1, 1], None),     # reflects channels
    ("reflect", [0, 0, -1, 0, 0, 0, 1, 0], None),    # a reflect crop
    ("constant", [0, B // 2, 0, 0, 0, B // 2, 0, 0], 0.0),   # half a block before
    ("constant", [0, 0, 0, 0, 0, 4, 0, 0], 1.0),     # channels of ones
], ids=["infinite value", "channel widths reflected", "reflect crop",
        "half a block of channels before", "non-zero channels"])
def test_a_pad_the_blocked_tensor_cannot_take_ends_the_blocked_layout(mode, widths, value,
                                                                      rng):
    graph = load_model(_padded_convs(rng, mode, widths, value))
    optimized = NchwcLayout().run(graph.copy())
    (pad,) = [n for n in optimized.nodes if n.op == "Pad"]
    assert len(optimized.tensors[pad.inputs[0]].shape) == 4


def _grouped_convs(rng, per_group: int, block: int, c: int | None = None) -> onnx.ModelProto:
    """Two convs, then a grouped 3x3 (stride 2) and a grouped 1x1 of `per_group` input
    channels per group (ResNeXt's 4, RegNet's whole blocks), `c` channels (4 blocks)."""
    c = c or 4 * block
    def const(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             n("Relu", ["a"], ["r"]),
             n("Conv", ["r", "w1", "b1"], ["g"], pads=[1, 1, 1, 1], strides=[2, 2],
               group=c // per_group),
             n("Relu", ["g"], ["gr"]),
             n("Conv", ["gr", "w2"], ["y"], group=c // per_group)]
    graph = helper.make_graph(
        nodes, "grouped", [helper.make_tensor_value_info("x", 1, [1, 3, 13, 11])],
        [helper.make_tensor_value_info("y", 1, [1, c, 7, 6])],
        [const("w0", (c, 3, 3, 3)), const("w1", (c, per_group, 3, 3)), const("b1", (c,)),
         const("w2", (c, per_group, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("per_group", [4, 8, B], ids=lambda p: f"{p} per group")
@pytest.mark.parametrize("impl", [*IMPLS, "micro.nchwc"])
def test_grouped_convs_join_the_layout_with_groups_of_whole_blocks(per_group, impl, rng):
    """A grouped conv whose groups are whole blocks keeps its groups; narrower ones
    (ResNeXt's 4 channels per group) merge into one group per input block, zeros between
    a merged group's own groups, and say how wide their groups are (`group_width`, which
    `micro.nchwc` reduces over instead of the block): no reorder around them, and the
    function kept."""
    if per_group > B:
        pytest.skip("a block holds fewer channels than a group")
    layout, optimized, ops, feeds, expected = _laid_out(_grouped_convs(rng, per_group, B),
                                                        (1, 3, 13, 11), rng)
    assert ops["wpk.nchwc:Conv"] == 3 and "Conv" not in ops
    assert ops.get("wpk.nchwc:ReorderInput", 0) == 0 and ops["wpk.nchwc:ReorderOutput"] == 1
    groups = [node.attrs["group"] for node in optimized.nodes if node.op == "Conv"][1:]
    assert groups == [4, 4]   # 4 blocks of input channels: one group per block
    assert layout.hits["grouped Conv widened to whole blocks"] == (2 if per_group < B else 0)
    widths = [node.attrs.get("group_width") for node in optimized.nodes if node.op == "Conv"]
    assert widths == [None] + [per_group if per_group < B else None] * 2
    actual = evaluate(optimized, feeds, impl)
    assert rel_l2(actual["y"], expected["y"]) <= 1e-5


@pytest.mark.parametrize("impl", [*IMPLS, "micro.nchwc"])
def test_grouped_convs_with_a_partial_last_block_take_zero_groups_into_its_padding(impl, rng):
    """RegNet's 104 and 440 channels in groups of 8 are not whole 16-lane blocks: groups
    of zero weights and bias fill the last block (its padding lanes stay zero), then the
    groups merge one per block as ResNeXt's do; the function kept, no reorder around."""
    c = 3 * B + B // 2
    layout, optimized, ops, feeds, expected = _laid_out(
        _grouped_convs(rng, B // 2, B, c), (1, 3, 13, 11), rng)
    assert ops["wpk.nchwc:Conv"] == 3 and "Conv" not in ops
    assert ops.get("wpk.nchwc:ReorderInput", 0) == 0 and ops["wpk.nchwc:ReorderOutput"] == 1
    grouped = [node for node in optimized.nodes if node.op == "Conv"][1:]
    assert [(n.attrs["group"], n.attrs["channels"]) for n in grouped] == [(4, 4 * B)] * 2
    assert [n.attrs["group_width"] for n in grouped] == [B // 2] * 2
    assert optimized.constants[grouped[0].inputs[2]].shape == (4 * B,)   # the padded bias
    assert layout.hits["grouped Conv widened to whole blocks"] == 2
    actual = evaluate(optimized, feeds, impl)
    assert rel_l2(actual["y"], expected["y"]) <= 1e-5


@pytest.mark.parametrize("impl", [*IMPLS, "micro.nchwc"])
def test_groups_that_are_not_whole_blocks_join_the_layout_as_one_sparse_group(impl, rng):
    """ShuffleNet's 68 channels a group are neither whole blocks nor a block's divisor:
    such a conv joins the layout as one dense group, its filter zero outside the groups,
    saying how many it had (`sparse_groups`: `micro.nchwc` reduces each tile over its
    groups' input blocks only); no reorder around it, and the function kept."""
    per_group = B + 2
    c = 4 * per_group
    layout, optimized, ops, feeds, expected = _laid_out(
        _grouped_convs(rng, per_group, B, c), (1, 3, 13, 11), rng)
    assert ops["wpk.nchwc:Conv"] == 3 and "Conv" not in ops
    assert ops.get("wpk.nchwc:ReorderInput", 0) == 0 and ops["wpk.nchwc:ReorderOutput"] == 1
    grouped = [node for node in optimized.nodes if node.op == "Conv"][1:]
    assert [(n.attrs["group"], n.attrs.get("sparse_groups")) for n in grouped] == [(1, 4)] * 2
    assert layout.hits["grouped Conv as one sparse group"] == 2
    dense = optimized.constants[grouped[1].inputs[1]]
    assert dense.shape == (c, c, 1, 1) and np.count_nonzero(dense) == c * per_group
    actual = evaluate(optimized, feeds, impl)
    assert rel_l2(actual["y"], expected["y"]) <= 1e-5


def test_groups_whose_bands_cost_too_much_stay_nchw(rng):
    """Groups of 3 channels: a block of outputs reads about 10 times its groups' inputs as
    one dense group; onnxruntime's NCHW grouped conv keeps it."""
    from wpk.passes.nchwc_rules import MAX_SPARSE_WORK, sparse_groups_fit

    assert fmt.sparse_group_work(16 * 3, 16 * 3, 16, B) > MAX_SPARSE_WORK
    assert not sparse_groups_fit(48, 48, 16, B)
    layout, optimized, ops, feeds, expected = _laid_out(
        _grouped_convs(rng, 3, B, 48), (1, 3, 13, 11), rng)
    grouped = [n for n in optimized.nodes if n.op == "Conv" and n.attrs.get("group", 1) > 1]
    assert [n.domain for n in grouped] == ["", ""]   # both stay onnxruntime's NCHW convs
    assert "grouped Conv as one sparse group" not in layout.hits
    actual = evaluate(optimized, feeds, "ort.nchwc")
    assert rel_l2(actual["y"], expected["y"]) <= 1e-5


def test_sparse_group_bands_and_their_cost():
    """`group_band` of output channels [first, end): the input blocks of their groups;
    `sparse_group_work` the bands' multiply-adds over the groups' own (ShuffleNet's)."""
    assert fmt.group_band(0, 16, 272, 272, 4, 16) == (0, 5)      # group 0: channels 0-67
    assert fmt.group_band(64, 80, 272, 272, 4, 16) == (0, 9)     # groups 0 and 1: 0-135
    assert fmt.group_band(256, 272, 272, 272, 4, 16) == (12, 5)  # group 3: 204-271
    assert fmt.group_band(16, 32, 24, 112, 4, 16) == (0, 1)      # groups 0-1 of 6 inputs
    assert fmt.group_band(128, 144, 136, 136, 4, 16) == (6, 3)   # padding lanes: group 3's
    assert fmt.sparse_group_work(64, 64, 4, 16) == 1.0          # whole blocks: no waste
    assert 1.3 < fmt.sparse_group_work(272, 272, 4, 16) < 1.4
    assert fmt.sparse_group_work(272, 272, 4, 8) < fmt.sparse_group_work(272, 272, 4, 16)


def test_widened_groups_compute_the_same_conv_and_narrow_ones_stay_out(rng):
    from wpk.passes.nchwc_rules import block_groups, widen_groups

    assert block_groups(64, 64, 16, 16) == 4 and block_groups(64, 128, 4, 16) == 4
    assert block_groups(64, 64, 4, 16) == 4        # whole blocks: its own groups
    assert block_groups(48, 48, 16, 16) == 0       # 3 per group: a block is not whole groups
    assert block_groups(60, 60, 15, 16) == 4       # a fake group of 4 fills the last block
    assert block_groups(56, 56, 7, 16) == 4        # RegNet-like: groups of 8, a partial block
    assert block_groups(56, 112, 7, 16) == 0       # a fake group's outputs overflow padding
    assert block_groups(56, 28, 7, 16) == 0        # 8 outputs a merged group: not a block
    assert block_groups(64, 32, 16, 16) == 0       # 8 outputs a merged group: not a block
    weight = rng.standard_normal((12, 2, 3, 3)).astype(np.float32)   # 6 groups of 2 in/out
    wide = widen_groups(weight, 6, 2)              # 2 groups of 6 inputs
    x = rng.standard_normal((1, 12, 5, 5)).astype(np.float32)
    def conv(w, group):
        node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[1] * 4)
        graph = helper.make_graph([node], "c",
                                  [helper.make_tensor_value_info("x", 1, x.shape)],
                                  [helper.make_tensor_value_info("y", 1, None)],
                                  [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert wide.shape == (12, 6, 3, 3) and np.count_nonzero(wide) == weight.size
    np.testing.assert_allclose(conv(wide, 2), conv(weight, 6), rtol=1e-5, atol=1e-5)
