"""A Concat's inputs written in place: the buffer plan puts each piece of a batch-1 channel
concat inside the concat's output (`wpk.plans.buffers.place_parts`), its producer writes
it there and the concat copies nothing. Whole models against onnxruntime, after save and
load; the cases that must stay copies (misaligned pieces, a piece that is a graph output,
one tensor concatenated twice) still compute the right thing. The planner's side:
`test_buffers.py`."""

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


def _conv(name, x, out, cin, cout, k, rng, inits, nodes, relu=True):
    weight = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    inits += [numpy_helper.from_array(weight, f"{name}_w"),
              numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), f"{name}_b")]
    target = f"{out}_pre" if relu else out
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [target],
                                  pads=[k // 2] * 4))
    if relu:
        nodes.append(helper.make_node("Relu", [target], [out]))


def _model(channels, size, concats, extra_outputs=(), seed=0):
    """x [1, channels[0], size, size] -> one conv per entry of `channels[1:]` (a{i}) ->
    the Concats `concats` ((name, inputs) in order) -> a 1x1 conv of the last -> y."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    for i, cout in enumerate(channels[1:]):
        _conv(f"c{i}", "x", f"a{i}", channels[0], cout, 3, rng, inits, nodes)
    width = {f"a{i}": c for i, c in enumerate(channels[1:])}
    for name, inputs in concats:
        nodes.append(helper.make_node("Concat", list(inputs), [name], axis=1))
        width[name] = sum(width[i] for i in inputs)
    last = concats[-1][0]
    _conv("head", last, "y", width[last], 8, 1, rng, inits, nodes, relu=False)
    shape = lambda c: [1, c, size, size]   # noqa: E731
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape(8))]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape(width[n]))
                for n in extra_outputs]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape(channels[0]))], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(model, tmp_path, channels, size):
    """Build, save, load and run `model`; every output against onnxruntime. Returns the
    loaded session and its plan."""
    x = np.random.default_rng(1).standard_normal((1, channels, size, size)).astype(np.float32)
    wpk.build(model, target="cpu", **FAST).save(tmp_path / "m.wpk")
    session = wpk.load(tmp_path / "m.wpk")
    assert_matches_onnxruntime(session, model, {"x": x})
    return session, session.plan


def _concat_steps(plan):
    return [s for s in plan.steps if s.op == "Concat"]


def _placed(plan, step):
    """Which inputs of Concat `step` lie inside its output, each at its own offset."""
    buffers, out = plan.buffer_plan, step.outputs[0]
    offsets = NumpyCopy().places_inputs(plan.workloads[step.workload_key])
    return [buffers.assignment.get(name) == buffers.assignment[out]
            and buffers.tensor_offset(name) == buffers.tensor_offset(out) + offset
            for name, offset in zip(step.inputs, offsets)]


def test_the_convs_of_a_blocked_concat_write_into_it(tmp_path):
    """Three convs (16, 32, 16 channels: whole blocks) concatenated: each conv writes its
    piece of the concat's buffer; the session's arrays are views of one another."""
    model = _model([8, 16, 32, 16], 10, [("cat", ["a0", "a1", "a2"])])
    session, plan = _check(model, tmp_path, 8, 10)
    (step,) = _concat_steps(plan)
    assert all(_placed(plan, step)), plan.buffer_plan.tensor_offsets
    whole = session._arrays[step.outputs[0]]
    for name in step.inputs:
        assert np.shares_memory(session._arrays[name], whole)
    assert plan.manifest["format_version"] == 2
    (entry,) = [w for w in plan.report["workloads"] if w["op"] == "Concat"]
    assert entry["algorithm"] == "in place (no copy)", entry


def test_nested_concats_place_every_piece(tmp_path):
    model = _model([8, 16, 16, 16], 6, [("inner", ["a0", "a1"]), ("cat", ["inner", "a2"])])
    _, plan = _check(model, tmp_path, 8, 6)
    for step in _concat_steps(plan):
        assert all(_placed(plan, step)), (step.node, plan.buffer_plan.tensor_offsets)


@pytest.mark.parametrize("case", ["graph_output", "twice", "misaligned"])
def test_pieces_that_must_be_copied_still_give_the_right_result(case, tmp_path):
    if case == "graph_output":   # a1 is read by the user too: never placed in the concat
        model = _model([8, 16, 16], 5, [("cat", ["a0", "a1"])], extra_outputs=["a1"])
    elif case == "twice":
        model = _model([8, 16], 5, [("cat", ["a0", "a0"])])
    else:                        # 3 channels of 5 x 5 floats: the second at 300 bytes
        model = _model([3, 3, 3], 5, [("cat", ["a0", "a1"])])
    _, plan = _check(model, tmp_path, 8 if case != "misaligned" else 3, 5)
    placed = {name for step in _concat_steps(plan)
              for name, inside in zip(step.inputs, _placed(plan, step)) if inside}
    assert not placed & {e["name"] for e in (*plan.inputs, *plan.outputs)}
    if case == "twice":
        assert not placed, plan.buffer_plan.tensor_offsets
    if case == "misaligned":    # the first piece at 0 is placed, the one at 300 bytes not
        (step,) = _concat_steps(plan)
        assert _placed(plan, step) == [True, False], plan.buffer_plan.tensor_offsets


def test_which_concats_place_their_inputs():
    """Batch-1 concats over any axis with only 1s before it; not a batch-2 channel concat,
    an epilogue, or mixed dtypes."""
    def concat(shapes, axis, dtype="float32", **extra):
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        return Workload("Concat", tuple(TensorSpec(tuple(s), dtype) for s in shapes),
                        (TensorSpec(tuple(out), "float32"),), (("axis", axis),), **extra)

    copy = NumpyCopy()
    assert copy.places_inputs(concat([(1, 16, 4, 4), (1, 32, 4, 4)], 1)) == (0, 1024)
    assert copy.algorithm(concat([(1, 16, 4, 4), (1, 32, 4, 4)], 1), {}) == "in place (no copy)"
    assert copy.algorithm(concat([(2, 16, 4, 4), (2, 16, 4, 4)], 1), {}) == "copy"
    assert copy.places_inputs(concat([(1, 2, 4, 4, 16), (1, 1, 4, 4, 16)], 1)) == (0, 2048)
    assert copy.places_inputs(concat([(1, 1, 3), (1, 1, 5)], -1)) == (0, 12)
    assert copy.places_inputs(concat([(2, 16, 4, 4), (2, 16, 4, 4)], 1)) is None
    assert copy.places_inputs(concat([(1, 16), (1, 16)], 1, dtype="float16")) is None


def _c2f_model(split: bool, size: int = 6, seed: int = 0):
    """YOLO's C2f block: a conv's output y split into halves a and b (a Split node, or two
    Slice nodes as TorchScript writes it), a conv of b, concat(a, b, conv(b)), a head."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    _conv("enter", "x", "y", 8, 32, 1, rng, inits, nodes)
    if split:
        inits.append(numpy_helper.from_array(np.array([16, 16], np.int64), "halves"))
        nodes.append(helper.make_node("Split", ["y", "halves"], ["a", "b"], axis=1))
    else:
        for name, (lo, hi) in (("a", (0, 16)), ("b", (16, 32))):
            for suffix, value in (("lo", lo), ("hi", hi), ("axis", 1)):
                inits.append(numpy_helper.from_array(np.array([value], np.int64),
                                                     f"{name}_{suffix}"))
            nodes.append(helper.make_node("Slice", ["y", f"{name}_lo", f"{name}_hi",
                                                    f"{name}_axis"], [name]))
    _conv("body", "b", "c", 16, 16, 3, rng, inits, nodes)
    nodes.append(helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1))
    _conv("head", "cat", "out", 48, 8, 1, rng, inits, nodes, relu=False)
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, size, size])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, [1, 8, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("split", [True, False], ids=["split", "slices"])
def test_a_c2f_blocks_conv_writes_into_its_concat(split, tmp_path):
    """The halves of y are views of it and pieces of the concat, so y itself lies in the
    concat's buffer: the conv writes there, the slices and the concat copy nothing (the
    session's arrays share memory), the report says so, and the result is onnxruntime's."""
    session, plan = _check(_c2f_model(split), tmp_path, 8, 6)
    slices = [s for s in plan.steps if s.op == "ChannelSlice"]
    (concat,) = _concat_steps(plan)
    assert len(slices) == 2 and all(_placed(plan, concat)), plan.buffer_plan.tensor_offsets
    whole = session._arrays[concat.outputs[0]]
    producer = slices[0].inputs[0]
    assert np.shares_memory(session._arrays[producer], whole)
    assert session._arrays[producer].ctypes.data == whole.ctypes.data
    entries = [w for w in plan.report["workloads"] if w["op"] == "ChannelSlice"]
    assert entries and all(w["algorithm"] == "view (no copy)" for w in entries), entries


def test_the_in_place_reason_says_what_stays_in_place():
    from wpk.commands.render import reason_text

    def entry(op, over):
        return {"op": op, "candidates": [], "reason": {
            "rule": "in-place", "faster": "ort.nchwc", "over_s": over}}

    for op in ("ChannelSlice", "Slice", "Gather"):
        assert "its output stays inside its input" in reason_text(entry(op, 2e-6))
    assert "its inputs are written in place (+2" in reason_text(entry("Concat", 2e-6))
    assert "faster than ort.nchwc timed alone too" in reason_text(entry("Concat", -3e-6))
