"""The DSL operator library: every `op` defined in `kernels/dsl/*.wpk`.

    load_operator("conv2d") -> compute.Operator
    list_operators()        -> ["add", "avgpool2d", ...]

Files are parsed once per process, and `load_operator` parses only the file that
defines the operator (found by its `op NAME(` line; lark's parser takes 0.15 s to
build and the ten files 0.1-0.25 s to parse, which a plan's load paid for one softmax). An
operator name is unique across the library (a duplicate is reported as a `DslError`
naming both files).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from wpk.core.errors import DslError

if TYPE_CHECKING:
    from wpk.dsl.compute import Operator

LIBRARY_DIR = Path(__file__).with_name("dsl")


def library_files() -> list[Path]:
    """The `.wpk` files of the library, sorted by name."""
    return sorted(LIBRARY_DIR.glob("*.wpk"))


_DEFINITION = re.compile(r"^op\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@functools.cache
def _parsed(path: Path) -> tuple[Operator, ...]:
    from wpk.dsl.parser import parse_file  # the parser and lark: 40 ms, for a parse only

    return tuple(parse_file(path))


@functools.cache
def _defining_files() -> dict[str, Path]:
    """{operator name: the one file whose text defines it}, from the `op NAME(` lines
    (a name on two files' lines is left to `_library`, which names both)."""
    found: dict[str, list[Path]] = {}
    for path in library_files():
        for name in _DEFINITION.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(path)
    return {name: paths[0] for name, paths in found.items() if len(paths) == 1}


@functools.cache
def _library() -> dict[str, tuple[Operator, Path]]:
    operators: dict[str, tuple[Operator, Path]] = {}
    for path in library_files():
        for op in _parsed(path):
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
    path = _defining_files().get(name)
    if path is not None:
        found = [op for op in _parsed(path) if op.name == name]
        if len(found) == 1:
            return found[0]
    entry = _library().get(name)
    if entry is None:
        raise DslError(f"no DSL library operator named '{name}'",
                       hint=f"available: {', '.join(list_operators())}")
    return entry[0]


def operator_file(name: str) -> Path:
    """The `.wpk` file that defines library operator `name`."""
    load_operator(name)
    return _library()[name][1]
