"""Writing a file for the user safely: checked before the work starts, written whole or
not at all, never through a link, never over anything but a regular file.

    check_output(path, "-o", inputs=[model])    # before a long build: OptionError if it
                                                # cannot end in a file at `path`
    with atomic_output(path, "-o") as handle:   # binary handle on a fresh temporary file
        handle.write(data)                      # renamed over `path` on success
    write_bytes(path, data, "-o")               # the same for bytes in memory
    write_text(path, text, "--output")

The temporary file is made by `tempfile.mkstemp` in the target folder (O_CREAT|O_EXCL, a
random name: a link planted there is never followed), synced, given the permissions
of an ordinary new file, and renamed over the target with `os.replace`, which swaps
the directory entry, so a reader sees the old file or the new one. Only a missing
path or a regular file is replaced: a folder, a device such as /dev/full, a FIFO or a
symbolic link at the target is refused, as is the command's own input file. Every
failure is an `OptionError` naming the path and the flag, and leaves no temporary
file behind.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from wpk.core.errors import OptionError

_HINT = "choose a path in an existing folder you can write to"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output(path: str | os.PathLike, flag: str,
                 inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Raise OptionError unless a file can be written at `path`: its folder exists and is
    writable, nothing but a regular file is there, and it is none of `inputs`."""
    if not isinstance(path, (str, os.PathLike)):
        raise OptionError(f"{flag} must be a path, not {type(path).__name__}",
                          hint="pass a str or a pathlib.Path")
    target = Path(os.fspath(path))
    where = f"{flag} '{target}'"
    if not target.name or target.name in (".", ".."):
        raise OptionError(f"{where} names a folder, not a file", hint=_HINT)
    folder = target.parent
    if not folder.is_dir():
        raise OptionError(f"{where}: folder '{folder}' does not exist",
                          hint=f"create it first (mkdir -p '{folder}') or {_HINT}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(f"{where}: folder '{folder}' is not writable", hint=_HINT)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OptionError(f"{where}: {exc.strerror}", hint=_HINT) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise OptionError(f"{where} is {_kind(mode)}; only a regular file is replaced",
                          hint="give the path of a new or regular file")
    for source in inputs:
        if _same_file(target, Path(os.fspath(source))):
            raise OptionError(f"{where} is the input file '{source}'; writing it would "
                              "destroy the input", hint="write to another path")
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, flag: str = "output") -> Iterator[BinaryIO]:
    """A binary handle on a new temporary file next to `path`, renamed over `path` when the
    block ends without an error; removed otherwise. OptionError if it cannot be written."""
    target = check_output(path, flag)
    try:
        handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                        suffix=".tmp")
    except OSError as exc:
        raise OptionError(f"{flag} '{target}': cannot create a file in '{target.parent}' "
                          f"({exc.strerror})", hint=_HINT) from None
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes it private; outputs are ordinary
        check_output(target, flag)         # nothing but a regular file appeared meanwhile
        os.replace(temp, target)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise OptionError(f"{flag} '{target}': cannot write it ({exc.strerror})",
                          hint=_HINT) from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes, flag: str = "output") -> Path:
    """Write `data` to `path` atomically (see `atomic_output`); returns the path."""
    with atomic_output(path, flag) as handle:
        handle.write(data)
    return Path(os.fspath(path))


def write_text(path: str | os.PathLike, text: str, flag: str = "output") -> Path:
    """Write `text` (UTF-8) to `path` atomically (see `atomic_output`); returns the path."""
    return write_bytes(path, text.encode("utf-8"), flag)
