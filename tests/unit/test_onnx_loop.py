"""wpk.core.onnx_loop: Loop scan outputs stacked as the ONNX spec says ([M, *one
iteration's shape]), where onnx.reference's own Loop gives scalars [M, 1] and merges the
first two axes of higher ranks; shapes inferred with it and plans built on it agree with
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import wpk
from wpk.core.onnx_loop import Loop
from wpk.runtime import Session

TRIPS = 5


def scan_model(shape: tuple[int, ...]) -> onnx.ModelProto:
    """A Loop of TRIPS iterations carrying v (of `shape`) += 1 and scanning each new v."""
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("Add", ["v_in", "one"], ["v_out"]),
         h.make_node("Identity", ["v_out"], ["scan"])],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, list(shape))],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, list(shape)),
         h.make_tensor_value_info("scan", T.FLOAT, list(shape))],
        [numpy_helper.from_array(np.array(1, np.float32), "one")])
    graph = h.make_graph(
        [h.make_node("Loop", ["trips", "cond", "v0"], ["vf", "ys"], body=body, name="loop")],
        "scan", [h.make_tensor_value_info("v0", T.FLOAT, list(shape))],
        [h.make_tensor_value_info("vf", T.FLOAT, list(shape)),
         h.make_tensor_value_info("ys", T.FLOAT, ["n", *shape])],
        [numpy_helper.from_array(np.array(TRIPS, np.int64), "trips"),
         numpy_helper.from_array(np.array(True), "cond")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


SHAPES = [(), (3,), (2, 3)]


def feeds_for(shape) -> dict[str, np.ndarray]:
    return {"v0": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def onnxruntime_outputs(model, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("shape", SHAPES)
def test_scan_outputs_have_the_spec_shape_and_onnxruntime_values(shape):
    model, feeds = scan_model(shape), feeds_for(shape)
    expected = onnxruntime_outputs(model, feeds)
    got = ReferenceEvaluator(model, new_ops=[Loop]).run(None, feeds)
    assert got[1].shape == (TRIPS, *shape) == expected[1].shape
    for actual, wanted in zip(got, expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6)


def test_onnx_reference_alone_gets_scalar_scans_wrong():
    """Why the class exists: if onnx.reference is fixed one day, this test says so."""
    model, feeds = scan_model(()), feeds_for(())
    assert ReferenceEvaluator(model).run(None, feeds)[1].shape == (TRIPS, 1)


@pytest.mark.parametrize("partition", [True, False])
@pytest.mark.parametrize("shape", [(), (2, 3)])
def test_a_plan_of_a_scanning_loop_matches_onnxruntime(shape, partition):
    model, feeds = scan_model(shape), feeds_for(shape)
    expected = onnxruntime_outputs(model, feeds)
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=partition)
    assert [output["shape"] for output in plan.outputs] == [list(shape), [TRIPS, *shape]]
    got = Session(plan).run(feeds)
    for name, wanted in zip(("vf", "ys"), expected):
        np.testing.assert_allclose(got[name], wanted, rtol=1e-6)
