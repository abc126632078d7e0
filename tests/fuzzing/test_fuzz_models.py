"""Fuzzing (issue 13.7): random and corrupted ONNX models through `wpk inspect` and
`wpk build`; the CLI contract holds for every one (see tests/fuzzing/harness.py).
A few examples per test in CI; `scripts/fuzz.py --minutes N` runs the same longer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tests.fuzzing.properties import check_model
from tests.fuzzing.strategies import model_bytes, models

CI = settings(max_examples=12, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))


@CI
@given(models())
def test_inspect_keeps_the_contract_on_random_models(model):
    assert check_model(model.SerializeToString(), "inspect").violations == []


@CI
@given(model_bytes())
def test_inspect_keeps_the_contract_on_damaged_model_bytes(data):
    assert check_model(data, "inspect").violations == []


@settings(CI, max_examples=4)
@given(models())
def test_build_keeps_the_contract_on_random_models(model):
    assert check_model(model.SerializeToString(), "build").violations == []


@settings(CI, max_examples=4)
@given(st.sampled_from([b"", b"\x00" * 7, b"not an onnx model", b"\x08\x07\x12"]))
def test_build_keeps_the_contract_on_garbage(data):
    assert check_model(data, "build").violations == []


def test_a_softmax_over_an_empty_slice_builds_and_runs(tmp_path):
    """The draw that ended a CLI fuzzing run (`scripts/fuzz.py --seed 71`): a float16
    Softmax over axis 0 of a Slice from 5 to 8 of a length-3 axis, an empty tensor. The
    build ended in `internal error: ValueError: zero-size array to reduction operation`
    (the float64 reference's max over nothing). It builds, its plan runs to onnxruntime's
    empty output, and `wpk run` says so without numpy's warnings about an empty mean."""
    ints = [helper.make_tensor(name, TensorProto.INT64, [1], [value])
            for name, value in (("starts", 5), ("ends", 8), ("axes", 0))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
         helper.make_node("Softmax", ["s"], ["y"], axis=-4)], "empty-softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 1, 5, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["a", "b", "c", "d"])],
        initializer=ints)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert check_model(model.SerializeToString(), "build").violations == []
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((3, 1, 5, 2), np.float16))
    cli = [sys.executable, "-m", "wpk.cli"]
    build = subprocess.run([*cli, "build", str(tmp_path / "m.onnx"), "--cpu", "-q",
                            "--no-partition", "-o", str(tmp_path / "m.wpk")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([*cli, "run", str(tmp_path / "m.wpk"), "--inputs",
                          str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz"),
                          "--repeat", "2", "--warmup", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr
    assert "y: shape (0, 1, 5, 2) float16  empty" in run.stdout
    with np.load(tmp_path / "y.npz") as outputs:
        assert outputs["y"].shape == (0, 1, 5, 2) and outputs["y"].dtype == np.float16
