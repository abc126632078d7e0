"""End-to-end accuracy: wpk plans against onnxruntime on the evaluation models.

For the nine `light` CNNs of the onnx wheel (weights made random and
BatchNormalization calibrated, see `tests.models.load_model`) and the three
hand-built models: build a CPU plan, save it, load it, run it on seeded random
inputs and compare every output with onnxruntime (ORT_ENABLE_ALL) on the same
inputs. Relative L2 error must stay below 1e-4. ResNet-50 also goes through
the command line (`wpk build`, `wpk run`) in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest

import wpk
from tests import models
from tests.built_plans import FAST_BUILD
from wpk.core.numerics import relative_l2

# Whole models: the compile cache is the run's, shared with the other whole-model tests.
pytestmark = pytest.mark.usefixtures("shared_compile_cache")
MAX_RELATIVE_L2 = 1e-4


def onnxruntime_outputs(model: onnx.ModelProto, *feeds: dict) -> dict | list[dict]:
    """The reference: onnxruntime with every graph optimization on; with several sets of
    feeds, a list of outputs, one session for all (VGG-19's takes 3-5 s to make)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = [dict(zip(names, session.run(names, one))) for one in feeds]
    return outputs[0] if len(outputs) == 1 else outputs


def assert_close_to(actual: dict, expected: dict, label: str) -> None:
    assert set(actual) == set(expected), f"{label}: outputs {sorted(actual)} != {sorted(expected)}"
    for name, reference in expected.items():
        assert actual[name].shape == reference.shape, f"{label}: shape of {name}"
        assert np.isfinite(actual[name]).all(), f"{label}: non-finite values in {name}"
        error = relative_l2(actual[name], reference)
        assert error < MAX_RELATIVE_L2, f"{label}: output {name} relative L2 error {error:.2e}"


def test_relative_l2_detects_a_wrong_answer():
    """The metric itself: equal arrays give 0, a 1% perturbation is far above the bound."""
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert relative_l2(x, x) == 0.0
    assert relative_l2(x * 1.01, x) > 10 * MAX_RELATIVE_L2


def _ops(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


def test_hand_built_models_have_the_intended_structure():
    """Depthwise convs + Clip + BN; SiLU as x*sigmoid(x); erf-Gelu, LayerNorm, heads."""
    mobilenet = models.load_model("mobilenet_v2_like")
    depthwise = [n for n in mobilenet.graph.node if n.op_type == "Conv"
                 and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(depthwise) >= 10
    assert {"Clip", "BatchNormalization", "Add", "Gemm"} <= _ops(mobilenet)
    efficientnet = models.load_model("efficientnet_like")
    assert {"Sigmoid", "Mul", "GlobalAveragePool", "BatchNormalization"} <= _ops(efficientnet)
    encoder = models.load_model("transformer_encoder")
    assert {"MatMul", "Softmax", "LayerNormalization", "Erf", "Reshape",
            "Transpose"} <= _ops(encoder)
    assert encoder.opset_import[0].version == 17
    dims = [d.dim_value for d in encoder.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 64, 256]


def test_models_are_deterministic():
    """Seeded weights: two builds give the same bytes."""
    for name in ("transformer_encoder", "light_squeezenet"):
        assert (models.load_model(name).SerializeToString()
                == models.load_model(name).SerializeToString())


def test_random_light_weights_make_outputs_depend_on_the_input():
    """The shipped light weights give a uniform softmax; the randomized ones do not."""
    shipped = models.load_model("light_squeezenet", random_weights=False)
    randomized = models.load_model("light_squeezenet")
    for model, varies in ((shipped, False), (randomized, True)):
        a = next(iter(onnxruntime_outputs(model, models.random_inputs(model, 1)).values()))
        b = next(iter(onnxruntime_outputs(model, models.random_inputs(model, 2)).values()))
        assert (relative_l2(a, b) > 1e-3) == varies


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n.startswith("light_") else n
    for n in models.ALL_MODELS])  # light CNNs: 10-100 s each on 2 busy cores; still in CI
def test_plan_matches_onnxruntime(name, tmp_path, built_plan):
    """The build is shared with the other tests of this run that build `name` with
    FAST_BUILD (tests/built_plans.py)."""
    model = models.load_model(name)
    feeds, feeds2 = models.random_inputs(model, seed=7), models.random_inputs(model, seed=8)
    expected, expected2 = onnxruntime_outputs(model, feeds, feeds2)
    plan = built_plan(name, **FAST_BUILD)
    path = tmp_path / f"{name}.wpk"
    plan.save(path)
    session = wpk.load(path)
    actual = session.run(feeds)
    assert_close_to(actual, expected, name)
    # A second run reuses the session's buffers: it must give the same answer on new data.
    assert_close_to(session.run(feeds2), expected2, f"{name} (run 2)")


@pytest.mark.slow
def test_cli_build_and_run_resnet50(tmp_path):
    model = models.load_model("light_resnet50")
    model_path = tmp_path / "resnet50.onnx"
    onnx.save(model, str(model_path))
    feeds = models.random_inputs(model, seed=9)
    np.savez(tmp_path / "x.npz", **feeds)
    plan_path, out_path = tmp_path / "resnet50.wpk", tmp_path / "y.npz"
    cli = [sys.executable, "-m", "wpk.cli"]
    build = subprocess.run([*cli, "build", str(model_path), "--cpu", "--search", "none",
                            "--quiet", "-o", str(plan_path)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    assert plan_path.is_file()
    run = subprocess.run([*cli, "run", str(plan_path), "--inputs", str(tmp_path / "x.npz"),
                          "--output", str(out_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    with np.load(out_path, allow_pickle=False) as data:
        actual = {name: data[name] for name in data.files}
    assert_close_to(actual, onnxruntime_outputs(model, feeds), "cli resnet50")
