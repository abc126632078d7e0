"""`wpk build --gpu NAME --offline` end to end on a machine without a GPU.

A small conv model (conv+relu, maxpool, 1x1 and 3x3 convs, concat, global
pooling, flatten, gemm, softmax) is built for h100 (nvcc, sm_90) and p100
(NVRTC 12 + ptxas, sm_60): every generated kernel in the plan must be a
cubin for that arch (read from its ELF header) and emulator-verified, and the
report must say the choices are predicted. Without --offline the build fails
with exit 2 naming the preset; `wpk tune` without the GPU fails the same way.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.cli import main
from wpk.commands.tune import tune_plan
from wpk.core.devices import detect_gpus
from wpk.core.errors import DeviceError
from wpk.kernels.cuda.offline import cubin_arch
from wpk.plans.planfile import read_plan

pytestmark = pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour")


def small_conv_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def const(name, shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [const("w1", (8, 3, 3, 3)), const("b1", (8,)), const("w2", (8, 8, 1, 1)),
             const("w3", (8, 8, 3, 3)), const("b3", (8,)), const("fc", (16, 10)),
             const("fcb", (10,))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("Conv", ["p1", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("Concat", ["c2", "r3"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "small_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("offline") / "small_conv.onnx"
    onnx.save(small_conv_model(), path)
    return path


@pytest.mark.parametrize("preset, arch, compiler", [("h100", "sm_90", "nvcc"),
                                                    ("p100", "sm_60", "nvrtc+ptxas")])
def test_offline_build_compiles_and_verifies_every_generated_kernel(
        model_path, tmp_path, capsys, preset, arch, compiler):
    out = tmp_path / f"model_{preset}.wpk"
    assert main(["build", str(model_path), "--gpu", preset, "--offline", "-q",
                 "-o", str(out), "--no-partition"]) == 0
    plan = read_plan(out)
    assert plan.target == "cuda" and plan.manifest["device"]["name"] == preset
    assert plan.manifest["predicted"]["gpu"] == preset
    assert all(step["predicted"] for step in plan.manifest["steps"])
    ops = {step["op"] for step in plan.manifest["steps"]}
    assert {"Conv", "Concat", "Gemm", "Softmax"} <= ops     # the plan is complete
    generated = [s for s in plan.manifest["steps"] if s["impl"] == "dsl.cuda"]
    assert generated, "no generated kernel was chosen"
    entries = {w["key"]: w for w in plan.report["workloads"]}
    for step in generated:
        files = {m.rsplit("/", 1)[-1]: plan.kernels[m] for m in step["artifacts"]}
        assert cubin_arch(files["kernel.cubin"]) == arch
        launch = json.loads(files["launch.json"])
        assert (launch["arch"], launch["gpu"], launch["compiler"]) == (arch, preset, compiler)
        assert step["config"]["gpu"] == preset
    # Every generated candidate that was kept compiled for the arch and passed the emulator.
    checked = 0
    for entry in entries.values():
        assert entry["predicted"]
        for cand in entry["candidates"]:
            if cand["impl"] == "dsl.cuda":
                assert cand["status"] == "ok", cand
                assert "emulator" in cand["message"] and cand["rel_l2_error"] < 1e-4
                assert cand["arch"] == cand["cubin_arch"] == arch
                assert cand["predicted"] and cand["model"]["occupancy"] > 0
                checked += 1
    assert checked >= len(generated)
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())   # rich wraps long lines
    assert "predicted by the analytical model, not measured" in text
    assert f"wpk tune PLAN` on a {preset}" in text


def test_absent_gpu_without_offline_is_exit_2_naming_both(model_path, tmp_path, capsys):
    out = tmp_path / "never.wpk"
    assert main(["build", str(model_path), "--gpu", "h100", "-o", str(out), "--no-partition"]) == 2
    err = capsys.readouterr().err
    assert "h100" in err and "no GPU present" in err and "--offline" in err
    assert not out.exists()


def test_tune_without_the_gpu_is_a_device_error(model_path, tmp_path):
    out = tmp_path / "model.wpk"
    assert main(["build", str(model_path), "--gpu", "p100", "--offline", "-q",
                 "-o", str(out), "--no-partition"]) == 0
    before = out.read_bytes()
    with pytest.raises(DeviceError) as info:
        tune_plan(out)
    assert "p100" in info.value.message and "no GPU present" in info.value.message
    assert "p100" in info.value.hint
    assert out.read_bytes() == before


def test_retune_rewrites_the_plan_with_the_new_choices(model_path, tmp_path):
    """The plan rewrite of `wpk tune`, driven here by the offline predictor (the GPU
    measurement needs a GPU): vendor placeholders are not candidates of a tune, so the
    convolutions move to generated kernels with their cubins, and the plan stays marked
    predicted because the predictor's results are predictions."""
    from wpk.core.devices import gpu_preset
    from wpk.kernels.cuda.target import CudaTarget
    from wpk.plans.planfile import write_plan
    from wpk.plans.retune import retune
    from wpk.search.predicted import PredictedRunner

    out = tmp_path / "model.wpk"
    assert main(["build", str(model_path), "--gpu", "p100", "--offline", "-q",
                 "-o", str(out), "--no-partition"]) == 0
    plan = read_plan(out)
    gpu = gpu_preset("p100")
    target = CudaTarget.for_preset(gpu)     # measured candidates: no vendor placeholders
    untouched = retune(read_plan(out), target, PredictedRunner(gpu), trials=2, budget=1e-9)
    assert untouched["measured"] == 0 and untouched["left_predicted"] > 0
    summary = retune(plan, target, PredictedRunner(gpu), trials=2)
    assert summary["changed"] > 0 and summary["measured"] > 0
    impls = {step["impl"] for step in plan.manifest["steps"]}
    assert "cuda.cudnn.predicted" not in impls and "cuda.cublas.predicted" not in impls
    for step in plan.manifest["steps"]:
        if step["impl"] == "dsl.cuda":
            cubin = plan.kernels[next(m for m in step["artifacts"] if m.endswith(".cubin"))]
            assert cubin_arch(cubin) == "sm_60"
    referenced = {m for step in plan.manifest["steps"] for m in step["artifacts"]}
    assert set(plan.kernels) == referenced
    assert plan.report["predicted"]["statement"]
    write_plan(plan, out)
    again = read_plan(out)
    assert [s["impl"] for s in again.manifest["steps"]] == \
        [s["impl"] for s in plan.manifest["steps"]]


def test_a_diffusion_unets_normalizations_run_on_the_device(corpus_model_path):
    """The torch export of the corpus UNet writes each GroupNorm as Reshape,
    InstanceNormalization, Reshape, Mul, Add: its h100 plan ran the 11 InstanceNormalizations
    on the host until they mapped to the DSL's `groupnorm` (emulator-verified)."""
    import wpk
    from tests.corpus import input_shapes

    plan = wpk.build(str(corpus_model_path("unet_torchscript")), target="cuda", gpu="h100",
                     offline=True, progress=False, input_shapes=input_shapes("unet_torchscript"))
    norms = [s.impl for s in plan.steps if s.op == "InstanceNormalization"]
    assert norms and set(norms) == {"dsl.cuda"}, norms
    assert not [s.node for s in plan.steps if s.impl == "cuda.host"]
