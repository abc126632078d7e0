"""Every DSL library operator through the code generators: C (gcc) and CUDA (GPU emulator)
agree with the reference interpreter, and the CUDA compiles for sm_90 (nvcc) and sm_60
(NVRTC 12 + ptxas)."""

from __future__ import annotations

import pytest

from wpk.commands.dsl import example_arrays
from wpk.core.devices import gpu_preset
from wpk.core.numerics import relative_l2 as relative_error
from wpk.dsl import toolchain_cuda as cuda
from wpk.dsl.compute import evaluate
from wpk.kernels import templates
from wpk.kernels.dsl_library import list_operators, load_operator

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

CONV = {"N": 1, "C": 4, "H": 6, "W": 5, "K": 4, "CG": 2, "R": 3, "S": 3, "groups": 2,
        "pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 0, "stride_h": 2, "dil_w": 2}
POOL = {"N": 1, "C": 3, "H": 7, "W": 6, "KH": 3, "KW": 2, "pad_t": 1, "stride_h": 2}
WINOGRAD = {"N": 1, "C": 3, "H": 5, "W": 6, "K": 4, "T": 4, "pad_t": 1, "pad_b": 1}
BINDINGS = {
    "conv2d": CONV, "conv2d_bias": CONV, "conv2d_bias_relu_add": CONV,
    "maxpool2d": POOL, "avgpool2d": POOL,
    "matmul": {"M": 5, "K": 7, "N": 3}, "batched_matmul": {"BT": 2, "M": 3, "K": 5, "N": 4},
    "softmax": {"N": 3, "D": 37}, "layernorm": {"N": 3, "D": 37},
    "winograd_conv2d": WINOGRAD, "winograd_conv2d_bias": WINOGRAD,
    "lrn": {"N": 2, "C": 7, "P": 5, "size": 4},
    "groupnorm": {"N": 2, "G": 3, "K": 5, "P": 7},
}
COMPILED = ["conv2d_bias_relu_add", "gemm_tn", "avgpool2d", "softmax", "layernorm",
            "bias_gelu_add", "groupnorm"]


def example(name: str):
    op = load_operator(name)
    arrays, bindings = example_arrays(op, BINDINGS.get(name, {}), seed=7)
    return op, arrays, bindings


@pytest.mark.parametrize("name", list_operators())
def test_c_and_emulated_cuda_match_the_reference(name):
    op, arrays, bindings = example(name)
    reference = evaluate(op, arrays, bindings)
    c_out = templates.build_cpu(op, bindings)(**arrays)
    cuda_out = templates.emulate_cuda(op, bindings, None, arrays, gpu=gpu_preset("t4"))
    for out in op.outputs:
        assert relative_error(c_out[out], reference[out]) < 1e-5, out
        assert relative_error(cuda_out[out], reference[out]) < 1e-5, out


@pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", COMPILED)
def test_generated_cuda_compiles_for_sm_90_with_nvcc(name):
    op, _, bindings = example(name)
    kernel = templates.build_cuda(op, bindings, gpu=gpu_preset("h100"), arch="sm_90",
                              compiler="nvcc")
    assert kernel.cubin and kernel.usage
    assert all(0 < u.registers <= 255 for u in kernel.usage.values())


@pytest.mark.skipif(not cuda.nvrtc_available(),
                    reason="nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvcc-cu12 wheels are absent")
@pytest.mark.parametrize("name", COMPILED)
def test_generated_cuda_compiles_for_sm_60_with_nvrtc(name):
    op, _, bindings = example(name)
    kernel = templates.build_cuda(op, bindings, gpu=gpu_preset("p100"), arch="sm_60",
                              compiler="nvrtc")
    assert kernel.cubin and kernel.usage
    assert all(0 < u.registers <= 255 for u in kernel.usage.values())
