"""Hardware specs: the GPU presets, the host CPU and GPU detection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wpk.core import devices
from wpk.core.errors import DeviceError

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa


def test_presets_cover_the_supported_architectures():
    archs = {name: devices.gpu_preset(name).arch for name in devices.GPU_PRESETS}
    assert archs == {"p100": "sm_60", "v100": "sm_70", "t4": "sm_75", "a100": "sm_80",
                     "h100": "sm_90", "h200": "sm_90"}


@pytest.mark.parametrize("name", list(devices.GPU_PRESETS))
def test_preset_limits_are_consistent(name):
    spec = devices.gpu_preset(name.upper())
    assert spec.kind == "cuda" and spec.warp_size == 32 and spec.max_threads_per_block == 1024
    assert spec.shared_memory_per_block == 48 * 1024
    assert spec.shared_memory_per_block <= spec.shared_memory_per_block_optin \
        <= spec.shared_memory_per_sm
    assert spec.max_threads_per_sm >= spec.max_threads_per_block
    assert spec.registers_per_sm == 65536 and spec.max_registers_per_thread == 255
    assert spec.sm_count == spec.cores > 0 and spec.l2_bytes > 0
    assert spec.memory_bandwidth_gbs > 0 and spec.fp32_tflops > 0
    assert spec.fingerprint == f"cuda:{spec.arch}"
    assert spec.to_json()["compute_capability"] == spec.compute_capability


def test_newer_generations_are_not_smaller():
    order = ["p100", "v100", "a100", "h100", "h200"]
    specs = [devices.gpu_preset(n) for n in order]
    for older, newer in zip(specs, specs[1:]):
        assert newer.sm_count >= older.sm_count
        assert newer.memory_bandwidth_gbs >= older.memory_bandwidth_gbs
        assert newer.shared_memory_per_block_optin >= older.shared_memory_per_block_optin


def test_unknown_preset_is_a_device_error_with_the_list():
    with pytest.raises(DeviceError, match="unknown GPU preset 'k80'") as info:
        devices.gpu_preset("k80")
    assert "h100" in info.value.hint


def test_host_cpu_reads_proc_cpuinfo():
    spec = devices.host_cpu()
    assert spec.kind == "cpu" and spec.cores >= 1
    text = Path("/proc/cpuinfo").read_text()
    flags_line = next(line for line in text.splitlines() if line.startswith("flags"))
    listed = tuple(sorted(flags_line.split(":", 1)[1].split()))
    flags = set(devices.runtime_checked(listed, devices._runtime_features()))
    restricted = devices.restricted_cpu_flags()  # pytest --isa avx2
    if restricted is not None:
        flags &= set(restricted)
    assert set(spec.isa_flags) == flags and flags <= set(listed)
    expected_bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    assert spec.vector_bits == expected_bits
    assert spec.vector_lanes == expected_bits // 32
    assert spec.l1_bytes >= 16 * 1024 and spec.l2_bytes >= spec.l1_bytes
    assert spec.fingerprint.startswith(f"cpu:{spec.arch}:")


AVX512_HOST = ("avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl",
               "avx512_vnni", "bmi1", "bmi2", "f16c", "fma", "movbe", "popcnt", "sse4_1",
               "sse4_2", "ssse3")


def test_simd_extensions_the_process_cannot_run_are_dropped():
    """/proc/cpuinfo lists AVX-512, but the CPU the process runs on (an emulator, an OS
    without AVX-512 state) does not: no avx512 flag survives, the rest stays."""
    runtime = {"AVX": True, "AVX2": True, "FMA3": True, "F16C": True, "AVX512F": False,
               "AVX512BW": False, "AVX512VL": False, "AVX512DQ": False, "AVX512CD": False,
               "SSE41": True, "SSE42": True}
    kept = devices.runtime_checked(AVX512_HOST, runtime)
    assert not [f for f in kept if f.startswith("avx512")]
    assert {"avx2", "fma", "bmi2", "sse4_2"} <= set(kept)
    assert devices.runtime_checked(AVX512_HOST, None) == AVX512_HOST
    everything = {name: True for name in devices.RUNTIME_CHECKED.values()}
    assert devices.runtime_checked(AVX512_HOST, everything) == AVX512_HOST


@pytest.mark.parametrize("flags, level, lanes", [
    (AVX512_HOST, "x86-64-v4", 16),
    (tuple(f for f in AVX512_HOST if not f.startswith("avx512")), "x86-64-v3", 8),
    (("sse4_1", "sse4_2", "ssse3", "popcnt"), "x86-64-v2", 4),
])
def test_compiler_flags_name_the_isa_level(flags, level, lanes):
    """Generated C is compiled for an explicit ISA level (part of the compile-cache key),
    never -march=native, so a cache shared by two machines cannot hand one the other's
    instructions."""
    base = devices.host_cpu()
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    spec = dataclasses.replace(base, arch="x86_64", isa_flags=flags, vector_bits=bits)
    assert devices.compiler_isa_flags(spec)[0] == f"-march={level}"
    assert "-march=native" not in devices.compiler_isa_flags(spec)
    assert spec.vector_lanes == lanes
    assert spec.fingerprint != dataclasses.replace(spec, isa_flags=AVX512_HOST).fingerprint \
        or level == "x86-64-v4"


def test_forcing_avx2_changes_what_wpk_compiles_for():
    from tests.isa import forced_isa
    from wpk.dsl import toolchain

    with forced_isa("avx2"):
        assert "avx512f" not in devices.host_cpu().isa_flags
        assert devices.host_cpu().vector_lanes <= 8
        assert not [f for f in toolchain.c_flags() if f == "-march=x86-64-v4"]
    assert devices.host_cpu().isa_flags == devices.cpu_flags()


def test_parse_nvidia_smi_maps_to_presets():
    text = ("0, NVIDIA H100 80GB HBM3, 9.0, 81559\n"
            "1, NVIDIA H200, 9.0, 143771\n"
            "2, Tesla T4, 7.5, 15360\n"
            "3, Some Future GPU, 12.0, 1000\n")
    gpus = devices.parse_nvidia_smi(text)
    assert [g.preset for g in gpus] == ["h100", "h200", "t4", None]
    assert gpus[0].compute_capability == (9, 0) and gpus[0].memory_bytes == 81559 * 1024 ** 2


def test_detect_gpus_returns_a_list_and_auto_follows_it():
    gpus = devices.detect_gpus()
    assert isinstance(gpus, list)
    if any(g.preset for g in gpus):
        assert devices.gpu_preset("auto").kind == "cuda"
    else:
        with pytest.raises(DeviceError, match="no supported NVIDIA GPU"):
            devices.gpu_preset("auto")
