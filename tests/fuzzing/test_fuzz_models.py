"""Fuzzing (issue 13.7): random and corrupted ONNX models through `wpk inspect` and
`wpk build`; the CLI contract holds for every one (see tests/fuzzing/harness.py).
A few examples per test in CI; `scripts/fuzz.py --minutes N` runs the same longer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing.properties import check_model
from tests.fuzzing.strategies import model_bytes, models

CI = settings(max_examples=12, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))


@CI
@given(models())
def test_inspect_keeps_the_contract_on_random_models(model):
    assert check_model(model.SerializeToString(), "inspect").violations == []


@CI
@given(model_bytes())
def test_inspect_keeps_the_contract_on_damaged_model_bytes(data):
    assert check_model(data, "inspect").violations == []


@settings(CI, max_examples=4)
@given(models())
def test_build_keeps_the_contract_on_random_models(model):
    assert check_model(model.SerializeToString(), "build").violations == []


@settings(CI, max_examples=4)
@given(st.sampled_from([b"", b"\x00" * 7, b"not an onnx model", b"\x08\x07\x12"]))
def test_build_keeps_the_contract_on_garbage(data):
    assert check_model(data, "build").violations == []
