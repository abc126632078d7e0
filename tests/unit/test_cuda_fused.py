"""Fused CUDA kernels without a GPU: the attention and inverted-residual kernels' loop IR
in the GPU emulator against the float64 reference on odd sizes (sequences not a multiple
of the tiles, masks of several broadcasts, heads, rank 3, K^T; odd channel counts, stride
2, 5x5, residuals, no biases, partial tiles), the emulator catching a missing barrier,
configs over a preset's limits rejected, offline compiles for an old and a new preset, the
unfused peers, the NCHW block pass (and where it must not fire), and offline builds of a
small transformer and a small MobileNet-like block whose plans list the fused candidates,
verified and predicted."""

from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

import wpk
from wpk.core.devices import gpu_preset
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.dsl import loopir as L
from wpk.dsl.emulator import EmulatorError, emulate
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_available
from wpk.frontend import load_model
from wpk.kernels.cpu.attention_spec import attention_shape
from wpk.kernels.cuda.fused import (
    FUSED_CUDA,
    UNFUSED_ATTENTION,
    UNFUSED_INVERTED_RESIDUAL,
    fused_candidates,
    fused_configs,
)
from wpk.kernels.cuda.fused_attention import (
    attention_config_reason,
    attention_feeds,
    lower_attention,
)
from wpk.kernels.cuda.fused_irb import irb_config_reason, irb_feeds, lower_irb
from wpk.kernels.cuda.irb_spec import irb_workload
from wpk.kernels.cuda.offline import check_usage, cubin_arch
from wpk.kernels.flops import workload_flops
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.passes import optimize, rule_docs, to_onnx
from wpk.search.predicted import PredictedRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import transformer_encoder  # noqa: E402

H100, P100 = gpu_preset("h100"), gpu_preset("p100")
TOLERANCE = 1e-5
OFFLINE_PRESET = "p100" if nvrtc_available() else "h100"   # NVRTC compiles faster than nvcc


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
    (attention(), {"tq": 32, "tk": 16, "split": 1}),                      # tails in q and k
    (attention(k_transposed=True), {"tq": 32, "tk": 32, "split": 2}),
    (attention(mask=(2, 1, 1, 45)), {"tq": 64, "tk": 16, "split": 1}),    # padding mask
    (attention(mask=(1, 1, 37, 45)), {"tq": 16, "tk": 64, "split": 4}),   # causal-like
    (attention(mask=(2, 3, 37, 45), k_transposed=True), {"tq": 32, "tk": 16, "split": 8}),
    (attention(lead=(3,), mask=(37, 45)), {"tq": 64, "tk": 32, "split": 2}),   # rank 3
    (attention(lead=(1, 2), sq=5, sk=3, d=7, dv=9),
     {"tq": 16, "tk": 16, "split": 8}),            # one tile, fewer keys than threads a row
    (attention(lead=(1, 1), sq=70, sk=33, d=8, dv=8, mask=(1, 1, 1, 33)),
     {"tq": 32, "tk": 16, "split": 1}),                                   # 3 query tiles
    (attention(lead=(2, 3, 2), sq=17, sk=19, mask=(2, 3, 1, 17, 19)),
     {"tq": 16, "tk": 16, "split": 2}),            # rank 5 (MaxViT): windows folded
    (attention(lead=(1, 4, 2), sq=17, sk=17, mask=(2, 17, 17), k_transposed=True),
     {"tq": 32, "tk": 16, "split": 1}),            # rank 5, a per-head bias
], ids=["tails", "kt-split2", "padmask", "sqmask-split4", "fullmask-kt-split8",
        "rank3-split2", "tiny-split8", "qtiles", "rank5-window-mask", "rank5-bias-kt"])
def test_emulated_attention_matches_the_float64_reference(w, config):
    assert attention_config_reason(attention_shape(w), config, H100) is None
    assert emulated_error(w, config, np.random.default_rng(1)) <= TOLERANCE


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min], ids=["-inf", "min"])
@pytest.mark.parametrize("config", [{"tq": 16, "tk": 16, "split": 8},
                                    {"tq": 32, "tk": 32, "split": 1}], ids=["split8", "split1"])
def test_emulated_attention_takes_a_masked_fills_causal_mask(fill, config):
    """torch's masked_fill as an added mask (rule `masked_fill_as_mask`): -inf or
    float32's lowest on the future keys. Row 0 keeps key 0 alone, so most of its split
    threads see no key in any tile (their running max stays at the fill) and whole key
    tiles of the early rows are masked; every output stays finite and matches."""
    w = attention(lead=(1, 2), sq=37, sk=37, mask=(1, 1, 37, 37))
    rng = np.random.default_rng(3)
    arrays = arrays_for(w, rng)[:3]
    future = np.triu(np.ones((37, 37), bool), k=1)
    arrays.append(np.where(future, np.float32(fill), np.float32(0))[None, None])
    feeds = {name: arrays[i] for name, i in attention_feeds(w).items()}
    out = emulate(lower_attention(w, config), feeds)["Y"]
    assert np.isfinite(out).all()
    assert relative_l2(out, reference(w, arrays)[0]) <= TOLERANCE


@pytest.mark.parametrize("config", [{"tq": 16, "tk": 16, "split": 8},
                                    {"tq": 32, "tk": 32, "split": 1}], ids=["split8", "split1"])
def test_emulated_attention_gives_a_query_with_no_key_nan_rows(config):
    """A query row whose keys are all -inf comes out NaN, as the softmax of the separate
    nodes does, and the other rows finite: the NaN guard of torch's export, moved past the
    product (pass `softmax_nan_guard`), then makes it the zeros the model gives."""
    w = attention(lead=(1, 2), sq=37, sk=37, mask=(1, 1, 37, 37))
    arrays = arrays_for(w, np.random.default_rng(3))[:3]
    mask = np.zeros((37, 37), np.float32)
    mask[5] = -np.inf
    arrays.append(mask[None, None])
    feeds = {name: arrays[i] for name, i in attention_feeds(w).items()}
    out = emulate(lower_attention(w, config), feeds)["Y"]
    assert np.isnan(out[:, :, 5]).all()
    assert np.isfinite(np.delete(out, 5, axis=2)).all()


def test_the_emulator_catches_the_kernel_without_its_barriers():
    """The check can fail: the same kernel with its __syncthreads() removed races."""
    w = attention(lead=(1, 1), sq=40, sk=40, d=8, dv=8)
    func = lower_attention(w, {"tq": 32, "tk": 16, "split": 2})

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
    reason = attention_config_reason(big, {"tq": 128, "tk": 64, "split": 1}, P100)
    assert reason is not None and "shared memory" in reason
    wide = attention_shape(attention(d=4, dv=240))   # 16 scores + 240 accumulators a thread
    assert "registers" in attention_config_reason(wide, {"tq": 32, "tk": 16, "split": 1},
                                                  H100)
    assert attention_config_reason(big, {"tq": 48, "tk": 16, "split": 1}, H100)\
        .startswith("tq")
    assert "threads" in attention_config_reason(big, {"tq": 128, "tk": 16, "split": 4}, H100)
    small = attention_shape(attention(d=8, dv=8))
    assert attention_config_reason(small, {"tq": 16, "tk": 64, "split": 8}, H100) is None
    configs = fused_configs(attention(), H100, count=3)
    assert len(configs) == 3 and all(c["gpu"] == "h100" for c in configs)
    assert fused_configs(Workload("Relu", (TensorSpec((4,)),), (TensorSpec((4,)),)), H100) \
        == []


# ----------------------------------------------------------------------------- inverted residual
RELU6 = ("clip", (("max", 6.0), ("min", 0.0)))


@pytest.mark.parametrize("w, config", [
    (irb_workload(1, 5, 19, 7, 9, 11), {"tile": 4, "ec": 8, "threads": 64, "cs": 1}),  # odd
    (irb_workload(2, 6, 20, 6, 9, 7, residual=True),
     {"tile": 2, "ec": 16, "threads": 64, "cs": 4}),          # 6 channels over 4 blocks
    (irb_workload(1, 5, 13, 9, 11, 10, k=5, stride=2, biases=False),
     {"tile": 4, "ec": 8, "threads": 128, "cs": 2}),
    (irb_workload(1, 3, 24, 5, 8, 8, stride=2, act=("relu", ())),
     {"tile": 8, "ec": 16, "threads": 64, "cs": 1}),
    (irb_workload(1, 4, 12, 4, 7, 7, k=5, residual=True, act=("hard_swish", ())),
     {"tile": 4, "ec": 32, "threads": 256, "cs": 1}),                           # ec > E
    (irb_workload(1, 7, 21, 7, 5, 6, residual=True),
     {"tile": 1, "ec": 8, "threads": 64, "cs": 2}),                             # 1x1 tiles
], ids=["odd", "residual-batch2-cs4", "5x5-s2-nobias-cs2", "relu-s2-tile8", "hardswish-5x5",
        "tile1-cs2"])
def test_emulated_inverted_residual_matches_the_float64_reference(w, config):
    assert irb_config_reason(w, config, H100) is None
    rng = np.random.default_rng(3)
    arrays = [None if s is None else rng.standard_normal(s.shape).astype(np.float32)
              for s in w.inputs]
    out = emulate(lower_irb(w, config), {n: arrays[i] for n, i in irb_feeds(w).items()})["Y"]
    assert np.isfinite(out).all()
    assert relative_l2(out, reference(w, arrays)[0]) <= TOLERANCE


def test_inverted_residual_configs_over_the_limits_are_rejected():
    wide = irb_workload(1, 320, 64, 64, 56, 56, stride=2)    # a 17x17 patch of 320 channels
    assert "shared memory" in irb_config_reason(
        wide, {"tile": 8, "ec": 8, "threads": 64, "cs": 1}, P100)
    many = irb_workload(1, 8, 16, 320, 32, 32)               # 320 x 64 outputs a block
    assert "accumulators" in irb_config_reason(
        many, {"tile": 8, "ec": 8, "threads": 64, "cs": 1}, H100)
    assert irb_config_reason(many, {"tile": 8, "ec": 8, "threads": 256, "cs": 4}, H100) \
        is None                                  # 80 x 64 outputs a block, 20 a thread
    assert fused_configs(many, H100, 3) and all(
        irb_config_reason(many, c, H100) is None for c in fused_configs(many, H100, 3))


def test_the_unfused_block_is_three_cudnn_predictions():
    w = irb_workload(1, 16, 96, 24, 28, 28, stride=2)
    result = PredictedRunner(H100).measure(w, Candidate(UNFUSED_INVERTED_RESIDUAL, {}))
    assert result.ok and result.extra["model"]["model"] == "cudnn x3"
    # the convs' multiply-adds plus one operation per activation and bias (the model's)
    assert workload_flops(w) <= result.extra["model"]["flops"] <= 1.1 * workload_flops(w)
    labels = [c.implementation.name for c in fused_candidates(w, H100, 2)]
    assert labels == ["cuda.fused", "cuda.fused", "cuda.inverted_residual.unfused"]


def block_model(residual=True, stride=1, act="Clip", group=None, expand_output=False,
                dilation=1) -> onnx.ModelProto:
    """X [1, 6, 9, 9] -> Conv1x1 (18) + act -> depthwise 3x3 + act -> Conv1x1 (6) [+ X]."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def weight(name, shape):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    def conv(x, name, w_shape, **attrs):
        nodes.append(h.make_node("Conv", [x, weight(name + "_w", w_shape),
                                          weight(name + "_b", (w_shape[0],))], [name], **attrs))
        return name

    def activation(x, name):
        if act == "Clip":
            inits.extend([numpy_helper.from_array(np.array(0, np.float32), name + "_lo"),
                          numpy_helper.from_array(np.array(6, np.float32), name + "_hi")])
            nodes.append(h.make_node("Clip", [x, name + "_lo", name + "_hi"], [name]))
        else:
            nodes.append(h.make_node(act, [x], [name]))
        return name

    h1 = activation(conv("x", "expand", (18, 6, 1, 1)), "h1")
    pads = [dilation] * 4
    h2 = activation(conv(h1, "dw", (18, (18 // group) if group else 1, 3, 3),
                         group=group or 18, strides=[stride] * 2, pads=pads,
                         dilations=[dilation] * 2), "h2")
    y = conv(h2, "project", (6, 18, 1, 1))
    if residual:
        nodes.append(h.make_node("Add", [y, "x"], ["y"]))
        y = "y"
    size = (9 + 2 * dilation - 2 * dilation - 1) // stride + 1
    outputs = [h.make_tensor_value_info(y, TensorProto.FLOAT, [1, 6, size, size])]
    if expand_output:
        outputs.append(h.make_tensor_value_info(h1, TensorProto.FLOAT, [1, 18, 9, 9]))
    graph = h.make_graph(nodes, "block", [h.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 6, 9, 9])], outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("options", [{}, {"residual": False, "stride": 2}, {"act": "Relu"}],
                         ids=["residual", "stride2", "relu"])
def test_the_nchw_block_pass_fuses_and_computes_the_same(options):
    model = block_model(**options)
    graph, report = optimize(load_model(model), "cuda")
    assert graph.op_counts() == {"InvertedResidualNCHW": 1}
    assert report.rules["inverted_residual_nchw"] == 1
    x = np.random.default_rng(1).standard_normal((1, 6, 9, 9)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    back = ort.InferenceSession(to_onnx(graph).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(back, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, why", [
    ({"expand_output": True}, "the expanded tensor is a graph output"),
    ({"group": 6}, "a grouped, not depthwise, 3x3 conv"),
    ({"dilation": 2}, "a dilated depthwise conv"),
    ({"act": "Softmax"}, "an activation that is no epilogue step"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_the_nchw_block_pass_does_not_fire(options, why):
    graph, report = optimize(load_model(block_model(**options)), "cuda")
    assert "InvertedResidualNCHW" not in graph.op_counts(), why
    assert report.rules.get("inverted_residual_nchw", 0) == 0


def test_the_nchw_block_rule_runs_only_for_cuda():
    assert "inverted_residual_nchw" in rule_docs("cuda")
    assert "inverted_residual_nchw" not in rule_docs("cpu")
    graph, _ = optimize(load_model(block_model()), "cpu")
    assert "InvertedResidualNCHW" not in graph.op_counts()


# ----------------------------------------------------------------------------- compile
def _compile_and_predict(gpu, arch, w):
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
    roles = [p["role"] for p in launch["params"]]
    assert roles == ["input"] * (len(roles) - 1) + ["output"]
    assert launch["kernels"][0]["usage"]["registers"] > 0


FUSED_WORKLOADS = [attention(lead=(1, 2), sq=40, sk=40, d=16, dv=16, mask=(1, 1, 1, 40)),
                   irb_workload(1, 8, 24, 8, 10, 10, residual=True)]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("w", FUSED_WORKLOADS, ids=["attention", "irb"])
def test_fused_kernels_compile_for_a_new_preset(w):
    _compile_and_predict(H100, "sm_90", w)


@pytest.mark.skipif(not nvrtc_available(),
                    reason="the NVRTC 12 + ptxas wheels (nvidia-cuda-nvrtc-cu12, "
                           "nvidia-cuda-nvcc-cu12) are not installed")
@pytest.mark.parametrize("w", FUSED_WORKLOADS, ids=["attention", "irb"])
def test_fused_kernels_compile_for_an_old_preset(w):
    _compile_and_predict(P100, "sm_60", w)


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
    model = transformer_encoder(seq_len=12, d_model=16, heads=2, ffn=32)
    path = tmp_path / "t.wpk"
    wpk.build(model, target="cuda", gpu=OFFLINE_PRESET, offline=True, output=str(path))
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


def test_an_offline_mobilenet_block_build_lists_the_fused_candidates(tmp_path):
    path = tmp_path / "m.wpk"
    wpk.build(block_model(), target="cuda", gpu=OFFLINE_PRESET, offline=True,
              output=str(path))
    with zipfile.ZipFile(path) as z:
        report = json.loads(z.read("report.json"))
        manifest = json.loads(z.read("manifest.json"))
    [step] = manifest["steps"]
    assert step["op"] == "InvertedResidualNCHW"
    assert step["impl"] in ("cuda.fused", "cuda.inverted_residual.unfused")
    [item] = report["workloads"]
    fused = [c for c in item["candidates"] if c["impl"] == "cuda.fused"]
    assert fused and all(c["status"] == "ok" and "emulator" in c["message"] for c in fused)
    assert any(c["impl"] == "cuda.inverted_residual.unfused" for c in item["candidates"])
    assert item["predicted"] and item["gflops"] > 0
