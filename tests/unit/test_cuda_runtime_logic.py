"""The GPU runtime's logic that needs no GPU: cuBLAS argument translation, cuDNN fusion and
plan bookkeeping, epilogue kernel source, graph-capture segments, arena layout, binary choice,
L2 flush sizing, parallel-measurement bookkeeping, and clear errors without cupy/GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wpk.core.devices import GPU_PRESETS
from wpk.core.errors import DeviceError, PlanError, UnsupportedError
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.cuda.epilogue_cuda import epilogue_source
from wpk.kernels.cuda.vendor_cublas import conv_geometry, gemm_call, gemm_problem
from wpk.kernels.cuda.vendor_cudnn import (
    find_plan,
    fusable_prefix,
    fusion_levels,
    operand_4d,
    plan_configs,
    plan_order,
)
from wpk.kernels.epilogue import apply_epilogue
from wpk.plans.buffers import BufferPlan
from wpk.runtime_cuda import binary_choice, buffer_layout, generated_artifacts, segment_steps
from wpk.search.measure import Measurement, Status
from wpk.search.measure_cuda import (
    ParallelResult,
    estimated_sequential_s,
    l2_flush_bytes,
    needs_more_runs,
    shared_inputs,
    summarize,
    top_candidates,
)

from .cuda_c_eval import run_c_body
from .plan_helpers import tiny_plan

GPU_PRESENT = False
try:  # the no-GPU tests below only mean something where cupy cannot run
    from wpk.kernels.cuda.cupy_support import gpu_available

    GPU_PRESENT = gpu_available()
except Exception:  # pragma: no cover
    pass
no_gpu_only = pytest.mark.skipif(GPU_PRESENT, reason="checks the behaviour without a GPU")


# ----------------------------------------------------------------------------- cuBLAS


def _col_major(flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix with leading dimension ld stored in `flat`."""
    return np.lib.stride_tricks.as_strided(flat, (rows, cols),
                                           (flat.itemsize, flat.itemsize * ld))


def _emulate(call, first: np.ndarray, second: np.ndarray, out: np.ndarray, alpha, beta):
    """Column-major cuBLAS sgemm(StridedBatched) on flat buffers, as the library defines it."""
    f, s, c = first.reshape(-1), second.reshape(-1), out.reshape(-1)
    for b in range(call.batch):
        fa, sa, ca = (f[b * call.stride_first:], s[b * call.stride_second:],
                      c[b * call.stride_c:])
        op_f = _col_major(fa, call.k, call.m, call.ld_first).T if call.trans_first \
            else _col_major(fa, call.m, call.k, call.ld_first)
        op_s = _col_major(sa, call.n, call.k, call.ld_second).T if call.trans_second \
            else _col_major(sa, call.k, call.n, call.ld_second)
        target = _col_major(ca, call.m, call.n, call.ldc)
        target[...] = alpha * (op_f @ op_s) + beta * target


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_call_computes_the_row_major_product(rng, trans_a, trans_b):
    m, n, k = 5, 7, 3
    a = rng.standard_normal((k, m) if trans_a else (m, k))
    b = rng.standard_normal((n, k) if trans_b else (k, n))
    c = rng.standard_normal((m, n))
    out = c.copy()
    call = gemm_call(m, n, k, trans_a, trans_b)
    _emulate(call, b, a, out, 0.5, 2.0)
    expected = 0.5 * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + 2.0 * c
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("own_a,own_b", [(True, True), (False, True), (True, False)])
def test_batched_gemm_call_broadcasts_a_whole_operand(rng, own_a, own_b):
    batch, m, n, k = 3, 4, 6, 5
    a = rng.standard_normal((batch, m, k) if own_a else (m, k))
    b = rng.standard_normal((batch, k, n) if own_b else (k, n))
    out = np.zeros((batch, m, n))
    call = gemm_call(m, n, k, False, False, batch, own_a, own_b)
    _emulate(call, b, a, out, 1.0, 0.0)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-12)


def _workload(op, inputs, outputs, attrs=(), epilogue=()):
    return Workload(op, tuple(None if s is None else TensorSpec(tuple(s)) for s in inputs),
                    tuple(TensorSpec(tuple(s)) for s in outputs), tuple(sorted(attrs)),
                    tuple(epilogue))


def test_gemm_problem_reads_onnx_gemm_and_matmul():
    gemm = _workload("Gemm", [(4, 3), (5, 4), (5,)], [(3, 5)],
                     [("transA", 1), ("transB", 1), ("alpha", 2.0), ("beta", 0.5)])
    p = gemm_problem(gemm)
    assert (p.m, p.n, p.k, p.trans_a, p.trans_b, p.alpha, p.beta, p.has_c) == \
        (3, 5, 4, True, True, 2.0, 0.5, True)
    no_c = gemm_problem(_workload("Gemm", [(3, 4), (4, 5)], [(3, 5)]))
    assert no_c.beta == 0.0 and not no_c.has_c
    batched = gemm_problem(_workload("MatMul", [(2, 3, 4, 5), (5, 6)], [(2, 3, 4, 6)]))
    assert (batched.batch, batched.batch_a, batched.batch_b) == (6, True, False)
    partial = gemm_problem(_workload("MatMul", [(2, 3, 4, 5), (3, 5, 6)], [(2, 3, 4, 6)]))
    assert "broadcast" in partial
    assert "vector" in gemm_problem(_workload("MatMul", [(5,), (5, 6)], [(6,)]))


def test_conv_geometry_reads_pads_strides_groups():
    conv = _workload("Conv", [(1, 8, 9, 9), (16, 4, 3, 3)], [(1, 16, 5, 5)],
                     [("pads", (1, 1, 1, 1)), ("strides", (2, 2)), ("group", 2)])
    g = conv_geometry(conv)
    assert (g.n, g.c, g.k, g.r, g.oh, g.strides, g.pads, g.groups) == \
        (1, 8, 16, 3, 5, (2, 2), (1, 1, 1, 1), 2)
    assert "2-D" in conv_geometry(_workload("Conv", [(1, 2, 9), (4, 2, 3)], [(1, 4, 7)]))


# ----------------------------------------------------------------------------- epilogue


@pytest.mark.parametrize("steps", [
    [EpilogueStep("relu")],
    [EpilogueStep("clip", (("max", 6.0), ("min", 0.0)))],
    [EpilogueStep("leaky_relu", (("alpha", 0.1),)), EpilogueStep("sigmoid")],
    [EpilogueStep("silu"), EpilogueStep("tanh"), EpilogueStep("abs"), EpilogueStep("sqrt")],
    [EpilogueStep("hard_sigmoid", (("alpha", 0.3), ("beta", 0.4))), EpilogueStep("hard_swish")],
    [EpilogueStep("gelu"), EpilogueStep("gelu_tanh"), EpilogueStep("erf"), EpilogueStep("neg")],
    [EpilogueStep("softplus"), EpilogueStep("log"), EpilogueStep("exp"),
     EpilogueStep("reciprocal")],
    [EpilogueStep("add", operand=2), EpilogueStep("relu"), EpilogueStep("sub", operand=3,
                                                                         swap=True),
     EpilogueStep("mul", operand=2), EpilogueStep("max", operand=3),
     EpilogueStep("div", operand=3), EpilogueStep("min", operand=2)],
])
def test_epilogue_source_matches_the_numpy_epilogue(rng, steps):
    y = rng.standard_normal((2, 3, 4)).astype(np.float32)
    inputs = [None, None, rng.standard_normal((2, 3, 4)).astype(np.float32),
              (rng.random((3, 1)) + 0.5).astype(np.float32)]
    source = epilogue_source(steps)
    got = run_c_body(source.body, y, [inputs[i] for i in source.operands])
    expected = apply_epilogue(y.copy(), steps, inputs)
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=2e-5, atol=1e-6)
    assert source.in_params.count("float32") == len(source.operands)


def test_epilogue_source_rejects_unknown_ops_and_dtypes():
    with pytest.raises(UnsupportedError, match="unknown epilogue op"):
        epilogue_source([EpilogueStep("frobnicate")])
    with pytest.raises(UnsupportedError, match="float32"):
        epilogue_source([EpilogueStep("relu")], "float16")


# ----------------------------------------------------------------------------- cuDNN


def _conv(epilogue, extra_inputs=()):
    inputs = [(1, 4, 8, 8), (8, 4, 3, 3), (8,), *extra_inputs]
    return _workload("Conv", inputs, [(1, 8, 8, 8)], [("pads", (1, 1, 1, 1))], epilogue)


def test_cudnn_fuses_the_longest_expressible_prefix():
    steps = [EpilogueStep("add", operand=3), EpilogueStep("relu"),
             EpilogueStep("hard_swish"), EpilogueStep("sigmoid")]
    workload = _conv(steps, [(1, 8, 8, 8)])
    ops = fusable_prefix(workload)
    assert [o.method for o in ops] == ["add", "relu"] and ops[0].operand == 3
    assert fusion_levels(workload) == [2, 0]
    assert fusion_levels(_conv([])) == [0]
    clipped = fusable_prefix(_conv([EpilogueStep("clip", (("max", 6.0), ("min", 0.0))),
                                    EpilogueStep("silu")]))
    assert clipped[0].method == "relu" and dict(clipped[0].kwargs) == \
        {"lower_clip": 0.0, "upper_clip": 6.0}
    assert clipped[1].method == "swish"
    # an operand that is neither full-size nor per-channel stops the fusion
    assert fusable_prefix(_conv([EpilogueStep("add", operand=3)], [(1, 1, 8, 1)])) == []


def test_operand_layouts():
    assert operand_4d((1, 8, 8, 8), (1, 8, 8, 8)) == ([1, 8, 8, 8], [512, 64, 8, 1])
    assert operand_4d((8, 1, 1), (1, 8, 8, 8)) == ([1, 8, 1, 1], [8, 1, 1, 1])
    assert operand_4d((8, 8), (1, 8, 8, 8)) is None


def test_plan_selection_prefers_the_name_then_the_index():
    names = ["eng0", None, "eng7_k3", "eng9"]
    assert find_plan(names, "eng9", 0) == 3
    assert find_plan(names, "gone", 2) == 2
    assert find_plan(names, "gone", 1) is None          # that index did not build
    assert find_plan(names, None, 7) is None
    assert find_plan(names, None, None) == 0 and find_plan([None, "x"], None, None) == 1
    configs = plan_configs({0: ["a", None, "b"], 2: [None, "c"]}, limit=1)
    assert configs == [{"fuse": 2, "plan": "c", "index": 1}, {"fuse": 0, "plan": "a", "index": 0}]


def test_a_config_naming_no_plan_tries_every_plan_in_the_heuristics_order():
    # the first plan may be barred (a TF32 engine) and not build: the next one runs
    names = ["tf32", None, "fp32a", "fp32b"]
    assert plan_order(names, {}) == [0, 2, 3]
    assert plan_order(names, {"plan": "fp32b", "index": 0}) == [3]
    assert plan_order(names, {"plan": "gone", "index": 1}) == []


# ----------------------------------------------------------------------------- runtime


def test_binary_choice():
    assert binary_choice("sm_90", (9, 0), False) == "cubin"
    assert binary_choice("sm_80", (8, 6), False) == "cubin"
    assert binary_choice("sm_80", (9, 0), True) == "ptx"
    with pytest.raises(DeviceError, match="no PTX"):
        binary_choice("sm_80", (9, 0), False)
    with pytest.raises(DeviceError, match="sm_70"):
        binary_choice("sm_90", (7, 0), True)
    assert generated_artifacts({"kernel.ptx": b".version 8.0\n"}, "ptx").endswith(b"\n\0")


def test_segments_keep_host_steps_out_of_graphs():
    assert segment_steps([True, True, False, True, False, False, True]) == [
        (True, [0, 1]), (False, [2]), (True, [3]), (False, [4]), (False, [5]), (True, [6])]
    assert segment_steps([]) == []
    assert segment_steps([True] * 3) == [(True, [0, 1, 2])]


def test_buffer_layout_follows_the_buffer_plan():
    plan = BufferPlan(sizes=(64, 256), offsets=(0, 256), assignment={"x": 0, "y": 1, "z": 0},
                      no_reuse_bytes=0, alignment=256)
    specs = {"x": TensorSpec((4, 4)), "y": TensorSpec((2, 8), "float64"), "z": TensorSpec((3,))}
    layout = buffer_layout(plan, specs)
    assert layout == {"x": (0, 64, (4, 4), "float32"), "y": (256, 128, (2, 8), "float64"),
                      "z": (0, 12, (3,), "float32")}
    with pytest.raises(PlanError, match="too small"):
        buffer_layout(plan, {**specs, "x": TensorSpec((5, 4))})


# ----------------------------------------------------------------------------- measurement


def test_l2_flush_is_twice_the_l2_of_the_preset():
    assert l2_flush_bytes(GPU_PRESETS["h100"].l2_bytes) == 100 * 1024 * 1024
    assert l2_flush_bytes(GPU_PRESETS["t4"].l2_bytes) == 8 * 1024 * 1024
    assert l2_flush_bytes(None) == l2_flush_bytes(0) == 100 * 1024 * 1024
    assert l2_flush_bytes(3) % 4 == 0 and l2_flush_bytes(3) >= 6


def test_run_count_and_statistics():
    assert needs_more_runs([], 3, 10, 0.0)
    assert not needs_more_runs([1e-3] * 3, 3, 10, 0.0)
    assert needs_more_runs([1e-3] * 3, 3, 10, 0.01)
    assert not needs_more_runs([1e-3] * 10, 3, 10, 1.0)
    median, (q25, q75) = summarize([4.0, 1.0, 3.0, 2.0, 100.0])
    assert median == 3.0 and q25 == 2.0 and q75 == 4.0


def test_candidates_of_a_workload_share_inputs_and_reference():
    calls = []

    def inputs_fn(workload, rng):
        return [rng.standard_normal(s.shape).astype(np.float32) for s in workload.inputs]

    def reference_fn(workload, inputs):
        calls.append(workload.key)
        return [inputs[0].astype(np.float64) @ inputs[1]]

    a = _workload("MatMul", [(2, 3), (3, 4)], [(2, 4)])
    b = _workload("MatMul", [(2, 5), (5, 4)], [(2, 4)])
    c = _workload("MatMul", [(1, 5), (5, 4)], [(1, 4)])
    first = shared_inputs(a, np.random.default_rng(1), inputs_fn, reference_fn)
    again = shared_inputs(a, np.random.default_rng(2), inputs_fn, reference_fn)
    assert again[0] is first[0] and calls == [a.key]
    np.testing.assert_allclose(first[1][0], first[0][0].astype(np.float64) @ first[0][1])
    shared_inputs(b, np.random.default_rng(3), inputs_fn, reference_fn)
    shared_inputs(c, np.random.default_rng(4), inputs_fn, reference_fn)   # evicts a
    shared_inputs(a, np.random.default_rng(5), inputs_fn, reference_fn)
    assert calls == [a.key, b.key, c.key, a.key]


def _m(median, status=Status.OK):
    return Measurement("c", "i", {}, status, (median,), median)


def test_parallel_bookkeeping():
    ms = [_m(3e-3), _m(1e-3), _m(float("nan"), Status.WRONG_ANSWER), _m(2e-3), _m(5e-4,
                                                                                 Status.TIMEOUT)]
    assert top_candidates(ms, 2) == [1, 3]
    assert top_candidates(ms, 0) == []
    assert estimated_sequential_s([1e-3, 2e-3], flush_s=1e-4, warmup=0, repeats=10,
                                  max_repeats=10, min_time=0.0) == pytest.approx(0.032)
    result = ParallelResult(ms, {}, 1, wall_s=0.05, estimated_sequential_s=0.2)
    assert result.saved_s == pytest.approx(0.15)
    assert ParallelResult(ms, {}, 1, 0.3, 0.2).saved_s == 0.0


# ----------------------------------------------------------------------------- without a GPU


@no_gpu_only
def test_vendor_candidates_say_why_they_are_absent():
    from wpk.kernels import registry

    conv = _conv([])
    for name in ("cudnn", "cublas.im2col"):
        reason = registry.get(name).unsupported_reason(conv)
        assert reason and ("cupy" in reason or "CUDA device" in reason)
    assert all(c.implementation.target == "cuda" for c in registry.candidates(conv, "cuda"))
    assert not [c for c in registry.candidates(conv, "cuda") if c.implementation.kind == "vendor"]


@no_gpu_only
def test_gpu_entry_points_raise_device_error(rng):
    from wpk.kernels import registry
    from wpk.kernels.registry import Candidate
    from wpk.search import measure_cuda

    gemm = _workload("Gemm", [(3, 4), (4, 5)], [(3, 5)])
    with pytest.raises(DeviceError, match="needs cupy and an NVIDIA GPU") as info:
        registry.get("cublas").prepare(gemm, {}, {})
    assert "pip install" in info.value.hint
    with pytest.raises(DeviceError, match="GPU measurement"):
        measure_cuda.measure_candidate(gemm, Candidate(registry.get("cublas"), {}), rng=rng)


@no_gpu_only
def test_cuda_plan_load_is_a_device_error(rng, tmp_path):
    from wpk.plans.planfile import write_plan
    from wpk.runtime import Session

    _, plan = tiny_plan(rng)
    plan.manifest["target"] = "cuda"
    path = tmp_path / "tiny_cuda.wpk"
    write_plan(plan, path)
    with pytest.raises(DeviceError, match="target cuda"):
        Session.load(path)


@no_gpu_only
def test_measurement_in_a_worker_reports_the_missing_gpu():
    from wpk.kernels import registry
    from wpk.kernels.registry import Candidate
    from wpk.search.runner import IsolatedRunner
    from wpk.search.workers import MeasureOptions

    gemm = _workload("Gemm", [(3, 4), (4, 5)], [(3, 5)])
    with IsolatedRunner("cuda-events", MeasureOptions(timeout_s=60)) as runner:
        (m,) = runner.run(gemm, [Candidate(registry.get("cublas"), {})])
    assert m.status is Status.RUNTIME_ERROR
    assert "GPU" in m.message and m.impl == "cublas"


@no_gpu_only
def test_gpu_test_folder_is_skipped_not_failed():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(root / "tests" / "gpu")], capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped" in done.stdout and "failed" not in done.stdout
    assert "no NVIDIA GPU" in done.stdout


def test_wpk_binds_the_cublas_that_cupy_loaded_not_cublaslt():
    from wpk.kernels.cuda.cublas_library import check, loaded_cublas_path

    maps = ["7f00-7f10 r-xp 00000000 08:01 12 /site/nvidia/cublas/lib/libcublasLt.so.13",
            "7f20-7f30 r-xp 00000000 08:01 13 /site/nvidia/cublas/lib/libcublas.so.13",
            "7f40-7f50 rw-p 00000000 00:00 0", ""]
    assert loaded_cublas_path(maps) == "/site/nvidia/cublas/lib/libcublas.so.13"
    assert loaded_cublas_path(maps[:1] + maps[2:]) is None
    check(0, "cublasSgemm")
    with pytest.raises(DeviceError, match="cublasSgemm failed: CUBLAS_STATUS_INVALID_VALUE"):
        check(7, "cublasSgemm")
