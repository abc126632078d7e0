"""Generated CUDA compiles: nvcc for sm_90 (h100) and NVRTC 12 + ptxas for sm_60 (p100), for
the default and a random valid config of every library operator; ptxas's resource report
agrees with the launch configuration the code generator computed."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.dsl_workloads import fixed_workload
from wpk.core.devices import gpu_preset
from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl.toolchain_cuda import compile_cuda, find_nvcc, nvrtc_available
from wpk.kernels.dsl_library import list_operators, load_operator
from wpk.kernels.templates import build_cuda, template_for

PRESETS = {"sm_90": ("h100", "nvcc"), "sm_60": ("p100", "nvrtc")}


def module_for(arch: str, variant: int):
    """One CUDA module holding a kernel set of every library operator (compiled at once)."""
    preset, _ = PRESETS[arch]
    gpu = gpu_preset(preset)
    rng = np.random.default_rng(11 + variant)
    sources, launches = [], {}
    for name in list_operators():
        op = load_operator(name)
        bindings, _ = fixed_workload(op)
        template = template_for(C.specialize(op, bindings), "cuda", gpu)
        config = template.default_config() if variant == 0 else \
            (template.sample(rng, 1) or [template.default_config()])[0]
        kernel = build_cuda(op, bindings, config, gpu=gpu, compile=False)
        sources.append(kernel.source)
        launches.update({k.name: k.launch for k in kernel.launches})
    return "\n".join(sources), launches


def _compile_and_check(arch: str, variant: int):
    _, compiler = PRESETS[arch]
    source, launches = module_for(arch, variant)
    binary = compile_cuda(source, arch, compiler=compiler)
    assert binary.cubin, "empty cubin"
    assert set(binary.kernels) == set(launches)
    preset = gpu_preset(PRESETS[arch][0])
    for name, usage in binary.kernels.items():
        assert 0 < usage.registers <= preset.max_registers_per_thread, name
        assert usage.shared_bytes == launches[name].shared_bytes, name
        assert usage.shared_bytes <= preset.shared_memory_per_block, name


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("variant", [0, 1], ids=["default", "random"])
def test_every_operator_compiles_for_sm90_with_nvcc(variant):
    _compile_and_check("sm_90", variant)


@pytest.mark.skipif(not nvrtc_available(),
                    reason="nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvcc-cu12 wheels not installed")
@pytest.mark.parametrize("variant", [0, 1], ids=["default", "random"])
def test_every_operator_compiles_for_sm60_with_nvrtc(variant):
    _compile_and_check("sm_60", variant)


def test_configs_exceeding_the_preset_are_rejected_before_compiling(monkeypatch):
    import wpk.dsl.toolchain_cuda as toolchain

    monkeypatch.setattr(toolchain, "compile_cuda", lambda *a, **k: pytest.fail("compiled"))
    op = load_operator("conv2d")
    rng = np.random.default_rng(0)
    arrays = {"X": rng.standard_normal((1, 64, 28, 28)).astype(np.float32),
              "Wt": rng.standard_normal((64, 64, 3, 3)).astype(np.float32)}
    bindings = C.infer_bindings(op, arrays, {"pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 1})
    template = template_for(C.specialize(op, bindings), "cuda", gpu_preset("p100"))
    fits = {"threads_x": 16, "threads_y": 4, "tile_k": 4, "block_k": 2, "tile_c": 8,
            "cache_input": 1, "cache_weight": 1}
    assert template.validate(fits) is None
    too_much_shared = dict(fits, tile_c=64, block_k=8)
    assert "shared memory" in template.validate(too_much_shared)
    assert "p100" in template.validate(too_much_shared)
    too_many_threads = dict(fits, threads_x=32, threads_y=16, block_k=4)
    assert "threads per block" in template.validate(too_many_threads)
    with pytest.raises(ScheduleError, match="shared memory"):
        build_cuda(op, bindings, too_much_shared, gpu=gpu_preset("p100"), arch="sm_60")
