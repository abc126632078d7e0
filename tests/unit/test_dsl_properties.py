"""Property tests: every library operator, random shapes, random valid schedules.

The C kernel (gcc) and the CUDA kernel run on the GPU emulator must both match
the float64 numpy reference (`compute.evaluate`) to a relative L2 error below
1e-5; the CUDA kernels also pass the kernel-by-kernel check of big pipelines.
Hypothesis is derandomised, so every run draws the same cases.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.dsl_workloads import draw_config, draw_workload
from wpk.core.numerics import relative_l2
from wpk.dsl import compute as C
from wpk.dsl.emulator import emulate
from wpk.kernels.cuda.kernel_by_kernel import verify_kernel_by_kernel
from wpk.kernels.dsl_library import list_operators, load_operator
from wpk.kernels.templates import build_cpu, lower_for, template_for

TOLERANCE = 1e-5
CONV_LIKE = {"conv2d", "conv2d_bias", "conv2d_bias_relu_add", "avgpool2d", "maxpool2d"}
SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])


def _examples(name: str, cpu: bool) -> int:
    if name in CONV_LIKE:
        return 6 if cpu else 12
    return 2 if cpu else 4


def _check(name: str, data, target: str) -> None:
    op = load_operator(name)
    bindings, arrays = draw_workload(data, op)
    reference = C.evaluate(op, arrays, bindings)
    template = template_for(C.specialize(op, bindings), target)
    config = draw_config(data, template)
    if target == "cpu":
        kernel = build_cpu(op, bindings, config)
        poisoned = {o: np.full(b.shape, np.nan, np.float32) for o in kernel.outputs
                    for b in [kernel.func.buffer(o)]}
        outputs = kernel(**arrays, out=poisoned)
    else:
        func = lower_for(op, bindings, config, "cuda")
        outputs = emulate(func, arrays)
        # the same kernels checked one at a time on sampled blocks, as big pipelines are
        by_kernel = verify_kernel_by_kernel(func, arrays, reference, TOLERANCE,
                                            full_grid_blocks=1)
        assert by_kernel.ok, f"{name} {config} bindings={bindings}: {by_kernel.message}"
    for out_name, ref in reference.items():
        err = relative_l2(outputs[out_name], ref)
        assert err < TOLERANCE, (f"{name} {target} {config} bindings={bindings}: "
                                 f"relative L2 error {err:.3g}")


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
@pytest.mark.parametrize("name", list_operators())
def test_c_kernel_matches_reference(name):
    @settings(max_examples=_examples(name, cpu=True), **SETTINGS)
    @given(st.data())
    def run(data):
        _check(name, data, "cpu")

    run()


@pytest.mark.parametrize("name", list_operators())
def test_emulated_cuda_kernel_matches_reference(name):
    @settings(max_examples=_examples(name, cpu=False), **SETTINGS)
    @given(st.data())
    def run(data):
        _check(name, data, "cuda")

    run()
