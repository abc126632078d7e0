"""Slices that stay inside their input: a Slice, or a Gather of one constant index, that
takes one contiguous run of its input's bytes (`NumpyCopy.slices_input`) lives in its
input's buffer on the CPU, and its copy is skipped. Whole models against onnxruntime after
save and load; the cases that must stay copies (an inner-axis slice, a step, an offset off
the alignment, a slice the user reads) still compute the right thing."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.unit.plan_helpers import assert_matches_onnxruntime
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.cpu.numpy_ops import NumpyCopy

FAST = {"search": "none", "progress": False, "partition": False, "warmup": 0, "repeats": 1,
        "min_time": 0.0}


def _slice(shape, out, starts, ends, axes, steps=None) -> Workload:
    params = [starts, ends, axes] + ([steps] if steps else [])
    inputs = (TensorSpec(shape),) + tuple(TensorSpec((len(starts),), "int64") for _ in params)
    return Workload("Slice", inputs, (TensorSpec(out),), (), opset=17,
                    static_inputs=tuple((i + 1, np.array(p)) for i, p in enumerate(params)))


def _gather(shape, out, index, axis) -> Workload:
    return Workload("Gather", (TensorSpec(shape), TensorSpec((), "int64")), (TensorSpec(out),),
                    (("axis", axis),), opset=17, static_inputs=((1, np.array(index)),))


@pytest.mark.parametrize("workload, offset", [
    (_slice((3, 1, 4, 8), (1, 1, 4, 8), [1], [2], [0]), 128),       # a packed QKV's second
    (_slice((1, 77, 512), (1, 76, 512), [1], [77], [1]), 2048),     # a batch-1 tensor's rows
    (_slice((1, 6, 16), (1, 1, 16), [-1], [6], [1]), 320),
    (_gather((3, 2, 16), (2, 16), 2, 0), 256),                      # unbind(0)'s third
    (_gather((1, 5, 16), (1, 16), 0, 1), 0),                        # a ViT's class token
    (_slice((1, 6, 16), (1, 6, 8), [0], [8], [2]), None),           # an inner axis
    (_slice((1, 6, 16), (1, 3, 16), [0], [6], [1], [2]), None),     # a step
    (_slice((1, 6, 16), (1, 6, 16), [-1], [-100], [1], [-1]), None),   # reversed
    (_slice((2, 6, 16), (2, 3, 16), [0], [3], [1]), None),          # an outer axis not 1
    (_gather((2, 3, 16), (2, 16), 0, 1), None),
])
def test_which_slices_stay_inside_their_input(workload, offset):
    copy = NumpyCopy()
    assert copy.slices_input(workload) == offset
    assert copy.algorithm(workload, {}) == ("copy" if offset is None else "view (no copy)")


def _model(width: int, start: int, user_reads_slice: bool = False):
    """x [1, 6, width] -> Relu r -> Slice of r's rows [start, 6) -> s -> MatMul -> y, and
    r's first row (a Gather) -> MatMul -> t."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([v], np.int64), n)
             for n, v in (("lo", start), ("hi", 6), ("axis", 1))]
    inits += [numpy_helper.from_array(np.array(0, np.int64), "first"),
              numpy_helper.from_array(rng.standard_normal((width, 8)).astype(np.float32), "w"),
              numpy_helper.from_array(rng.standard_normal((width, 4)).astype(np.float32), "v")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "lo", "hi", "axis"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["y"]),
             helper.make_node("Gather", ["r", "first"], ["cls"], axis=1),
             helper.make_node("MatMul", ["cls", "v"], ["t"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6 - start, 8]),
               helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])]
    if user_reads_slice:
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT,
                                                     [1, 6 - start, width]))
    graph = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 6, width])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inside(plan, name: str, source: str, offset: int) -> bool:
    buffers = plan.buffer_plan
    return buffers.assignment.get(name) == buffers.assignment.get(source) and \
        buffers.tensor_offset(name) == buffers.tensor_offset(source) + offset


@pytest.mark.parametrize("width, start, user_reads_slice, placed", [
    (16, 2, False, True),     # rows of 64 bytes: the slice at 128
    (12, 1, False, False),    # rows of 48 bytes: the slice at 48, off the alignment
    (16, 2, True, False),     # the user reads the slice: a buffer of its own
])
def test_a_slice_runs_inside_its_input_or_is_copied(tmp_path, width, start, user_reads_slice,
                                                    placed):
    model = _model(width, start, user_reads_slice)
    wpk.build(model, target="cpu", **FAST).save(tmp_path / "m.wpk")
    session = wpk.load(tmp_path / "m.wpk")
    plan = session.plan
    assert _inside(plan, "s", "r", 4 * width * start) == placed, plan.buffer_plan.tensor_offsets
    assert _inside(plan, "cls", "r", 0)   # the first row: at the start of r
    if placed:
        assert session._arrays["s"].ctypes.data == session._arrays["r"].ctypes.data + 128
    x = np.random.default_rng(1).standard_normal((1, 6, width)).astype(np.float32)
    for feeds in ({"x": x}, {"x": -x}):   # a second run: nothing a first one left behind
        assert_matches_onnxruntime(session, model, feeds)
