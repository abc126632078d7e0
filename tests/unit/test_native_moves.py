"""Data-movement steps in native form (kernels/cpu/native_moves): the strided C copy
against numpy on every dtype width, merged dims, and numpy.copy's Reshape, Transpose,
Slice and Concat kernels joining a native chain with the outputs of their Python form."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel, native_call
from wpk.kernels.cpu.native_moves import PAR_BYTES, merged_dims, moves_call, native_form
from wpk.kernels.reference import reference

NUMPY_COPY = registry.get("numpy.copy")
DTYPES = [np.float32, np.int64, np.float16, np.uint8, np.bool_]


def _run_moves(pairs) -> None:
    call, table = moves_call(pairs)
    chain_kernel([call], keep=[table])([], [])


def _random(shape, dtype, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 50).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("view", [
    lambda x: x.transpose(0, 2, 1, 3),          # attention heads: rows of the last dim
    lambda x: x.transpose(0, 1, 3, 2),          # K^T: a strided inner dim
    lambda x: x.transpose(3, 2, 1, 0),
    lambda x: x[:, 1:, ::-2, 2:6],              # a negative step
    lambda x: x[1:2, :, 3:4, :1],               # size-1 dims everywhere
    lambda x: x.reshape(6, 35),
], ids=["heads", "k-transposed", "reversed", "negative-step", "ones", "reshape"])
def test_a_move_copies_what_numpy_copies(dtype, view):
    source = view(_random((2, 3, 5, 7), dtype))
    out = np.zeros(source.shape, dtype)
    _run_moves([(source, out)])
    np.testing.assert_array_equal(out, source)


@pytest.mark.parametrize("row_floats", [8, 16, 32, 64, 13])
@pytest.mark.parametrize("view", [
    lambda x: x.transpose(1, 0, 2, 3),               # blocks of rows regrouped
    lambda x: x.transpose(2, 0, 1, 3)[::-1],         # ... in reverse order
    lambda x: x[:, :, 1:].transpose(1, 2, 0, 3),     # a slice: rows that do not merge
], ids=["regrouped", "reversed", "sliced"])
def test_a_large_move_shares_its_rows_out_to_the_threads(view, row_floats):
    """Moves of PAR_BYTES and more run on the OpenMP threads, each from its own row of
    the odometer (odd row counts: shares that start mid-dimension); rows of 32, 64, 128,
    256 bytes take the inline copies, 52 bytes the libc one: all equal numpy's copy."""
    source = view(_random((3, 7, 11 * 37, row_floats), np.float32, 3))
    assert source.nbytes >= PAR_BYTES
    out = np.full(source.shape, np.nan, np.float32)
    _run_moves([(source, out)])
    np.testing.assert_array_equal(out, source)


def test_moves_write_into_strided_destinations_in_order():
    a, b = _random((2, 3, 4), np.float32, 1), _random((2, 5, 4), np.float32, 2)
    out = np.full((2, 8, 4), np.nan, np.float32)
    _run_moves([(a, out[:, :3]), (b, out[:, 3:])])
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


def test_contiguous_dims_merge_so_a_reshape_is_one_copy():
    x = np.zeros((2, 3, 4), np.float32)
    assert merged_dims(x.shape, x.strides, x.strides, 4) == ([24], [4], [4])
    heads = x.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)   # last dim stays contiguous
    out = np.zeros(heads.shape, np.float32)
    shape, src, dst = merged_dims(heads.shape, heads.strides, out.strides, 4)
    assert shape[-1] == 2 and src[-1] == dst[-1] == 4 and len(shape) == 4
    assert merged_dims((1, 1), (4, 4), (4, 4), 4) == ([1], [4], [4])


def test_no_native_move_where_the_copy_is_not_a_plain_byte_copy():
    x = np.zeros((4, 4), np.float32)
    assert moves_call([(x, np.zeros((4, 4), np.float64))]) is None   # a cast
    assert moves_call([(x[:2], x[2:])]) is not None                  # disjoint halves
    assert moves_call([(x, x.T)]) is None                            # overlapping memory
    assert moves_call([(x[:, :3], np.zeros((4, 4), np.float32))]) is None   # shapes differ


def _copy_kernel(workload):
    return NUMPY_COPY.prepare(workload, {}, {})


def _spec(shape, dtype="float32"):
    return TensorSpec(tuple(shape), dtype)


WORKLOADS = {
    "reshape": Workload("Reshape", (_spec((2, 6, 4)), _spec((3,), "int64")),
                        (_spec((2, 3, 8)),), const_inputs=(1,),
                        static_inputs=((1, np.array((2, 3, 8), np.int64)),)),
    "transpose-heads": Workload("Transpose", (_spec((1, 16, 4, 8)),),
                                (_spec((1, 4, 16, 8)),), attrs=(("perm", (0, 2, 1, 3)),)),
    "transpose-default": Workload("Transpose", (_spec((3, 5, 7)),), (_spec((7, 5, 3)),)),
    "slice-steps": Workload("Slice", (_spec((6, 9)), _spec((2,), "int64"), _spec((2,), "int64"),
                                      _spec((2,), "int64"), _spec((2,), "int64")),
                            (_spec((2, 4)),), const_inputs=(1, 2, 3, 4),
                            static_inputs=tuple((i, np.array(v, np.int64)) for i, v in
                                                  ((1, (1, 8)), (2, (5, 0)), (3, (0, 1)),
                                                   (4, (2, -2))))),
    "concat": Workload("Concat", (_spec((2, 3, 5)), _spec((2, 1, 5)), _spec((2, 4, 5))),
                       (_spec((2, 8, 5)),), attrs=(("axis", -2),)),
    # the exporters' Splits: sizes as a static input (opset 13+), equal parts (opset 18)
    "split-sizes": Workload("Split", (_spec((1, 12, 84)), _spec((2,), "int64")),
                            (_spec((1, 4, 84)), _spec((1, 8, 84))), attrs=(("axis", 1),),
                            const_inputs=(1,), static_inputs=((1, np.array((4, 8))),),
                            opset=13),
    "gather-class-token": Workload("Gather", (_spec((2, 5, 3)), _spec((), "int64")),
                                   (_spec((2, 3)),), attrs=(("axis", 1),), const_inputs=(1,),
                                   static_inputs=((1, np.array(-5, np.int64)),)),
    "gather-one-index-kept": Workload("Gather", (_spec((4, 3)), _spec((1,), "int64")),
                                      (_spec((1, 3)),), const_inputs=(1,),
                                      static_inputs=((1, np.array([2], np.int64)),)),
    # broadcasts: zero source strides (grouped-query attention's repeated K/V heads)
    "expand-heads": Workload("Expand", (_spec((1, 2, 1, 5, 8)), _spec((5,), "int64")),
                             (_spec((1, 2, 4, 5, 8)),), const_inputs=(1,),
                             static_inputs=((1, np.array((1, 2, 4, 5, 8), np.int64)),)),
    "tile-heads": Workload("Tile", (_spec((1, 2, 1, 5, 8)), _spec((5,), "int64")),
                           (_spec((1, 2, 4, 5, 8)),), const_inputs=(1,),
                           static_inputs=((1, np.array((1, 1, 4, 1, 1), np.int64)),)),
    "tile-every-axis": Workload("Tile", (_spec((3, 5), "int64"), _spec((2,), "int64")),
                                (_spec((6, 15), "int64"),), const_inputs=(1,),
                                static_inputs=((1, np.array((2, 3), np.int64)),)),
    "split-last-axis": Workload("Split", (_spec((2, 3, 9)),),
                                (_spec((2, 3, 3)),) * 3, attrs=(("axis", -1),
                                                                ("num_outputs", 3)), opset=18),
}


@pytest.mark.parametrize("case", sorted(WORKLOADS))
def test_numpy_copy_steps_give_a_native_form_with_the_same_output(case):
    workload = WORKLOADS[case]
    assert NUMPY_COPY.unsupported_reason(workload) is None
    kernel = _copy_kernel(workload)
    inputs = [_random(spec.shape, spec.dtype, seed) if workload.static_value(i) is None
              else np.asarray(workload.static_value(i), np.int64)
              for seed, (i, spec) in enumerate(enumerate(workload.inputs))]
    python_out = [np.zeros(spec.shape, spec.dtype) for spec in workload.outputs]
    kernel(inputs, python_out)
    for got, expected in zip(python_out, reference(workload, inputs), strict=True):
        np.testing.assert_array_equal(got, expected)
    native_out = [np.full(spec.shape, 7, spec.dtype) for spec in workload.outputs]
    call = native_call(kernel, inputs, native_out)
    assert call is not None
    chain_kernel([call], keep=[kernel])([], [])
    for got, expected in zip(native_out, python_out):
        np.testing.assert_array_equal(got, expected)


def test_copy_steps_that_would_copy_twice_or_compute_have_no_native_form():
    reshape = _copy_kernel(WORKLOADS["reshape"])
    strided = _random((2, 12, 4), np.float32)[:, ::2]     # reshape() would copy it first
    assert native_call(reshape, [strided, None], [np.zeros((2, 3, 8), np.float32)]) is None
    with_epilogue = Workload("Reshape", WORKLOADS["reshape"].inputs,
                             WORKLOADS["reshape"].outputs, const_inputs=(1,),
                             static_inputs=((1, (2, 3, 8)),),
                             epilogue=(EpilogueStep("relu"),))
    assert getattr(_copy_kernel(with_epilogue), "native", None) is None
    gather = Workload("Gather", (_spec((5, 3)), _spec((2,), "int64")), (_spec((2, 3)),))
    assert getattr(_copy_kernel(gather), "native", None) is None
    assert not NUMPY_COPY.native_chain(gather)
    assert NUMPY_COPY.native_chain(WORKLOADS["gather-class-token"])
    # a destination that is a copy, not a view of the step's output, would write nothing
    # the step's output sees: no native form
    def copied_destination(inputs, outputs):
        return [(inputs[0], outputs[0].copy())]

    kernel = _copy_kernel(WORKLOADS["transpose-default"])
    native = native_form(kernel, copied_destination)
    x = _random((3, 5, 7), np.float32)
    assert native([x], [np.zeros((3, 5, 7), np.float32)]) is None


def test_reshape_steps_share_their_input_buffer_and_copy_nothing(rng, monkeypatch):
    """A plan's Reshape-likes (Reshape, Flatten, Squeeze, Unsqueeze) are views: one buffer
    with their source (the graph input's, for the first), a native form that copies
    nothing, and the outputs onnxruntime gives. (onnxruntime's single-node kernels are
    kept out of the build: it would give these tiny steps to one onnxruntime region.)"""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import wpk
    from wpk.kernels.cpu.ort_node import OrtNode
    from wpk.runtime import Session

    monkeypatch.setattr(OrtNode, "unsupported_reason", lambda self, workload: "not here")

    def node(op, inputs, output, **attrs):
        return helper.make_node(op, inputs, [output], **attrs)

    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [2, 12, 5])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    nodes = [node("Reshape", ["x", "shape"], "r0"), node("Relu", ["r0"], "a"),
             node("Flatten", ["a"], "f", axis=2), node("Unsqueeze", ["f", "axes"], "u"),
             node("Squeeze", ["u", "axes"], "s"), node("Sigmoid", ["s"], "b"),
             node("Add", ["f", "b"], "y")]
    graph = helper.make_graph(
        nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 5])], [shape, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    plan = wpk.build(model, "cpu", partition=False)
    buffers = plan.buffer_plan.assignment
    assert buffers["r0"] == buffers["x"]
    assert buffers["f"] == buffers["u"] == buffers["s"] == buffers["a"]
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = Session(plan)
    np.testing.assert_allclose(session.run({"x": x})["y"], expected, rtol=1e-6)
    views = [step for step in plan.steps if step.op in ("Reshape", "Flatten", "Squeeze",
                                                         "Unsqueeze")]
    assert {step.impl for step in views} == {"numpy.copy"}
    in_place = 0
    for kernel, inputs, outputs in session._prepare_steps(session._arrays, merge=False)[0]:
        if getattr(kernel, "native", None) and inputs[0].ctypes.data == outputs[0].ctypes.data:
            call, args = kernel.native(inputs, outputs)
            assert np.ctypeslib.as_array(ctypes.cast(args[0], ctypes.POINTER(ctypes.c_int64)),
                                         (1,))[0] == 0   # a table of no moves
            in_place += 1
    assert in_place == len(views) == 4
