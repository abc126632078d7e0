"""Python code generated at run time, kept compiled between processes.

    code = cached_code(folder, "manifest", key, make_source)   # a code object; exec it

A library that writes Python source (fastjsonschema's validators) costs its generation
and `compile` in every process; the code object, `marshal`led, reads back in a fraction
of a millisecond. The file's name holds `key` (the caller's hash of everything the source
depends on) and the interpreter's bytecode tag (marshal's format is the interpreter's);
its first 32 bytes are the sha256 of the rest, so a damaged or truncated file is made
again, never run. A folder that cannot be made or written only costs the time it saves.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path


def _read(path: Path) -> types.CodeType | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[:32], data[32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def _write(path: Path, code: types.CodeType) -> None:
    payload = marshal.dumps(code)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(hashlib.sha256(payload).digest() + payload)
        os.replace(temp, path)
    except OSError:
        Path(temp).unlink(missing_ok=True)


def cached_code(folder: Path, name: str, key: str,
                make_source: Callable[[], str]) -> types.CodeType:
    """The compiled `make_source()`, read from `folder` when a process before made it for
    the same `key` (and interpreter), else compiled and stored there for the next."""
    path = folder / f"{name}-{key}.{sys.implementation.cache_tag}.marshal"
    code = _read(path)
    if code is None:
        code = compile(make_source(), f"<generated {name}>", "exec")
        _write(path, code)
    return code
