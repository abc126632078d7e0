"""The DSL parser and type checker: the compute IR they build, and its interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wpk.dsl import compute as ir
from wpk.dsl import evaluate as evaluate_module
from wpk.dsl import parser as parser_module
from wpk.dsl.parser import parse_source

GEMM = """
# a comment line
op gemm(A: f32[M, K], B: f32[K, N], C: f32[M, N], alpha: f32 = 1.0, beta: float = 0.5)
    -> Y: f32[M, N]
{
    Y[m, n] = alpha * sum(k in K) { A[m, k] * B[k, n] } + beta * C[m, n]  # epilogue
}
"""


def parse_one(text: str) -> ir.Operator:
    (op,) = parse_source(text, "t.wpk")
    return op


def test_gemm_builds_the_documented_ir():
    op = parse_one(GEMM)
    assert op.doc == "a comment line" and ir.operator_text(op).startswith("# a comment line\n")
    assert op.name == "gemm" and op.outputs == ("Y",) and op.source == ir.SourceSpan("t.wpk", 3, 4)
    assert [p.name for p in op.params] == ["A", "B", "C"]
    assert op.params[0].shape == (ir.SymVar("M"), ir.SymVar("K"))
    assert op.scalars == (ir.Scalar("alpha", "f32", 1.0), ir.Scalar("beta", "f32", 0.5))
    assert op.shape_symbols == ("M", "K", "N")
    (stage,) = op.stages
    m, n = stage.axes
    assert (m.name, m.extent, m.kind) == ("m", ir.SymVar("M"), "spatial")
    red = stage.reduce
    assert red.op == "sum" and red.dtype == "f32"
    assert red.axes == (ir.IterVar("k", ir.SymVar("K"), "reduce"),)
    assert red.body == ir.BinOp("*", ir.Load("A", (m, red.axes[0]), "f32"),
                                ir.Load("B", (red.axes[0], n), "f32"), "f32")
    acc = ir.SymVar("acc", "f32")
    assert ir.replace_reduce(stage.body, acc) == ir.BinOp(
        "+", ir.BinOp("*", ir.SymVar("alpha", "f32"), acc, "f32"),
        ir.BinOp("*", ir.SymVar("beta", "f32"), ir.Load("C", (m, n), "f32"), "f32"), "f32")


def test_every_binop_has_operands_of_one_dtype():
    op = parse_one("""
    op f(X: f32[N, D], Z: f64[N]) -> (Y: f32[N, D], W: f64[N]) {
        Y[n, d] = X[n, d] / D + n * 2 + 1 - pow(X[n, d], 2) + f32(n / 2)
        W[n] = Z[n] * 0.5 + sum(d in D) { f64(X[n, d]) } / D
    }""")
    for stage in op.stages:
        for e in ir.walk(stage.body):
            if isinstance(e, ir.BinOp):
                assert e.a.dtype == e.b.dtype, ir.to_text(e)
                if e.op == "/":
                    assert e.dtype in ir.FLOAT_TYPES
    text = ir.to_text(op.stages[0].body)
    assert "f32(D)" in text and "(n // 2)" in text  # int division, explicit casts
    assert op.outputs == ("Y", "W") and op.stages[1].dtype == "f64"


def test_lets_requires_locals_and_padded_reads():
    op = parse_one("""
    op pool(X: f32[N, H], KH: int, stride: int = 2) -> Y: f32[N, OH] {
        require KH > 0, "window must not be empty"
        let OH = (H - KH) / stride + 1
        local T: f32[N, H]
        T[n, h] = X[n, h] * 2
        Y[n, o] = max(r in KH) { T[n, o * stride + r - 1] ?: -inf }
    }""")
    assert [name for name, _ in op.derived] == ["OH"]
    assert op.requires[0].message == "window must not be empty"
    assert op.stages[-1].shape == (ir.SymVar("N"), ir.SymVar("OH"))
    load = op.stages[-1].reduce.body
    assert isinstance(load, ir.Load) and load.pad == ir.Const(-math.inf, "f32")
    x = np.arange(14.0).reshape(2, 7)
    y = ir.evaluate(op, {"X": x}, {"KH": 3})["Y"]
    bindings = ir.infer_bindings(op, {"X": x}, {"KH": 3})
    assert bindings == {"KH": 3, "stride": 2, "N": 2, "H": 7, "OH": 3}
    expected = [[max(2 * x[i, j] for j in range(o * 2 - 1, o * 2 + 2) if 0 <= j < 7)
                 for o in range(3)] for i in range(2)]
    np.testing.assert_array_equal(y, expected)
    assert "local T" in ir.operator_text(op) and "let OH" in ir.operator_text(op)


@pytest.mark.parametrize("fn,reference", [
    ("relu(X[i])", lambda x: np.maximum(x, 0)),
    ("relu6(X[i])", lambda x: np.clip(x, 0, 6)),
    ("clip(X[i], -1.0, 0.5)", lambda x: np.clip(x, -1, 0.5)),
    ("leaky_relu(X[i], 0.1)", lambda x: np.where(x >= 0, x, 0.1 * x)),
    ("leaky_relu(X[i])", lambda x: np.where(x >= 0, x, 0.01 * x)),
    ("sigmoid(X[i])", lambda x: 1 / (1 + np.exp(-x))),
    ("silu(X[i])", lambda x: x / (1 + np.exp(-x))),
    ("tanh(X[i])", np.tanh),
    ("gelu(X[i])", lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    ("gelu_tanh(X[i])", lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                         * (x + 0.044715 * x ** 3)))),
    ("hard_sigmoid(X[i])", lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    ("hard_swish(X[i])", lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    ("softplus(X[i])", lambda x: np.log1p(np.exp(x))),
    ("reciprocal(X[i])", lambda x: 1 / x),
    ("abs(X[i]) + floor(X[i]) + ceil(X[i])", lambda x: np.abs(x) + np.floor(x) + np.ceil(x)),
    ("rsqrt(abs(X[i]) + 1)", lambda x: 1 / np.sqrt(np.abs(x) + 1)),
    ("round(X[i] * 2) + round(X[i] - X[i] + 2.5)", lambda x: np.rint(x * 2) + 2),  # to even
    ("select(X[i] > 0 and not (X[i] > 1) or X[i] < -1, 1.0, 0.0)",
     lambda x: (((x > 0) & ~(x > 1)) | (x < -1)).astype(float)),
    ("min(X[i], 0.25) - max(X[i], -0.25)", lambda x: np.minimum(x, 0.25) - np.maximum(x, -0.25)),
    ("-X[i] + i % 3 + i // 2", lambda x: -x + np.arange(x.size) % 3 + np.arange(x.size) // 2),
])
def test_builtin_functions_match_numpy(rng, fn, reference):
    op = parse_one(f"op f(X: f32[L]) -> Y: f32[L] {{ Y[i] = {fn} }}")
    x = rng.standard_normal(50) * 3
    np.testing.assert_allclose(ir.evaluate(op, {"X": x})["Y"], reference(x), rtol=1e-12,
                               atol=1e-12)


def test_scalar_defaults_may_be_negative():
    op = parse_one("op f(X: f32[N], s: int = -1, a: f32 = -0.5) -> Y: f32[N] "
                   "{ Y[i] = X[i] * a + s }")
    assert [s.default for s in op.scalars] == [-1, -0.5]
    np.testing.assert_allclose(ir.evaluate(op, {"X": np.ones(2)})["Y"], [-1.5, -1.5])


def test_select_only_reads_in_its_chosen_branch():
    op = parse_one("op f(X: f32[N]) -> Y: f32[N] { Y[i] = select(i > 0, X[i - 1], 0.0) }")
    np.testing.assert_array_equal(ir.evaluate(op, {"X": np.array([1.0, 2, 3])})["Y"], [0, 1, 2])


def test_large_grids_are_evaluated_in_slices(rng, monkeypatch):
    op = parse_one("op f(A: f32[M, K], B: f32[K, N]) -> Y: f32[M, N] "
                   "{ Y[m, n] = sum(k in K) { A[m, k] * B[k, n] } }")
    a, b = rng.standard_normal((9, 5)), rng.standard_normal((5, 4))
    monkeypatch.setattr(evaluate_module, "MAX_GRID_ELEMENTS", 30)
    np.testing.assert_allclose(ir.evaluate(op, {"A": a, "B": b})["Y"], a @ b, rtol=1e-12)


def test_empty_reductions_give_the_identity():
    op = parse_one("op f(X: f32[N, K]) -> (S: f32[N], M: f32[N]) "
                   "{ S[n] = sum(k in K) { X[n, k] } M[n] = max(k in K) { X[n, k] } }")
    out = ir.evaluate(op, {"X": np.zeros((3, 0))})
    np.testing.assert_array_equal(out["S"], [0, 0, 0])
    assert np.all(out["M"] == -np.inf)


def test_specialize_binds_every_symbol():
    op = parse_one(GEMM)
    bindings = {"M": 2, "K": 3, "N": 4, "alpha": 2.0, "beta": 0.5}
    spec = ir.specialize(op, bindings)
    assert spec.params[0].shape == (ir.Const(2), ir.Const(3))
    symbols = {e.name for s in spec.stages for e in ir.walk(s.body) if isinstance(e, ir.SymVar)}
    assert not symbols
    assert all(isinstance(a.extent, ir.Const) for a in spec.stages[0].axes)
    rng = np.random.default_rng(0)
    arrays = {"A": rng.random((2, 3)), "B": rng.random((3, 4)), "C": rng.random((2, 4))}
    np.testing.assert_allclose(ir.evaluate(spec, arrays)["Y"],
                               ir.evaluate(op, arrays, bindings)["Y"], rtol=1e-12)


def test_ir_nodes_are_hashable_and_comparable():
    a = parse_one(GEMM)
    b = parse_one(GEMM)
    assert a == b and hash(a.stages) == hash(b.stages)
    assert ir.simplify(ir.BinOp("+", ir.Const(2), ir.BinOp("*", ir.Const(3), ir.SymVar("N"),
                                                           "i32"), "i32")) == \
        ir.BinOp("+", ir.Const(2), ir.BinOp("*", ir.Const(3), ir.SymVar("N"), "i32"), "i32")
    assert ir.simplify(ir.BinOp("*", ir.Const(3), ir.Const(4), "i32")) == ir.Const(12)
    assert ir.bind_dim(ir.BinOp("//", ir.SymVar("C"), ir.SymVar("G"), "i32"),
                       {"C": 8, "G": 2}) == 4


def test_a_text_parsed_again_gives_the_same_operators_without_a_second_parse():
    from wpk.core.errors import DslError
    from wpk.dsl import parser

    text = "op twice(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i] * 2.0\n}\n"
    first = parse_source(text, "<twice>")
    hits = parser._parsed.cache_info().hits
    again = parse_source(text, "<twice>")
    assert again == first and again is not first          # a new list of the same operators
    assert parser._parsed.cache_info().hits == hits + 1
    for _ in range(2):                                    # a syntax error is raised each time
        with pytest.raises(DslError, match="<bad>:1"):
            parse_source("op broken(X: f32[N] -> Y", "<bad>")


def test_the_parser_tables_are_kept_in_the_cache_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    """The LALR tables are written under $WPK_CACHE_DIR/lark and read by the next process
    (a parser loaded from them has no `grammar`: lark did not build it); a damaged file is
    rebuilt and written again, and the parsers parse either way."""
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path))
    built = parser_module._lark.__wrapped__()
    cached_file = tmp_path / "lark" / "dsl-grammar.cache"
    assert hasattr(built, "grammar") and cached_file.stat().st_size > 1000
    loaded = parser_module._lark.__wrapped__()
    assert not hasattr(loaded, "grammar")
    assert loaded.parse(GEMM) == built.parse(GEMM)
    good = cached_file.read_bytes()
    cached_file.write_bytes(good[:len(good) // 2])
    rebuilt = parser_module._lark.__wrapped__()
    assert hasattr(rebuilt, "grammar") and rebuilt.parse(GEMM) == built.parse(GEMM)
    assert not hasattr(parser_module._lark.__wrapped__(), "grammar")   # whole again


def test_the_parser_works_where_the_cache_folder_cannot_be_made(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WPK_CACHE_DIR", str(blocker))
    assert parser_module._parser_cache() is False
    assert parser_module._lark.__wrapped__().parse(GEMM) is not None
