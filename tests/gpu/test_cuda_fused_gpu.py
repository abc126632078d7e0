"""The fused CUDA kernels on a real GPU (skipped without one, see conftest.py): the fused
attention and inverted-residual kernels, compiled for the GPU present and loaded from their
cubin, against the float64 reference and against their unfused peers (cuBLAS + softmax via
cupy; three cuDNN convs) on the same inputs; a transformer plan built on the GPU runs and
matches onnxruntime. Run by scripts/gpu_check.sh (part gpu-fused)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cuda.fused import (
    FUSED_CUDA,
    UNFUSED_ATTENTION,
    UNFUSED_INVERTED_RESIDUAL,
    fused_configs,
)
from wpk.kernels.cuda.irb_spec import irb_workload
from wpk.kernels.reference import reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import random_inputs, transformer_encoder  # noqa: E402

pytestmark = pytest.mark.gpu


def _relative_l2(got, ref) -> float:
    got, ref = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def _attention(lead=(1, 12), sq=77, sk=77, d=64, dv=64, mask=(1, 1, 1, 77)) -> Workload:
    inputs = [TensorSpec(lead + (sq, d)), TensorSpec(lead + (d, sk)),
              TensorSpec(lead + (sk, dv)), TensorSpec(mask)]
    return Workload("Attention", tuple(inputs), (TensorSpec(lead + (sq, dv)),),
                    (("k_transposed", 1), ("scale", 0.125)), domain="wpk")


WORKLOADS = [_attention(), irb_workload(1, 24, 144, 24, 29, 29, residual=True),
             irb_workload(1, 32, 192, 64, 28, 28, stride=2, k=5),
             # MaxViT's window attention: [B, windows, heads, 49, 32], a per-head bias
             _attention(lead=(1, 16, 4), sq=49, sk=49, d=32, dv=32, mask=(4, 49, 49))]


def _run(cupy, kernel, w, arrays):
    inputs = [None if a is None else cupy.asarray(a) for a in arrays]
    out = cupy.full(w.outputs[0].shape, cupy.nan, cupy.float32)
    kernel(inputs, [out])
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(out)


@pytest.mark.parametrize("w", WORKLOADS, ids=["attention", "irb", "irb-5x5-s2",
                                             "attention-rank5"])
def test_fused_kernels_match_the_reference_and_their_peers(cupy, present_gpu, w):
    rng = np.random.default_rng(0)
    arrays = [None if s is None else rng.standard_normal(s.shape).astype(np.float32)
              for s in w.inputs]
    consts = {i: arrays[i] for i in w.const_inputs}
    expected = reference(w, arrays)[0]
    for config in fused_configs(w, present_gpu, 3):
        got = _run(cupy, FUSED_CUDA.prepare(w, consts, config), w, arrays)
        assert np.isfinite(got).all() and _relative_l2(got, expected) < 1e-4, config
    peer = UNFUSED_ATTENTION if w.op == "Attention" else UNFUSED_INVERTED_RESIDUAL
    got = _run(cupy, peer.prepare(w, consts, {}), w, arrays)
    assert _relative_l2(got, expected) < 1e-4


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min], ids=["-inf", "min"])
def test_the_fused_attention_takes_a_masked_fills_causal_mask(cupy, present_gpu, fill):
    """torch's masked_fill (-inf or float32's lowest on the future keys, rule
    `masked_fill_as_mask`): row 0 keeps key 0 alone, so most split threads of the early
    rows see no key; the device's fast exp must give 0 for -inf as the emulator's does."""
    w = _attention(mask=(1, 1, 77, 77))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s.shape).astype(np.float32) for s in w.inputs[:3]]
    future = np.triu(np.ones((77, 77), bool), k=1)
    arrays.append(np.where(future, np.float32(fill), np.float32(0))[None, None])
    expected = reference(w, arrays)[0]
    for config in fused_configs(w, present_gpu, 3):
        got = _run(cupy, FUSED_CUDA.prepare(w, {}, config), w, arrays)
        assert np.isfinite(got).all() and _relative_l2(got, expected) < 1e-4, config


def test_a_transformer_plan_with_the_fused_attention_matches_onnxruntime(tmp_path,
                                                                         present_gpu):
    import wpk

    model = transformer_encoder(seq_len=40, d_model=64, heads=4, ffn=128)
    plan = wpk.build(model, target="cuda", gpu=present_gpu.name, progress=False,
                     partition=False)
    path = tmp_path / "t.wpk"
    plan.save(path)
    steps = {s["op"]: s["impl"] for s in plan.manifest["steps"]}
    assert steps["Attention"] in ("cuda.fused", "cuda.attention.unfused")
    feeds = random_inputs(model, seed=1)
    got = wpk.load(path).run(feeds)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    assert _relative_l2(list(got.values())[0], expected[0]) < 1e-4
