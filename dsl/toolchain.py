"""Host toolchain: gcc to shared libraries, loaded with ctypes, and the compile cache.

    compile_c(source)          -> CompiledArtifact(path, key, cached, log)
    compile_c_shared(source)   -> Path of the .so (what the kernel builders call)
    load_function(path, name, argtypes) -> ctypes function

Every compiler output is cached under `$WPK_CACHE_DIR` (default `~/.cache/wpk`),
in `compile/`, keyed by the sha256 of (source, flags, compiler version,
codegen version), so changing any of them recompiles and nothing stale is
reused. Writes are atomic (temporary file, then rename), so concurrent
workers never see half a file. The CUDA compilers live in `toolchain_cuda`.

A CPU plan carries the libraries its steps load (`wpk.native_bundle`), keyed by
`bundle_key` (source, flags and codegen version: not the compiler, which the host that
loads a plan need not have); `use_bundled_libraries` makes `compile_c` return those
without compiling, and `recording_libraries` collects what `compile_c` hands out.

Most of a small AVX kernel's compile was gcc parsing <immintrin.h> (0.24 s of
0.32 s), so gcc reads it from a precompiled header instead (`immintrin_flags`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from wpk.core.devices import compiler_isa_flags
from wpk.core.errors import ToolchainError

# Bump when the code generators change what they emit for the same input (the compile
# cache and plans' bundled libraries; tuning records' fingerprints also carry a digest of
# the kernel code, `wpk.kernels.target.codegen_version`).
CODEGEN_VERSION = "1"
# Everything but the ISA, which `c_flags` adds for the host (see `compiler_isa_flags`).
BASE_C_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-fno-math-errno")
COMPILE_TIMEOUT_S = 300


@dataclass(frozen=True)
class CompiledArtifact:
    """A compiler output in the cache: its path, cache key, whether it was a hit, and log."""

    path: Path
    key: str
    cached: bool
    log: str = ""


def cache_root() -> Path:
    """`$WPK_CACHE_DIR`, or `~/.cache/wpk`."""
    root = os.environ.get("WPK_CACHE_DIR") or os.path.join(Path.home(), ".cache", "wpk")
    return Path(root)


def compile_cache_dir() -> Path:
    path = cache_root() / "compile"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(source: str, flags: Sequence[str], compiler_version: str,
              codegen_version: str = CODEGEN_VERSION) -> str:
    """sha256 of everything the output depends on."""
    payload = json.dumps({"source": source, "flags": list(flags), "compiler": compiler_version,
                          "codegen": codegen_version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def bundle_key(source: str, flags: Sequence[str],
               codegen_version: str = CODEGEN_VERSION) -> str:
    """sha256 of what a library a plan carries was built from, less the compiler."""
    payload = json.dumps({"source": source, "flags": list(flags), "codegen": codegen_version},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


# Libraries that loaded plans brought, by bundle key, and the collectors of
# `recording_libraries` (both touched from one thread at a time: a plan's load or build).
_BUNDLED: dict[str, Path] = {}
_RECORDERS: list[dict[str, Path]] = []


@contextlib.contextmanager
def recording_libraries():
    """Collects {bundle key: library path} of every `compile_c` call inside the block."""
    found: dict[str, Path] = {}
    _RECORDERS.append(found)
    try:
        yield found
    finally:
        _RECORDERS.remove(found)


def use_bundled_libraries(libraries: Mapping[str, bytes]) -> None:
    """From now on `compile_c` returns these libraries ({bundle key: shared library bytes},
    a plan's) for their sources instead of compiling: each is written into the compile
    cache (`bundled_<key>.so`, unless the same bytes are there) and loaded from there, or
    from a private temporary folder where the cache cannot be written (a read-only home)."""
    try:
        placed = _placed(compile_cache_dir(), libraries)
    except OSError:
        placed = _placed(Path(tempfile.mkdtemp(prefix="wpk-native-")), libraries)
    _BUNDLED.update(placed)


def _placed(directory: Path, libraries: Mapping[str, bytes]) -> dict[str, Path]:
    """{key: path} of the libraries written into `directory` (kept where its bytes are)."""
    paths = {}
    for key, data in libraries.items():
        path = paths[key] = directory / f"bundled_{key[:32]}.so"
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data)
    return paths


def temp_tag() -> str:
    """A name part unique to this process and thread: two threads compiling the same
    source (an offline build's compile pool) must not share a temporary file."""
    return f"{os.getpid()}.{threading.get_ident()}"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{temp_tag()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def run_tool(argv: Sequence[str], what: str, hint: str, cwd: Path | None = None) \
        -> subprocess.CompletedProcess:
    """Run a compiler; a missing executable or a timeout is a ToolchainError."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd,
                              timeout=COMPILE_TIMEOUT_S)
    except FileNotFoundError:
        raise ToolchainError(f"{what}: {argv[0]} not found", hint=hint) from None
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what}: {argv[0]} ran longer than {COMPILE_TIMEOUT_S} s",
                             hint="simplify the kernel or its schedule") from None


# ----------------------------------------------------------------------------- gcc

GCC_HINT = "install gcc (e.g. `apt-get install gcc`) or set CC to a C compiler"


def c_compiler() -> str:
    """The C compiler: $CC if set, else gcc on PATH."""
    cc = os.environ.get("CC") or shutil.which("gcc")
    if not cc:
        raise ToolchainError("no C compiler found (gcc is not on PATH)", hint=GCC_HINT)
    return cc


@functools.cache
def compiler_version(executable: str) -> str:
    """First line of `executable --version` (part of every cache key)."""
    proc = run_tool([executable, "--version"], f"{executable} --version", GCC_HINT)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else executable


def c_flags() -> tuple[str, ...]:
    """gcc flags of generated kernels: `BASE_C_FLAGS` plus the host's ISA level, which is
    part of every cache key, so a cache shared by an AVX-512 and an AVX2 machine never
    hands one the other's binary."""
    return (*BASE_C_FLAGS, *compiler_isa_flags())


def compile_c(source: str, flags: Sequence[str] | None = None,
              libraries: Sequence[str] = ("-lm",),
              codegen_version: str = CODEGEN_VERSION) -> CompiledArtifact:
    """Compile C `source` into a shared library (cached); `flags` default to `c_flags()`."""
    flags = c_flags() if flags is None else flags
    bundled = bundle_key(source, [*flags, *libraries], codegen_version)
    artifact = _cached_or_compiled(source, flags, libraries, codegen_version, bundled)
    for found in _RECORDERS:
        found[bundled] = artifact.path
    return artifact


def _cached_or_compiled(source: str, flags: Sequence[str], libraries: Sequence[str],
                        codegen_version: str, bundled: str) -> CompiledArtifact:
    carried = _BUNDLED.get(bundled)
    if carried is not None and carried.exists():   # a loaded plan's own: no compiler needed
        return CompiledArtifact(carried, bundled, True)
    cc = c_compiler()
    all_flags = [*flags, *libraries]
    key = cache_key(source, all_flags, compiler_version(cc), codegen_version)
    directory = compile_cache_dir()
    lib = directory / f"c_{key[:32]}.so"
    if lib.exists():
        return CompiledArtifact(lib, key, True)
    src = directory / f"c_{key[:32]}.c"
    atomic_write(src, source)
    tmp = lib.with_name(f".{lib.name}.{temp_tag()}.tmp")
    proc = run_tool([cc, *flags, *immintrin_flags(source, cc, flags), str(src), "-o", str(tmp),
                     *libraries], "compiling C", GCC_HINT)
    if proc.returncode != 0:
        raise ToolchainError(f"{cc} failed to compile {src}:\n{proc.stderr[-4000:]}",
                             hint="the source is kept there; a generated kernel failing to "
                                  "compile is a code generator bug")
    os.replace(tmp, lib)
    return CompiledArtifact(lib, key, False, proc.stderr)


def compile_c_shared(source: str, flags: Sequence[str] | None = None) -> Path:
    """Path of the shared library built from C `source` (cached; default `c_flags()`)."""
    flags = c_flags() if flags is None else flags
    has_shared = "-shared" in flags
    flags = list(flags) if has_shared else [*flags, "-shared", "-fPIC"]
    return compile_c(source, flags).path


class MissingLibraryError(ToolchainError):
    """A kernel library needs a shared library this host lacks (libgomp on a slim image
    that loads a plan built elsewhere): its hint says how to install it."""


# what the dynamic loader says of a library it cannot find
_CANNOT_OPEN = re.compile(r"^(?P<name>[^:]+): cannot open shared object file")
_OPENMP_HINT = ("install the GNU OpenMP runtime the kernels were compiled against "
                "(Debian/Ubuntu: apt install libgomp1; Fedora/RHEL: dnf install libgomp; "
                "Alpine: apk add libgomp)")


def _load_error(library: Path | str, name: str, exc: Exception) -> ToolchainError:
    """The error of a library that did not load: a dependency it names that this host
    lacks, or the library itself damaged or gone."""
    missing = _CANNOT_OPEN.match(str(exc))
    if missing and Path(missing["name"]).name != Path(library).name:
        dependency = missing["name"]
        hint = _OPENMP_HINT if dependency.startswith("libgomp.") else (
            f"install the package that provides {dependency} on this host")
        return MissingLibraryError(f"cannot load {name} from {library}: it needs "
                                   f"{dependency}, which this host does not have", hint=hint)
    return ToolchainError(f"cannot load {name} from {library}: {exc}",
                          hint="delete the compile cache ($WPK_CACHE_DIR/compile) and retry")


def load_function(library: Path | str, name: str, argtypes: Sequence, restype=None):
    """A ctypes function `name` from a shared library."""
    try:
        lib = ctypes.CDLL(str(library))
        fn = getattr(lib, name)
    except (OSError, AttributeError) as exc:
        raise _load_error(library, name, exc) from None
    fn.argtypes = list(argtypes)
    fn.restype = restype
    fn._library = lib  # keep the library alive as long as the function
    return fn


# ------------------------------------------------------------ precompiled <immintrin.h>
#
# AVX-512 and AVX2 kernels include <immintrin.h> for a handful of intrinsics, and parsing it
# was most of a small kernel's compile (0.24 s of 0.32 s). gcc reads a precompiled header
# (`.gch`) in milliseconds when it was built by the same compiler with the same options, so
# the first compile with a flag set builds one into the compile cache
# (`pch/<key>/wpk_immintrin.h.gch`, about 25 MB, keyed like a kernel by the compiler's
# version and the flags) and every source that includes <immintrin.h> before defining
# anything is compiled with `-include` of it: the header's guard makes the source's own
# include a no-op and the machine code is the same, so kernels keep their cache keys. gcc
# reads the plain header when a `.gch` does not match; a header that cannot be built (not
# gcc, no PCH support) costs only the speed.

PCH_HEADER = "wpk_immintrin.h"
_IMMINTRIN = "#include <immintrin.h>"
_DEFINE = re.compile(r"^\s*#\s*define\b", re.MULTILINE)


def immintrin_flags(source: str, cc: str, flags: Sequence[str]) -> list[str]:
    """`-include` of the precompiled <immintrin.h> for `cc` and `flags` when `source`
    includes <immintrin.h> before any `#define` (a feature macro must precede the first
    system header) and `cc` is gcc; else []."""
    position = source.find(_IMMINTRIN)
    if position < 0 or _DEFINE.search(source, 0, position):
        return []
    if "gcc" not in compiler_version(cc).lower():
        return []
    header = _precompiled_immintrin(cc, tuple(f for f in flags if f != "-shared"))
    return [] if header is None else ["-include", str(header)]


def pch_dir(cc: str, flags: Sequence[str]) -> Path:
    """The folder of the precompiled header for `cc` and (compile-only) `flags`, keyed as
    a kernel compiled from the header's one line would be (`cache_key`)."""
    return cache_root() / "pch" / cache_key(_IMMINTRIN, flags, compiler_version(cc))[:32]


_UNBUILDABLE: set[tuple[str, tuple[str, ...]]] = set()   # (cc, flags) whose header failed


def _precompiled_immintrin(cc: str, flags: tuple[str, ...]) -> Path | None:
    """The header's path once its `.gch` exists in the current compile cache (built here
    when missing); None when gcc cannot build it, remembered for this process."""
    if (cc, flags) in _UNBUILDABLE:
        return None
    directory = pch_dir(cc, flags)
    header, compiled = directory / PCH_HEADER, directory / f"{PCH_HEADER}.gch"
    if compiled.exists():
        return header
    directory.mkdir(parents=True, exist_ok=True)
    if not header.exists():
        atomic_write(header, _IMMINTRIN + "\n")
    tmp = compiled.with_name(f".{compiled.name}.{temp_tag()}.tmp")
    try:
        proc = run_tool([cc, *flags, "-x", "c-header", str(header), "-o", str(tmp)],
                        "precompiling <immintrin.h>", GCC_HINT)
    except ToolchainError:
        proc = None
    if proc is None or proc.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        _UNBUILDABLE.add((cc, flags))
        return None
    os.replace(tmp, compiled)
    return header
