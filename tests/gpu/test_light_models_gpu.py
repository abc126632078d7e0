"""The nine `light` CNNs that ship with onnx, built for the GPU present and run by the CUDA
runtime, against onnxruntime (relative L2 under 1e-4, float32). Skipped without a GPU.

Each plan is built with `--gpu auto` (every candidate measured on the GPU present with CUDA
events: generated kernels, every cuDNN plan, cuBLAS; brief timing: one warm-up, two runs)
and loaded as a CUDA-graph session. (The offline path, `--offline` then `wpk tune`, is
exercised by tests/gpu/test_cuda_runtime.py.) All nine take several minutes: on the device
tool, run them alone with `scripts/gpu_check.sh --light-only`.
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


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_plan_matches_onnxruntime(present_gpu, tmp_path, name):
    import onnxruntime as ort

    import wpk
    from wpk.runtime_cuda import CudaSession

    model = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    plan = wpk.build(model, target="cuda", gpu="auto", progress=False, warmup=1, repeats=2,
                     min_time=0.0, partition=False)
    assert plan.manifest["device"]["name"] == present_gpu.name
    assert not plan.manifest.get("predicted"), "a --gpu auto build left choices predicted"
    path = tmp_path / f"{name}.wpk"
    plan.save(path)
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
