"""numpy.gemm's and numpy.matmul's packing of a constant B: the tiled transpose, alpha's
scaling, and the [N, K] rows of a one-row product."""

import math

import numpy as np
import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cpu.gemm import TRANSPOSE_TILE, transposed
from wpk.kernels.registry import get


@pytest.mark.parametrize("shape", [(1, 5), (7, 1), (TRANSPOSE_TILE, TRANSPOSE_TILE),
                                   (TRANSPOSE_TILE + 3, 2 * TRANSPOSE_TILE - 1), (300, 517)])
def test_the_tiled_transpose_is_numpys_transpose(shape, rng):
    matrix = rng.standard_normal(shape).astype(np.float32)
    result = transposed(matrix)
    assert result.flags.c_contiguous and result.dtype == matrix.dtype
    assert np.array_equal(result, matrix.T)
    assert not np.shares_memory(result, matrix)


@pytest.mark.parametrize("m", [3, 1])
@pytest.mark.parametrize("trans_b, alpha", [(1, 1.0), (1, 0.5), (0, 2.0), (0, 1.0)])
def test_gemm_with_a_constant_b_matches_numpy_and_leaves_b_alone(m, trans_b, alpha, rng):
    k, n = 300, 270
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    kept = b.copy()
    workload = Workload("Gemm", (TensorSpec((m, k)), TensorSpec(b.shape)), (TensorSpec((m, n)),),
                        (("alpha", alpha), ("transB", trans_b)), const_inputs=(1,))
    kernel = get("numpy.gemm").prepare(workload, {1: b}, {})
    out = np.empty((m, n), np.float32)
    kernel([a, b], [out])
    expected = alpha * (a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    assert np.allclose(out, expected, rtol=1e-4, atol=1e-3)
    assert np.array_equal(b, kept)


def _prepared_b(kernel):
    """The packed B a numpy kernel closes over."""
    cells = dict(zip(kernel.__code__.co_freevars, kernel.__closure__))
    return cells["packed_b"].cell_contents


def test_a_one_row_gemm_reads_a_transposed_b_in_place_as_rows_of_k():
    """Batch-1 classifier (Gemm transB=1, alpha 1): B's [N, K] rows are used as they are,
    no copy; with several rows the [K, N] copy stays."""
    rng = np.random.default_rng(3)
    b = rng.standard_normal((270, 300)).astype(np.float32)
    for m, in_place in ((1, True), (3, False)):
        workload = Workload("Gemm", (TensorSpec((m, 300)), TensorSpec(b.shape)),
                            (TensorSpec((m, 270)),), (("transB", 1),), const_inputs=(1,))
        packed = _prepared_b(get("numpy.gemm").prepare(workload, {1: b}, {}))
        assert np.shares_memory(packed, b) == in_place
        assert packed.shape == (300, 270) and packed.T.flags.c_contiguous == in_place


@pytest.mark.parametrize("a_shape", [(1, 1, 300), (300,), (4, 300)])
def test_matmul_with_a_constant_b_matches_numpy_in_both_layouts(a_shape, rng):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal((300, 270)).astype(np.float32)
    kept = b.copy()
    out_shape = np.matmul(a, b).shape
    workload = Workload("MatMul", (TensorSpec(a_shape), TensorSpec(b.shape)),
                        (TensorSpec(out_shape),), (), const_inputs=(1,))
    kernel = get("numpy.matmul").prepare(workload, {1: b}, {})
    out = np.empty(out_shape, np.float32)
    kernel([a, b], [out])
    assert np.allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)
    assert np.array_equal(b, kept)
    one_row = math.prod(a_shape[:-1]) == 1
    assert _prepared_b(kernel).T.flags.c_contiguous == one_row
