"""Fixtures of the fuzzing harness: a real plan to mutate, built once per session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def small_model() -> onnx.ModelProto:
    """Conv + bias + Relu + residual Add + Gemm head: weights, a fused step, a fallback-free
    plan of a few steps."""
    rng = np.random.default_rng(0)
    weight = nh.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    bias = nh.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fc = nh.from_array(rng.standard_normal((64, 3)).astype(np.float32), "fc")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("Add", ["r", "x"], ["s"], name="add"),
             h.make_node("Flatten", ["s"], ["f"], name="flatten"),
             h.make_node("MatMul", ["f", "fc"], ["y"], name="head")]
    graph = h.make_graph(nodes, "small", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 4, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 3])],
                         [weight, bias, fc])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def build_small_plan(folder) -> bytes:
    """The bytes of a real plan of `small_model()` for this CPU."""
    import wpk

    path = folder / "small.wpk"
    wpk.build(small_model(), target="cpu", output=str(path), partition=False, progress=False,
              warmup=0, repeats=1, min_time=0.0)
    from tests.fuzzing.strategies import Blob

    return Blob(path.read_bytes())


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> bytes:
    return build_small_plan(tmp_path_factory.mktemp("fuzz-plan"))
