"""Fixtures of the CLI error tests (test_cli_errors, test_hostile_input): a small Conv
model and its CPU plan."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_errors import _conv_model, run_cli


@pytest.fixture
def model(tmp_path, rng) -> str:
    """A Conv+Relu model saved in `tmp_path`."""
    return _conv_model(tmp_path / "model.onnx", rng)


@pytest.fixture
def plan(tmp_path, model, capsys) -> str:
    """`model` built for the CPU (untuned) into `tmp_path`."""
    path = tmp_path / "model.wpk"
    code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", path, "--quiet")
    assert code == 0, err
    return str(path)
