"""The DSL operator library: every `op` defined in `kernels/dsl/*.wpk`.

    load_operator("conv2d") -> compute.Operator
    list_operators()        -> ["add", "avgpool2d", ...]

Files are parsed once per process. An operator name is unique across the
library (a duplicate is reported as a `DslError` naming both files).
"""

from __future__ import annotations

import functools
from pathlib import Path

from wpk.core.errors import DslError
from wpk.dsl.compute import Operator
from wpk.dsl.parser import parse_file

LIBRARY_DIR = Path(__file__).with_name("dsl")


def library_files() -> list[Path]:
    """The `.wpk` files of the library, sorted by name."""
    return sorted(LIBRARY_DIR.glob("*.wpk"))


@functools.cache
def _library() -> dict[str, tuple[Operator, Path]]:
    operators: dict[str, tuple[Operator, Path]] = {}
    for path in library_files():
        for op in parse_file(path):
            if op.name in operators:
                raise DslError(f"{path}: operator '{op.name}' is also defined in "
                               f"{operators[op.name][1]}", hint="rename one of them")
            operators[op.name] = (op, path)
    return operators


def list_operators() -> list[str]:
    """Names of every library operator, sorted."""
    return sorted(_library())


def load_operator(name: str) -> Operator:
    """The compute IR of library operator `name` (DslError if there is none)."""
    entry = _library().get(name)
    if entry is None:
        raise DslError(f"no DSL library operator named '{name}'",
                       hint=f"available: {', '.join(list_operators())}")
    return entry[0]


def operator_file(name: str) -> Path:
    """The `.wpk` file that defines library operator `name`."""
    load_operator(name)
    return _library()[name][1]
