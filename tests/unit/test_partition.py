"""The end-to-end check against onnxruntime's whole model (wpk.partition)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.cli import main
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.kernels.registry import Implementation
from wpk.partition import ONNXRUNTIME, WPK, PartitionOptions, choose_partition, decide
from wpk.plans.assemble import whole_model_plan
from wpk.plans.planfile import read_plan
from wpk.runtime import Session


def tiny_matmuls(count: int = 120, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """`count` chained 8x8 MatMuls: onnxruntime runs them in one session call, a plan in
    `count` steps, so onnxruntime's whole model is many times faster."""
    rng = np.random.default_rng(seed)
    nodes, weights, value = [], [], "x"
    for i in range(count):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        value = f"y{i}"
    graph = helper.make_graph(nodes, "tiny_matmuls",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, size])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT,
                                                             [4, size])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_decide_keeps_wpk_within_the_margin():
    times = {WPK: [1.01, 1.02, 1.00], ONNXRUNTIME: [1.0, 1.0, 1.0]}
    assert decide(times, margin=0.02) == (WPK, pytest.approx(1.01))
    times = {WPK: [1.5, 1.4, 1.6], ONNXRUNTIME: [1.0, 1.1, 0.9]}
    assert decide(times, margin=0.02)[0] == ONNXRUNTIME
    assert decide({WPK: [0.5], ONNXRUNTIME: [1.0]}, margin=0.02) == (WPK, 0.5)


class SlowMatMul(Implementation):
    """A correct MatMul that sleeps 2 ms first: a plan of these is certainly slower than
    onnxruntime's whole model, whatever else the machine does."""

    name = "test.slow_matmul"
    target = "test"  # never among the cpu target's candidates; plans name it explicitly

    def unsupported_reason(self, workload):
        return None if workload.op == "MatMul" else "MatMul only"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):
            time.sleep(0.002)
            np.matmul(inputs[0], inputs[1], out=outputs[0])
        return kernel


SLOW = registry.register(SlowMatMul())


def test_a_plan_slower_than_onnxruntime_becomes_onnxruntimes_whole_model(tmp_path):
    model = tiny_matmuls(count=6)
    slow = wpk.build(model, target="cpu", progress=False, partition=False)
    for step in slow.manifest["steps"]:
        step["impl"] = SLOW.name
    whole = whole_model_plan(load_model(model), model.SerializeToString())
    chosen, summary = choose_partition(slow, whole, PartitionOptions(blocks=2, runs=3))
    assert chosen is whole and summary["winner"] == ONNXRUNTIME, summary
    assert summary["ratio"] > 10 and summary["rel_l2_between"] <= 1e-4
    (step,) = chosen.steps
    assert step.impl == "ort.model" and step.artifacts
    path = chosen.save(tmp_path / "m.wpk")
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = wpk.load(str(path)).run(None, {"x": x})
    assert relative_l2(got, expected) <= 1e-6


def test_a_build_measures_the_whole_model_and_keeps_the_per_operator_report():
    model = tiny_matmuls()
    plan = wpk.build(model, target="cpu", progress=False)
    summary = plan.report["partition"]
    assert summary["winner"] in (WPK, ONNXRUNTIME) and summary["rel_l2_between"] <= 1e-4
    assert summary["runs"] >= 6 and summary["wpk_median_s"] > 0
    assert (summary["winner"] == ONNXRUNTIME) == (summary["ratio"] > 1.02)
    assert (plan.steps[0].impl == "ort.model") == (summary["winner"] == ONNXRUNTIME)
    assert len(plan.report["workloads"]) >= 1   # the per-operator report stays
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = Session(plan).run(None, {"x": x})
    assert relative_l2(got, expected) <= 1e-5


def test_no_partition_keeps_the_per_operator_plan(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_matmuls(count=6), path)
    out = tmp_path / "m.wpk"
    assert main(["build", str(path), "-q", "--no-partition", "-o", str(out)]) == 0
    plan = read_plan(out)
    assert "partition" not in plan.report and len(plan.steps) == 6


def test_a_whole_model_that_disagrees_is_never_chosen():
    """Outputs of the two must agree before timing decides: here the 'whole model' is
    another network, so the per-operator plan (verified per operator) stays."""
    per_op = wpk.build(tiny_matmuls(count=3, seed=0), target="cpu", progress=False,
                       partition=False)
    other = tiny_matmuls(count=3, seed=1)
    whole = whole_model_plan(load_model(other), other.SerializeToString())
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(blocks=1, runs=1))
    assert chosen is per_op and summary["winner"] == WPK
    assert "differ" in summary["reason"] and summary["rel_l2_between"] > 1e-4


def test_the_margin_keeps_a_close_plan():
    model = tiny_matmuls(count=4)
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    whole = whole_model_plan(load_model(model), model.SerializeToString())
    chosen, summary = choose_partition(per_op, whole, PartitionOptions(blocks=1, runs=2,
                                                                       margin=1e6))
    assert chosen is per_op and summary["winner"] == WPK and summary["ratio"] > 0
    outputs = Session(chosen).run({"x": np.ones((4, 8), np.float32)})
    assert np.isfinite(next(iter(outputs.values()))).all()
