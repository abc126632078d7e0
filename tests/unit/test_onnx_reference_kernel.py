"""The `onnx.reference` kernel: the last resort for nodes onnxruntime cannot run or runs
wrongly, verified like every kernel and measured only when nothing else verifies."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import wpk
from wpk.core.errors import UnsupportedError
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.onnx_reference import ONNX_REFERENCE
from wpk.kernels.registry import Candidate
from wpk.runtime import Session
from wpk.search.measure import Status, measure_candidate

S = TensorSpec


def _run(workload: Workload, inputs: list, consts: dict | None = None) -> list[np.ndarray]:
    kernel = ONNX_REFERENCE.prepare(workload, consts or {}, {})
    outputs = [np.empty(spec.shape, np.dtype(spec.dtype)) for spec in workload.outputs]
    kernel(inputs, outputs)
    return outputs


def test_integer_mod_with_fmod_matches_numpy():
    workload = Workload("Mod", (S((3, 5), "int32"), S((3, 5), "int32")), (S((3, 5), "int32"),),
                        attrs=(("fmod", 1),), opset=21)
    rng = np.random.default_rng(0)
    a = rng.integers(-50, 50, (3, 5)).astype(np.int32)
    b = rng.integers(1, 9, (3, 5)).astype(np.int32) * rng.choice([-1, 1], (3, 5)).astype(np.int32)
    (got,) = _run(workload, [a, b])
    assert got.dtype == np.int32 and np.array_equal(got, np.fmod(a, b))


def test_a_cast_to_bfloat16_writes_ml_dtypes_outputs():
    workload = Workload("Cast", (S((4,), "float32"),), (S((4,), "bfloat16"),),
                        attrs=(("to", TensorProto.BFLOAT16),), opset=21)
    x = np.array([1.0, -2.5, 3.14159, 1e-3], np.float32)
    (got,) = _run(workload, [x])
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(got, x.astype(ml_dtypes.bfloat16))


def test_the_epilogue_runs_after_the_node():
    workload = Workload("Selu", (S((2, 6)),), (S((2, 6)),), epilogue=(EpilogueStep("relu"),),
                        opset=17)
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(2, 6)
    (got,) = _run(workload, [x])
    alpha, gamma = 1.67326319217681884765625, 1.05070102214813232421875
    selu = np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1))
    assert np.allclose(got, np.maximum(selu, 0), rtol=1e-6)


def test_a_value_dependent_shape_is_an_error_not_a_stretched_copy():
    """NonZero's output shape depends on the values: the plan's fixed shape must match."""
    workload = Workload("NonZero", (S((4,)),), (S((1, 3), "int64"),), opset=13)
    with pytest.raises(UnsupportedError, match="shape"):
        _run(workload, [np.array([1.0, 0.0, 0.0, 2.0], np.float32)])
    (got,) = _run(workload, [np.array([1.0, 0.0, 3.0, 2.0], np.float32)])
    assert np.array_equal(got, [[0, 2, 3]])


def test_it_declines_what_onnx_reference_cannot_build():
    contrib = Workload("FusedMatMul", (S((2, 2)), S((2, 2))), (S((2, 2)),), domain="com.microsoft")
    unknown = Workload("NoSuchOp", (S((2,)),), (S((2,)),))
    assert "contrib" in ONNX_REFERENCE.unsupported_reason(contrib)
    assert ONNX_REFERENCE.unsupported_reason(unknown) is not None


def test_it_is_verified_against_the_float64_reference():
    """measure_candidate checks it like any kernel: right answers pass; a workload whose
    declared output shape is wrong fails verification."""
    candidate = Candidate(ONNX_REFERENCE, {})
    good = Workload("LpNormalization", (S((3, 4)),), (S((3, 4)),), attrs=(("p", 1),), opset=17)
    measured = measure_candidate(good, candidate, rng=np.random.default_rng(0), warmup=0,
                                 repeats=1, min_time=0.0)
    assert measured.status is Status.OK and measured.rel_l2_error < 1e-6
    wrong = Workload("Flatten", (S((2, 3, 4)),), (S((2, 6)),), attrs=(("axis", 1),), opset=17)
    measured = measure_candidate(wrong, candidate, rng=np.random.default_rng(0), warmup=0,
                                 repeats=1, min_time=0.0)
    assert measured.status is not Status.OK


def test_it_is_a_last_resort_among_the_candidates():
    relu = Workload("Relu", (S((2, 3)),), (S((2, 3)),), opset=17)
    assert "onnx.reference" not in [c.label for c in registry.candidates(relu)]
    assert "onnx.reference" in [c.label for c in registry.candidates(relu, last_resort=True)]


def _model(op: str, dtype: int, **attrs):
    node = helper.make_node(op, ["x", "y"], ["z"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, dtype, [3, 4])
                                            for n in "xy"],
                              [helper.make_tensor_value_info("z", dtype, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_the_planner_measures_it_only_when_nothing_else_verifies():
    """float Max: onnxruntime and wpk's kernels verify, onnx.reference is never measured;
    int16 Max (no onnxruntime kernel): onnx.reference is measured, chosen and reported."""
    plan = wpk.build(_model("Max", TensorProto.FLOAT), progress=False, partition=False)
    (entry,) = plan.report["workloads"]
    assert "onnx.reference" not in {c["impl"] for c in entry["candidates"]}
    plan = wpk.build(_model("Max", TensorProto.INT16), progress=False, partition=False)
    (entry,) = plan.report["workloads"]
    assert entry["chosen_impl"] == "onnx.reference" and entry["fallback"]
    assert [s.impl for s in plan.steps] == ["onnx.reference"]
    x = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    y = x[::-1].copy()
    assert np.array_equal(Session(plan).run({"x": x, "y": y})["z"], np.maximum(x, y))


@pytest.mark.parametrize("dtype", [TensorProto.BFLOAT16, TensorProto.FLOAT8E5M2])
def test_a_narrow_float_model_builds_saves_loads_and_runs(tmp_path, dtype):
    """bfloat16 (or float8e5m2) tensors (Cast, Pad with a constant value of that dtype,
    Cast back) flow through the plan's steps, and the plan file keeps the constant's dtype
    (npz cannot store ml_dtypes)."""
    from onnx import numpy_helper

    narrow = helper.tensor_dtype_to_np_dtype(dtype)
    value = np.array(-2.5, np.float32).astype(narrow)
    pads = np.array([0, 0, 1, 0], np.int64)
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=dtype),
             helper.make_node("Pad", ["xb", "pads", "value"], ["yb"]),
             helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [3, 4])], [numpy_helper.from_array(value, "value"),
                                              numpy_helper.from_array(pads, "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = tmp_path / "narrow.wpk"
    wpk.build(model, progress=False, partition=False).save(path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    (got,) = wpk.load(str(path)).run(None, {"x": x})
    expected = np.concatenate([x.astype(narrow).astype(np.float32), np.full((1, 4), -2.5)])
    assert np.array_equal(got, expected)
