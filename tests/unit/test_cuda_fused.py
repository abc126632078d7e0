"""Fused CUDA kernels without a GPU: the attention kernel's loop IR in the GPU emulator
against the float64 reference on odd sizes (sequences not a multiple of the tiles, masks
of several broadcasts, heads, rank 3, K^T), the emulator catching a missing barrier,
configs over a preset's limits rejected, offline compiles for an old and a new preset, the
unfused peer, and an offline build of a small transformer whose plan lists the fused
candidates, verified and predicted."""

from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import wpk
from wpk.core.devices import gpu_preset
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.dsl import loopir as L
from wpk.dsl.emulator import EmulatorError, emulate
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_available
from wpk.kernels.cpu.attention_spec import attention_shape
from wpk.kernels.cuda.fused import (
    FUSED_CUDA,
    UNFUSED_ATTENTION,
    fused_candidates,
    fused_configs,
)
from wpk.kernels.cuda.fused_attention import (
    attention_config_reason,
    attention_feeds,
    lower_attention,
)
from wpk.kernels.cuda.offline import check_usage, cubin_arch
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.search.predicted import PredictedRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import transformer_encoder  # noqa: E402

H100, P100 = gpu_preset("h100"), gpu_preset("p100")
TOLERANCE = 1e-5


def attention(lead=(2, 3), sq=37, sk=45, d=20, dv=13, k_transposed=False, mask=None,
              scale=0.31) -> Workload:
    k = lead + ((d, sk) if k_transposed else (sk, d))
    inputs = [TensorSpec(lead + (sq, d)), TensorSpec(k), TensorSpec(lead + (sk, dv))]
    if mask is not None:
        inputs.append(TensorSpec(mask))
    return Workload("Attention", tuple(inputs), (TensorSpec(lead + (sq, dv)),),
                    (("k_transposed", int(k_transposed)), ("scale", scale)), domain="wpk")


def arrays_for(w: Workload, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = [rng.standard_normal(s.shape).astype(np.float32) * 2 for s in w.inputs[:3]]
    if len(w.inputs) > 3:
        mask = rng.standard_normal(w.inputs[3].shape).astype(np.float32)
        arrays.append(np.where(mask > 1.0, -1e4, mask).astype(np.float32))  # keys masked away
    return arrays


def emulated_error(w: Workload, config: dict, rng: np.random.Generator) -> float:
    func = lower_attention(w, config)
    arrays = arrays_for(w, rng)
    feeds = {name: arrays[i] for name, i in attention_feeds(w).items()}
    out = emulate(func, feeds)["Y"]          # poisoned with NaN: every element written
    assert np.isfinite(out).all()
    return relative_l2(out, reference(w, arrays)[0])


@pytest.mark.parametrize("w, config", [
    (attention(), {"tq": 32, "tk": 16}),                                  # tails in q and k
    (attention(k_transposed=True), {"tq": 32, "tk": 32}),
    (attention(mask=(2, 1, 1, 45)), {"tq": 64, "tk": 16}),                # padding mask
    (attention(mask=(1, 1, 37, 45)), {"tq": 32, "tk": 64}),               # causal-like
    (attention(mask=(2, 3, 37, 45), k_transposed=True), {"tq": 32, "tk": 16}),
    (attention(lead=(3,), mask=(37, 45)), {"tq": 64, "tk": 32}),          # rank 3
    (attention(lead=(1, 2), sq=5, sk=3, d=7, dv=9), {"tq": 32, "tk": 16}),  # one tile
    (attention(lead=(1, 1), sq=70, sk=33, d=8, dv=8, mask=(1, 1, 1, 33)),
     {"tq": 32, "tk": 16}),                                               # 3 query tiles
], ids=["tails", "kt", "padmask", "sqmask", "fullmask-kt", "rank3", "tiny", "qtiles"])
def test_emulated_attention_matches_the_float64_reference(w, config):
    assert attention_config_reason(attention_shape(w), config, H100) is None
    assert emulated_error(w, config, np.random.default_rng(1)) <= TOLERANCE


def test_the_emulator_catches_the_kernel_without_its_barriers():
    """The check can fail: the same kernel with its __syncthreads() removed races."""
    w = attention(lead=(1, 1), sq=40, sk=40, d=8, dv=8)
    func = lower_attention(w, {"tq": 32, "tk": 16})

    def strip(stmt):
        if isinstance(stmt, L.Seq):
            return L.Seq(tuple(strip(s) for s in stmt.stmts if not isinstance(s, L.Barrier)))
        if isinstance(stmt, L.For):
            return replace(stmt, body=strip(stmt.body))
        return stmt

    kernel = replace(func.kernels[0], body=strip(func.kernels[0].body))
    broken = replace(func, kernels=(kernel,))
    arrays = arrays_for(w, np.random.default_rng(0))
    with pytest.raises(EmulatorError, match="race"):
        emulate(broken, {name: arrays[i] for name, i in attention_feeds(w).items()})


def test_configs_over_the_preset_limits_are_rejected():
    big = attention_shape(attention(d=1024, dv=64))
    reason = attention_config_reason(big, {"tq": 128, "tk": 64}, P100)
    assert reason is not None and "shared memory" in reason
    wide = attention_shape(attention(d=4, dv=240))   # 16 scores + 240 accumulators a thread
    assert "registers" in attention_config_reason(wide, {"tq": 32, "tk": 16}, H100)
    assert attention_config_reason(big, {"tq": 48, "tk": 16}, H100).startswith("tq")
    configs = fused_configs(attention(), H100, count=3)
    assert len(configs) == 3 and all(c["gpu"] == "h100" for c in configs)
    assert fused_configs(Workload("Relu", (TensorSpec((4,)),), (TensorSpec((4,)),)), H100) \
        == []


def _compile_and_predict(gpu, arch):
    w = attention(lead=(1, 2), sq=40, sk=40, d=16, dv=16, mask=(1, 1, 1, 40))
    config = fused_configs(w, gpu, count=1)[0]
    built = FUSED_CUDA.build(w, config)
    assert built.binary.arch == arch and cubin_arch(built.binary.cubin) == arch
    assert check_usage(built.binary.kernels, built.launches, gpu) is None
    result = PredictedRunner(gpu).measure(w, Candidate(FUSED_CUDA, config))
    assert result.ok, result.message
    assert result.extra["predicted"] and "emulator" in result.message
    assert result.rel_l2_error <= TOLERANCE and result.median_s > 0
    files = FUSED_CUDA.artifacts(w, config)
    launch = json.loads(files["launch.json"])
    assert [p["role"] for p in launch["params"]] == ["input"] * 4 + ["output"]
    assert launch["kernels"][0]["usage"]["registers"] > 0


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) is not installed")
def test_fused_attention_compiles_for_a_new_preset():
    _compile_and_predict(H100, "sm_90")


@pytest.mark.skipif(not nvrtc_available(),
                    reason="the NVRTC 12 + ptxas wheels (nvidia-cuda-nvrtc-cu12, "
                           "nvidia-cuda-nvcc-cu12) are not installed")
def test_fused_attention_compiles_for_an_old_preset():
    _compile_and_predict(P100, "sm_60")


def test_the_unfused_peer_computes_attention_and_is_predicted():
    w = attention(mask=(2, 1, 1, 45), k_transposed=True)
    arrays = arrays_for(w, np.random.default_rng(2))
    out = np.full(w.outputs[0].shape, np.nan, np.float32)
    UNFUSED_ATTENTION.prepare(w, {}, {})(arrays, [out])
    assert relative_l2(out, reference(w, arrays)[0]) <= TOLERANCE
    result = PredictedRunner(H100).measure(w, Candidate(UNFUSED_ATTENTION, {}))
    model = result.extra["model"]
    assert result.ok and model["model"] == "cublas+softmax+cublas"
    assert result.median_s > model["roofline_s"] > 0
    labels = [c.implementation.name for c in fused_candidates(w, H100, 2)]
    assert labels == ["cuda.fused", "cuda.fused", "cuda.attention.unfused"]


def test_an_offline_transformer_build_lists_the_fused_candidates(tmp_path):
    model = transformer_encoder(seq_len=24, d_model=32, heads=2, ffn=64)
    path = tmp_path / "t.wpk"
    wpk.build(model, target="cuda", gpu="h100", offline=True, output=str(path))
    with zipfile.ZipFile(path) as z:
        report = json.loads(z.read("report.json"))
        manifest = json.loads(z.read("manifest.json"))
    [step] = [s for s in manifest["steps"] if s["op"] == "Attention"]
    assert step["impl"] in ("cuda.fused", "cuda.attention.unfused")
    [item] = [w for w in report["workloads"] if w["op"] == "Attention"]
    fused = [c for c in item["candidates"] if c["impl"] == "cuda.fused"]
    assert fused and all(c["status"] == "ok" and c["predicted"] for c in fused)
    assert all("emulator" in c["message"] for c in fused)
    assert any(c["impl"] == "cuda.attention.unfused" for c in item["candidates"])
    assert item["predicted"] and item["gflops"] > 0
