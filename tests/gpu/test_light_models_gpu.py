"""The nine `light` CNNs that ship with onnx, built for the GPU present and run by the CUDA
runtime, against onnxruntime (relative L2 under 1e-4, float32). Skipped without a GPU.

A plan is built with `--gpu PRESET --offline` (generated kernels compiled for the preset,
vendor calls predicted), its predicted choices are measured on the GPU by `wpk tune`
(a few trials, a time budget), and the tuned plan is loaded as a CUDA-graph session.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

pytestmark = pytest.mark.gpu

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
# smallest builds first, so a time-limited run checks as many models as it can
LIGHT_MODELS = ["squeezenet", "shufflenet", "bvlc_alexnet", "zfnet512", "inception_v1",
                "resnet50", "inception_v2", "densenet121", "vgg19"]
TOLERANCE = 1e-4
TUNE_BUDGET_S = 20.0


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_plan_matches_onnxruntime(present_gpu, tmp_path, name):
    import onnxruntime as ort

    import wpk
    from wpk.runtime_cuda import CudaSession
    from wpk.tune_command import tune_plan

    model = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    plan = wpk.build(model, target="cuda", gpu=present_gpu.name, offline=True, progress=False)
    path = tmp_path / f"{name}.wpk"
    plan.save(path)
    tune_plan(path, trials=2, budget=TUNE_BUDGET_S)
    session = wpk.load(path)
    assert isinstance(session, CudaSession)
    [meta] = session.get_inputs()
    x = np.random.default_rng(0).standard_normal(meta.shape).astype(np.float32)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    expected = reference.run(None, {reference.get_inputs()[0].name: x})
    got = session.run(None, {meta.name: x})
    for out, ref in zip(got, expected):
        ref64 = np.asarray(ref, np.float64)
        error = np.linalg.norm(out.astype(np.float64) - ref64) / max(np.linalg.norm(ref64),
                                                                     1e-30)
        assert error < TOLERANCE, f"{name}: relative L2 error {error:.3g}"
