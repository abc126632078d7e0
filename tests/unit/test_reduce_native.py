"""reduce.c (kernels/cpu/reduce_native.py): ReduceMean, ReduceSum and the norms (ReduceL1,
ReduceL2, ReduceSumSquare) over a run of adjacent axes against the float64 reference --
along rows (the last axes), down rows (axes with others after them), every axis, keepdims
0 and 1, axes as an attribute and as an input (opset 18), odd sizes, on the calling
thread and the OpenMP threads --, its native form, what it refuses, and a model's norms
against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel
from wpk.kernels.reference import reference

REDUCE = registry.get("reduce.c")


def _reduce(op, shape, axes, keepdims=1, opset=17) -> Workload:
    rank = len(shape)
    kept = sorted(a % rank for a in axes) if axes else list(range(rank))
    out = tuple(1 if k in kept else d for k, d in enumerate(shape)) if keepdims else \
        tuple(d for k, d in enumerate(shape) if k not in kept)
    as_input = opset >= 18 or op == "ReduceSum" and opset >= 13
    inputs = [TensorSpec(tuple(shape))]
    attrs = {"keepdims": keepdims}
    static = ()
    if as_input:
        inputs.append(TensorSpec((len(axes),), "int64"))
        static = ((1, np.array(axes, np.int64)),)
    elif axes:
        attrs["axes"] = tuple(axes)
    return Workload(op, tuple(inputs), (TensorSpec(out),), tuple(sorted(attrs.items())),
                    const_inputs=(1,) if as_input else (), static_inputs=static, opset=opset)


CASES = {
    "svtr's mean over the height": _reduce("ReduceMean", (1, 128, 6, 48), [2], keepdims=0),
    "keras' global average (NHWC)": _reduce("ReduceMean", (1, 28, 28, 67), [1, 2], 0),
    "last axis (rows)": _reduce("ReduceMean", (3, 7, 97), [-1]),
    "every axis": _reduce("ReduceSum", (5, 9, 11), [], opset=11),
    "sum, axes input, threads": _reduce("ReduceSum", (2, 40, 33, 31), [1, 2], opset=13),
    "mean, axes input (opset 18), threads": _reduce("ReduceMean", (2, 3, 6000), [2],
                                                    opset=18),
    "one element": _reduce("ReduceMean", (1, 1, 1), [1]),
    "F.normalize's L2 over the last axis (Swin V2)": _reduce("ReduceL2", (49, 3, 64, 32), [-1]),
    "L2 down rows, axes input (opset 18)": _reduce("ReduceL2", (2, 33, 7), [1], opset=18),
    "L1 over two axes": _reduce("ReduceL1", (3, 5, 9, 4), [1, 2], keepdims=0),
    "sum of squares, every axis, threads": _reduce("ReduceSumSquare", (4, 130, 97), []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_the_reference(name, rng):
    workload = CASES[name]
    assert REDUCE.unsupported_reason(workload) is None
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    inputs = [x] + ([workload.static_value(1)] if len(workload.inputs) > 1 else [])
    kernel = REDUCE.prepare(workload, {}, {})
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [y])
    expected = reference(workload, [x.astype(np.float64), *inputs[1:]])[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    y2 = np.full_like(y, np.nan)
    chain_kernel([kernel.native(inputs, [y2])], keep=[kernel])([], [])
    np.testing.assert_array_equal(y2, y)


def test_refuses_what_it_does_not_compute():
    assert "adjacent" in REDUCE.unsupported_reason(_reduce("ReduceMean", (2, 3, 4), [0, 2]))
    variable = Workload("ReduceMean", (TensorSpec((2, 3)), TensorSpec((1,), "int64")),
                        (TensorSpec((2, 1)),), (("keepdims", 1),), opset=18)
    assert "constants" in REDUCE.unsupported_reason(variable)
    noop = Workload("ReduceSum", (TensorSpec((2, 3)),), (TensorSpec((2, 3)),),
                    (("noop_with_empty_axes", 1),), opset=11)
    assert REDUCE.unsupported_reason(noop) is not None
    assert "ReduceMean" in REDUCE.unsupported_reason(_reduce("ReduceMax", (2, 3), [1]))


def test_a_models_norms_run_in_c_and_match_onnxruntime(tmp_path, rng):
    """F.normalize as torch exports it (ReduceL2, Clip, Expand, Div) and the other norms:
    reduce.c is a verified candidate of each (before, onnxruntime ran them as fallbacks),
    and the plan matches onnxruntime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto
    from onnx import helper as h

    import wpk
    from tests.built_plans import FAST_BUILD

    shape = [48, 3, 64, 32]
    nodes = [h.make_node("ReduceL2", ["x"], ["norm"], axes=[-1], keepdims=1),
             h.make_node("Clip", ["norm", "eps"], ["clipped"]),
             h.make_node("Expand", ["clipped", "shape"], ["wide"]),
             h.make_node("Div", ["x", "wide"], ["unit"]),
             h.make_node("ReduceL1", ["x"], ["l1"], axes=[1, 2], keepdims=0),
             h.make_node("ReduceSumSquare", ["x"], ["squares"], axes=[2], keepdims=1)]
    inits = [onnx.numpy_helper.from_array(np.array(1e-12, np.float32), "eps"),
             onnx.numpy_helper.from_array(np.array(shape, np.int64), "shape")]
    graph = h.make_graph(nodes, "norms", [h.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                         [h.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n, dims in
                          (("unit", shape), ("l1", [48, 32]), ("squares", [48, 3, 1, 32]))], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    plan = wpk.build(model, target="cpu", **FAST_BUILD)
    verified = {w["op"]: {c["impl"] for c in w["candidates"] if c["status"] == "ok"}
                for w in plan.report["workloads"]}
    for op in ("ReduceL2", "ReduceL1", "ReduceSumSquare"):
        assert "reduce.c" in verified[op], verified
    plan.save(tmp_path / "norms.wpk")
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = dict(zip(("unit", "l1", "squares"), session.run(None, feeds)))
    actual = wpk.load(tmp_path / "norms.wpk").run(feeds)
    for name, want in expected.items():
        np.testing.assert_allclose(actual[name], want, rtol=1e-5, atol=1e-6)
