"""Winograd F(2x2,3x3) and F(4x4,3x3) on the CUDA target (`dsl.cuda.winograd`): the DSL
operators of kernels/dsl/winograd.wpk under their CUDA schedule, run in the GPU emulator
against the float64 reference on odd shapes, compiled for an old and a new preset, and
ranked by the analytical model in an offline build (predicted, never measured here)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.cli import main
from wpk.core.devices import detect_gpus, gpu_preset
from wpk.core.errors import ScheduleError
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.dsl.emulator import emulate
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_available
from wpk.kernels.cuda import analytic
from wpk.kernels.cuda.offline import check_usage, cubin_arch, verify_emulated
from wpk.kernels.cuda.target import CudaTarget
from wpk.kernels.cuda.winograd import (
    WINOGRAD_CUDA,
    error_bound,
    preferred_winograd_configs,
    winograd_constants,
    winograd_reason,
    winograd_space,
)
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.plans.planfile import read_plan
from wpk.search.predicted import PredictedRunner

T4 = gpu_preset("t4")
H100 = gpu_preset("h100")


def conv(n=1, c=3, k=5, h=7, w=9, pads=(1, 1, 1, 1), bias=True, epilogue=(), **attrs):
    """A Conv workload whose filter (and bias) are constants, as after wpk's passes."""
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    inputs = [TensorSpec((n, c, h, w)), TensorSpec((k, c, 3, 3))]
    if bias:
        inputs.append(TensorSpec((k,)))
    extra = []
    for step in epilogue:
        if step.operand is not None:
            extra.append(TensorSpec((n, k, oh, ow)))
    return Workload("Conv", (*inputs, *extra), (TensorSpec((n, k, oh, ow)),),
                    (("pads", tuple(pads)), *attrs.items()), epilogue=tuple(epilogue),
                    const_inputs=tuple(range(1, len(inputs))))


def emulated_error(workload, config, seed=0) -> float:
    """Relative L2 error of the config's module, every kernel emulated fully, on fresh
    random inputs against the float64 reference."""
    built = WINOGRAD_CUDA.build(workload, config, compile=False)
    inputs = random_inputs(workload, np.random.default_rng(seed))
    expected = reference(workload, inputs)[0]
    feeds, output = WINOGRAD_CUDA.emulator_feeds(workload, inputs, config)
    got = emulate(built.func, feeds)[output]
    assert not np.isnan(got).any(), "an output element was never written"
    return relative_l2(got, expected)


ODD_SHAPES = {
    "1-pixel image": dict(n=2, c=3, k=5, h=1, w=1),
    "odd image, asymmetric pads": dict(c=5, k=7, h=7, w=5, pads=(1, 0, 2, 1)),
    "no padding, wide": dict(c=1, k=3, h=5, w=11, pads=(0, 0, 0, 0)),
    "channels off every tile": dict(c=17, k=9, h=6, w=6, bias=False),
}


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("shape", list(ODD_SHAPES))
def test_emulated_winograd_matches_float64_on_odd_shapes(m, shape):
    workload = conv(**ODD_SHAPES[shape])
    space = winograd_space(workload, T4)
    configs = [p for p in space.preferred_configs(8) if p["m"] == m][:2]
    assert configs, "no valid config"
    # and a point that stages nothing in shared memory, several outputs per thread
    plain = next(p for p in space.template(m).space().points()
                 if p["tile_r"] == 0 and p["per_thread"] == 2 and p["tile_m"] == 2
                 and space.validate({"m": m, **p}) is None)
    for config in [*configs, {"m": m, **plain}]:
        config = dict(config, gpu=T4.name)
        error = emulated_error(workload, config)
        assert error <= error_bound(workload, m), (config, error)


def test_fused_relu_and_residual_epilogue_is_applied_by_the_output_transform():
    steps = (EpilogueStep("add", operand=3), EpilogueStep("relu"))
    workload = conv(c=4, k=6, h=5, w=6, epilogue=steps)
    for config in preferred_winograd_configs(workload, T4, 2):
        assert emulated_error(workload, config, seed=3) <= error_bound(workload, config["m"])


def test_the_error_bound_is_the_tolerance_and_a_wrong_filter_transform_fails_it():
    workload = conv(c=16, k=8, h=6, w=6)
    config = preferred_winograd_configs(workload, T4, 1)[0]
    m = config["m"]
    assert WINOGRAD_CUDA.tolerance(workload, config) == error_bound(workload, m)
    assert error_bound(workload, 4) > error_bound(workload, 2)
    assert WINOGRAD_CUDA.algorithm(workload, config) == f"winograd F({m}x{m},3x3)"
    built = WINOGRAD_CUDA.build(workload, config, compile=False)
    inputs = random_inputs(workload, np.random.default_rng(1))
    expected = {"Y": reference(workload, inputs)[0]}
    feeds, _ = WINOGRAD_CUDA.emulator_feeds(workload, inputs, config)
    good = verify_emulated(built.func, feeds, expected, error_bound(workload, m),
                           full_before_last=True)
    assert good.ok and good.rel_l2_error <= error_bound(workload, m)
    # a filter transformed with its rows flipped: a plausible bug the bound must catch
    wrong = dict(feeds, U=winograd_constants(inputs[1][:, :, ::-1, :], m)["U"])
    bad = verify_emulated(built.func, wrong, expected, error_bound(workload, m),
                          full_before_last=True)
    assert not bad.ok and "exceeds" in bad.message


def _conv_with(attrs: dict, weight=(5, 3, 3, 3), out=(1, 5, 7, 9), const=(1,)) -> Workload:
    return Workload("Conv", (TensorSpec((1, 3, 7, 9)), TensorSpec(weight)), (TensorSpec(out),),
                    (("pads", (1, 1, 1, 1)), *attrs.items()), const_inputs=const)


@pytest.mark.parametrize("workload, reason", [
    (_conv_with({"strides": (2, 2)}, out=(1, 5, 4, 5)), "stride-1"),
    (_conv_with({"dilations": (2, 2)}, out=(1, 5, 5, 7)), "dilation-1"),
    (_conv_with({"group": 3}, weight=(6, 1, 3, 3), out=(1, 6, 7, 9)), "one group"),
    (_conv_with({}, weight=(5, 3, 1, 1), out=(1, 5, 9, 11)), "3x3"),
    (_conv_with({}, const=()), "constant")])
def test_only_3x3_stride_1_dilation_1_ungrouped_convs_with_constant_filters(workload, reason):
    assert reason in winograd_reason(workload)
    assert WINOGRAD_CUDA.unsupported_reason(workload) == winograd_reason(workload)
    assert winograd_reason(_conv_with({})) is None


def test_search_space_has_m_as_a_knob_and_validates_per_m():
    space = winograd_space(conv(c=8, k=8, h=8, w=8), H100)
    knobs = space.space()
    assert knobs["m"] == [4, 2] and {"tile_m", "tile_n", "tile_r", "gemm_threads"} <= set(knobs)
    best = preferred_winograd_configs(conv(c=8, k=8, h=8, w=8), H100, 2)
    assert [c["m"] for c in best] == [4, 2]
    point = {k: v for k, v in best[0].items() if k != "gpu"}
    assert space.validate(point) is None
    assert "m=3" in space.validate(dict(point, m=3))
    assert space.validate(dict(point, gemm_threads=64, threads_m=128)) is not None
    with pytest.raises(ScheduleError):
        WINOGRAD_CUDA.build(conv(), dict(point, m=3, gpu="h100"), compile=False)


def test_cuda_target_offers_winograd_next_to_the_implicit_gemm():
    target = CudaTarget.for_preset(H100, predicted=True)
    labels = [c.implementation.name for c in target.candidates(conv(c=8, k=8, h=8, w=8))]
    assert labels.count("dsl.cuda.winograd") == 2 and "dsl.cuda" in labels
    assert "cuda.cudnn.predicted" in labels
    one = Workload("Conv", (TensorSpec((1, 3, 5, 5)), TensorSpec((4, 3, 1, 1))),
                   (TensorSpec((1, 4, 5, 5)),), const_inputs=(1,))
    assert "dsl.cuda.winograd" not in [c.implementation.name for c in target.candidates(one)]
    family = target.family("dsl.cuda.winograd")
    assert family is not None and family.supports(conv()) and not family.supports(one)
    assert family.template(conv()).space()["m"] == [4, 2]


def test_model_counts_the_three_stages_not_the_direct_convolution():
    workload = conv(c=64, k=64, h=56, w=56)
    direct, _ = analytic.workload_work(workload)
    # the GEMM alone does 2.25x (F(2)) and 4x (F(4)) fewer multiplies; the transforms
    # take some of it back
    for m, saving in ((2, 1.8), (4, 3.0)):
        flops, nbytes = analytic.winograd_work(workload, m)
        assert saving < direct / flops < {2: 2.25, 4: 4.0}[m]
        assert nbytes > analytic.workload_work(workload)[1]   # the workspaces' traffic


def _compiled_and_predicted(preset: str, arch: str):
    gpu = gpu_preset(preset)
    workload = conv(c=6, k=10, h=9, w=7, pads=(1, 1, 0, 1))
    runner = PredictedRunner(gpu)
    for config in preferred_winograd_configs(workload, gpu, 2):
        built = WINOGRAD_CUDA.build(workload, config)
        assert built.binary.arch == arch == cubin_arch(built.binary.cubin)
        assert check_usage(built.binary.kernels, built.launches, gpu) is None
        assert len(built.launches) == 3          # input transform, GEMM, output transform
        measured = runner.measure(workload, Candidate(WINOGRAD_CUDA, config))
        assert measured.status.value == "ok", measured.message
        assert "predicted" in measured.message and "emulator" in measured.message
        assert measured.extra["predicted"] and measured.median_s > 0
        flops = analytic.winograd_work(workload, config["m"])[0]
        assert measured.extra["model"]["flops"] == flops
        # what a plan stores: the cubin and launch.json, whose constants the GPU session
        # computes from the filter (U, BT, AT) and passes in parameter order
        files = WINOGRAD_CUDA.artifacts(workload, config)
        assert cubin_arch(files["kernel.cubin"]) == arch
        launch = json.loads(files["launch.json"])
        assert launch["m"] == config["m"] and launch["arch"] == arch
        assert [k["name"] for k in launch["kernels"]] == [k.name for k in built.launches]
        params = [(p["name"], p["role"]) for p in launch["params"]]
        assert params == [("X", "input"), ("BT", "constant"), ("AT", "constant"),
                          ("U", "constant"), ("B", "input"), ("Y", "output"),
                          ("V", "workspace"), ("M", "workspace")]
        shapes = {k: v.size for k, v in winograd_constants(np.ones((10, 6, 3, 3)),
                                                           config["m"]).items()}
        assert all(p["size"] == shapes[p["name"]] for p in launch["params"]
                   if p["role"] == "constant")
    runner.close()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_compiles_and_predicts_for_h100_with_nvcc():
    _compiled_and_predicted("h100", "sm_90")


@pytest.mark.skipif(not nvrtc_available(), reason="the NVRTC 12 + ptxas wheels "
                    "(nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12) are not installed")
def test_compiles_and_predicts_for_p100_with_nvrtc():
    _compiled_and_predicted("p100", "sm_60")


def resnet_like_model(seed: int = 0) -> onnx.ModelProto:
    """A stem conv and one basic residual block of 3x3 stride-1 convs (conv-relu-conv,
    add, relu), then global pooling: what ResNet's 3x3 layers look like, small."""
    rng = np.random.default_rng(seed)

    def const(name, shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [const("w0", (8, 3, 3, 3)), const("b0", (8,)), const("w1", (8, 8, 3, 3)),
             const("b1", (8,)), const("w2", (8, 8, 3, 3)), const("b2", (8,))]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r0"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "resnet_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(bool(detect_gpus()), reason="checks the offline (no-GPU) build")
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_offline_build_of_a_resnet_like_model_reports_the_winograd_candidates(tmp_path):
    model = tmp_path / "resnet_like.onnx"
    onnx.save(resnet_like_model(), model)
    out = tmp_path / "resnet_like.wpk"
    assert main(["build", str(model), "--gpu", "h100", "--offline", "-q", "-o", str(out),
                 "--no-partition"]) == 0
    plan = read_plan(out)
    seen = set()
    for entry in plan.report["workloads"]:
        winograd = [c for c in entry["candidates"] if c["impl"] == "dsl.cuda.winograd"]
        if not winograd:
            continue
        for cand in winograd:
            assert cand["status"] == "ok", cand["message"]
            assert cand["median_s"] > 0 and "predicted" in cand["message"]
            assert "emulator" in cand["message"]
            seen.add(cand["algorithm"])
    assert seen == {"winograd F(2x2,3x3)", "winograd F(4x4,3x3)"}
    # a chosen Winograd step carries its cubin, constants declared in launch.json
    for step in plan.manifest["steps"]:
        if step["impl"] == "dsl.cuda.winograd":
            files = {m.rsplit("/", 1)[-1]: plan.kernels[m] for m in step["artifacts"]}
            assert cubin_arch(files["kernel.cubin"]) == "sm_90"
            launch = json.loads(files["launch.json"])
            roles = {p["name"]: p["role"] for p in launch["params"]}
            assert roles["U"] == roles["BT"] == roles["AT"] == "constant"
            assert launch["m"] == step["config"]["m"]
