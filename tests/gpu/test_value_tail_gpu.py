"""A CUDA plan with a value-dependent tail (`wpk.value_tail`) on a real GPU (skipped
without one): the static head runs on the GPU, the tail in onnxruntime on the host."""

from __future__ import annotations

import numpy as np
import pytest

import wpk
from tests.unit.test_value_tail import FAST, detector_model, image, onnxruntime_outputs

pytestmark = pytest.mark.gpu


def test_a_cuda_plan_with_a_tail_matches_onnxruntime(present_gpu, tmp_path):
    path = tmp_path / "detector.wpk"
    wpk.build(detector_model(), target="cuda", gpu="auto", output=str(path), **FAST)
    session = wpk.load(path)
    assert type(session.head).__name__ == "CudaSession"
    for seed, scale in [(1, 1.0), (3, 3.0), (4, 0.0)]:
        feeds = image(seed, scale)
        expected = onnxruntime_outputs(detector_model(), feeds)
        actual = session.run(feeds)
        for name, reference in expected.items():
            assert actual[name].shape == reference.shape, (seed, name)
            np.testing.assert_allclose(actual[name], reference, rtol=1e-4, atol=1e-5)
