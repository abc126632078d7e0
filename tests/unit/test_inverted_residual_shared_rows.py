"""Strips of the fused inverted-residual kernel that share the expanded rows at their
boundaries (`ir_templates.shared_strips`): where the compiled kernel shares them, and that
it then gives the float64 reference's result on any team, row tile, strip height, stride and
filter, with the output in place of the input too."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.numerics import relative_l2
from wpk.kernels import nchwc_format as fmt
from wpk.kernels.cpu.inverted_residual_spec import block_workload
from wpk.kernels.cpu.microkernels.inverted_residual import MICRO_INVERTED_RESIDUAL
from wpk.kernels.cpu.microkernels.ir_space import BlockSpace, block_geometry
from wpk.kernels.reference import reference

from .irb_helpers import TOLERANCE, arrays_for, openmp_threads, run, shared_strips

BLOCK = fmt.host_block_size()
RELU6 = ("clip", (("max", 6.0), ("min", 0.0)))
RELU = ("relu", ())

# (n, cin, expanded, cout, h, w, k, stride, activation, residual)
CASES = {
    "14x14-stride1-residual": (1, 16, 48, 16, 14, 14, 3, 1, RELU6, True),
    "14x14-stride2": (1, 16, 48, 24, 14, 14, 3, 2, RELU6, False),
    "5x5-stride1-odd-image": (1, 12, 36, 12, 11, 9, 5, 1, RELU, True),
    "5x5-stride2-odd-image": (1, 12, 36, 20, 13, 10, 5, 2, RELU, False),
    "two-images": (2, 8, 24, 8, 12, 7, 3, 1, RELU6, True),
}


def case_workload(case: str, **changes):
    n, cin, e, cout, h, w, k, s, act, residual = CASES[case]
    return block_workload(n, cin, e, cout, h, w, k, s, act, residual, BLOCK, **changes)


def default(workload) -> dict:
    return BlockSpace(block_geometry(workload)).default_config()


def test_strips_share_their_boundary_rows_only_where_that_spares_work():
    """One strip a thread shares; one thread, one strip an image, a large image (the rows
    spared under a sixteenth of a strip's), a gate or no expand conv: the rows twice."""
    small = case_workload("14x14-stride1-residual")
    assert shared_strips(small, default(small), 2) == 2
    assert shared_strips(small, default(small), 3) == 3
    assert shared_strips(small, default(small), 1) == 0
    two = case_workload("two-images")
    assert shared_strips(two, default(two), 2) == 0   # an image a thread: no boundary
    assert shared_strips(two, default(two), 4) == 2
    large = block_workload(1, 16, 96, 24, 112, 112, 3, 2, RELU6, False, BLOCK)
    assert shared_strips(large, default(large), 2) == 0   # 57 rows a strip, one spared
    gated = case_workload("14x14-stride1-residual", squeezed=8)
    assert shared_strips(gated, default(gated), 2) == 0
    plain = case_workload("14x14-stride1-residual", expand=False)
    assert shared_strips(plain, default(plain), 2) == 0


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_rows_keep_the_result(case, threads):
    """Row tiles of one row to the whole strip, the strips the threads make and strips of
    three rows: where the rows are shared (strips walking up and down, odd rows at a
    boundary, a 5x5 window's four rows), the result is the reference's."""
    workload = case_workload(case)
    arrays, consts = arrays_for(workload, np.random.default_rng(7), BLOCK)
    expected = reference(workload, arrays)[0]
    base = default(workload)
    shared = 0
    with openmp_threads(threads):
        for config in ({**base, "rt": 1}, {**base, "rt": 2}, base, {**base, "rt": 14},
                       {**base, "rows": 4, "rt": 3}):
            out = run(MICRO_INVERTED_RESIDUAL.prepare(workload, consts, config), workload,
                      arrays)
            assert relative_l2(out, expected) < TOLERANCE, (config, threads)
            shared += shared_strips(workload, config, threads) > 0
    # two images on two threads: an image a thread, no boundary; on three: more strips than
    # threads (a strip waiting for one that has no thread yet could wait for ever)
    unshared = case == "two-images" and threads < 4
    assert shared >= (0 if unshared else 1), (case, threads)


def test_shared_rows_leave_the_input_unread_once_the_output_overwrites_it():
    """A stride-1 strip that shares its boundary rows reads only its own rows of X, so the
    output may take X's buffer."""
    workload = case_workload("14x14-stride1-residual")
    arrays, consts = arrays_for(workload, np.random.default_rng(8), BLOCK)
    expected = reference(workload, arrays)[0]
    with openmp_threads(2):
        assert shared_strips(workload, default(workload), 2) == 2
        kernel = MICRO_INVERTED_RESIDUAL.prepare(workload, consts, default(workload))
        for _ in range(5):
            buffer = arrays[0].copy()
            kernel([buffer, *arrays[1:]], [buffer])
            assert relative_l2(buffer, expected) < TOLERANCE
