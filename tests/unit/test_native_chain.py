"""Consecutive generated-kernel steps run as one native call (kernels/cpu/native_chain)."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

import wpk
from tests import corpus, models
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.dsl import toolchain
from wpk.dsl.codegen_c import CHUNK_WORK, MIN_PARALLEL_WORK
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import (
    MAX_ARGS,
    chain_kernel,
    function_address,
    native_call,
)
from wpk.kernels.generated import DSL_CPU, default_config, map_workload
from wpk.kernels.templates import build_cpu
from wpk.runtime import Session, example_feeds

# Functions of different arities that record the order they ran in.
_SOURCE = """
#include <stdint.h>
static int64_t calls = 0;
void scale(float *x, float *y) { y[0] = 2.0f * x[0]; y[1] = (float)(++calls); }
void add3(float *a, float *b, float *c, float *out) { out[0] = a[0] + b[0] + c[0];
                                                     out[1] = (float)(++calls); }
void many(PARAMETERS) { p31[0] = p0[0] + p30[0]; p31[1] = (float)(++calls); }
""".replace("PARAMETERS", ", ".join(f"float *p{i}" for i in range(MAX_ARGS)))


def _functions():
    library = ctypes.CDLL(str(toolchain.compile_c_shared(_SOURCE)))
    return library, {name: function_address(getattr(library, name))
                     for name in ("scale", "add3", "many")}


def test_the_driver_calls_each_function_in_order_with_its_own_arguments():
    library, address = _functions()
    x, y, z, w = (np.array([value, 0], np.float32) for value in (1.5, 0, 4.0, 0))
    wide = [np.array([float(i), 0], np.float32) for i in range(MAX_ARGS)]
    chain = chain_kernel([(address["scale"], (x.ctypes.data, y.ctypes.data)),
                          (address["add3"], (y.ctypes.data, x.ctypes.data, z.ctypes.data,
                                             w.ctypes.data)),
                          (address["many"], tuple(a.ctypes.data for a in wide))],
                         keep=[library])
    chain([], [])
    assert y[0] == 3.0 and w[0] == 3.0 + 1.5 + 4.0 and wide[-1][0] == 0.0 + 30.0
    assert (y[1], w[1], wide[-1][1]) == (1.0, 2.0, 3.0)   # in the chain's order


def test_the_timed_driver_runs_the_same_calls_and_stamps_each_on_the_host_clock():
    """`kernel.timed()`: the chain's calls in order, the clock read before the first and
    after each (on time.perf_counter's clock, so a trace can place the steps)."""
    library, address = _functions()
    x, y, z, w = (np.array([value, 0], np.float32) for value in (1.5, 0, 4.0, 0))
    chain = chain_kernel([(address["scale"], (x.ctypes.data, y.ctypes.data)),
                          (address["add3"], (y.ctypes.data, x.ctypes.data, z.ctypes.data,
                                             w.ctypes.data))], keep=[library])
    before = time.perf_counter()
    stamps = chain.timed()
    after = time.perf_counter()
    assert y[0] == 3.0 and w[0] == 3.0 + 1.5 + 4.0 and w[1] == y[1] + 1
    assert len(stamps) == 3 and before <= stamps[0] <= stamps[1] <= stamps[2] <= after


def _add_kernel(size: int):
    spec = TensorSpec((1, size), "float32")
    workload = Workload("Add", (spec, spec), (spec,))
    return DSL_CPU.prepare(workload, {}, default_config(workload))


def test_a_kernel_gives_its_native_form_only_where_a_call_copies_nothing():
    kernel = _add_kernel(37)
    a, b, out = (np.full((1, 37), v, np.float32) for v in (1.0, 2.0, 0.0))
    address, pointers = native_call(kernel, [a, b], [out])
    assert list(pointers) == [a.ctypes.data, b.ctypes.data, out.ctypes.data]
    chain_kernel([(address, pointers)], keep=[kernel])([], [])
    assert np.all(out == 3.0)
    strided = np.ones((1, 74), np.float32)[:, ::2]   # the kernel would copy it first
    assert native_call(kernel, [strided, b], [out]) is None
    assert native_call(kernel, [a.astype(np.float64), b], [out]) is None
    assert native_call(lambda inputs, outputs: None, [a, b], [out]) is None  # no native form


def _generated_plan(model, input_shapes=None):
    """The model's plan with every step a generated kernel computes given to one (its
    default config: micro-kernels first; blocked data movement to `native.nchwc`), so the
    chaining is tested, not the planner."""
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False, input_shapes=input_shapes or {})
    impls = [registry.get(name) for name in ("micro.inverted_residual", "micro.winograd",
                                              "micro.nchwc", "micro.gemm", "attention.c",
                                              "native.nchwc")]
    copy = registry.get("numpy.copy")  # data movement that joins the chain (native_moves)
    for step in plan.manifest["steps"]:
        workload = plan.workloads[step["workload_key"]]
        impl = next((i for i in impls if i.unsupported_reason(workload) is None), None)
        if impl is not None:
            step.update(impl=impl.name, config=impl.configs(workload)[0], kind=impl.kind)
        elif DSL_CPU.unsupported_reason(workload) is None:
            step.update(impl=DSL_CPU.name, config=default_config(workload), kind=DSL_CPU.kind)
        elif copy.unsupported_reason(workload) is None:
            step.update(impl=copy.name, config={}, kind=copy.kind)
    return plan


@pytest.mark.parametrize("model", [models.transformer_encoder, models.tiny_conv_gemm,
                                   lambda: models.mobilenet_v2_like(image_size=64)],
                         ids=["transformer", "conv_gemm", "mobilenet_v2_64"])
def test_a_plans_consecutive_generated_steps_run_as_one_call_with_the_same_outputs(model):
    plan = _generated_plan(model())
    chained, stepwise = Session(plan), Session(plan, merge_regions=False)
    chains = [n for n in chained._step_names if ".." in n]
    assert chains and len(chained._calls) < len(stepwise._calls)
    timeline = chained.timeline(example_feeds(chained))
    assert sum(len(call.steps) for call in timeline) == len(plan.steps)
    for call in timeline:   # a chain times each of its steps inside it, in order
        spans = call.step_spans()
        assert len(spans) == (len(call.steps) if len(call.steps) > 1 else 0)
        ends = [call.start_s] + [end for _, _, end in spans]
        assert ends == sorted(ends) and (not spans or ends[-1] == call.end_s)
    for seed in (0, 1):
        feeds = example_feeds(chained, seed)
        ours, reference = chained.run(feeds), stepwise.run(feeds)
        for output in reference:
            assert relative_l2(ours[output], reference[output]) <= 1e-6, output


def test_a_transformers_plan_on_generated_kernels_is_one_native_call():
    """The heads' Reshapes and Transposes (numpy.copy, native_moves) and the fused attention
    join the chain, so no step of the layer returns to Python between kernels."""
    plan = _generated_plan(models.transformer_encoder())
    impls = {step.impl for step in plan.steps}
    assert {"numpy.copy", "attention.c", "micro.gemm"} <= impls, impls
    assert Session(plan)._step_names == [f"{plan.steps[0].node}..{plan.steps[-1].node}"]


def test_a_yolo_plans_blocked_data_movement_joins_the_chain():
    """The tf2onnx YOLO's channel slices, SPPF MaxPools, nearest Upsamples and reorders
    (`native.nchwc`; with 16-lane blocks also gathers: its CI channel counts are not whole
    blocks) and its Splits and Concats (`numpy.copy`) join the generated kernels: the whole
    plan is one native call, with the outputs of step-by-step execution."""
    plan = _generated_plan(corpus.build_model("yolo_tf", "ci"), corpus.input_shapes("yolo_tf"))
    ops = {step.op for step in plan.steps if step.impl == "native.nchwc"}
    movement = {"ChannelSlice", "MaxPool", "Upsample", "ReorderOutput"}
    assert movement <= ops <= movement | {"ChannelGather", "ReorderInput"}, ops
    chained, stepwise = Session(plan), Session(plan, merge_regions=False)
    assert chained._step_names == [f"{plan.steps[0].node}..{plan.steps[-1].node}"]
    feeds = example_feeds(chained, 0)
    ours, reference = chained.run(feeds), stepwise.run(feeds)
    for output in reference:
        assert relative_l2(ours[output], reference[output]) <= 1e-6, output


@pytest.mark.parametrize("op,lone", [("Transpose", "numpy.copy"), ("MatMul", "micro.gemm")])
def test_a_lone_native_step_runs_as_a_chain_of_one(op, lone):
    """A step between two onnxruntime steps (no chain to join) still runs its native form,
    named after its node, with the outputs of the Python form: a Transpose as `wpk_moves`
    (faster than numpy's copy), a generated product without the wrapper's per-call work.
    onnxruntime's steps stay Python calls."""
    from onnx import TensorProto, helper, numpy_helper

    transpose = op == "Transpose"
    nodes = [helper.make_node("Softmax", ["x"], ["a"], name="first"),
             helper.make_node(op, ["a"] if transpose else ["a", "w"], ["b"], name="move",
                              **({"perm": [0, 2, 3, 1]} if transpose else {})),
             helper.make_node("Softmax", ["b"], ["y"], name="last")]
    weight = np.random.default_rng(0).standard_normal((48, 48)).astype(np.float32)
    graph = helper.make_graph(nodes, "lone", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 32, 40, 48])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 40, 48, 32] if transpose else [1, 32, 40, 48])],
        [] if transpose else [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False)
    for step in plan.manifest["steps"]:
        impl = registry.get(lone if step["node"] == "move" else "ort")
        configs = impl.configs(plan.workloads[step["workload_key"]])
        step.update(impl=impl.name, config=configs[0] if configs else {}, kind=impl.kind)
    chained, stepwise = Session(plan), Session(plan, merge_regions=False)
    assert chained._step_names == ["first", "move", "last"]
    kernel = chained._calls[1][0]
    assert hasattr(kernel, "timed") and not hasattr(stepwise._calls[1][0], "timed")
    assert not hasattr(chained._calls[0][0], "timed")   # onnxruntime's: a Python call
    feeds = example_feeds(chained, 0)
    np.testing.assert_array_equal(chained.run(feeds)["y"], stepwise.run(feeds)["y"])


def test_a_small_parallel_loop_runs_on_the_calling_thread():
    """Below MIN_PARALLEL_WORK iterations the C has no OpenMP region to wake; above, it has."""
    for size, parallel in ((256, False), (4 * MIN_PARALLEL_WORK, True)):
        spec = TensorSpec((1, size), "float32")
        workload = Workload("Add", (spec, spec), (spec,))
        mapping = map_workload(workload)
        source = build_cpu(mapping.op, mapping.bindings, default_config(workload)).source
        assert ("#pragma omp parallel" in source) == parallel, size
        if parallel:   # vectors handed out CHUNK_WORK floats at a time, not one by one
            vector = default_config(workload)["vector"]
            assert f"schedule(dynamic, {-(-CHUNK_WORK // vector)})" in source


def test_step_overhead_bench_measures_two_pools_in_one_plan(monkeypatch):
    """The two-pool rows: per pair and each step alone under onnxruntime's per-session
    pools (wpk's regions), spinning during a run and one global pool, each in its own
    process (the global pool is the process's)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_step_overhead

    rows = bench_step_overhead.mixed_rows()
    for label in bench_step_overhead.MIXED_POOLS.values():
        pair = rows[f"mixed: onnxruntime Softmax + generated Add, per pair, {label}"]
        alone = (rows[f"mixed: the onnxruntime Softmax step alone, {label}"],
                 rows[f"mixed: the generated Add step alone, {label}"])
        assert pair > 0 and min(alone) > 0
        excess = rows[f"mixed: excess per pair (the pair minus both alone), {label}"]
        assert excess == pytest.approx(pair - sum(alone))


def test_step_overhead_bench_result_names_the_machine(monkeypatch, tmp_path):
    """Its JSON says which CPU ran it, as the other per-op benchmarks' do: runs on VMs of
    different vendors (or with AVX-512 hidden) are told apart."""
    import json
    from pathlib import Path

    from wpk.core.devices import host_cpu

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_step_overhead

    out = tmp_path / "steps.json"
    bench_step_overhead.write_result(str(out), 200, 256, {"onnxruntime Add": 3.6e-7})
    written = json.loads(out.read_text())
    assert written["cpu_model"] == host_cpu().description
    assert written["seconds_per_step"] == {"onnxruntime Add": 3.6e-7}
    assert written["steps"] == 200 and "cpuid_denied" in written and written["machine"]
