"""The CUDA execution path on a real GPU (skipped without one, see conftest.py).

* every DSL library operator: the generated CUDA kernels (compiled by cupy's NVRTC) against
  the GPU emulator and the numpy evaluation of the operator, on small odd shapes;
* cuDNN and cuBLAS candidates (every cuDNN plan tried) against the float64 reference, and a
  generated `dsl.cuda` candidate verified and timed like any other;
* CUDA-graph sessions of small models against onnxruntime, with no allocation and no
  implicit host synchronisation in the steady state.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.registry import Candidate
from wpk.search import measure_cuda

pytestmark = pytest.mark.gpu
DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}


def _relative_l2(got, ref) -> float:
    got, ref = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


# ----------------------------------------------------------------------------- generated


def _library_ops():
    from wpk.kernels.dsl_library import list_operators

    return list_operators()


@pytest.mark.parametrize("name", _library_ops())
def test_generated_kernel_matches_emulator_and_numpy(cupy, present_gpu, name):
    from tests.unit.dsl_workloads import fixed_workload
    from wpk.dsl.compute import specialize
    from wpk.dsl.emulator import emulate
    from wpk.dsl.evaluate import evaluate
    from wpk.kernels.dsl_library import load_operator
    from wpk.kernels.templates import build_cuda, template_for

    op = load_operator(name)
    bindings, arrays = fixed_workload(op)
    template = template_for(specialize(op, bindings), "cuda", present_gpu)
    config = next(p for i, p in enumerate(template.preferred_points())
                  if i < 400 and template.validate(p) is None)
    built = build_cuda(op, bindings, config, present_gpu, compile=False)
    module = cupy.RawModule(code=built.source, options=("--use_fast_math",))
    func = built.func
    outputs = func.meta["outputs"]
    device = {}
    for buffer in func.params + func.workspaces:
        dtype = DTYPES[buffer.dtype]
        if buffer.name in outputs or buffer in func.workspaces:
            device[buffer.name] = cupy.full(buffer.size, np.nan, dtype)
        else:
            device[buffer.name] = cupy.asarray(np.asarray(arrays[buffer.name], dtype).ravel())
    args = tuple(device[b.name] for b in func.params + func.workspaces)
    for item in built.launches:
        module.get_function(item.name)(tuple(item.launch.grid), tuple(item.launch.block), args)
    cupy.cuda.Device().synchronize()
    emulated = emulate(func, arrays)
    expected = evaluate(op, arrays, bindings)
    for out in outputs:
        got = cupy.asnumpy(device[out]).reshape(func.buffer(out).shape)
        assert not np.isnan(got).any(), f"{name}: {out} has unwritten elements on the GPU"
        assert _relative_l2(got, emulated[out]) < 1e-5, f"{name}: GPU and emulator disagree"
        assert _relative_l2(got, expected[out]) < 1e-4, f"{name}: GPU and numpy disagree"


# ----------------------------------------------------------------------------- vendors


def _w(op, inputs, outputs, attrs=(), epilogue=(), consts=(1,)):
    return Workload(op, tuple(None if s is None else TensorSpec(tuple(s)) for s in inputs),
                    tuple(TensorSpec(tuple(s)) for s in outputs), tuple(sorted(attrs)),
                    tuple(epilogue), const_inputs=tuple(consts))


VENDOR_WORKLOADS = {
    "conv3x3_bias_relu": _w("Conv", [(1, 16, 14, 14), (32, 16, 3, 3), (32,)], [(1, 32, 14, 14)],
                            [("pads", (1, 1, 1, 1))], [EpilogueStep("relu")], (1, 2)),
    "conv_s2_residual": _w("Conv", [(2, 8, 15, 15), (16, 8, 3, 3), (16,), (2, 16, 8, 8)],
                           [(2, 16, 8, 8)], [("pads", (1, 1, 1, 1)), ("strides", (2, 2))],
                           [EpilogueStep("add", operand=3), EpilogueStep("relu")], (1, 2)),
    "conv1x1_sigmoid": _w("Conv", [(1, 24, 7, 7), (12, 24, 1, 1)], [(1, 12, 7, 7)], (),
                          [EpilogueStep("sigmoid")]),
    "conv_grouped": _w("Conv", [(1, 8, 9, 9), (8, 2, 3, 3)], [(1, 8, 7, 7)], [("group", 4)]),
    "gemm_transb_c": _w("Gemm", [(5, 32), (24, 32), (24,)], [(5, 24)],
                        [("transB", 1), ("alpha", 0.5), ("beta", 2.0)], (), (1, 2)),
    "gemm_transa": _w("Gemm", [(32, 5), (32, 24)], [(5, 24)], [("transA", 1)],
                      [EpilogueStep("tanh")]),
    "matmul_batched": _w("MatMul", [(3, 4, 6, 10), (10, 7)], [(3, 4, 6, 7)]),
    "matmul_both": _w("MatMul", [(2, 6, 10), (2, 10, 7)], [(2, 6, 7)], consts=()),
}


@pytest.mark.parametrize("key", sorted(VENDOR_WORKLOADS))
def test_vendor_candidates_match_the_reference(cupy, key):
    workload = VENDOR_WORKLOADS[key]
    found = [c for c in registry.candidates(workload, "cuda") if c.implementation.kind == "vendor"]
    libraries = {c.implementation.name for c in found}
    if workload.op == "Conv":
        assert "cudnn" in libraries, registry.get("cudnn").unsupported_reason(workload)
    else:
        assert "cublas" in libraries
    rng = np.random.default_rng(0)
    per_impl: dict[str, int] = {}
    for candidate in found:
        count = per_impl.setdefault(candidate.implementation.name, 0)
        if count >= 4:   # the first plans of each library (the heuristics' order)
            continue
        per_impl[candidate.implementation.name] += 1
        m = measure_cuda.measure_candidate(workload, candidate, rng=rng, repeats=3,
                                           max_repeats=3, min_time=0.0)
        if candidate.implementation.name == "cudnn" and m.status.value == "wrong_answer" \
                and m.rel_l2_error < 3e-3:
            continue  # a TF32 engine: cuDNN's float32 tensor-core math, rightly rejected
        assert m.ok, f"{candidate.label}: {m.status.value} {m.message}"
        assert m.median_s > 0 and m.extra["timer"] == "cuda_events"


def test_cudnn_offers_several_plans_and_fuses_the_epilogue():
    workload = VENDOR_WORKLOADS["conv3x3_bias_relu"]
    configs = registry.get("cudnn").configs(workload)
    assert len(configs) >= 2, configs
    assert {c["fuse"] for c in configs} <= {0, 1}
    assert all(isinstance(c["plan"], str) and c["plan"] for c in configs)


def test_generated_candidate_is_verified_against_the_vendor(present_gpu):
    from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs

    workload = VENDOR_WORKLOADS["conv3x3_bias_relu"]
    try:
        configs = preferred_configs(workload, present_gpu, 2)
        DSL_CUDA.artifacts(workload, configs[0])
    except Exception as exc:  # ToolchainError: no nvcc / NVRTC+ptxas on this machine
        pytest.skip(f"no CUDA compiler for generated kernels here: {exc}")
    for config in configs:
        m = measure_cuda.measure_candidate(workload, Candidate(DSL_CUDA, config),
                                           rng=np.random.default_rng(1), repeats=3)
        assert m.ok, f"{config}: {m.status.value} {m.message}"
        assert m.extra.get("vendor_rel_l2", 0.0) < 1e-4


def test_parallel_measurement_picks_a_verified_winner():
    workload = VENDOR_WORKLOADS["conv_s2_residual"]
    found = [c for c in registry.candidates(workload, "cuda")][:6]
    result = measure_cuda.measure_parallel(workload, found, rng=np.random.default_rng(2),
                                           streams=3, top=2, runs=10, repeats=3)
    assert result.winner is not None and result.remeasured[result.winner].ok
    assert result.wall_s > 0 and result.estimated_sequential_s > 0


# Operators written for the workload (wpk.kernels.generated_ops), not in the DSL library:
# the corpus's reductions, slices, upsamples and transposed convs, host steps before.
WRITTEN_FOR_THE_WORKLOAD = {
    "reduce_mean": Workload("ReduceMean", (TensorSpec((1, 64, 7, 7)),),
                            (TensorSpec((1, 64, 1, 1)),), (("axes", (2, 3)),)),
    "slice_steps": Workload(
        "Slice", (TensorSpec((1, 8, 6, 5)),) + (TensorSpec((2,), "int64"),) * 4,
        (TensorSpec((1, 4, 3, 5)),), const_inputs=(1, 2, 3, 4), opset=13, static_inputs=(
            (1, np.array([1, 5])), (2, np.array([8, -100])), (3, np.array([1, 2])),
            (4, np.array([2, -2])))),
    "resize_nearest": Workload(
        "Resize", (TensorSpec((1, 32, 10, 10)), None, TensorSpec((4,))),
        (TensorSpec((1, 32, 20, 20)),), (("mode", b"nearest"),), const_inputs=(2,),
        static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=13),
    "conv_transpose": Workload(
        "ConvTranspose", (TensorSpec((1, 32, 20, 20)), TensorSpec((32, 16, 2, 2)),
                          TensorSpec((16,))), (TensorSpec((1, 16, 40, 40)),),
        (("strides", (2, 2)),), const_inputs=(1, 2)),
    # a diffusion UNet's normalizations (the DSL's groupnorm): host steps before 2026-12-04
    "group_norm_silu": Workload(
        "GroupNorm", (TensorSpec((1, 64, 12, 10)), TensorSpec((64,)), TensorSpec((64,))),
        (TensorSpec((1, 64, 12, 10)),), (("epsilon", 1e-5), ("groups", 32)),
        (EpilogueStep("silu"),), domain="wpk", const_inputs=(1, 2)),
    "instance_norm": Workload(
        "InstanceNormalization", (TensorSpec((1, 32, 128)), TensorSpec((32,)),
                                  TensorSpec((32,))), (TensorSpec((1, 32, 128)),),
        (("epsilon", 1e-5),), const_inputs=(1, 2)),
}


@pytest.mark.parametrize("name", sorted(WRITTEN_FOR_THE_WORKLOAD))
def test_operators_written_for_the_workload_match_the_reference(present_gpu, name):
    from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs

    workload = WRITTEN_FOR_THE_WORKLOAD[name]
    for config in preferred_configs(workload, present_gpu, 2):
        m = measure_cuda.measure_candidate(workload, Candidate(DSL_CUDA, config),
                                           rng=np.random.default_rng(2), repeats=3)
        assert m.ok, f"{name} {config}: {m.status.value} {m.message}"


ROW_REDUCTIONS = {
    # AlexNet's classifier Softmax: 122 us on an H200 reduced by one thread (2026-11-27)
    "softmax_1x1000": Workload("Softmax", (TensorSpec((1, 1000)),), (TensorSpec((1, 1000)),),
                               (("axis", 1),), opset=13),
    "softmax_prime_row": Workload("Softmax", (TensorSpec((3, 997)),),
                                  (TensorSpec((3, 997)),), (("axis", 1),), opset=13),
    "layernorm_128x768": Workload(
        "LayerNormalization", (TensorSpec((1, 128, 768)), TensorSpec((768,)),
                               TensorSpec((768,))), (TensorSpec((1, 128, 768)),),
        (("axis", -1), ("epsilon", 1e-5)), const_inputs=(1, 2)),
}


@pytest.mark.parametrize("name", sorted(ROW_REDUCTIONS))
def test_rows_reduced_in_parts_match_the_reference(present_gpu, name):
    """Every preferred config (`reduce_parts` split and not) on the device against the
    float64 reference."""
    from wpk.kernels.cuda.generated import DSL_CUDA, preferred_configs

    workload = ROW_REDUCTIONS[name]
    configs = preferred_configs(workload, present_gpu, 3)
    assert {c["reduce_parts"] > 1 for c in configs} == {True, False}, configs
    for config in configs:
        m = measure_cuda.measure_candidate(workload, Candidate(DSL_CUDA, config),
                                           rng=np.random.default_rng(4), repeats=3)
        assert m.ok, f"{name} {config}: {m.status.value} {m.message}"


def test_device_copy_splits_and_gathers_inside_a_cuda_graph(cupy):
    """Split and a static Gather as `cuda.copy` steps: views and take(out=), nothing
    allocated after the first run, so a CUDA graph captures them."""
    from wpk.kernels.cuda.predicted import DEVICE_COPY

    x_host = np.random.default_rng(3).standard_normal((1, 6, 4, 5)).astype(np.float32)
    index = np.array([3, -1, 0])
    split = Workload("Split", (TensorSpec((1, 6, 4, 5)),),
                     (TensorSpec((1, 2, 4, 5)), TensorSpec((1, 4, 4, 5))), (("axis", 1),))
    gather = Workload("Gather", (TensorSpec((1, 6, 4, 5)), TensorSpec((3,), "int64")),
                      (TensorSpec((1, 3, 4, 5)),), (("axis", 1),), const_inputs=(1,),
                      static_inputs=((1, index),))
    x = cupy.asarray(x_host)
    outs = [cupy.full(o.shape, np.nan, np.float32) for o in (*split.outputs, *gather.outputs)]
    split_kernel = DEVICE_COPY.prepare(split, {}, {})
    gather_kernel = DEVICE_COPY.prepare(gather, {1: index}, {})
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        split_kernel([x], outs[:2])          # first run: uploads Gather's indices
        gather_kernel([x, None], outs[2:])
        for out in outs:
            out.fill(np.nan)
        stream.begin_capture()
        split_kernel([x], outs[:2])
        gather_kernel([x, None], outs[2:])
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    expected = [x_host[:, :2], x_host[:, 2:], np.take(x_host, index, axis=1)]
    for out, want in zip(outs, expected):
        np.testing.assert_array_equal(cupy.asnumpy(out), want)


# ----------------------------------------------------------------------------- sessions


def _small_model(path):
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w2")
    fc = numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3, 16, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 10])], [w1, b1, w2, fc])
    # IR 8, not onnx's newest: the GPU image's onnxruntime (1.30) reads IR <= 13, and
    # onnx 1.23 writes 14 by default
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def small_session(tmp_path_factory, present_gpu):
    import wpk
    from wpk.commands.tune import tune_plan
    from wpk.runtime_cuda import CudaSession

    folder = tmp_path_factory.mktemp("small")
    model = _small_model(str(folder / "small.onnx"))
    plan = wpk.build(model, target="cuda", gpu=present_gpu.name, offline=True, progress=False,
                     partition=False)
    path = folder / "small.wpk"
    plan.save(path)
    tune_plan(path, trials=2, budget=30)
    session = wpk.load(path)
    assert isinstance(session, CudaSession)
    return model, session


def test_cuda_graph_session_matches_onnxruntime(small_session):
    import onnxruntime as ort

    model, session = small_session
    x = np.random.default_rng(4).standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = session.run({"x": x})["y"]
    assert _relative_l2(got, expected) < 1e-4
    assert session._graphs and not session.capture_errors, session.capture_errors
    # a second input gives a second answer: the graph reads the arena, not a frozen copy
    x2 = x[::-1].copy()
    expected2 = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"x": x2})[0]
    assert _relative_l2(session.run({"x": x2})["y"], expected2) < 1e-4


SPIN = r"""extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}"""


def test_steady_state_allocates_nothing_and_does_not_synchronise(cupy, small_session):
    import time

    _, session = small_session
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    session.run({"x": x})
    pool, pinned = cupy.get_default_memory_pool(), cupy.get_default_pinned_memory_pool()
    before = (pool.used_bytes(), pool.total_bytes(), pinned.n_free_blocks())
    for _ in range(5):
        session.run({"x": x})
    assert (pool.used_bytes(), pool.total_bytes(), pinned.n_free_blocks()) == before
    host_steps = [s.node for s in session.plan.steps if s.kind == "fallback"]
    if host_steps:
        pytest.skip(f"steps {host_steps} run on the host (they synchronise by design)")
    # Keep the stream busy for ~0.2 s, then enqueue a whole run: with no host
    # synchronisation inside, enqueueing returns long before the stream is done.
    spin = cupy.RawKernel(SPIN, "spin")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    spin((1,), (1,), (np.int64(10_000_000),))
    end.record()
    end.synchronize()
    cycles_per_s = 10_000_000 / (cupy.cuda.get_elapsed_time(start, end) / 1e3)
    with session.stream:
        spin((1,), (1,), (np.int64(0.2 * cycles_per_s),))
    started = time.perf_counter()
    session._enqueue({"x": x})
    enqueue_s = time.perf_counter() - started
    busy = not session.stream.done
    session.stream.synchronize()
    assert busy and enqueue_s < 0.1, f"enqueueing a run waited for the GPU ({enqueue_s:.3f} s)"
