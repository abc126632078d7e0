"""The fuzzing properties: one hostile input through the CLI, its contract checked.

Shared by the tests (`tests/fuzzing/test_*.py`, a few examples each) and by
`scripts/fuzz.py` (a long run that counts examples and violations).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.fuzzing.harness import MAX_MEMORY, Outcome, contract_run
from tests.fuzzing.strategies import input_shape_of

MODEL_COMMANDS = ("inspect", "build")
PLAN_COMMANDS = ("run", "report")


def model_args(command: str, input_shape: str | None = None) -> tuple[list[str], str | None]:
    """(arguments, output file) of `command` on `m.onnx`."""
    shape = [] if input_shape is None else ["--input-shape", input_shape]
    if command == "inspect":
        return ["inspect", "m.onnx", "--json", "--max-memory", MAX_MEMORY, *shape], None
    return ["build", "m.onnx", "-o", "m.wpk", "-q", "--cpu", "--no-partition",
            "--max-memory", MAX_MEMORY, *shape], "m.wpk"


def plan_args(command: str) -> tuple[list[str], str | None]:
    """(arguments, output file) of `command` on `p.wpk`."""
    if command == "run":
        return ["run", "p.wpk", "--output", "o.npz", "--repeat", "1", "--warmup", "0"], "o.npz"
    return ["report", "p.wpk", "--format", "json", "-o", "r.json"], "r.json"


def check_model(data: bytes, command: str, timeout: float | None = None) -> Outcome:
    """`wpk inspect` or `wpk build` on a model file holding `data`, contract checked."""
    args, output = model_args(command, input_shape_of(data))
    return _check(data, "m.onnx", args, output, timeout)


def check_plan(data: bytes, command: str, timeout: float | None = None) -> Outcome:
    """`wpk run` or `wpk report` on a plan file holding `data`, contract checked."""
    args, output = plan_args(command)
    return _check(data, "p.wpk", args, output, timeout)


def _check(data: bytes, name: str, args: list[str], output: str | None,
           timeout: float | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="wpk-fuzz-") as folder:
        path = Path(folder)
        (path / name).write_bytes(data)
        kwargs = {} if timeout is None else {"timeout": timeout}
        return contract_run(args, path, output, **kwargs)
