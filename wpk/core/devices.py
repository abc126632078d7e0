"""Hardware specifications, in one place: the host CPU and the NVIDIA GPU presets.

    host_cpu()          -> HardwareSpec of this machine (ISA flags this process can run,
                           vector width, cores, cache sizes from sysfs)
    gpu_preset("t4")    -> HardwareSpec of a preset: p100 (sm_60), v100 (sm_70),
                           t4 (sm_75), a100 (sm_80), h100 (sm_90), h200 (sm_90)
    detect_gpus()       -> the GPUs present (nvidia-smi or cupy), [] without any

GPU figures are NVIDIA's published specifications of the SXM boards (PCIe for
T4) from the CUDA programming guide's compute-capability tables and the
product datasheets. Schedules are checked against these limits (threads and
shared memory per block, registers), so every target can be compiled and
checked on a machine without a GPU.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from wpk.core.errors import DeviceError

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class HardwareSpec:
    """Limits and throughput of one target (CPU host or GPU), all sizes in bytes."""

    name: str                                  # 'cpu' or a preset name such as 'h100'
    kind: str                                  # 'cpu' | 'cuda'
    arch: str                                  # 'x86_64' ... or 'sm_90'
    description: str = ""
    cores: int = 1                             # CPU cores, or SMs on a GPU
    # CPU
    isa_flags: tuple[str, ...] = ()
    vector_bits: int = 0
    vector_registers: int = 0
    l1_bytes: int = 0
    l2_bytes: int = 0                          # per core on CPUs, whole chip on GPUs
    l3_bytes: int = 0
    # GPU
    compute_capability: tuple[int, int] | None = None
    sm_count: int = 0
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 0
    shared_memory_per_block: int = 48 * KIB    # without opt-in
    shared_memory_per_block_optin: int = 48 * KIB
    shared_memory_per_sm: int = 0
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    memory_bytes: int = 0
    # throughput
    memory_bandwidth_gbs: float = 0.0
    fp32_tflops: float = 0.0

    @property
    def vector_lanes(self) -> int:
        """float32 lanes of the widest SIMD register (1 on a GPU thread)."""
        return max(1, self.vector_bits // 32)

    @property
    def sm_arch(self) -> str | None:
        """'sm_XY' for a GPU, None for the CPU."""
        return self.arch if self.kind == "cuda" else None

    @property
    def fingerprint(self) -> str:
        """What a compiled kernel depends on: GPU arch, or CPU arch plus SIMD ISA."""
        if self.kind == "cuda":
            return f"cuda:{self.arch}"
        simd = [f for f in ("avx512f", "avx512bw", "avx512vl", "avx2", "fma", "avx", "sse4_2",
                            "neon", "asimd") if f in self.isa_flags]
        return f"cpu:{self.arch}:{','.join(simd) or 'scalar'}"

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["vector_lanes"] = self.vector_lanes
        data["fingerprint"] = self.fingerprint
        return data


def _gpu(name, cc, description, sms, threads_per_sm, smem_optin, smem_sm, l2_mib, mem_gib,
         bandwidth, tflops) -> HardwareSpec:
    return HardwareSpec(
        name=name, kind="cuda", arch=f"sm_{cc[0]}{cc[1]}", description=description, cores=sms,
        compute_capability=cc, sm_count=sms, max_threads_per_sm=threads_per_sm,
        shared_memory_per_block_optin=smem_optin, shared_memory_per_sm=smem_sm,
        l2_bytes=int(l2_mib * MIB), memory_bytes=mem_gib * 1024 * MIB,
        memory_bandwidth_gbs=bandwidth, fp32_tflops=tflops)


GPU_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec for spec in (
        _gpu("p100", (6, 0), "Tesla P100 SXM2 16GB", 56, 2048, 48 * KIB, 64 * KIB, 4, 16,
             732.0, 10.6),
        _gpu("v100", (7, 0), "Tesla V100 SXM2 32GB", 80, 2048, 96 * KIB, 96 * KIB, 6, 32,
             900.0, 15.7),
        _gpu("t4", (7, 5), "Tesla T4 16GB", 40, 1024, 64 * KIB, 64 * KIB, 4, 16, 320.0, 8.1),
        _gpu("a100", (8, 0), "A100 SXM4 80GB", 108, 2048, 163 * KIB, 164 * KIB, 40, 80,
             2039.0, 19.5),
        _gpu("h100", (9, 0), "H100 SXM5 80GB", 132, 2048, 227 * KIB, 228 * KIB, 50, 80,
             3350.0, 67.0),
        _gpu("h200", (9, 0), "H200 SXM 141GB", 132, 2048, 227 * KIB, 228 * KIB, 50, 141,
             4800.0, 67.0),
    )
}


def gpu_preset(name: str) -> HardwareSpec:
    """The preset called `name` (case-insensitive); 'auto' picks the first detected GPU."""
    key = name.strip().lower()
    if key == "auto":
        for gpu in detect_gpus():
            if gpu.preset is not None:
                return GPU_PRESETS[gpu.preset]
        raise DeviceError("--gpu auto: no supported NVIDIA GPU detected",
                          hint=f"name a preset ({', '.join(GPU_PRESETS)}) or use --cpu")
    if key not in GPU_PRESETS:
        raise DeviceError(f"unknown GPU preset '{name}'",
                          hint=f"presets are {', '.join(GPU_PRESETS)} (or auto)")
    return GPU_PRESETS[key]


def preset_for_compute_capability(cc: tuple[int, int], name: str = "") -> str | None:
    """The preset matching a GPU's compute capability (and product name for sm_90)."""
    if cc == (9, 0):
        return "h200" if "h200" in name.lower() else "h100"
    return next((p.name for p in GPU_PRESETS.values() if p.compute_capability == cc), None)


# ----------------------------------------------------------------------------- CPU


# /proc/cpuinfo's names of SIMD extensions -> numpy's names of the same runtime checks.
RUNTIME_CHECKED = {
    "sse4_1": "SSE41", "sse4_2": "SSE42", "avx": "AVX", "f16c": "F16C", "fma": "FMA3",
    "avx2": "AVX2", "avx512f": "AVX512F", "avx512cd": "AVX512CD", "avx512bw": "AVX512BW",
    "avx512dq": "AVX512DQ", "avx512vl": "AVX512VL", "avx512_vnni": "AVX512VNNI",
    "avx512_bf16": "AVX512BF16", "avx512_fp16": "AVX512FP16", "avx512ifma": "AVX512IFMA",
    "avx512vbmi": "AVX512VBMI", "avx512vbmi2": "AVX512VBMI2",
}


_restriction: frozenset[str] | None = None


def cpu_flags() -> tuple[str, ...]:
    """ISA flags this process can execute (empty when unknown).

    /proc/cpuinfo lists what the CPU has; a SIMD extension is kept only when
    the runtime check of numpy (CPUID and the OS-enabled register state, as
    compilers and onnxruntime's MLAS see them) agrees, so an emulator or an OS
    that disables AVX-512 state never gets AVX-512 code. `restrict_cpu_flags`
    narrows it further.
    """
    flags = _checked_flags()
    if _restriction is not None:
        flags = tuple(f for f in flags if f in _restriction)
    return flags


@functools.cache
def _checked_flags() -> tuple[str, ...]:
    """/proc/cpuinfo's flags less what numpy's runtime check rules out: fixed for the
    process (a plan's load asks for them once per kernel)."""
    return runtime_checked(_cpuinfo().get("flags", ()), _runtime_features())


def cpuid_denied_flags() -> tuple[str, ...]:
    """SIMD extensions /proc/cpuinfo lists that the runtime check (CPUID) denies this
    process: AVX-512 on a host whose OS disables its state, under an emulator, or hidden
    by `scripts/avx2_only.sh`; benchmarks record them beside their figures."""
    listed = _cpuinfo().get("flags", ())
    usable = set(_checked_flags())
    return tuple(f for f in listed if f in RUNTIME_CHECKED and f not in usable)


def restrict_cpu_flags(flags: Iterable[str] | None) -> None:
    """Let wpk in this process use only `flags` of the CPU's (None: all it can run).

    The checks use it to run the AVX2 code paths on an AVX-512 machine; worker
    processes started by wpk inherit it (`restricted_cpu_flags`). onnxruntime
    keeps choosing its kernels by the real CPU (`scripts/avx2_only.sh` hides AVX-512
    from it too).
    """
    global _restriction
    _restriction = None if flags is None else frozenset(flags)
    host_cpu.cache_clear()


def restricted_cpu_flags() -> tuple[str, ...] | None:
    """The flags `restrict_cpu_flags` limited this process to, or None."""
    return None if _restriction is None else tuple(sorted(_restriction))


def runtime_checked(flags: tuple[str, ...], runtime: dict[str, bool] | None) -> tuple[str, ...]:
    """`flags` less the SIMD extensions that `runtime` (numpy's feature dict) reports
    unusable; every avx512 extension needs avx512f."""
    if runtime is None:
        return tuple(flags)
    kept = tuple(f for f in flags
                 if f not in RUNTIME_CHECKED or runtime.get(RUNTIME_CHECKED[f], True))
    if "avx512f" not in kept:
        kept = tuple(f for f in kept if not f.startswith("avx512"))
    return kept


def _runtime_features() -> dict[str, bool] | None:
    """numpy's CPU feature dict (CPUID + XGETBV, checked when numpy loaded), or None."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # pragma: no cover - numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return None
    return dict(__cpu_features__)


# x86-64 micro-architecture levels (the psABI's), highest first, with the flags each needs.
X86_LEVELS = (
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    ("x86-64-v3", ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe")),
    ("x86-64-v2", ("sse4_1", "sse4_2", "ssse3", "popcnt")),
)


def compiler_isa_flags(spec: HardwareSpec | None = None) -> tuple[str, ...]:
    """gcc flags that target exactly the ISA of `spec` (default: this host).

    On x86-64 an explicit micro-architecture level rather than -march=native, so
    a compiled kernel and its cache key name the ISA it needs (and gcc, even when
    run outside an emulator, emits only what this process can execute); tuning
    stays the host's. Elsewhere -march=native.
    """
    spec = spec or host_cpu()
    if spec.arch != "x86_64":
        return ("-march=native",)
    flags = set(spec.isa_flags)
    level = next((name for name, needs in X86_LEVELS if flags.issuperset(needs)), "x86-64")
    return (f"-march={level}", "-mtune=native")


@functools.cache
def _cpuinfo() -> dict:
    info: dict = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and "flags" not in info:
            info["flags"] = tuple(sorted(value.split()))
        elif key == "model name" and "model" not in info:
            info["model"] = value.strip()
    return info


def _cache_sizes() -> dict[int, int]:
    """Data/unified cache size per level of cpu0, from sysfs."""
    sizes: dict[int, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        scale = {"K": KIB, "M": MIB}.get(text[-1:], 1)
        sizes[level] = int(text.rstrip("KM")) * scale
    return sizes


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@functools.cache
def host_cpu() -> HardwareSpec:
    """The host CPU: ISA flags, vector width, usable cores and cache sizes."""
    flags = cpu_flags()
    if "avx512f" in flags:
        bits, registers = 512, 32
    elif "avx2" in flags or "avx" in flags:
        bits, registers = 256, 16
    elif "sse2" in flags or "asimd" in flags or "neon" in flags:
        bits, registers = 128, 16 if "sse2" in flags else 32
    else:
        bits, registers = 32, 16
    caches = _cache_sizes()
    return HardwareSpec(
        name="cpu", kind="cpu", arch=platform.machine() or "unknown",
        description=_cpuinfo().get("model", platform.processor() or "cpu"),
        cores=_usable_cores(), isa_flags=flags, vector_bits=bits, vector_registers=registers,
        l1_bytes=caches.get(1, 32 * KIB), l2_bytes=caches.get(2, 1 * MIB),
        l3_bytes=caches.get(3, 0), max_threads_per_block=1, warp_size=1,
        shared_memory_per_block=0, shared_memory_per_block_optin=0)


# CPU features worth recording: those a native kernel may be compiled for.
ISA_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
             "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


@functools.cache
def cpu_fingerprint() -> dict:
    """The host CPU: machine, core count and the ISA flags of ISA_FLAGS it has."""
    flags = set(cpu_flags())
    return {"kind": "cpu", "machine": platform.machine(), "cores": os.cpu_count() or 1,
            "isa": [flag for flag in ISA_FLAGS if flag in flags]}


# ----------------------------------------------------------------------------- GPU detection


@dataclass(frozen=True)
class DetectedGpu:
    """A GPU found on this machine, and the preset that describes it (if any)."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    preset: str | None


def detect_gpus() -> list[DetectedGpu]:
    """The NVIDIA GPUs present: from nvidia-smi, else cupy; [] when there are none."""
    gpus = _from_nvidia_smi()
    return gpus if gpus else _from_cupy()


def _from_nvidia_smi() -> list[DetectedGpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,compute_cap,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return parse_nvidia_smi(out.stdout)


def parse_nvidia_smi(text: str) -> list[DetectedGpu]:
    """GPUs from `nvidia-smi --query-gpu=index,name,compute_cap,memory.total` CSV output."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            major, minor = (int(x) for x in parts[2].split("."))
            gpus.append(DetectedGpu(int(parts[0]), parts[1], (major, minor),
                                    int(float(parts[3])) * MIB,
                                    preset_for_compute_capability((major, minor), parts[1])))
        except ValueError:
            continue
    return gpus


def _from_cupy() -> list[DetectedGpu]:
    try:
        import cupy  # noqa: F401  (optional dependency)
        from cupy.cuda import runtime
        count = runtime.getDeviceCount()
    except Exception:
        return []
    gpus = []
    for index in range(count):
        try:
            props = runtime.getDeviceProperties(index)
        except Exception:
            continue
        cc = (int(props["major"]), int(props["minor"]))
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gpus.append(DetectedGpu(index, name, cc, int(props["totalGlobalMem"]),
                                preset_for_compute_capability(cc, name)))
    return gpus
