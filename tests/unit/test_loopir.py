"""Loop IR: constant folding, interval bounds, substitution, index flattening, regions."""

from __future__ import annotations

from wpk.dsl import loopir as L
from wpk.dsl.regions import flatten, region, simplify_cond, split_affine

i, j, k = L.Var("i"), L.Var("j"), L.Var("k")


def test_binary_folds_trivial_integer_arithmetic():
    assert L.binary("+", i, 0) == i
    assert L.binary("*", 1, i) == i
    assert L.binary("*", i, 0) == L.const(0)
    assert L.binary("+", 2, 3) == L.const(5)
    assert L.binary("-", i, i) == L.const(0)
    assert L.binary("-", i, -2) == L.binary("+", i, 2)
    assert L.binary("//", 7, 2) == L.const(3)


def test_bounds_of_affine_and_division_expressions():
    ranges = {"i": (0, 3), "j": (0, 7)}
    assert L.bounds(L.binary("+", L.binary("*", i, 8), j), ranges) == (0, 31)
    assert L.bounds(L.binary("-", j, 1), ranges) == (-1, 6)
    assert L.bounds(L.binary("//", j, 4), ranges) == (0, 1)
    assert L.bounds(L.binary("%", j, 4), ranges) == (0, 3)
    assert L.bounds(L.binary("+", i, k), ranges) is None


def test_simplify_cond_decides_comparisons_by_interval():
    ranges = {"i": (0, 3)}
    always = L.Bin("<", i, L.const(4), "bool")
    never = L.Bin("<", i, L.const(0), "bool")
    maybe = L.Bin("<", i, L.const(2), "bool")
    assert simplify_cond(always, ranges) == L.Imm(1, "bool")
    assert simplify_cond(never, ranges) == L.Imm(0, "bool")
    assert simplify_cond(maybe, ranges) == maybe
    both = L.Bin("and", always, maybe, "bool")
    assert simplify_cond(both, ranges) == maybe


def test_substitute_refolds():
    e = L.binary("+", L.binary("*", i, 4), j)
    assert L.substitute(e, {"i": L.const(0)}) == j
    assert L.free_vars(e) == {"i", "j"}


def test_flatten_merges_fused_dimension_pairs():
    fused = L.binary("+", L.binary("*", i, 16), j)
    merged = flatten([k, L.binary("//", fused, 7), L.binary("%", fused, 7)], (3, 5, 7))
    assert merged == L.binary("+", L.binary("*", k, 35), fused)
    plain = flatten([i, j], (4, 8))
    assert plain == L.binary("+", L.binary("*", i, 8), j)


def test_seq_flattens_and_merges_adjacent_barriers():
    body = L.seq(L.Barrier(), L.seq(L.Barrier(), L.Comment("x")), None)
    assert body == L.Seq((L.Barrier(), L.Comment("x")))
    assert L.seq(L.Comment("only")) == L.Comment("only")


def test_split_affine_separates_ranged_variables():
    expr = L.binary("-", L.binary("+", L.binary("*", i, 2), j), 1)
    coef, rest, const = split_affine(expr, {"j": 3})
    assert coef == {"j": 1} and rest == L.binary("*", i, 2) and const == -1
    # a fused coordinate of ranged loops is an opaque term; mixing with a fixed loop is not
    term = L.binary("//", j, 2)
    assert split_affine(term, {"j": 3}) == ({term: 1}, L.const(0), 0)
    assert split_affine(L.binary("//", L.binary("+", i, j), 2), {"j": 3}) is None


def test_region_covers_every_access_of_a_stencil():
    # x[2*i + j - 1] for j in 0..2 (ranged), i fixed: window of 3 starting at 2*i - 1
    access = [L.binary("-", L.binary("+", L.binary("*", i, 2), j), 1)]
    bases, extents, strides = region([access], (10,), {"j": 3}, {"i": (0, 4), "j": (0, 2)})
    assert extents == [3] and strides == [1]
    assert bases[0] == L.binary("+", L.binary("*", i, 2), -1)
    # a stride-2 access is copied densely: x[2*j] for j in 0..2 -> 3 elements, step 2
    bases, extents, strides = region([[L.binary("*", j, 2)]], (10,), {"j": 3}, {"j": (0, 2)})
    assert (bases, extents, strides) == ([L.const(0)], [3], [2])
    # mixed fixed/ranged non-linear access: falls back to the interval over every loop
    mixed = L.binary("//", L.binary("+", i, j), 2)
    bases, extents, strides = region([[mixed]], (10,), {"j": 3}, {"i": (0, 4), "j": (0, 2)})
    assert bases == [L.const(0)] and extents == [4] and strides == [1]


def test_to_text_prints_the_lowered_function():
    import numpy as np

    from wpk.dsl import compute as C
    from wpk.kernels.dsl_library import load_operator
    from wpk.kernels.templates import lower_for

    op = load_operator("conv2d")
    arrays = {"X": np.zeros((1, 4, 6, 6), np.float32), "Wt": np.zeros((4, 4, 3, 3), np.float32)}
    bindings = C.infer_bindings(op, arrays, {"pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 1})
    config = {"threads_x": 4, "threads_y": 2, "tile_k": 2, "block_k": 2, "tile_c": 2,
              "cache_input": 1, "cache_weight": 0}
    text = L.to_text(lower_for(op, bindings, config, "cuda"))
    assert text.startswith("func wpk_conv2d(X: f32[1, 4, 6, 6]")
    assert "threadIdx.x for" in text and "barrier" in text
    assert "alloc shared X_shared" in text and "alloc local Y_acc" in text
