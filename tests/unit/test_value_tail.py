"""Models whose last nodes have value-dependent shapes (`wpk.value_tail`, `wpk.runtime_tail`).

The static head is planned as any model; the tail (NMS, NonZero, a computed TopK, ...)
runs in onnxruntime after it. Checked against onnxruntime running the whole model, on
inputs that keep different numbers of boxes (none included), through the API, the CLI,
the report and the ONNX backend; where the split must not happen; and the errors.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import wpk
import wpk.backend
from wpk.core.errors import UnsupportedError
from wpk.frontend import load_model
from wpk.runtime import Session, with_tail
from wpk.value_tail import split_value_tail

BOXES = 64
FAST = {"warmup": 0, "repeats": 1, "min_time": 0.0, "progress": False}


def detector_model() -> onnx.ModelProto:
    """A conv 'backbone' giving boxes and scores, then NMS, a score filter (NonZero) and a
    Compress; one output of the head (`features`) comes first, between the tail's."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((5, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["features"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["features", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Transpose", ["flat"], ["per_box"], name="per_box", perm=[0, 2, 1]),
        helper.make_node("Slice", ["per_box", "s0", "s4", "s2"], ["raw_boxes"], name="boxes"),
        helper.make_node("Slice", ["per_box", "s4", "s5", "s2"], ["logits"], name="logits"),
        helper.make_node("Sigmoid", ["logits"], ["box_scores"], name="sigmoid"),
        helper.make_node("Transpose", ["box_scores"], ["scores"], name="scores", perm=[0, 2, 1]),
        helper.make_node("Constant", [], ["iou"], name="iou",
                         value=helper.make_tensor("iou_value", TensorProto.FLOAT, [1], [0.3])),
        helper.make_node("NonMaxSuppression", ["raw_boxes", "scores", "max_boxes", "iou",
                                               "threshold"], ["selected"], name="nms"),
        helper.make_node("Reshape", ["box_scores", "one_dim"], ["score_list"], name="scores_1d"),
        helper.make_node("Greater", ["score_list", "threshold"], ["kept"], name="over"),
        helper.make_node("NonZero", ["kept"], ["kept_at"], name="nonzero"),
        helper.make_node("Compress", ["score_list", "kept"], ["kept_scores"], name="compress",
                         axis=0),
    ]
    initializers = [
        helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
        helper.make_tensor("flat_shape", TensorProto.INT64, [3], [1, 5, BOXES]),
        helper.make_tensor("one_dim", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("s2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("s4", TensorProto.INT64, [1], [4]),
        helper.make_tensor("s5", TensorProto.INT64, [1], [5]),
        helper.make_tensor("max_boxes", TensorProto.INT64, [1], [20]),
        helper.make_tensor("threshold", TensorProto.FLOAT, [1], [0.6]),
    ]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                          [1, 3, 8, 8])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 5, 8, 8]),
         helper.make_tensor_value_info("kept_at", TensorProto.INT64, [1, "k"]),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, ["k"])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def image(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": (rng.standard_normal((1, 3, 8, 8)) * scale).astype(np.float32)}


@pytest.fixture(scope="module")
def detector_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("tail") / "detector.wpk"
    wpk.build(detector_model(), target="cpu", output=str(path), **FAST)
    return path


def test_the_split_keeps_the_static_nodes_in_the_head_and_moves_a_constant_with_the_tail():
    head, tail = split_value_tail(detector_model(), "detector.onnx")
    assert [n.name for n in tail.nodes] == ["iou", "nms", "nonzero", "compress"]
    assert tail.seeds == [("NonMaxSuppression", "nms"), ("NonZero", "nonzero"),
                          ("Compress", "compress")]
    assert tail.outputs == ["selected", "kept_at", "kept_scores"]
    assert tail.graph_inputs == [] and set(tail.head_inputs) == {"raw_boxes", "scores",
                                                                  "score_list", "kept"}
    # the head: every static node, outputs the model's own first, then what the tail reads
    outputs = [o.name for o in head.graph.output]
    assert outputs[0] == "features" and outputs[1:] == tail.head_inputs
    assert "iou" not in {n.name for n in head.graph.node}
    graph = load_model(head)   # static shapes throughout
    assert graph.tensors["kept"].shape == (BOXES,)


def test_a_model_with_static_shapes_is_not_split():
    model = detector_model()
    static = helper.make_model(helper.make_graph(
        [n for n in model.graph.node if n.name in ("conv",)], "static",
        list(model.graph.input), [model.graph.output[1]], [model.graph.initializer[0]]),
        opset_imports=list(model.opset_import))
    assert split_value_tail(static, "static.onnx") is None
    # a NonZero of a constant has a static shape: no tail either
    nonzero = helper.make_model(helper.make_graph(
        [helper.make_node("NonZero", ["c"], ["at"]), helper.make_node("Cast", ["at"], ["y"],
                                                                      to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor("c", TensorProto.FLOAT, [2], [0.0, 3.0])]),
        opset_imports=[helper.make_opsetid("", 17)])
    assert split_value_tail(nonzero, "nonzero.onnx") is None


def test_plan_with_a_tail_matches_onnxruntime_whatever_the_number_of_boxes(detector_plan):
    session = wpk.load(detector_plan)
    model = detector_model()
    counts = set()
    for seed, scale in [(1, 1.0), (2, 1.0), (3, 3.0), (4, 0.0)]:
        feeds = image(seed, scale)
        expected = onnxruntime_outputs(model, feeds)
        actual = session.run(feeds)
        assert list(actual) == ["selected", "features", "kept_at", "kept_scores"]
        for name, reference in expected.items():
            assert actual[name].dtype == reference.dtype
            assert actual[name].shape == reference.shape, (seed, name)
            if reference.dtype.kind == "f":
                np.testing.assert_allclose(actual[name], reference, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(actual[name], reference)
        counts.add(len(actual["kept_scores"]))
    assert len(counts) >= 3 and 0 in counts   # a zero image: sigmoid(0) < 0.6, none kept
    # onnxruntime's form: names in, a list out; shapes open where they depend on values
    feeds = image(1)
    kept, selected = session.run(["kept_scores", "selected"], feeds)
    np.testing.assert_array_equal(kept, session.run(feeds)["kept_scores"])
    assert selected.shape[1] == 3
    assert [(m.name, m.shape, m.dtype) for m in session.get_outputs()] == [
        ("selected", [None, 3], "int64"), ("features", [1, 5, 8, 8], "float32"),
        ("kept_at", [1, None], "int64"), ("kept_scores", [None], "float32")]
    assert [m.name for m in session.get_inputs()] == ["image"]
    with pytest.raises(wpk.core.errors.InputError, match="unknown output 'raw_boxes'"):
        session.run(["raw_boxes"], feeds)   # the head's outputs for the tail are not shown


def test_the_plan_and_its_report_say_what_runs_in_onnxruntime(detector_plan):
    plan = wpk.plans.planfile.read_plan(detector_plan)
    assert plan.manifest["tail"]["model"] == "tail.onnx"
    assert "kernels/tail.onnx" in plan.manifest["members"]
    tail = onnx.load_model_from_string(plan.kernels["tail.onnx"])
    assert [n.op_type for n in tail.graph.node] == ["Constant", "NonMaxSuppression",
                                                    "NonZero", "Compress"]
    assert plan.report["tail"]["value_shaped"][0] == {"op": "NonMaxSuppression", "node": "nms"}
    assert "wpk_median_s" in plan.report["partition"]   # the head was measured end to end
    table = subprocess.run([sys.executable, "-m", "wpk.cli", "report", str(detector_plan)],
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert ("tail: 4 node(s) from NonMaxSuppression node 'nms' on run in onnxruntime after "
            "the plan") in text
    as_json = subprocess.run([sys.executable, "-m", "wpk.cli", "report", str(detector_plan),
                              "--format", "json"], capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["tail"]["nodes"] == 4


def test_the_cli_builds_and_runs_a_model_with_a_tail(tmp_path):
    model_path, plan_path = tmp_path / "detector.onnx", tmp_path / "detector.wpk"
    onnx.save(detector_model(), str(model_path))
    np.savez(tmp_path / "x.npz", **image(2))
    cli = [sys.executable, "-m", "wpk.cli"]
    build = subprocess.run([*cli, "build", str(model_path), "--cpu", "-o", str(plan_path)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    printed = " ".join((build.stdout + build.stderr).split())
    assert "tail: 4 node(s) from NonMaxSuppression node 'nms'" in printed
    trace_path = tmp_path / "trace.json"
    run = subprocess.run([*cli, "run", str(plan_path), "--inputs", str(tmp_path / "x.npz"),
                          "--output", str(tmp_path / "y.npz"), "--profile", str(trace_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "then the onnxruntime tail:" in run.stdout
    events = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
    (tail,) = [e for e in events if e["name"].startswith("onnxruntime tail")]
    assert tail["name"] == "onnxruntime tail (4 nodes)" and tail["args"]["ops"]
    (whole,) = [e for e in events if e["name"] == "run"]   # the run encloses the tail
    assert tail["ts"] >= max(e["ts"] + e["dur"] for e in events if e not in (tail, whole))
    assert whole["dur"] == tail["ts"] + tail["dur"]
    expected = onnxruntime_outputs(detector_model(), image(2))
    with np.load(tmp_path / "y.npz") as data:
        assert sorted(data.files) == sorted(expected)
        np.testing.assert_array_equal(data["selected"], expected["selected"])
    strict = subprocess.run([*cli, "build", str(model_path), "--cpu", "--strict", "-o",
                             str(tmp_path / "strict.wpk")], capture_output=True, text=True,
                            timeout=120)
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert strict.stderr.startswith("error: the shape of tensor 'selected' (output of "
                                    "NonMaxSuppression node 'nms')")
    assert "without --strict its nodes from there on would run in onnxruntime" in strict.stderr
    assert not (tmp_path / "strict.wpk").exists()


def test_a_model_that_is_all_tail_runs_in_onnxruntime_after_a_copy(tmp_path):
    """Every output after a value-dependent node reading only the inputs (ONNX's NonZero
    case alone): the head copies the input, the whole model is the tail; a model with
    no input to plan stays an error."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["at"], name="where")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("at", TensorProto.INT64, [1, "n"])]),
        opset_imports=[helper.make_opsetid("", 17)])
    plan = wpk.build(model, target="cpu", **FAST)
    assert [s.op for s in plan.steps] == ["Identity"]
    assert plan.report["tail"]["nodes"] == 1
    path = tmp_path / "nonzero.wpk"
    plan.save(path)
    session = wpk.load(path)
    assert [o.name for o in session.get_outputs()] == ["at"]
    x = np.array([0.0, 2.0, 0.0, -1.0], np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["at"], [[1, 3]])
    with pytest.raises(UnsupportedError, match="NonZero node 'where'"):
        wpk.build(model, target="cpu", strict=True, **FAST)


def test_the_backend_runs_a_model_with_a_tail():
    feeds = image(5)
    prepared = wpk.backend.prepare(detector_model(), **FAST)
    outputs = prepared.run([feeds["image"]])
    expected = onnxruntime_outputs(detector_model(), feeds)
    assert len(outputs) == 4
    for actual, reference in zip(outputs, expected.values()):
        np.testing.assert_allclose(actual, reference, rtol=1e-5, atol=1e-6)


def test_an_offline_gpu_build_gets_the_same_tail(tmp_path):
    """The tail is target-independent: a CUDA plan (predicted here) holds it too, and its
    session (`CudaSession`) is wrapped the same way (tests/gpu runs it on a device)."""
    plan = wpk.build(detector_model(), target="cuda", gpu="h100", offline=True, **FAST)
    assert plan.target == "cuda" and plan.manifest["tail"]["reads"] == \
        wpk.build(detector_model(), target="cpu", **FAST).manifest["tail"]["reads"]
    assert [e["name"] for e in plan.manifest["tail"]["graph_outputs"]] == [
        "selected", "features", "kept_at", "kept_scores"]


def test_a_tail_reading_a_graph_input_and_a_branch_inside_an_if():
    """NMS on the model's own box input (fed to the tail as it is) and scores the head
    computes; the tail holds an If whose branches read a tail tensor from outside."""
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["selected"], ["picked"])], "then", [],
        [helper.make_tensor_value_info("picked", TensorProto.INT64, None)])
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["selected"], ["picked_else"])], "else", [],
        [helper.make_tensor_value_info("picked_else", TensorProto.INT64, None)])
    nodes = [
        helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes"], ["selected"],
                         name="nms"),
        helper.make_node("ReduceMax", ["scores"], ["best"], name="best", keepdims=0),
        helper.make_node("Greater", ["best", "half"], ["confident"], name="confident"),
        helper.make_node("If", ["confident"], ["picked"], name="branch",
                         then_branch=then_branch, else_branch=else_branch),
    ]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 16, 4]),
                     helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, 16])],
        [helper.make_tensor_value_info("picked", TensorProto.INT64, ["n", 3]),
         helper.make_tensor_value_info("best", TensorProto.FLOAT, [])],
        [helper.make_tensor("max_boxes", TensorProto.INT64, [1], [5]),
         helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]),
        opset_imports=[helper.make_opsetid("", 17)])
    head, tail = split_value_tail(model, "branch.onnx")
    assert [n.name for n in tail.nodes] == ["nms", "branch"]
    assert tail.graph_inputs == ["boxes"] and tail.head_inputs == ["scores", "confident"]
    session = with_tail(Session(wpk.build(model, target="cpu", **FAST)))
    rng = np.random.default_rng(3)
    corners = rng.random((1, 16, 2)).astype(np.float32)
    for sign in (1.0, -1.0):   # every score over one half (then) or under (else)
        logits = sign * (np.abs(rng.standard_normal((1, 1, 16))) + 0.1)
        feeds = {"boxes": np.concatenate([corners, corners + 0.3], -1),
                 "logits": logits.astype(np.float32)}
        expected = onnxruntime_outputs(model, feeds)
        actual = session.run(feeds)
        np.testing.assert_array_equal(actual["picked"], expected["picked"])
        assert (actual["picked"] >= 0).all() == (sign > 0) and actual["picked"].size
        np.testing.assert_allclose(actual["best"], expected["best"], rtol=1e-6)


def test_a_loop_whose_trip_count_is_an_input_value_goes_to_the_tail():
    """A Loop's scan output has as many rows as the loop runs, a count the model reads
    from its input: no rule names the Loop, the frontend's two evaluations find the shape
    differing, and the split takes the Loop from there."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["keep"], ["keep_out"]),
         helper.make_node("Add", ["total", "features"], ["total_out"]),
         helper.make_node("Cast", ["i"], ["step"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["features", "step"], ["row"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("keep", TensorProto.BOOL, []),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("keep_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("Relu", ["x"], ["features"], name="relu"),
             helper.make_node("Add", ["count", "one"], ["trips"], name="trips"),
             helper.make_node("Loop", ["trips", "true", "features"], ["total", "rows"],
                              name="loop", body=body)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                     helper.make_tensor_value_info("count", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [4])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("true", TensorProto.BOOL, [], [True])]),
        opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(wpk.core.errors.ValueShapeError) as error:
        load_model(model)
    assert error.value.tensor == "rows"
    plan = wpk.build(model, target="cpu", **FAST)
    assert plan.report["tail"]["value_shaped"] == [{"op": "Loop", "node": "loop"}]
    session = with_tail(Session(plan))
    for count in (0, 3):
        feeds = {"x": np.array([1.0, -2.0, 3.0, -4.0], np.float32),
                 "count": np.array(count, np.int64)}
        expected = onnxruntime_outputs(model, feeds)
        actual = session.run(feeds)
        assert actual["rows"].shape == (count + 1, 4) and list(actual) == list(expected)
        for name, reference in expected.items():
            np.testing.assert_array_equal(actual[name], reference)
