"""DSL mistakes: each gives a DslError at file:line:col with a message and a hint."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.errors import DslError
from wpk.dsl.compute import evaluate
from wpk.dsl.parser import parse_file, parse_source

HEADER = ("op f(X: f32[N, C], B: f32[C], D: f64[N], alpha: f32 = 1.0, g: int = 2) "
          "-> Y: f32[N, C] {\n")

# (kind, body lines after the header, expected line, column, message fragment)
BODY_CASES = [
    ("undefined name", "Y[n, c] = X[n, c] * beta", 2, 21, "undefined name 'beta'"),
    ("undefined tensor", "Y[n, c] = Z[n, c]", 2, 11, "undefined tensor 'Z'"),
    ("rank mismatch in a read", "Y[n, c] = X[n]", 2, 11,
     "rank mismatch: 'X' has 2 dimension(s) but is indexed with 1"),
    ("rank mismatch in a definition", "Y[n] = X[n, 0]", 2, 1,
     "rank mismatch: 'Y' has 2 dimension(s) but is defined with 1"),
    ("float widths mixed", "Y[n, c] = X[n, c] + D[n]", 2, 19,
     "type mismatch in '+': f32 and f64"),
    ("float index", "Y[n, c] = X[n, alpha]", 2, 16,
     "an index must be an integer expression, got f32"),
    ("bool in arithmetic", "Y[n, c] = X[n, c] + (n > 0)", 2, 19, "type mismatch in '+': bool"),
    ("float stored in int", "Y[n, c] = f64(X[n, c])", 2, 11,
     "type mismatch: value of 'Y' expects f32, got f64"),
    ("reduction axis outside its body",
     "Y[n, c] = sum(k in C) { X[n, k] } + X[n, k]", 2, 42,
     "'k' is a reduction axis of the reduction at 2:11"),
    ("nested reduction", "Y[n, c] = sum(k in C) { max(j in C) { X[n, j] } }", 2, 25,
     "nested reductions are not supported"),
    ("two reductions", "Y[n, c] = sum(k in C) { X[n, k] } + max(j in C) { X[n, j] }", 2, 37,
     "stage 'Y' has a second reduction (the first is at 2:11)"),
    ("reduction in an index", "Y[n, c] = X[n, sum(k in C) { k }]", 2, 16,
     "a reduction cannot appear in an index"),
    ("reduction axis shadows", "Y[n, c] = sum(n in C) { X[n, c] }", 2, 15,
     "reduction axis 'n' shadows an existing name"),
    ("assignment to an input", "X[n, c] = 0\nY[n, c] = X[n, c]", 2, 1,
     "cannot assign to input 'X'"),
    ("defined twice", "Y[n, c] = X[n, c]\nY[n, c] = X[n, c]", 3, 1, "'Y' is defined twice"),
    ("read before defined", "local T: f32[N]\nY[n, c] = T[n]\nT[n] = X[n, 0]", 3, 11,
     "'T' is read before it is defined"),
    ("undeclared stage", "T[n] = X[n, 0]\nY[n, c] = X[n, c]", 2, 1, "'T' is not declared"),
    ("local never defined", "local T: f32[N]\nY[n, c] = X[n, c]", 2, 7,
     "local 'T' is declared but never defined"),
    ("unknown function", "Y[n, c] = softsign(X[n, c])", 2, 11, "unknown function 'softsign'"),
    ("wrong arity", "Y[n, c] = clip(X[n, c], 0.0)", 2, 11,
     "'clip' takes 3 argument(s), got 2"),
    ("reduction written as a call", "Y[n, c] = sum(X[n, c])", 2, 11, "'sum' is a reduction"),
    ("float modulo", "Y[n, c] = X[n, c] % 2", 2, 19, "'%' needs integer operands"),
    ("non-bool condition", "Y[n, c] = select(X[n, c], 1.0, 0.0)", 2, 18,
     "a condition must be bool, got f32"),
    ("tensor used as a value", "Y[n, c] = X + 1", 2, 11, "'X' is a tensor"),
    ("index variable clashes", "Y[N, c] = X[0, c]", 2, 3,
     "index variable 'N' clashes with an existing name"),
    ("unbound size in a let", "let Q = M * 2\nY[n, c] = X[n, c]", 2, 9,
     "undefined symbol 'M' in a size expression"),
    ("float scalar in a size", "local T: f32[alpha]\nY[n, c] = X[n, c]", 2, 14,
     "'alpha' is a f32 scalar and cannot be used in a size"),
]


@pytest.mark.parametrize("kind,body,line,column,fragment", BODY_CASES,
                         ids=[c[0] for c in BODY_CASES])
def test_semantic_mistakes_point_at_the_right_place(kind, body, line, column, fragment):
    with pytest.raises(DslError) as info:
        parse_source(HEADER + body + "\n}\n", "k.wpk")
    message = str(info.value)
    assert message.startswith(f"k.wpk:{line}:{column}: "), message
    assert fragment in message, message
    assert info.value.hint


SIGNATURE_CASES = [
    ("unbound output dim", "op f(X: f32[N]) -> Y: f32[M] { Y[i] = 0 }", 1, 27,
     "undefined symbol 'M' in a size expression"),
    ("duplicate names", "op f(X: f32[N], X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }", 1, 17,
     "'X' is already defined at 1:6"),
    ("dim named like a tensor", "op f(N: f32[N]) -> Y: f32[N] { Y[i] = 0 }", 1, 13,
     "'N' is already defined at 1:6"),
    ("output never defined", "op f(X: f32[N]) -> Y: f32[N] { }", 1, 20,
     "output 'Y' is declared but never defined"),
    ("operator defined twice",
     "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }\nop f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }",
     2, 4, "operator 'f' is already defined at 1:4"),
    ("float default for an int scalar", "op f(X: f32[N], s: int = 1.5) -> Y: f32[N] { Y[i] = 0 }",
     1, 26, "float literal 1.5 where an integer is expected"),
]


@pytest.mark.parametrize("kind,source,line,column,fragment", SIGNATURE_CASES,
                         ids=[c[0] for c in SIGNATURE_CASES])
def test_signature_mistakes(kind, source, line, column, fragment):
    with pytest.raises(DslError) as info:
        parse_source(source, "s.wpk")
    assert str(info.value).startswith(f"s.wpk:{line}:{column}: "), str(info.value)
    assert fragment in str(info.value)
    assert info.value.hint


SYNTAX_CASES = [
    ("missing bracket", "op f(X: f32[N) -> Y: f32[N] { Y[i] = X[i] }", 1, 14,
     "syntax error: unexpected ')'", "']'"),
    ("stray character", "op f(X: f32[N]) -> Y: f32[N] {\n  Y[i] = X[i] $ 2\n}", 2, 15,
     "syntax error: unexpected character '$'", "expected"),
    ("missing closing brace", "op f(X: f32[N]) -> Y: f32[N] {\n  Y[i] = X[i]\n", 2, 14,
     "syntax error: unexpected end of file", "'}'"),
    ("keyword typo", "opp f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }", 1, 1,
     "syntax error: unexpected 'opp'", "'op'"),
]


@pytest.mark.parametrize("kind,source,line,column,fragment,hint", SYNTAX_CASES,
                         ids=[c[0] for c in SYNTAX_CASES])
def test_syntax_errors_name_what_was_expected(kind, source, line, column, fragment, hint):
    with pytest.raises(DslError) as info:
        parse_source(source, "p.wpk")
    assert str(info.value).startswith(f"p.wpk:{line}:{column}: "), str(info.value)
    assert fragment in str(info.value)
    assert hint in info.value.hint


def test_parse_file_names_the_file(tmp_path):
    path = tmp_path / "bad.wpk"
    path.write_text("op f(X: f32[N]) -> Y: f32[N] {\n  Y[i] = X[j]\n}\n")
    with pytest.raises(DslError, match=rf"^{path}:2:12: undefined name 'j'") as info:
        parse_file(path)
    assert "i" in info.value.hint  # names in scope are listed
    with pytest.raises(DslError, match="cannot read DSL file"):
        parse_file(tmp_path / "missing.wpk")


def test_runtime_mistakes_are_dsl_errors_too():
    (shift,) = parse_source("op shift(X: f32[N]) -> Y: f32[N] { Y[i] = X[i + 1] }", "r.wpk")
    with pytest.raises(DslError, match=r"r.wpk:1:4: stage Y reads X\[3\] out of bounds") as info:
        evaluate(shift, {"X": np.zeros(3)})
    assert "?: 0" in info.value.hint
    (needs,) = parse_source(
        "op f(X: f32[N], g: int) -> Y: f32[N] {\n require N % g == 0, \"N must divide\"\n"
        " Y[i] = X[i]\n}", "q.wpk")
    with pytest.raises(DslError, match="needs a value for scalar 'g'"):
        evaluate(needs, {"X": np.zeros(4)})
    with pytest.raises(DslError, match="N must divide"):
        evaluate(needs, {"X": np.zeros(4)}, {"g": 3})
    assert evaluate(needs, {"X": np.ones(4)}, {"g": 2})["Y"].sum() == 4
