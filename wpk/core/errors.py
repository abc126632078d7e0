"""The one error hierarchy of wpk.

Every error a user can cause is a `WpkError` (or subclass) whose message says
what went wrong and where (file, node name, or line:col of a DSL file), and
whose `hint` says what to do. The CLI prints `error: <message>` and
`hint: <hint>` on stderr and exits with code 2; anything else is an internal
error (exit code 1).
"""

from __future__ import annotations


class WpkError(Exception):
    """A user-facing error: bad file, bad flag, unsupported model, mismatched plan."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ModelError(WpkError):
    """The ONNX model cannot be read, fails the checker or is malformed."""


class UnsupportedError(WpkError):
    """The model uses something wpk cannot execute (with --strict: any fallback)."""


class ShapeError(WpkError):
    """A shape cannot be determined or an input shape is missing/invalid."""


class ValueShapeError(ShapeError):
    """A tensor's shape depends on the values of the graph's inputs (NonZero, NMS, ...):
    the build runs the nodes from there on in onnxruntime (`wpk.value_tail`). `tensor`
    names it."""

    def __init__(self, message: str, hint: str | None = None, tensor: str | None = None):
        super().__init__(message, hint)
        self.tensor = tensor


class OptionError(WpkError):
    """A command-line flag or API option is invalid."""


class PlanError(WpkError):
    """A plan file is corrupted, from another format version or for another device."""


class InputError(WpkError):
    """Inputs given at run time do not match the plan (name, shape, dtype)."""


class DeviceError(WpkError):
    """The requested device is absent or does not match."""


class DslError(WpkError):
    """A DSL source file has a syntax or type error (message carries file:line:col)."""


class ScheduleError(WpkError):
    """A schedule configuration is invalid for the workload or the target."""


class ToolchainError(WpkError):
    """A compiler needed for the target is missing or failed."""


class ClusterError(WpkError):
    """A Ray cluster (`--cluster`) cannot be reached, or has no node left that can measure
    for the build target."""
