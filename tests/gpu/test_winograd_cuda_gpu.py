"""`dsl.cuda.winograd` on the GPU present: the compiled Winograd module of each m, loaded
through the implementation's `prepare` (filter transformed on the host, constants
uploaded), against the float64 reference within the Winograd error bound and against the
emulator's result for the same inputs. Skipped without a GPU (tests/gpu/conftest.py); run
by scripts/gpu_check.sh."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload

SHAPES = {
    "odd image, asymmetric pads": ((1, 5, 7, 9), (6, 5, 3, 3), (1, 0, 2, 1)),
    "resnet 128ch 28x28": ((1, 128, 28, 28), (128, 128, 3, 3), (1, 1, 1, 1)),
}


def _workload(x, w, pads, residual: bool) -> Workload:
    n, _, h, width = x
    out = (n, w[0], h + pads[0] + pads[2] - 2, width + pads[1] + pads[3] - 2)
    inputs = [TensorSpec(x), TensorSpec(w), TensorSpec((w[0],))]
    steps = [EpilogueStep("relu")]
    if residual:
        inputs.append(TensorSpec(out))
        steps.insert(0, EpilogueStep("add", operand=3))
    return Workload("Conv", tuple(inputs), (TensorSpec(out),), (("pads", tuple(pads)),),
                    tuple(steps), const_inputs=(1, 2))


def _relative_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_winograd_module_matches_reference_and_emulator(cupy, present_gpu, shape, residual):
    from wpk.dsl.emulator import emulate
    from wpk.kernels.cuda.winograd import (
        WINOGRAD_CUDA,
        error_bound,
        preferred_winograd_configs,
    )
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    workload = _workload(*SHAPES[shape], residual)
    inputs = random_inputs(workload, np.random.default_rng(5))
    expected = reference(workload, inputs)[0]
    consts = {i: inputs[i] for i in workload.const_inputs}
    configs = preferred_winograd_configs(workload, present_gpu, 2)
    assert sorted(c["m"] for c in configs) == [2, 4]
    for config in configs:
        kernel = WINOGRAD_CUDA.prepare(workload, consts, config)
        out = cupy.full(workload.outputs[0].shape, np.nan, cupy.float32)
        kernel([cupy.asarray(a) for a in inputs], [out])
        cupy.cuda.Device().synchronize()
        got = cupy.asnumpy(out)
        assert not np.isnan(got).any(), f"{config}: unwritten outputs"
        bound = error_bound(workload, config["m"])
        assert _relative_l2(got, expected) <= bound, config
        if shape.startswith("odd"):   # the emulator runs small grids quickly
            built = WINOGRAD_CUDA.build(workload, config, compile=False)
            feeds, output = WINOGRAD_CUDA.emulator_feeds(workload, inputs, config)
            emulated = emulate(built.func, feeds)[output]
            assert _relative_l2(got, emulated) <= bound, f"{config}: GPU and emulator disagree"
