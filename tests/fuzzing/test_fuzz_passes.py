"""Differential fuzzing of the graph passes (tests/fuzzing/mutations.py): a few seeded
mutants of small corpus models per CI run must build to plans that compute what
onnxruntime computes; `scripts/fuzz_passes.py --minutes N` runs the same longer."""

from __future__ import annotations

import random

import onnx
import pytest

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
