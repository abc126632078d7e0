"""Fixtures of the CLI error tests (test_cli_errors, test_hostile_input): a small Conv
model and its CPU plan; under pytest-xdist, the ONNX backend suite's counts merged from
the workers (`test_onnx_backend`)."""

from __future__ import annotations

import json

import pytest

from tests.integration.onnx_cases import SUMMARY_KEY, summary_lines
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


_BACKEND_OUTCOMES: dict[str, list] = {}
_BACKEND_FALLBACK_SECONDS = [0.0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: keep a finished worker's ONNX backend outcomes."""
    data = getattr(node, "workeroutput", {}).get(SUMMARY_KEY)
    if data:
        outcomes, seconds = json.loads(data)
        _BACKEND_OUTCOMES.update(outcomes)
        _BACKEND_FALLBACK_SECONDS[0] += seconds


def pytest_terminal_summary(terminalreporter, config):
    """The ONNX backend suite's counts over every xdist worker (a run without xdist prints
    them when the module ends)."""
    if _BACKEND_OUTCOMES:
        for line in ["", *summary_lines(_BACKEND_OUTCOMES, _BACKEND_FALLBACK_SECONDS[0])]:
            terminalreporter.write_line(line)
