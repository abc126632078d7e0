"""FLOP counts of workloads (`wpk.kernels.flops`) and the algorithm names implementations
give reports (`Implementation.algorithm`, `wpk.kernels.algorithms`)."""

from __future__ import annotations

import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.algorithms import conv_algorithm
from wpk.kernels.cpu.inverted_residual_spec import block_workload
from wpk.kernels.flops import gflops_per_s, workload_flops


def spec(*shape: int) -> TensorSpec:
    return TensorSpec(tuple(shape))


def conv(x, w, out, domain="", **attrs) -> Workload:
    return Workload("Conv", (spec(*x), spec(*w)), (spec(*out),),
                    tuple(sorted(attrs.items())), domain=domain)


def naive_conv_macs(n, c, h, w, k, r, s, group, stride, pad) -> int:
    """Multiply-accumulates of a direct convolution, counted one loop iteration at a time
    (padding taps included, as every convention counts them)."""
    oh, ow = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    macs = 0
    for _ in range(n):
        for _ in range(k):
            for _ in range(oh * ow):
                for _ in range(c // group):
                    for _ in range(r * s):
                        macs += 1
    return macs


@pytest.mark.parametrize("n,c,h,w,k,r,s,group,stride,pad", [
    (1, 3, 8, 8, 4, 3, 3, 1, 1, 1),     # 3x3, padded
    (2, 6, 7, 5, 4, 1, 1, 2, 2, 0),     # grouped 1x1, strided, batch 2
    (1, 8, 5, 5, 8, 3, 3, 8, 1, 0),     # depthwise
    (1, 3, 9, 9, 5, 7, 7, 1, 2, 3),     # the stem's shape class
])
def test_conv_flops_count_two_per_multiply_accumulate(n, c, h, w, k, r, s, group, stride, pad):
    oh, ow = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    workload = conv((n, c, h, w), (k, c // group, r, s), (n, k, oh, ow), group=group,
                    strides=(stride, stride), pads=(pad,) * 4)
    assert workload_flops(workload) == 2 * naive_conv_macs(n, c, h, w, k, r, s, group,
                                                          stride, pad)


def test_a_blocked_conv_counts_its_logical_channels_not_the_padding_lanes():
    plain = conv((1, 3, 8, 8), (4, 3, 3, 3), (1, 4, 8, 8), pads=(1, 1, 1, 1))
    blocked = conv((1, 3, 8, 8), (4, 3, 3, 3), (1, 1, 8, 8, 8), domain="wpk.nchwc",
                   pads=(1, 1, 1, 1), block=8, channels=4)
    assert workload_flops(blocked) == workload_flops(plain) == 2 * 4 * 64 * 27


def test_a_blocked_conv_of_widened_groups_counts_its_own_groups():
    """The layout pass's widened filters hold zeros outside each output channel's group:
    narrow groups (`group_width` 4 of a block of 16) and sparse ones (4 groups of 17 as
    one dense group) count their own groups' channels, as the grouped conv does."""
    grouped = conv((1, 64, 8, 8), (64, 4, 3, 3), (1, 64, 8, 8), group=16, pads=(1,) * 4)
    narrow = conv((1, 4, 8, 8, 16), (64, 16, 3, 3), (1, 4, 8, 8, 16), domain="wpk.nchwc",
                  group=4, pads=(1,) * 4, block=16, channels=64, group_width=4)
    assert workload_flops(narrow) == workload_flops(grouped) == 2 * 64 * 64 * 4 * 9
    grouped = conv((1, 68, 7, 7), (68, 17, 1, 1), (1, 68, 7, 7), group=4)
    sparse = conv((1, 5, 7, 7, 16), (68, 68, 1, 1), (1, 5, 7, 7, 16), domain="wpk.nchwc",
                  group=1, block=16, channels=68, sparse_groups=4)
    assert workload_flops(sparse) == workload_flops(grouped) == 2 * 68 * 49 * 17


def test_conv_transpose_matmul_gemm_and_attention():
    # ConvTranspose: every input element meets K/group x kernel weights
    transpose = Workload("ConvTranspose", (spec(1, 2, 3, 3), spec(2, 4, 2, 2)),
                         (spec(1, 4, 4, 4),))
    assert workload_flops(transpose) == 2 * (2 * 9) * (4 * 4)
    matmul = Workload("MatMul", (spec(2, 3, 5), spec(5, 7)), (spec(2, 3, 7),))
    assert workload_flops(matmul) == 2 * 2 * 3 * 7 * 5
    vector = Workload("MatMul", (spec(5,), spec(5, 7)), (spec(7,),))
    assert workload_flops(vector) == 2 * 7 * 5
    gemm_t = Workload("Gemm", (spec(5, 3), spec(5, 7)), (spec(3, 7),), (("transA", 1),))
    assert workload_flops(gemm_t) == 2 * 3 * 7 * 5
    gemm = Workload("Gemm", (spec(3, 5), spec(7, 5), spec(7)), (spec(3, 7),),
                    (("transB", 1),))
    assert workload_flops(gemm) == 2 * 3 * 7 * 5
    attention = Workload("Attention", (spec(2, 4, 6, 8), spec(2, 4, 10, 8), spec(2, 4, 10, 16)),
                         (spec(2, 4, 6, 16),), (("k_transposed", 0), ("scale", 0.35)),
                         domain="wpk")
    assert workload_flops(attention) == 2 * 8 * 6 * 10 * (8 + 16)


def test_ops_without_a_flop_count_and_malformed_workloads_are_none():
    assert workload_flops(Workload("Relu", (spec(2, 5),), (spec(2, 5),))) is None
    assert workload_flops(Workload("MaxPool", (spec(1, 3, 8, 8),), (spec(1, 3, 4, 4),),
                                   (("kernel_shape", (2, 2)),))) is None
    assert workload_flops(Workload("Conv", (spec(1, 3, 8, 8), None), (spec(1, 4, 8, 8),))) \
        is None
    bad_attention = Workload("Attention", (spec(6, 8), spec(10, 8), spec(10, 16)),
                             (spec(6, 16),), domain="wpk")   # rank 2: not wpk's Attention
    assert workload_flops(bad_attention) is None


def test_gflops_per_s():
    assert gflops_per_s(3_000_000_000, 1.5) == pytest.approx(2.0)
    assert gflops_per_s(None, 1.0) is None
    assert gflops_per_s(1000, None) is None and gflops_per_s(1000, 0.0) is None


def test_conv_algorithm_by_shape():
    assert conv_algorithm(conv((1, 8, 5, 5), (8, 1, 3, 3), (1, 8, 5, 5), group=8,
                               pads=(1,) * 4)) == "depthwise"
    assert conv_algorithm(conv((1, 8, 5, 5), (16, 8, 1, 1), (1, 16, 3, 3),
                               strides=(2, 2))) == "1x1"
    assert conv_algorithm(conv((1, 8, 5, 5), (16, 8, 1, 1), (1, 16, 7, 7),
                               pads=(1,) * 4)) == "direct"       # a padded 1x1 is not pointwise
    assert conv_algorithm(conv((1, 8, 5, 5), (16, 8, 3, 3), (1, 16, 5, 5),
                               pads=(1,) * 4)) == "direct"


def test_implementations_name_their_algorithm():
    pointwise = conv((1, 8, 5, 5), (16, 8, 1, 1), (1, 16, 5, 5))
    numpy_conv = registry.get("numpy.conv")
    assert [numpy_conv.algorithm(pointwise, c) for c in numpy_conv.configs(pointwise)] == \
        ["1x1 gemm"]
    assert numpy_conv.algorithm(pointwise, {"strategy": "im2col"}) == "im2col gemm"
    assert registry.get("dsl.cpu").algorithm(pointwise, {}) == "1x1"
    blocked_in = conv((1, 2, 5, 5, 8), (16, 16, 3, 3), (1, 2, 5, 5, 8), domain="wpk.nchwc",
                      pads=(1,) * 4)
    nchw_in = conv((1, 3, 5, 5), (16, 3, 3, 3), (1, 2, 5, 5, 8), domain="wpk.nchwc",
                   pads=(1,) * 4)
    mlas = registry.get("ort.nchwc")
    assert mlas.algorithm(blocked_in, {}) == "direct"
    assert mlas.algorithm(nchw_in, {}) == "direct (NCHW input)"
    matmul = Workload("MatMul", (spec(2, 5), spec(5, 7)), (spec(2, 7),))
    assert registry.get("numpy.matmul").algorithm(matmul, {}) == "gemm (BLAS)"
    # the default: the implementation's own name
    assert registry.get("ort").algorithm(matmul, {}) == "ort"


def test_micro_kernels_name_the_algorithm_their_config_picks():
    blocked_in = conv((1, 2, 5, 5, 8), (16, 16, 3, 3), (1, 2, 5, 5, 8), domain="wpk.nchwc",
                      pads=(1,) * 4)
    strided = conv((1, 2, 9, 9, 8), (16, 16, 3, 3), (1, 2, 5, 5, 8), domain="wpk.nchwc",
                   pads=(1,) * 4, strides=(2, 2))
    stem = conv((1, 3, 5, 5), (16, 3, 3, 3), (1, 2, 5, 5, 8), domain="wpk.nchwc",
                pads=(1,) * 4)
    micro = registry.get("micro.nchwc")
    assert micro.algorithm(blocked_in, {"split": 0}) == "direct"
    assert micro.algorithm(strided, {"split": 1}) == "direct, phase split"
    assert micro.algorithm(blocked_in, {"split": 1}) == "direct, padded input"
    assert micro.algorithm(stem, {"split": 0}) == "direct (NCHW input)"
    winograd = registry.get("micro.winograd")
    assert winograd.algorithm(blocked_in, {"m": 4}) == "winograd F(4x4,3x3)"
    assert winograd.algorithm(blocked_in, {"m": 2}) == "winograd F(2x2,3x3)"
    matmul = Workload("MatMul", (spec(2, 5), spec(5, 7)), (spec(2, 7),))
    assert registry.get("micro.gemm").algorithm(matmul, {}) == "gemm"


def test_inverted_residual_counts_its_three_convs_and_names_its_algorithms():
    block = block_workload(1, 16, 96, 24, 9, 9, k=3, stride=2)
    # expand 1x1 16->96 at 9x9, depthwise 3x3 stride 2 -> 5x5, project 1x1 96->24 at 5x5
    expected = 2 * (96 * 81 * 16 + 96 * 25 * 9 + 24 * 25 * 96)
    assert workload_flops(block) == expected
    assert registry.get("micro.inverted_residual").algorithm(block, {}).startswith("fused")
    assert "separate" in registry.get("ort.inverted_residual").algorithm(block, {})


def test_gated_expansion1_block_counts_its_convs_only():
    """No expand conv; the gate's two 1x1 convs on the pooled vector count, the pool and
    the multiply (no multiply-adds of a conv) do not."""
    block = block_workload(1, 16, 16, 24, 9, 9, k=3, stride=2, squeezed=8, expand=False)
    expected = 2 * (16 * 25 * 9 + 24 * 25 * 16 + 8 * 16 + 16 * 8)
    assert workload_flops(block) == expected
