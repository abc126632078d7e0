"""`layernorm.c` (kernels/cpu/layernorm_native): LayerNormalization in C against the float64
reference on odd sizes (rows not a multiple of the chunks, lengths not a multiple of the
vector width, two normalized axes, no bias, variable scale), through the native chain,
and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.native_checks import assert_chain_matches
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.layernorm_native import LAYERNORM_C, layernorm_reason
from wpk.kernels.reference import reference

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

T = TensorSpec


def layernorm(x, axis=-1, bias=True, consts=(1, 2), eps=1e-5, dtype="float32",
              outputs=1, epilogue=()) -> Workload:
    tail = tuple(x[axis % len(x):])
    inputs = (T(x, dtype), T(tail, dtype)) + ((T(tail, dtype),) if bias else ())
    return Workload("LayerNormalization", inputs, (T(x, dtype),) * outputs,
                    (("axis", axis), ("epsilon", eps)), tuple(epilogue), "",
                    tuple(i for i in consts if i < len(inputs)))


def arrays_for(w: Workload, rng) -> list[np.ndarray]:
    x = rng.standard_normal(w.inputs[0].shape).astype(np.float32) * 4 + 3   # off-centre
    return [x] + [rng.standard_normal(s.shape).astype(np.float32) for s in w.inputs[1:]]


CASES = {
    "vit": dict(x=(1, 197, 192)),
    "odd": dict(x=(3, 37, 45)),
    "two_axes": dict(x=(2, 5, 7, 9), axis=2),
    "no_bias": dict(x=(4, 33), bias=False),
    "one_row": dict(x=(70,), axis=0),
    "variable_scale": dict(x=(6, 129), consts=()),
    "tiny_eps": dict(x=(5, 17), eps=1e-12),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("par", [1, 0])
def test_matches_the_reference(rng, case, par):
    w = layernorm(**CASES[case])
    assert layernorm_reason(w) is None
    arrays = arrays_for(w, rng)
    consts = {i: arrays[i] for i in w.const_inputs}
    out = np.full(w.outputs[0].shape, np.nan, np.float32)   # poisoned: every element written
    LAYERNORM_C.prepare(w, consts, {"par": par})(arrays, [out])
    assert relative_l2(out, reference(w, arrays)[0]) < 1e-6


def test_the_native_form_computes_the_same_in_a_chain(rng):
    w = layernorm((9, 64))
    arrays = arrays_for(w, rng)
    kernel = LAYERNORM_C.prepare(w, {1: arrays[1], 2: arrays[2]}, {"par": 1})
    assert_chain_matches(kernel, arrays, reference(w, arrays)[0])


def test_the_planner_offers_it_next_to_onnxruntime():
    names = {c.implementation.name for c in registry.candidates(layernorm((2, 8, 32)))}
    assert {"layernorm.c", "ort"} <= names


@pytest.mark.parametrize("w, words", [
    (layernorm((4, 8), outputs=2), "Y only"),
    (layernorm((4, 8), epilogue=(EpilogueStep("relu"),)), "Y only"),
    (layernorm((4, 8), dtype="float16"), "float32"),
    (Workload("LayerNormalization", (T((4, 8)), T((4, 8))), (T((4, 8)),), (("axis", -1),)),
     "Scale and B"),
    (Workload("Softmax", (T((4, 8)),), (T((4, 8)),)), "LayerNormalization only"),
])
def test_what_it_refuses(w, words):
    assert words in layernorm_reason(w)
    with pytest.raises(ValueError):
        LAYERNORM_C.prepare(w, {}, {"par": 1})
