"""numpy.gemm's packing of a constant B: the tiled transpose and alpha's scaling."""

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


@pytest.mark.parametrize("trans_b, alpha", [(1, 1.0), (1, 0.5), (0, 2.0), (0, 1.0)])
def test_gemm_with_a_constant_b_matches_numpy_and_leaves_b_alone(trans_b, alpha, rng):
    m, k, n = 3, 300, 270
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
