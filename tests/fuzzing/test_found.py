"""What the fuzzer found, kept as plain regression tests (each was exit code 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from tests.fuzzing.properties import check_model, check_plan
from tests.fuzzing.strategies import archive_of, members_of, rechecksum


def relu_bytes() -> bytes:
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 8])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.doc_string = "ab"
    return model.SerializeToString()


def test_a_doc_string_that_is_not_utf8_is_exit_2():
    data = relu_bytes().replace(b"\x02ab", b"\x02\x90b")
    with pytest.raises(Exception):  # noqa: B017 - protobuf refuses to decode it
        onnx.load_model_from_string(data).doc_string.encode()
    outcome = check_model(data, "inspect")
    assert outcome.violations == [] and outcome.code == 2
    assert "'doc_string'" in outcome.stderr and "UTF-8" in outcome.stderr


def edited(plan: bytes, change) -> bytes:
    members = members_of(plan)
    change(members)
    return archive_of(rechecksum(members))


def set_manifest(members, edit):
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()


@pytest.mark.parametrize("change", [
    lambda m: m.__setitem__("report.json", b"not json"),
    lambda m: set_manifest(m, lambda d: d["steps"][0].pop("op")),
    lambda m: set_manifest(m, lambda d: d["inputs"][0].__setitem__("shape", [2**70])),
    lambda m: set_manifest(m, lambda d: d["buffers"].__setitem__("buffers", "x")),
], ids=["report-not-json", "step-without-op", "huge-input", "buffers-not-a-list"])
@pytest.mark.parametrize("command", ["run", "report"])
def test_tampered_re_checksummed_plans_are_exit_0_or_2(small_plan, change, command):
    assert check_plan(edited(small_plan, change), command).violations == []


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400"])
def test_a_manifest_with_non_finite_numbers_is_exit_2(small_plan, value):
    members = members_of(small_plan)
    text = members["manifest.json"].decode().replace('"target": "cpu"', f'"x": {value}, '
                                                     '"target": "cpu"', 1)
    assert text != members["manifest.json"].decode()
    members["manifest.json"] = text.encode()
    outcome = check_plan(archive_of(members), "run")
    assert outcome.violations == [] and outcome.code == 2


def test_a_range_with_step_0_is_exit_2_naming_the_node():
    import numpy as np
    from onnx import numpy_helper as nh

    graph = h.make_graph([h.make_node("Range", ["a", "b", "c"], ["y"], name="steps")], "g", [],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n"])],
                         [nh.from_array(np.float32(0), "a"), nh.from_array(np.float32(7), "b"),
                          nh.from_array(np.float32(0), "c")])
    data = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    for command in ("inspect", "build"):
        outcome = check_model(data, command)
        assert outcome.violations == [] and outcome.code == 2
        assert "Range node 'steps'" in outcome.stderr


def test_a_conv_kernel_larger_than_its_input_is_exit_2_naming_the_node():
    import numpy as np
    from onnx import numpy_helper as nh

    weight = nh.from_array(np.ones((2, 4, 2, 2), np.float32), "w")
    graph = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], name="conv",
                                      kernel_shape=[2, 2])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 1, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, [None] * 4)], [weight])
    data = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    outcome = check_model(data, "build")
    assert outcome.violations == [] and outcome.code == 2
    assert "conv" in outcome.stderr and "larger than its padded input" in outcome.stderr


def test_a_pool_window_larger_than_its_input_is_exit_2_naming_the_node():
    graph = h.make_graph([h.make_node("MaxPool", ["x"], ["y"], name="pool",
                                      kernel_shape=[2, 2])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 5, 4, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, [None] * 4)])
    data = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    outcome = check_model(data, "build")
    assert outcome.violations == [] and outcome.code == 2
    assert "pool" in outcome.stderr and "larger than its padded input" in outcome.stderr


def test_a_softmax_axis_out_of_range_is_exit_2_naming_the_node():
    graph = h.make_graph([h.make_node("Softmax", ["x"], ["y"], name="soft", axis=2**63 - 1)],
                         "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 1])])
    data = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    outcome = check_model(data, "build")
    assert outcome.violations == [] and outcome.code == 2
    assert "soft" in outcome.stderr and "axis=" in outcome.stderr


@pytest.mark.parametrize("b_shape, c_shape, trans_b, wanted", [
    ([64, 1], [1], 0, "has 2 columns but B"),      # the fuzzer's draw, alpha 0
    ([1, 2], [1], 0, "has 2 columns but B"),
    ([3, 2], [5, 3], 1, "does not broadcast"),
], ids=["inner-dims", "inner-dims-small", "c-shape"])
def test_a_gemm_whose_shapes_do_not_fit_is_exit_2_naming_the_node(b_shape, c_shape, trans_b,
                                                                   wanted):
    """At opset 8 (the fuzzer's draw, seed 75) ONNX's shape inference checks neither Gemm's
    inner dims nor, at any opset, C's broadcast: the build ended in `internal error:
    ValueError: matmul: ... mismatch in its core dimension` (the float64 reference's
    product)."""
    from onnx import numpy_helper as nh

    weights = [nh.from_array(np.ones(b_shape, np.float32), "b"),
               nh.from_array(np.ones(c_shape, np.float32), "c")]
    graph = h.make_graph([h.make_node("Gemm", ["x", "b", "c"], ["y"], name="gemm", alpha=0.0,
                                      transB=trans_b)], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [6, 2])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["o0", "o1"])], weights)
    data = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)]).SerializeToString()
    outcome = check_model(data, "build")
    assert outcome.violations == [] and outcome.code == 2
    assert "gemm" in outcome.stderr and wanted in outcome.stderr


def test_a_softmax_over_an_empty_slice_builds_and_runs(tmp_path):
    """The draw that ended a CLI fuzzing run (`scripts/fuzz.py --seed 71`): a float16
    Softmax over axis 0 of a Slice from 5 to 8 of a length-3 axis, an empty tensor. The
    build ended in `internal error: ValueError: zero-size array to reduction operation`
    (the float64 reference's max over nothing). It builds, its plan runs to onnxruntime's
    empty output, and `wpk run` says so without numpy's warnings about an empty mean."""
    ints = [h.make_tensor(name, T.INT64, [1], [value])
            for name, value in (("starts", 5), ("ends", 8), ("axes", 0))]
    graph = h.make_graph(
        [h.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
         h.make_node("Softmax", ["s"], ["y"], axis=-4)], "empty-softmax",
        [h.make_tensor_value_info("x", T.FLOAT16, [3, 1, 5, 2])],
        [h.make_tensor_value_info("y", T.FLOAT16, ["a", "b", "c", "d"])],
        initializer=ints)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
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
