"""Differential fuzzing of the graph passes (tests/fuzzing/mutations.py): a few seeded
mutants of small corpus models per CI run must build to plans that compute what
onnxruntime computes; `scripts/fuzz_passes.py --minutes N` runs the same longer."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest

from tests import corpus
from tests.built_plans import FAST_BUILD
from tests.fuzzing.mutations import VIOLATIONS, add_output, check_mutant, compare_plan

# Small models with the patterns the fusion rules take in: LayerNorm (torch, Keras),
# attention, GELU, hard-swish and the inverted residuals
SMALL = ["mobilenetv3_dynamo", "gpt_dynamo", "convnext_tf", "svtr_dynamo"]


@pytest.mark.parametrize("seed", range(6))
def test_mutated_corpus_models_build_to_plans_that_match_onnxruntime(seed, corpus_model_path):
    rng = random.Random(seed)
    name = rng.choice(SMALL)
    model = onnx.load(str(corpus_model_path(name)))
    outcome = check_mutant(name, model, rng)
    assert outcome.kind not in VIOLATIONS, (outcome.mutations, outcome.detail)


@pytest.mark.parametrize("mutation, name, seed, what", [
    ("change_int_constant", "gpt_dynamo", 11, "int constant val_37[2]: 32 -> -1"),
    ("change_permutation", "gpt_dynamo", 0, "perm [0, 2, 1, 3] -> [0, 2, 3, 1]"),
    ("change_attribute", "convnext_tf", 1, "(ReduceMean): axes [-1] -> [0]"),
    ("insert_unary", "mobilenetv3_dynamo", 0, "input 1 features.1.body.1.reduce.weight "
                                              "through Sigmoid"),
    ("insert_unary", "convnext_tf", 1, "input 0 matmul.tmp_1 through Neg"),
    ("change_window", "mobilenetv3_dynamo", 4, "(Conv): auto_pad -> SAME_LOWER"),
    ("change_window", "convnext_tf", 1, "(Conv): strides [2, 2] -> [2, 3]")])
def test_each_kind_of_mutation_builds_to_a_plan_that_matches_onnxruntime(
        mutation, name, seed, what, corpus_model_path):
    """One draw of each mutation added on 2026-12-06, on a pattern a rule takes in: a head
    split's Reshape, an attention head permutation, a LayerNorm's reduced axis, a conv
    whose weight is computed, a MatMul's output read through a Neg by its bias Add, a
    conv given SAME padding, a conv's strides made unequal."""
    from tests.fuzzing import mutations

    model = onnx.load(str(corpus_model_path(name)))
    outcome = check_mutant(name, model, random.Random(seed), [getattr(mutations, mutation)])
    assert any(what in applied for applied in outcome.mutations), outcome.mutations
    assert outcome.kind == "ok", (outcome.mutations, outcome.kind, outcome.detail)


def test_a_layer_norms_mean_asked_for_as_an_output_is_computed(corpus_model_path):
    """The mutation that found the LayerNorm rules' defect (their inner tensors read as
    graph outputs: 'internal error: KeyError' before the fix): this draw asks for the mean
    of one of tf2onnx's LayerNorms, and the plan computes it."""
    model = onnx.load(str(corpus_model_path("convnext_tf")))
    before = len(model.graph.output)
    what = add_output(model, random.Random(7))
    assert what.startswith("output reducemean") and len(model.graph.output) == before + 1
    outcome = compare_plan("convnext_tf", model, 0, [what])
    assert outcome.kind == "ok", (outcome.mutations, outcome.detail)


@pytest.mark.parametrize("name, node, epilogue", [
    ("torchenc_torchscript", "/encoder/layers.0/linear1/Add", ["div", "gelu"]),
    ("swin_torchscript", "/blocks/blocks.1/qkv/Add", ["div"])])
def test_a_node_onnxruntime_computes_only_within_rounding_builds_no_worse_than_it(
        name, node, epilogue, corpus_model_path, tmp_path):
    """The mutants that found it: a MatMul's bias Add made a Div. In the torch encoder the
    product divided by the bias, then GELU (onnxruntime's own kernel 3.5e-4 off the float64
    reference, over the 1e-4 tolerance); in Swin the bias divided by the product, which
    crosses zero (1.02e-2 off). Both used to be refused; now their candidates are verified
    within twice onnxruntime's error, the plan matches onnxruntime, the report says so,
    and a rebuild from the records measures nothing."""
    model = onnx.load(str(corpus_model_path(name)))
    bias = next(n for n in model.graph.node if n.name == node)
    bias.op_type = "Div"
    outcome = compare_plan(name, model, 0, [f"{node}: Add -> Div"])
    assert outcome.kind == "ok", outcome.detail

    import wpk

    def loosened(db):
        plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name),
                         db=str(db), **FAST_BUILD)
        found = [(w["label"], w["tolerance"]) for w in plan.report["workloads"]
                 if w.get("tolerance") is not None]
        return found, plan.report["search"]

    first, searched = loosened(tmp_path / "db.jsonl")
    assert [label.split(" +")[1:] for label, _ in first] == [epilogue]
    assert 2e-4 < first[0][1] <= 5e-2 and searched["measured"] > 0
    again, rebuilt = loosened(tmp_path / "db.jsonl")
    assert again == first and rebuilt["measured"] == 0


def test_a_clip_bound_of_minus_infinity_builds_into_a_plan_that_is_written(corpus_model_path):
    """The mutant that found it: paddle2onnx's DBNet with a Clip's min constant made -inf.
    The Clip rides in the conv's epilogue; the plan's manifest is strict JSON, which has no
    infinity, and writing the plan ended in 'internal error: ValueError: Out of range
    float values are not JSON compliant'. The plan is written, loaded and matches
    onnxruntime now."""
    from onnx import numpy_helper

    model = onnx.load(str(corpus_model_path("dbnet_paddle")))
    constant = next(n for n in model.graph.node if "constant.tmp_5" in n.output)
    constant.attribute[0].t.CopyFrom(numpy_helper.from_array(
        np.array(-np.inf, np.float32), constant.attribute[0].t.name))
    outcome = compare_plan("dbnet_paddle", model, 0, ["constant constant.tmp_5 -> [-inf]"])
    assert outcome.kind == "ok", (outcome.mutations, outcome.detail)


def test_a_graph_only_onnxruntimes_leniency_runs_is_refused_with_a_hint_at_the_model(
        corpus_model_path):
    """A mutant the fuzzer found refused with the wrong hint: the torch ViT with its class
    token's Expand shape built from a constant 0 instead of the batch size. The Expand
    makes a (0, 1, 32) tensor that a Concat joins with the (1, 16, 32) patches: invalid
    ONNX, which onnxruntime runs by skipping the empty input. wpk cannot evaluate the
    shapes and says so; the hint was "give the input shape", which the build had."""
    import wpk
    from wpk.core.errors import ShapeError

    model = onnx.load(str(corpus_model_path("vit_torchscript")))
    concat = next(n for n in model.graph.node if n.name == "/Concat_1")
    concat.input[0] = "/Constant_output_0"
    with pytest.raises(ShapeError, match="evaluating the model failed") as refused:
        wpk.build(model, target="cpu", input_shapes=corpus.input_shapes("vit_torchscript"),
                  **FAST_BUILD)
    assert "ONNX spec" in refused.value.hint and "--input-shape" not in refused.value.hint


def test_a_mutant_that_crashes_onnxruntime_is_skipped_and_the_run_goes_on(corpus_model_path):
    """The draw that ended a campaign (`--seed 64 --mutations change_window`): onnxruntime
    1.32 dies of SIGFPE on this YOLO with a conv's stride and its SPPF pool's end pad
    changed. Its reference now runs in a forked child, so the mutant is a skip (wpk itself
    refuses the model with a clear error) and this process lives on."""
    model = onnx.load(str(corpus_model_path("yolopost_torchscript")))
    edits = {"/detector/top_down3/leave/leave.0/Conv": ("strides", [1, 3]),
             "/detector/down5/down5.2/pool_2/MaxPool": ("pads", [2, 2, 0, 2])}
    for node in model.graph.node:
        if node.name in edits:
            name, values = edits.pop(node.name)
            [attribute] = [a for a in node.attribute if a.name == name]
            attribute.ClearField("ints")
            attribute.ints.extend(values)
    assert not edits
    outcome = compare_plan("yolopost_torchscript", model, 0, ["the crashing draw"])
    assert outcome.kind == "skip" and outcome.detail.startswith("onnxruntime:"), outcome


def test_boxes_in_another_order_are_near_and_other_boxes_wrong():
    """A detector sorts its boxes by score; two scores 1e-7 apart come out in either order
    (a YOLO mutant with a dilated conv, `--seed 64 --mutations change_window`, 0.046 off
    onnxruntime with its rows, sorted, equal to onnxruntime's, was counted a wrong plan).
    The same rows in another order are near; a changed row is still wrong."""
    from tests.fuzzing.mutations import _compare

    rng = np.random.default_rng(0)
    boxes = rng.standard_normal((40, 4)).astype(np.float32)
    swapped = boxes.copy()
    swapped[[31, 32]] = boxes[[32, 31]]
    assert _compare({"y": boxes}, {"y": boxes}, {"y": swapped}) == \
        ("near", "y: the same rows in another order")
    moved = boxes.copy()
    moved[31] += 0.5
    assert _compare({"y": boxes}, {"y": boxes}, {"y": moved})[0] == "wrong"
    assert _compare({"y": boxes}, {"y": boxes}, {"y": boxes.copy()}) == ("ok", "")
