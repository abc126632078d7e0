"""Toolchains: gcc + ctypes, nvcc (sm_90), NVRTC 12 + ptxas (sm_60), ptxas usage, cache."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from wpk.core.errors import ToolchainError
from wpk.dsl import toolchain
from wpk.dsl import toolchain_cuda as cuda

# What the compile cache compiles and finds cached: a cache of its own, empty at the start.
pytestmark = pytest.mark.private_compile_cache

SAXPY_C = r"""
void saxpy(int n, float a, const float *x, float *y) {
    #pragma omp parallel for
    for (int i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
}
"""

SCALE_CU = r"""
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = erff(tile[255 - threadIdx.x]) * 2.0f;
}
"""

HEAVY_CU = r"""
extern "C" __global__ void heavy(const float* __restrict__ x, float* __restrict__ y) {
    float acc[32];
    #pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = x[threadIdx.x * 32 + j];
    #pragma unroll
    for (int it = 0; it < 8; ++it) {
        #pragma unroll
        for (int j = 0; j < 32; ++j) acc[j] = acc[j] * acc[(j + 1) % 32] + x[it * 32 + j];
    }
    float s = 0;
    #pragma unroll
    for (int j = 0; j < 32; ++j) s += acc[j] * (j + 1);
    y[threadIdx.x] = s;
}
"""

needs_nvcc = pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc is not installed")
needs_nvrtc = pytest.mark.skipif(
    not cuda.nvrtc_available(),
    reason="nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvcc-cu12 wheels are not installed")


@pytest.mark.isa  # the C compile's -march: scripts/isa_check.sh reruns it for AVX2
def test_gcc_compiles_and_ctypes_calls_the_function(rng, cache_dir):
    artifact = toolchain.compile_c(SAXPY_C)
    assert not artifact.cached and str(artifact.path).startswith(cache_dir)
    fn = toolchain.load_function(artifact.path, "saxpy", [ctypes.c_int, ctypes.c_float,
                                                          ctypes.c_void_p, ctypes.c_void_p])
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    expected = 2.5 * x + y
    fn(x.size, 2.5, x.ctypes.data, y.ctypes.data)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


@pytest.mark.isa  # the C compile's -march: scripts/isa_check.sh reruns it for AVX2
def test_c_cache_hits_on_recompile_and_misses_on_new_flags():
    first = toolchain.compile_c(SAXPY_C)
    again = toolchain.compile_c(SAXPY_C)
    assert again.cached and again.path == first.path and again.key == first.key
    other = toolchain.compile_c(SAXPY_C, flags=("-O2", "-shared", "-fPIC"))
    assert not other.cached and other.key != first.key
    assert toolchain.compile_c_shared(SAXPY_C) == first.path
    assert toolchain.cache_key("a", [], "gcc 1") != toolchain.cache_key("a", [], "gcc 2")
    assert toolchain.cache_key("a", [], "gcc", "1") != toolchain.cache_key("a", [], "gcc", "2")


@pytest.mark.isa  # the C compile's -march: scripts/isa_check.sh reruns it for AVX2
def test_c_compile_error_is_a_toolchain_error_with_the_diagnostic():
    with pytest.raises(ToolchainError, match="undeclared") as info:
        toolchain.compile_c("int f(void) { return undeclared_name; }")
    assert "code generator" in info.value.hint


@pytest.mark.isa  # the C compile's -march: scripts/isa_check.sh reruns it for AVX2
def test_missing_c_compiler_has_a_hint(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/gcc")
    with pytest.raises(ToolchainError, match="not found") as info:
        toolchain.compile_c(SAXPY_C + "/* fresh */")
    assert "gcc" in info.value.hint


AVX_C = r"""
#if defined(__AVX__)
#include <immintrin.h>
#endif
void twice(int n, float *x) {
    for (int i = 0; i < n; ++i) x[i] = 2.0f * x[i];
}
"""


@pytest.mark.isa  # the header is built with the host's -march: isa_check.sh reruns it
def test_an_avx_source_is_compiled_with_the_precompiled_immintrin(tmp_path, monkeypatch, rng):
    """The first compile of a source including <immintrin.h> builds the header's `.gch` into
    the compile cache; gcc reads it (its -H trace marks a used `.gch` with `!`) and the
    kernel computes what it did without it."""
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path))   # a cache without the run's headers
    flags = toolchain.c_flags()
    cc = toolchain.c_compiler()
    artifact = toolchain.compile_c(AVX_C)
    extra = toolchain.immintrin_flags(AVX_C, cc, flags)
    if "gcc" not in toolchain.compiler_version(cc).lower():
        assert extra == []
        pytest.skip("not gcc: no precompiled header")
    compile_flags = [f for f in flags if f != "-shared"]
    folder = toolchain.pch_dir(cc, compile_flags)
    assert extra == ["-include", str(folder / toolchain.PCH_HEADER)]
    assert (folder / f"{toolchain.PCH_HEADER}.gch").stat().st_size > 1_000_000
    source = tmp_path / "avx.c"
    source.write_text(AVX_C)
    trace = subprocess.run([cc, *compile_flags, *extra, "-H", "-fsyntax-only", str(source)],
                           capture_output=True, text=True, check=True).stderr
    assert f"! {folder / toolchain.PCH_HEADER}.gch" in trace
    twice = toolchain.load_function(artifact.path, "twice", [ctypes.c_int, ctypes.c_void_p])
    x = rng.standard_normal(37).astype(np.float32)
    expected = 2 * x
    twice(x.size, x.ctypes.data)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.isa
def test_the_precompiled_header_is_left_out_where_it_would_not_be_the_same_program(monkeypatch):
    """No header for a source without <immintrin.h>, for one defining a macro before it (a
    feature macro must precede every system header), for a compiler that is not gcc, and
    for options gcc cannot build it with (remembered; the kernel compiles as before)."""
    cc, flags = toolchain.c_compiler(), toolchain.c_flags()
    assert toolchain.immintrin_flags(SAXPY_C, cc, flags) == []
    defined_first = "#define _POSIX_C_SOURCE 199309L\n" + AVX_C
    assert toolchain.immintrin_flags(defined_first, cc, flags) == []
    assert toolchain.compile_c(defined_first).path.exists()
    bad = (*flags, "-fno-such-gcc-option")
    assert toolchain.immintrin_flags(AVX_C, cc, bad) == []

    def run_again(*args, **kwargs):
        raise AssertionError("gcc ran again for a header it could not build")

    monkeypatch.setattr(toolchain, "run_tool", run_again)
    assert toolchain.immintrin_flags(AVX_C, cc, bad) == []
    monkeypatch.setattr(toolchain, "compiler_version", lambda executable: "clang version 18")
    assert toolchain.immintrin_flags(AVX_C, cc, flags) == []


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4gemmPKfS0_Pf' for 'sm_80'
ptxas info    : Function properties for _Z4gemmPKfS0_Pf
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33024 bytes smem, 376 bytes cmem[0]
ptxas info    : Compiling entry function 'copy' for 'sm_80'
ptxas info    : Function properties for copy
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 6 registers, 360 bytes cmem[0]
"""


def test_parse_ptxas_usage_reads_every_kernel():
    report = cuda.parse_ptxas_report(PTXAS_LOG)
    assert report["_Z4gemmPKfS0_Pf"] == cuda.ResourceUsage(255, 33024, 12, 16, 8, 376)
    assert report["copy"] == cuda.ResourceUsage(6, 0, 0, 0, 0, 360)
    merged = cuda.parse_ptxas_usage(PTXAS_LOG)
    assert (merged.registers, merged.shared_bytes, merged.spill_stores) == (255, 33024, 12)
    assert cuda.parse_ptxas_usage(PTXAS_LOG, kernel="copy").registers == 6
    assert merged.spills and not report["copy"].spills
    with pytest.raises(ToolchainError, match="no kernel matching 'nope'"):
        cuda.parse_ptxas_usage(PTXAS_LOG, kernel="nope")


def test_arch_numbers():
    assert [cuda.arch_number(a) for a in ("sm_60", "compute_70", "75", "8.0")] == [60, 70, 75, 80]
    with pytest.raises(ToolchainError, match="invalid CUDA architecture"):
        cuda.arch_number("hopper")


@needs_nvcc
def test_nvcc_compiles_for_sm_90_with_resource_usage():
    binary = cuda.compile_cuda(SCALE_CU, "sm_90", compiler="nvcc")
    assert binary.compiler == "nvcc" and binary.arch == "sm_90" and not binary.cached
    assert binary.cubin[:4] == b"\x7fELF"
    usage = binary.kernels["scale"]
    assert usage.shared_bytes == 256 * 4 and 0 < usage.registers <= 255 and not usage.spills
    again = cuda.compile_cuda(SCALE_CU, "sm_90", compiler="nvcc")
    assert again.cached and again.cubin == binary.cubin and again.kernels == binary.kernels


@needs_nvcc
def test_nvcc_reports_spills_under_a_register_cap():
    capped = cuda.compile_cuda(HEAVY_CU, "sm_90", flags=("-O3", "-maxrregcount=16"))
    free = cuda.compile_cuda(HEAVY_CU, "sm_90")
    assert capped.usage.spills and not free.usage.spills
    assert capped.usage.registers < free.usage.registers


@needs_nvcc
def test_nvcc_refuses_old_archs_and_reports_errors():
    with pytest.raises(ToolchainError, match="cannot compile for sm_60") as info:
        cuda.compile_cuda(SCALE_CU, "sm_60", compiler="nvcc")
    assert "nvrtc" in info.value.hint
    with pytest.raises(ToolchainError, match="nvcc failed for sm_90"):
        cuda.compile_cuda("__global__ void k() { undefined_fn(); }", "sm_90", compiler="nvcc")


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_60", "sm_70"])
def test_nvrtc_and_ptxas_compile_for_pascal_and_volta(arch):
    binary = cuda.compile_cuda(SCALE_CU, arch)  # auto picks NVRTC below sm_75
    assert binary.compiler == "nvrtc+ptxas" and binary.arch == arch
    assert f".target {arch}" in binary.ptx and binary.cubin[:4] == b"\x7fELF"
    usage = binary.kernels["scale"]
    assert usage.shared_bytes == 1024 and usage.registers > 0
    assert cuda.compile_cuda(SCALE_CU, arch).cached


@needs_nvrtc
def test_nvrtc_compile_error_carries_the_log():
    with pytest.raises(ToolchainError, match="undefined_fn"):
        cuda.compile_cuda("__global__ void k() { undefined_fn(); }", "sm_60")
