"""C code generation: readable source with OpenMP/SIMD pragmas and restrict pointers,
and correct kernels on the edge shapes of convolution (1x1 images, odd sizes, tiles that
do not divide, stride 2, dilation 2, depthwise) compared with the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.errors import InputError
from wpk.core.numerics import relative_l2
from wpk.dsl import compute as C
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.templates import build_cpu, emulate_cuda, template_for

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

EDGE_CASES = {
    "1x1 image": dict(n=1, c=3, h=1, w=1, k=5, r=1, s=1),
    "1x1 image padded 3x3": dict(n=1, c=2, h=1, w=1, k=3, r=3, s=3, pad=1),
    "odd sizes": dict(n=2, c=3, h=7, w=5, k=7, r=3, s=3, pad=1),
    "stride 2": dict(n=1, c=4, h=9, w=11, k=6, r=3, s=3, pad=1, stride=2),
    "dilation 2": dict(n=1, c=2, h=9, w=8, k=3, r=3, s=3, pad=2, dil=2),
    "depthwise": dict(n=1, c=6, h=8, w=9, k=6, r=3, s=3, pad=1, groups=6),
    "grouped": dict(n=1, c=4, h=6, w=6, k=6, r=3, s=2, pad=1, groups=2),
}


def conv_case(n, c, h, w, k, r, s, pad=0, stride=1, dil=1, groups=1, seed=0):
    op = load_operator("conv2d_bias")
    rng = np.random.default_rng(seed)
    arrays = {"X": rng.standard_normal((n, c, h, w)).astype(np.float32),
              "Wt": rng.standard_normal((k, c // groups, r, s)).astype(np.float32),
              "B": rng.standard_normal(k).astype(np.float32)}
    scalars = {"pad_t": pad, "pad_l": pad, "pad_b": pad, "pad_r": pad, "stride_h": stride,
               "stride_w": stride, "dil_h": dil, "dil_w": dil, "groups": groups}
    bindings = C.infer_bindings(op, arrays, scalars)
    return op, bindings, arrays, C.evaluate(op, arrays, bindings)["Y"]


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_conv_edge_shapes_on_c_and_emulated_cuda(case):
    op, bindings, arrays, ref = conv_case(**EDGE_CASES[case])
    spec = C.specialize(op, bindings)
    cpu = template_for(spec, "cpu")
    rng = np.random.default_rng(7)
    for config in [cpu.default_config(), *cpu.sample(rng, 2)]:
        out = build_cpu(op, bindings, config)(**arrays)["Y"]
        assert relative_l2(out, ref) < 1e-5, (case, config)
    gpu = template_for(spec, "cuda")
    for config in [gpu.default_config(), *gpu.sample(rng, 3)]:
        out = emulate_cuda(op, bindings, config, arrays)["Y"]
        assert relative_l2(out, ref) < 1e-5, (case, config)


def test_generated_c_is_readable_and_uses_openmp_simd_restrict():
    op, bindings, arrays, ref = conv_case(**EDGE_CASES["odd sizes"])
    config = {"tile_k": 4, "fuse_yx": 0, "tile_x": 8, "tile_y": 2, "tile_c": 3,
              "cache_input": 1, "unroll_window": 1, "k_inner": 0}
    kernel = build_cpu(op, bindings, config)
    src = kernel.source
    assert "void wpk_conv2d_bias(const float* restrict X" in src
    assert "float* restrict Y" in src
    assert "#pragma omp parallel for" in src
    assert "#pragma omp simd" in src
    assert "#pragma GCC unroll 3" in src  # the kernel window
    assert "X_local" in src and "Y_acc" in src  # input patch cache, register tile
    assert relative_l2(kernel(**arrays)["Y"], ref) < 1e-5


def test_kernel_checks_input_shapes():
    op, bindings, arrays, _ = conv_case(**EDGE_CASES["1x1 image"])
    kernel = build_cpu(op, bindings)
    with pytest.raises(InputError, match="shape"):
        kernel(X=np.zeros((1, 3, 2, 2), np.float32), Wt=arrays["Wt"], B=arrays["B"])
    with pytest.raises(InputError, match="missing input"):
        kernel(X=arrays["X"])


def test_multi_stage_operator_uses_workspaces():
    op = load_operator("layernorm")
    rng = np.random.default_rng(3)
    arrays = {"X": rng.standard_normal((5, 19)).astype(np.float32),
              "Gamma": rng.standard_normal(19).astype(np.float32),
              "Beta": rng.standard_normal(19).astype(np.float32)}
    bindings = C.infer_bindings(op, arrays, {})
    kernel = build_cpu(op, bindings)
    assert "static __thread float* wpk_keep_Mean;" in kernel.source
    ref = C.evaluate(op, arrays, bindings)["Y"]
    assert relative_l2(kernel(**arrays)["Y"], ref) < 1e-5
