"""CUDA toolchains: nvcc for sm_75+, NVRTC 12 + ptxas (PyPI wheels) for sm_60/sm_70.

    compile_cuda(source, "sm_90")  -> CudaBinary(cubin, ptx, usage, log, compiler, cached)
    parse_ptxas_usage(log)         -> ResourceUsage(registers, shared_bytes, spills, stack)

nvcc 13 dropped sm_60 and sm_70, so those (and any arch when nvcc is absent)
go through NVRTC 12 from `nvidia-cuda-nvrtc-cu12` (loaded with ctypes) to PTX
for `compute_XY`, then the wheel `nvidia-cuda-nvcc-cu12`'s `ptxas -v` to a
cubin. Both paths report ptxas resource usage, so register pressure, shared
memory and spills are known without a GPU. Results are cached like C builds
(`wpk.dsl.toolchain`), keyed by source, flags, arch and compiler versions.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from wpk.core.errors import ToolchainError
from wpk.dsl.toolchain import (
    CODEGEN_VERSION,
    atomic_write,
    cache_key,
    compile_cache_dir,
    run_tool,
    temp_tag,
)

NVCC_MIN_ARCH = 75
NVCC_FLAGS = ("-O3", "--use_fast_math")
NVRTC_FLAGS = ("--use_fast_math",)
WHEEL_HINT = ("pip install wpk[cuda] (installs nvidia-cuda-nvrtc-cu12 and "
              "nvidia-cuda-nvcc-cu12, which compile for every preset)")
NVCC_HINT = "install the CUDA toolkit (nvcc) or " + WHEEL_HINT


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel resources reported by `ptxas -v` (bytes except registers)."""

    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    constant_bytes: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class CudaBinary:
    """A compiled CUDA module: cubin bytes, PTX (NVRTC path), usage per kernel, log."""

    arch: str
    cubin: bytes
    ptx: str | None
    kernels: dict[str, ResourceUsage]
    log: str
    compiler: str
    cached: bool = False

    @property
    def usage(self) -> ResourceUsage:
        """Usage over all kernels: max registers/shared/stack, summed spills."""
        return merge_usage(self.kernels.values())


_FUNCTION = re.compile(r"Function properties for (\S+)")
_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas_report(text: str) -> dict[str, ResourceUsage]:
    """Resource usage of every kernel in `ptxas -v` output, by (mangled) name."""
    kernels: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _COMPILING.search(line) or _FUNCTION.search(line)
        if m:
            current = m.group(1)
            kernels.setdefault(current, {})
            continue
        if current is None:
            continue
        m = _STACK.search(line)
        if m:
            kernels[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                    spill_loads=int(m.group(3)))
        m = _USED.search(line)
        if m:
            kernels[current]["registers"] = int(m.group(1))
            smem = _SMEM.search(line)
            kernels[current]["shared_bytes"] = int(smem.group(1)) if smem else 0
            cmem = _CMEM.search(line)
            if cmem:
                kernels[current]["constant_bytes"] = int(cmem.group(1))
    return {name: ResourceUsage(**values) for name, values in kernels.items()}


def merge_usage(usages) -> ResourceUsage:
    usages = list(usages)
    if not usages:
        return ResourceUsage()
    return ResourceUsage(
        registers=max(u.registers for u in usages),
        shared_bytes=max(u.shared_bytes for u in usages),
        spill_stores=sum(u.spill_stores for u in usages),
        spill_loads=sum(u.spill_loads for u in usages),
        stack=max(u.stack for u in usages),
        constant_bytes=max(u.constant_bytes for u in usages))


def parse_ptxas_usage(text: str, kernel: str | None = None) -> ResourceUsage:
    """Usage of `kernel` (a substring of its name), or merged over all kernels."""
    report = parse_ptxas_report(text)
    if kernel is not None:
        matches = [u for name, u in report.items() if kernel in name]
        if not matches:
            raise ToolchainError(f"ptxas output names no kernel matching '{kernel}'",
                                 hint=f"kernels: {', '.join(report) or 'none'}")
        return merge_usage(matches)
    return merge_usage(report.values())


def arch_number(arch: str) -> int:
    """60 for 'sm_60' (also accepts 'compute_60', '60', '6.0')."""
    m = re.fullmatch(r"(?:sm_|compute_)?(\d)\.?(\d)", arch.strip())
    if not m:
        raise ToolchainError(f"invalid CUDA architecture '{arch}'",
                             hint="use sm_60, sm_70, sm_75, sm_80 or sm_90")
    return int(m.group(1) + m.group(2))


# ----------------------------------------------------------------------------- locating tools


def _wheel_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_nvcc() -> str | None:
    """nvcc on PATH, else /usr/local/cuda/bin/nvcc, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def find_wheel_ptxas() -> Path | None:
    base = _wheel_dir("nvidia.cuda_nvcc")
    path = base / "bin" / "ptxas" if base else None
    return path if path is not None and path.exists() else None


def find_libnvrtc() -> Path | None:
    base = _wheel_dir("nvidia.cuda_nvrtc")
    path = base / "lib" / "libnvrtc.so.12" if base else None
    return path if path is not None and path.exists() else None


@functools.cache
def tool_version(executable: str) -> str:
    """Last line of `executable --version` (e.g. 'Build cuda_13.0.r13.0/compiler...')."""
    proc = run_tool([executable, "--version"], f"{executable} --version", NVCC_HINT)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return " ".join(lines[-2:]) if lines else executable


def nvcc_supports(arch: str) -> bool:
    return arch_number(arch) >= NVCC_MIN_ARCH and find_nvcc() is not None


def nvrtc_available() -> bool:
    return find_libnvrtc() is not None and find_wheel_ptxas() is not None


# ----------------------------------------------------------------------------- NVRTC (ctypes)


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    path = find_libnvrtc()
    if path is None:
        raise ToolchainError("NVRTC 12 is not installed", hint=WHEEL_HINT)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise ToolchainError(f"cannot load {path}: {exc}", hint=WHEEL_HINT) from None
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def nvrtc_version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"nvrtc {major.value}.{minor.value}"


def nvrtc_compile_ptx(source: str, arch: str, flags: Sequence[str] = NVRTC_FLAGS,
                      name: str = "kernel.cu") -> tuple[str, str]:
    """(PTX, log) of CUDA C `source` for virtual arch compute_XY, via NVRTC."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()

    def check(status: int, what: str, log: str = "") -> None:
        if status != 0:
            message = lib.nvrtcGetErrorString(status).decode()
            raise ToolchainError(f"NVRTC {what} failed ({message}) for compute_"
                                 f"{arch_number(arch)}:\n{log[-4000:]}",
                                 hint="a generated kernel failing to compile is a code "
                                      "generator bug; the log names the line")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0,
                                 None, None), "create")
    try:
        options = [f"--gpu-architecture=compute_{arch_number(arch)}", *flags]
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buffer)
        log = buffer.value.decode(errors="replace")
        check(status, "compilation", log)
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, buffer), "PTX extraction")
        return buffer.value.decode(), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ----------------------------------------------------------------------------- compile


def compile_cuda(source: str, arch: str, flags: Sequence[str] | None = None,
                 compiler: str = "auto", codegen_version: str = CODEGEN_VERSION) -> CudaBinary:
    """Compile CUDA C to a cubin for `arch` ('sm_60'...'sm_90'), with ptxas usage (cached).

    `compiler` is 'nvcc', 'nvrtc' or 'auto' (nvcc for sm_75+ when present,
    else NVRTC 12 + ptxas from the PyPI wheels).
    """
    number = arch_number(arch)
    if compiler == "auto":
        compiler = "nvcc" if nvcc_supports(arch) else "nvrtc"
    if compiler == "nvcc":
        nvcc = find_nvcc()
        if nvcc is None:
            raise ToolchainError(f"nvcc not found, needed for sm_{number}", hint=NVCC_HINT)
        if number < NVCC_MIN_ARCH:
            raise ToolchainError(f"nvcc 13 cannot compile for sm_{number}",
                                 hint="use compiler='nvrtc' (" + WHEEL_HINT + ")")
        flags = tuple(NVCC_FLAGS if flags is None else flags)
        version = tool_version(nvcc)
    elif compiler == "nvrtc":
        if not nvrtc_available():
            raise ToolchainError(f"NVRTC 12 and ptxas wheels are needed for sm_{number}",
                                 hint=WHEEL_HINT)
        flags = tuple(NVRTC_FLAGS if flags is None else flags)
        version = f"{nvrtc_version()} / {tool_version(str(find_wheel_ptxas()))}"
    else:
        raise ToolchainError(f"unknown CUDA compiler '{compiler}'", hint="use nvcc or nvrtc")
    key = cache_key(source, [f"sm_{number}", compiler, *flags], version, codegen_version)
    directory = compile_cache_dir()
    stem = directory / f"cu_{key[:32]}"
    cubin_path, meta_path = stem.with_suffix(".cubin"), stem.with_suffix(".json")
    if cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return CudaBinary(f"sm_{number}", cubin_path.read_bytes(), meta["ptx"],
                          {k: ResourceUsage(**v) for k, v in meta["kernels"].items()},
                          meta["log"], meta["compiler"], cached=True)
    if compiler == "nvcc":
        binary = _compile_nvcc(source, number, flags, stem)
    else:
        binary = _compile_nvrtc(source, number, flags, stem)
    atomic_write(cubin_path, binary.cubin)
    atomic_write(meta_path, json.dumps({
        "ptx": binary.ptx, "log": binary.log, "compiler": binary.compiler,
        "kernels": {k: asdict(v) for k, v in binary.kernels.items()}}))
    return binary


def _compile_nvcc(source: str, number: int, flags: Sequence[str], stem: Path) -> CudaBinary:
    src = stem.with_suffix(".cu")
    atomic_write(src, source)
    out = stem.with_name(f".{stem.name}.{temp_tag()}.cubin")
    proc = run_tool([find_nvcc(), "-cubin", f"-arch=sm_{number}", *flags, "-Xptxas", "-v",
                     "-o", str(out), str(src)], f"compiling CUDA for sm_{number}", NVCC_HINT)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise ToolchainError(f"nvcc failed for sm_{number} on {src}:\n{log[-4000:]}",
                             hint="a generated kernel failing to compile is a code generator "
                                  "bug; the source is kept there")
    cubin = out.read_bytes()
    out.unlink()
    return CudaBinary(f"sm_{number}", cubin, None, parse_ptxas_report(log), log, "nvcc")


def _compile_nvrtc(source: str, number: int, flags: Sequence[str], stem: Path) -> CudaBinary:
    ptx, nvrtc_log = nvrtc_compile_ptx(source, f"sm_{number}", flags)
    ptx_path = stem.with_suffix(".ptx")
    atomic_write(ptx_path, ptx)
    out = stem.with_name(f".{stem.name}.{temp_tag()}.cubin")
    proc = run_tool([str(find_wheel_ptxas()), f"-arch=sm_{number}", "-O3", "-v",
                     str(ptx_path), "-o", str(out)], f"ptxas for sm_{number}", WHEEL_HINT)
    log = nvrtc_log + proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise ToolchainError(f"ptxas failed for sm_{number} on {ptx_path}:\n{log[-4000:]}",
                             hint="a generated kernel failing to assemble is a code generator "
                                  "bug")
    cubin = out.read_bytes()
    out.unlink()
    return CudaBinary(f"sm_{number}", cubin, ptx, parse_ptxas_report(log), log, "nvrtc+ptxas")
