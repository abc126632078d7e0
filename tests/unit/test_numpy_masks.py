"""The mask and id ops wpk computes for any numpy dtype (`numpy.mask`, `numpy.copy`):
each against the reference (onnx.reference for the mask ops) on random inputs, exactly
for integer and bool outputs; which dtypes and epilogues `kernels.support` refuses; and
the exact comparison verification applies to integer outputs."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.cpu.numpy_masks import NUMPY_MASK
from wpk.kernels.cpu.numpy_ops import NumpyCopy
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.support import unsupported_reason
from wpk.search.measure import compare, poisoned_outputs

COPY = NumpyCopy()


def workload(op: str, inputs: list[tuple[tuple[int, ...], str]], out: tuple[tuple[int, ...], str],
             attrs: tuple = (), static: tuple = (), epilogue: tuple = ()) -> Workload:
    return Workload(op, tuple(TensorSpec(shape, dtype) for shape, dtype in inputs),
                    (TensorSpec(*out),), attrs, epilogue=epilogue,
                    const_inputs=tuple(i for i, _ in static), static_inputs=static, opset=17)


CASES = {
    "cast int64 -> float32": workload("Cast", [((2, 5), "int64")], ((2, 5), "float32"),
                                      (("to", 1),)),
    "cast float32 -> int64": workload("Cast", [((3, 4), "float32")], ((3, 4), "int64"),
                                      (("to", 7),)),
    "cast float32 -> bool": workload("Cast", [((7,), "float32")], ((7,), "bool"), (("to", 9),)),
    "cast bool -> float16": workload("Cast", [((2, 3), "bool")], ((2, 3), "float16"),
                                     (("to", 10),)),
    "equal int64, broadcast": workload("Equal", [((2, 1, 6), "int64"), ((6,), "int64")],
                                       ((2, 1, 6), "bool")),
    "greater float32": workload("Greater", [((4, 5), "float32"), ((1, 5), "float32")],
                                ((4, 5), "bool")),
    "less int32": workload("Less", [((9,), "int32"), ((9,), "int32")], ((9,), "bool")),
    "greater-or-equal": workload("GreaterOrEqual", [((3, 3), "float64"), ((), "float64")],
                                 ((3, 3), "bool")),
    "less-or-equal uint8": workload("LessOrEqual", [((5,), "uint8"), ((5,), "uint8")],
                                    ((5,), "bool")),
    "not": workload("Not", [((2, 8), "bool")], ((2, 8), "bool")),
    "and, broadcast": workload("And", [((2, 4), "bool"), ((4,), "bool")], ((2, 4), "bool")),
    "or": workload("Or", [((6,), "bool"), ((6,), "bool")], ((6,), "bool")),
    "where float32, broadcast": workload(
        "Where", [((1, 1, 1, 7), "bool"), ((), "float32"), ((2, 3, 5, 7), "float32")],
        ((2, 3, 5, 7), "float32")),
    "where int64": workload("Where", [((4,), "bool"), ((4,), "int64"), ((4,), "int64")],
                            ((4,), "int64")),
    # the index ops: small random ints tie often, so the tie rules are checked too
    "argmax float32, kept axis": workload("ArgMax", [((3, 7, 5), "float32")], ((3, 1, 5), "int64"),
                                          (("axis", 1),)),
    "argmin int64, last of ties, axis dropped": workload(
        "ArgMin", [((4, 9), "int64")], ((4,), "int64"),
        (("axis", -1), ("keepdims", 0), ("select_last_index", 1))),
    "argmax uint8, first of ties": workload("ArgMax", [((6, 4), "uint8")], ((1, 4), "int64")),
    "argmax int32, last of ties": workload("ArgMax", [((2, 3, 8), "int32")], ((2, 3, 1), "int64"),
                                           (("axis", 2), ("select_last_index", 1))),
    "where with an add epilogue": workload(
        "Where", [((3, 4), "bool"), ((3, 4), "float32"), ((3, 4), "float32"),
                  ((3, 4), "float32")], ((3, 4), "float32"),
        epilogue=(EpilogueStep("add", operand=3),)),
}


@pytest.mark.parametrize("case", CASES)
def test_mask_ops_match_the_reference(rng, case):
    w = CASES[case]
    assert unsupported_reason(w) is None and NUMPY_MASK.unsupported_reason(w) is None
    arrays = random_inputs(w, rng)
    expected = reference(w, arrays)
    outputs = poisoned_outputs(w.outputs)
    NUMPY_MASK.prepare(w, {}, {})(arrays, outputs)
    assert outputs[0].dtype == np.dtype(w.outputs[0].dtype)
    error, why = compare(outputs, expected)
    assert error < 1e-6, why


MOVES = {
    "unsqueeze int64": workload("Unsqueeze", [((1, 8), "int64"), ((2,), "int64")],
                                ((1, 1, 1, 8), "int64"), static=((1, (1, 2)),)),
    "transpose bool": workload("Transpose", [((2, 3, 4), "bool")], ((4, 2, 3), "bool"),
                               (("perm", (2, 0, 1)),)),
    "concat int32": workload("Concat", [((2, 3), "int32"), ((2, 1), "int32")], ((2, 4), "int32"),
                             (("axis", 1),)),
    "expand bool": workload("Expand", [((1, 1, 1, 5), "bool"), ((4,), "int64")],
                            ((2, 1, 5, 5), "bool"), static=((1, (2, 1, 5, 5)),)),
    "expand float32": workload("Expand", [((3, 1), "float32"), ((2,), "int64")],
                               ((3, 4), "float32"), static=((1, (3, 4)),)),
    "tile float32 (grouped-query heads)": workload(
        "Tile", [((1, 2, 1, 5, 3), "float32"), ((5,), "int64")], ((1, 2, 4, 5, 3), "float32"),
        static=((1, (1, 1, 4, 1, 1)),)),
    "tile int64 on every axis": workload("Tile", [((2, 3), "int64"), ((2,), "int64")],
                                         ((6, 6), "int64"), static=((1, (3, 2)),)),
    "tile bool once": workload("Tile", [((4,), "bool"), ((1,), "int64")], ((4,), "bool"),
                               static=((1, (1,)),)),
    "gather int64 ids": workload("Gather", [((50, 4), "int64"), ((3,), "int64")],
                                ((3, 4), "int64"), (("axis", 0),)),
}


@pytest.mark.parametrize("case", MOVES)
def test_moves_of_any_dtype_match_the_reference(rng, case):
    w = MOVES[case]
    assert unsupported_reason(w) is None and COPY.unsupported_reason(w) is None
    arrays = random_inputs(w, rng)
    outputs = poisoned_outputs(w.outputs)
    COPY.prepare(w, {}, {})(arrays, outputs)
    assert compare(outputs, reference(w, arrays)) == (0.0, "")


def test_tile_into_a_strided_output_still_matches(rng):
    """A strided output: the blocked view of it splits axes only, so it is written."""
    w = MOVES["tile int64 on every axis"]
    arrays = random_inputs(w, rng)
    wide = np.zeros((6, 12), np.int64)
    COPY.prepare(w, {}, {})(arrays, [wide[:, ::2]])
    np.testing.assert_array_equal(wide[:, ::2], np.tile(arrays[0], (3, 2)))
    assert not wide[:, 1::2].any()


def test_what_support_refuses():
    bf16 = workload("Cast", [((4,), "float32")], ((4,), "bfloat16"), (("to", 16),))
    assert "bfloat16" in unsupported_reason(bf16)
    strings = workload("Reshape", [((4,), "object"), ((1,), "int64")], ((4,), "object"),
                       static=((1, (4,)),))
    assert "object" in unsupported_reason(strings)
    epilogue = workload("Greater", [((4,), "float32"), ((4,), "float32"), ((4,), "float32")],
                        ((4,), "bool"), epilogue=(EpilogueStep("add", operand=2),))
    assert "non-float" in unsupported_reason(epilogue)
    variable = workload("Expand", [((3, 1), "float32"), ((2,), "int64")], ((3, 4), "float32"))
    assert "static" in unsupported_reason(variable)
    variable = workload("Tile", [((3, 1), "float32"), ((2,), "int64")], ((3, 4), "float32"))
    assert "static" in unsupported_reason(variable)
    int_add = workload("Add", [((4,), "int64"), ((4,), "int64")], ((4,), "int64"))
    assert unsupported_reason(int_add) == "only float outputs are implemented"


def test_integer_outputs_must_equal_the_reference_exactly():
    ref = np.arange(1000, dtype=np.int64)
    off_by_one = ref.copy()
    off_by_one[500] += 1   # relative L2 of 2e-6: it would pass a float tolerance
    error, why = compare([off_by_one], [ref])
    assert error == float("inf") and "1 of 1000" in why
    assert compare([ref.copy()], [ref]) == (0.0, "")
    flipped = np.array([True, False, True])
    assert compare([flipped], [np.array([True, True, True])])[0] == float("inf")
