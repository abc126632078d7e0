"""The real-exporter corpus (tests/corpus) end to end against onnxruntime.

Every corpus model, at its CI size and exported once per session (the
`corpus_model_path` fixture), must build untuned for the CPU and match
onnxruntime within 1e-4 relative L2 on seeded random inputs. The tolerance
widens to onnxruntime's own spread between its optimization levels
(ORT_DISABLE_ALL against ORT_ENABLE_ALL) where that spread is larger, since
then onnxruntime cannot tell a right answer to that precision either. Cases
where wpk fails today are strict xfails with the error they show (`KNOWN_FAILURES`).
The structure tests check that each model really has its exporter's patterns,
so the corpus cannot silently drift into graphs that no exporter writes.
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import onnx
import pytest

import wpk
from tests import corpus
from tests.built_plans import FAST_BUILD
from tests.fuzzing.mutations import ask_for_output
from wpk.core.numerics import relative_l2

# Whole models: the compile cache is the run's, shared with the other whole-model tests.
pytestmark = pytest.mark.usefixtures("shared_compile_cache")
MAX_RELATIVE_L2 = 1e-4
# Corpus models on which wpk fails today: name -> the failure as it shows.
KNOWN_FAILURES: dict[str, str] = {}


def _marks(name: str) -> list:
    entry = corpus.corpus_model(name)
    marks = [pytest.mark.skipif(importlib.util.find_spec(package) is None,
                                reason=f"{package} is not installed (pip install -e .[dev])")
             for package in entry.needs]
    if name in KNOWN_FAILURES:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[name]))
    return marks


CORPUS_CASES = [pytest.param(name, marks=_marks(name)) for name in corpus.CORPUS]
STRUCTURE_CASES = [pytest.param(name, marks=_marks(name)[:len(corpus.CORPUS[name].needs)])
                   for name in corpus.CORPUS]


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _input_dims(model: onnx.ModelProto) -> list:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]


def _opset(model: onnx.ModelProto) -> int:
    return next(e.version for e in model.opset_import if e.domain in ("", "ai.onnx"))


# Ops each architecture's graph must hold, by exporter (the patterns the corpus is for).
EXPECTED_OPS = {
    "mobilenetv3": {"torch": {"HardSwish", "HardSigmoid", "ReduceMean", "Mul", "Gemm"},
                    "paddle": {"Clip", "Div", "HardSigmoid", "GlobalAveragePool",
                               "BatchNormalization", "MatMul"},
                    # quantized: HardSwish written out, every tensor between Q/DQ nodes
                    "qdq": {"QuantizeLinear", "DequantizeLinear", "Conv", "HardSigmoid", "Mul",
                            "ReduceMean", "Gemm"},
                    "qop": {"QLinearConv", "QLinearMul", "QLinearAdd", "QuantizeLinear",
                            "DequantizeLinear", "HardSigmoid"}},
    "dbnet": {"torch": {"Resize", "ConvTranspose", "Concat", "Sigmoid"},
              "paddle": {"Resize", "ConvTranspose", "Concat", "BatchNormalization"}},
    "svtr": {"torch": {"LayerNormalization", "Softmax", "Transpose", "Reshape", "Erf"},
             "paddle": {"ReduceMean", "Pow", "Sqrt", "Softmax", "Reshape", "Shape",
                        "Gather", "Concat", "Squeeze"}},
    "vit": {"torch": {"LayerNormalization", "MatMul", "Softmax", "Erf", "Concat"},
            "tf": {"ReduceMean", "Reciprocal", "Tanh", "Cast", "Expand", "Softmax"}},
    "convnext": {"torch": {"LayerNormalization", "ReduceMean", "Pow", "Sqrt", "Erf",
                           "Transpose"},
                 "tf": {"Transpose", "Reciprocal", "Erf", "MatMul", "ReduceMean"}},
    "yolo": {"torch": {"Sigmoid", "Concat", "Resize", "MaxPool"},
             "tf": {"Sigmoid", "Split", "Resize", "Shape", "Cast", "Transpose"}},
    "yolopost": {"torch": {"Sigmoid", "Resize", "NonZero", "GatherND", "TopK"}},
    "resnext": {"torch": {"Conv", "Relu", "Add", "MaxPool", "Gemm"},
                "qdq": {"QuantizeLinear", "DequantizeLinear", "Conv", "Add", "MaxPool"}},
    "speech": {"torch": {"Conv", "Erf", "Relu", "Add", "MaxPool", "ReduceMean"}},
    "deeplab": {"torch": {"Conv", "Relu", "Concat", "Resize"}},
    "espcn": {"torch": {"Conv", "Tanh", "DepthToSpace", "Clip"}},
    "torchenc": {"torch": {"Where", "Softmax", "MatMul", "LayerNormalization", "Transpose",
                           "Greater"}},
    "gpt": {"torch": {"Where", "Softmax", "MatMul", "LayerNormalization", "Tanh"}},
    "crnn": {"torch": {"Conv", "LSTM", "GRU", "LogSoftmax"}},
    "llama": {"torch": {"Pow", "ReduceMean", "Sqrt", "Neg", "Slice", "Concat", "Sigmoid",
                        "Softmax", "MatMul"}},
    "kerasvit": {"tf": {"Einsum", "Softmax", "Erf", "Reciprocal", "ReduceMean"}},
    "shufflenet": {"torch": {"Concat", "Reshape", "Transpose", "Conv", "MaxPool"}},
    "regnet": {"torch": {"Conv", "Sigmoid", "Mul", "Add", "Relu"}},
    "maxvit": {"torch": {"Einsum", "Softmax", "LayerNormalization", "Sigmoid", "Erf",
                         "AveragePool"}},
    # GroupNorm as both exporters write it: Reshape, InstanceNormalization, Reshape, Mul, Add
    "unet": {"torch": {"InstanceNormalization", "Reshape", "Sigmoid", "ConvTranspose",
                       "Resize", "Concat"}},
    # torch.roll as Slice and Concat
    "swin": {"torch": {"Slice", "Concat", "LayerNormalization", "Softmax", "MatMul",
                       "Transpose", "Erf"}},
    "clip": {"torch": {"Sigmoid", "Mul", "Softmax", "LayerNormalization", "MatMul"}},
    # Mish: written out by the TorchScript exporter below opset 18, one op in dynamo's
    "cspdarknet": {"torchscript": {"Conv", "Softplus", "Tanh", "Mul", "Concat", "Add"},
                   "dynamo": {"Conv", "Mish", "Concat", "Add"}},
}


@pytest.mark.parametrize("name", STRUCTURE_CASES)
def test_corpus_models_have_their_exporters_patterns(name, corpus_model_path):
    entry = corpus.corpus_model(name)
    model = onnx.load(str(corpus_model_path(name)))
    expected = EXPECTED_OPS[entry.architecture]
    family = entry.exporter if entry.exporter in expected else (
        "torch" if entry.exporter in corpus.TORCH_EXPORTERS else entry.exporter)
    missing = expected[family] - set(_ops(model))
    assert not missing, f"{name}: no {sorted(missing)} in the graph"
    dims = _input_dims(model)
    if entry.quantized:   # the torchscript export with its input shape fixed
        assert _opset(model) == 17 and list(dims) == list(entry.input_shape("ci"))
    elif entry.exporter == "torchscript":
        assert _opset(model) == 17 and dims[0] == "batch"
    elif entry.exporter == "dynamo":
        assert _opset(model) == 18 and list(dims) == list(entry.input_shape("ci"))
    else:  # paddle2onnx / tf2onnx style: old opset, dynamic dims declared as -1
        assert 11 <= _opset(model) <= 13 and dims[0] == -1
        assert "HardSwish" not in _ops(model) and "LayerNormalization" not in _ops(model)
    if entry.exporter == "paddle":
        assert _ops(model)["Constant"] > 0
        assert not any(t.dims == [] for t in model.graph.initializer), "scalars are Constants"
    if entry.exporter == "tf":  # NHWC input, transposed to NCHW on entry
        assert dims[-1] == 3
        assert any(n.op_type == "Transpose" and list(n.input) == ["x"]
                   and list(n.attribute[0].ints) == [0, 3, 1, 2] for n in model.graph.node)


@pytest.mark.parametrize("name", ["dbnet_torchscript", "dbnet_dynamo", "svtr_paddle",
                                  "yolo_tf"])
def test_corpus_builds_are_deterministic(name):
    for package in corpus.corpus_model(name).needs:
        pytest.importorskip(package)
    first = corpus.build_model(name, "ci").SerializeToString()
    assert corpus.build_model(name, "ci").SerializeToString() == first


@pytest.mark.parametrize("name", STRUCTURE_CASES)
def test_corpus_outputs_depend_on_the_input(name, corpus_model_path):
    """A comparison is only worth something when the output is not (nearly) constant (an
    output whose shape depends on the values may show it by its shape)."""
    model = onnx.load(str(corpus_model_path(name)))
    first = corpus.onnxruntime_outputs(model, corpus.random_feeds(name, seed=1))
    second = corpus.onnxruntime_outputs(model, corpus.random_feeds(name, seed=2))
    for output, value in first.items():
        assert np.isfinite(value).all()
        assert second[output].shape != value.shape or relative_l2(second[output], value) > 1e-2, \
            f"{name}: {output} ignores the input"


@pytest.mark.parametrize("name", CORPUS_CASES)
def test_corpus_plan_matches_onnxruntime(name, corpus_model_path, tmp_path):
    model = onnx.load(str(corpus_model_path(name)))
    feeds = corpus.random_feeds(name, seed=7)
    expected = corpus.onnxruntime_outputs(model, feeds)
    unoptimized = corpus.onnxruntime_outputs(model, feeds, optimized=False)
    # onnxruntime's own spread between its optimization levels bounds what is meaningful.
    spread = max(relative_l2(unoptimized[n], expected[n]) for n in expected)
    tolerance = max(MAX_RELATIVE_L2, spread)
    plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name), **FAST_BUILD)
    path = tmp_path / f"{name}.wpk"
    plan.save(path)
    actual = wpk.load(path).run(feeds)
    assert set(actual) == set(expected)
    for output, reference in expected.items():
        assert actual[output].shape == reference.shape, f"{name}: shape of {output}"
        # a quantized model's nodes as written (wpk's plan) or as onnxruntime's integer
        # kernels round them (its whole model, which the plan may be)
        error = min(relative_l2(actual[output], reference),
                    relative_l2(actual[output], unoptimized[output]))
        assert error < tolerance, (f"{name}: {output} relative L2 {error:.2e} (tolerance "
                                   f"{tolerance:.0e}, onnxruntime's levels differ by {spread:.1e})")


def test_the_yolo_detectors_data_movement_has_verified_native_kernels(corpus_model_path):
    """The blocked channel slices, SPPF MaxPools, nearest Upsamples and head reorders of a
    real exporter's YOLO each get a verified `native.nchwc` candidate (kernels that join
    the native chain, so a plan on generated kernels runs without onnxruntime's threads)."""
    name = "yolo_tf"
    model = onnx.load(str(corpus_model_path(name)))
    plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name), **FAST_BUILD)
    blocked = {"ChannelSlice", "MaxPool", "Upsample", "ReorderOutput"}
    found = Counter()
    for entry in plan.report["workloads"]:
        statuses = {c["impl"]: c["status"] for c in entry["candidates"]}
        if entry["op"] not in blocked or "ort.nchwc" not in statuses:   # not a blocked op
            continue
        assert statuses.get("native.nchwc") == "ok", f"{entry['label']}: {statuses}"
        found[entry["op"]] += 1
    assert set(found) == blocked, found


@pytest.mark.parametrize("name", ["shufflenet_torchscript", "shufflenet_dynamo"])
def test_shufflenet_block_ends_are_verified_gathers_in_the_blocked_layout(
        name, corpus_model_path):
    """Every unit's Concat, channel shuffle and split (channel counts 30 and 58: not whole
    blocks) become ChannelGather steps with a verified native kernel, so the plan leaves
    the blocked layout only for its classifier."""
    model = onnx.load(str(corpus_model_path(name)))
    plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name), **FAST_BUILD)
    ops = Counter(step.op for step in plan.steps)
    assert not {"Concat", "Reshape", "Transpose", "Split", "Slice", "ReorderInput"} & set(ops)
    assert ops["ChannelGather"] >= 5 and ops["ReorderOutput"] == 1, ops
    for entry in plan.report["workloads"]:
        if entry["op"] == "ChannelGather":
            statuses = {c["impl"]: c["status"] for c in entry["candidates"]}
            assert statuses.get("native.nchwc") == "ok", f"{entry['label']}: {statuses}"


@pytest.mark.parametrize("name", ["regnet_torchscript", "regnet_dynamo"])
def test_regnet_grouped_convs_stay_in_the_blocked_layout(name, corpus_model_path):
    """Groups of 8 channels in 24 and 56 (not whole 16-lane blocks): zero groups fill the
    last block and the groups merge one per block, so no conv reads NCHW and nothing is
    reordered but the classifier's features."""
    model = onnx.load(str(corpus_model_path(name)))
    plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name), **FAST_BUILD)
    convs = [plan.workloads[step.workload_key] for step in plan.steps if step.op == "Conv"]
    assert convs and all(w.domain == "wpk.nchwc" for w in convs)
    ops = Counter(step.op for step in plan.steps)
    assert ops["ReorderOutput"] == 1 and "ReorderInput" not in ops, ops


@pytest.mark.parametrize("name", [case for case in STRUCTURE_CASES
                                  if case.values[0] in ("resnext_torchscript",
                                                        "resnext_dynamo")])
def test_resnext_models_have_narrow_grouped_convs(name, corpus_model_path):
    """The ResNeXt's 3x3 convs are grouped, 4 and 8 channels per group at the CI size:
    narrower than a block (wpk's layout merges them, `nchwc_rules.widen_groups`)."""
    model = onnx.load(str(corpus_model_path(name)))
    per_group = sorted({init.dims[1] for init in model.graph.initializer
                        for node in model.graph.node if node.op_type == "Conv"
                        and node.input[1] == init.name
                        and any(a.name == "group" and a.i > 1 for a in node.attribute)})
    assert per_group == [4, 8], per_group


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> element type, as ONNX's shape inference types the model."""
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info
            if v.type.tensor_type.elem_type}


def _with_output(model: onnx.ModelProto, name: str, element_type: int,
                 rank: int) -> onnx.ModelProto:
    """A copy of `model` with tensor `name` (an intermediate) also a graph output."""
    asked = onnx.ModelProto()
    asked.CopyFrom(model)
    ask_for_output(asked, name, element_type, rank)
    return asked


# The exporters' spellings of the patterns the fusion rules take in: Keras' LayerNorm
# (reciprocal form, tf2onnx), paddle's (division form), attention, RMSNorm, GroupNorm,
# the blocked inverted residuals
@pytest.mark.parametrize("name", ["vit_tf", "convnext_tf", "kerasvit_tf", "llama_dynamo",
                                  "gpt_dynamo", "unet_dynamo", "mobilenetv3_dynamo",
                                  "svtr_dynamo"])
def test_a_tensor_the_passes_take_in_stays_computed_when_an_output_reads_it(
        name, corpus_model_path):
    """Every tensor the CPU passes fold into a fused node, asked for as a graph output
    too, is still computed by the optimized graph (a rule must not fire over it, or must
    keep it). Found by mutating the corpus: tf2onnx's LayerNorm with its mean or its
    scaled reciprocal read as an output built to 'internal error: KeyError'."""
    from wpk.passes import optimize
    from wpk.passes.base import check_graph
    from wpk.value_tail import load_head

    model = onnx.load(str(corpus_model_path(name)))
    shapes = corpus.input_shapes(name)
    graph = load_head(model, shapes)[0]
    kept = {o for n in optimize(graph, "cpu")[0].nodes for o in n.outputs}
    types = _element_types(model)
    taken_in = [o for n in graph.nodes for o in n.outputs
                if o and o not in kept and o not in graph.outputs and o in types]
    assert taken_in, f"{name}: no pass fused anything"
    for tensor in taken_in:
        asked = _with_output(model, tensor, types[tensor], len(graph.tensors[tensor].shape))
        optimized = optimize(load_head(asked, shapes)[0], "cpu")[0]
        check_graph(optimized)   # every graph output produced, every tensor typed


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name", ["swin_torchscript", "swin_dynamo"])
def test_swins_window_attention_is_fused_with_the_shifted_windows_mask(name, target,
                                                                        corpus_model_path):
    """Both blocks' attention becomes one fused node, the shifted block's with its mask:
    the scores viewed per image, the mask added and viewed back (rules
    `window_mask_unreshaped` and `score_constants_summed`), on either target."""
    from wpk.passes import optimize
    from wpk.value_tail import load_head

    model = onnx.load(str(corpus_model_path(name)))
    graph, report = optimize(load_head(model, corpus.input_shapes(name))[0], target)
    assert _ops(model)["Softmax"] == 2 and graph.op_counts().get("Attention") == 2
    assert report.rules["window_mask_unreshaped"] == 1
    assert report.rules["score_constants_summed"] == 1


def test_a_plan_computes_a_fused_layer_norms_mean_asked_for_as_an_output(corpus_model_path,
                                                                          tmp_path):
    """The case the mutation found, end to end: ConvNeXt's tf2onnx LayerNorm with its
    mean also a graph output builds, and the plan's outputs (the mean too) match
    onnxruntime's."""
    model = onnx.load(str(corpus_model_path("convnext_tf")))
    mean = next(n.output[0] for n in model.graph.node if n.op_type == "ReduceMean"
                and any(m.op_type == "Sub" and m.input[1] == n.output[0]
                        for m in model.graph.node))
    rank = len(corpus.corpus_model("convnext_tf").input_shape("ci"))
    asked = _with_output(model, mean, onnx.TensorProto.FLOAT, rank)
    feeds = corpus.random_feeds("convnext_tf", seed=3)
    expected = corpus.onnxruntime_outputs(asked, feeds)
    plan = wpk.build(asked, target="cpu", input_shapes=corpus.input_shapes("convnext_tf"),
                     **FAST_BUILD)
    plan.save(tmp_path / "convnext_tf.wpk")
    actual = wpk.load(tmp_path / "convnext_tf.wpk").run(feeds)
    assert set(actual) == set(expected) and mean in actual
    for output, reference in expected.items():
        assert relative_l2(actual[output], reference) < MAX_RELATIVE_L2, output
