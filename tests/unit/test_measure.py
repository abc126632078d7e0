"""Measurement: verification catches wrong, partial and failing kernels; timing is sane."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.registry import Candidate, Implementation
from wpk.search.measure import Measurement, Status, compare, measure_candidate, time_kernel

MATMUL = Workload("MatMul", (TensorSpec((6, 8)), TensorSpec((8, 5))), (TensorSpec((6, 5)),),
                  const_inputs=(1,))


def random_inputs(workload, rng):
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in workload.inputs]


def reference(workload, inputs):
    return [np.matmul(inputs[0].astype(np.float64), inputs[1].astype(np.float64))]


class NumpyMatMul(Implementation):
    name = "test.matmul"

    def unsupported_reason(self, workload):
        return None if workload.op == "MatMul" else "not a MatMul"

    def prepare(self, workload, consts, config):
        weight = np.ascontiguousarray(consts[1])

        def kernel(inputs, outputs):
            np.matmul(inputs[0], weight, out=outputs[0])
        return kernel


class OffByALittle(NumpyMatMul):
    name = "test.matmul_wrong"

    def prepare(self, workload, consts, config):
        weight = consts[1] * np.float32(1.01)

        def kernel(inputs, outputs):
            np.matmul(inputs[0], weight, out=outputs[0])
        return kernel


class WritesHalf(NumpyMatMul):
    name = "test.matmul_half"

    def prepare(self, workload, consts, config):
        weight = consts[1]

        def kernel(inputs, outputs):
            outputs[0][:3] = inputs[0][:3] @ weight
        return kernel


class RaisesInRun(NumpyMatMul):
    name = "test.matmul_raises"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):
            raise RuntimeError("illegal memory access")
        return kernel


class RaisesInPrepare(NumpyMatMul):
    name = "test.matmul_no_compile"

    def prepare(self, workload, consts, config):
        raise ValueError("syntax error in generated code")


class IgnoresItsInput(NumpyMatMul):
    """Right on the first input set only: it caches the first result."""

    name = "test.matmul_caches"

    def prepare(self, workload, consts, config):
        weight = consts[1]
        cached = []

        def kernel(inputs, outputs):
            if not cached:
                cached.append(inputs[0] @ weight)
            outputs[0][...] = cached[0]
        return kernel


class ScribblesOnItsInput(NumpyMatMul):
    """Right answer, but uses its input as scratch space (would corrupt other readers)."""

    name = "test.matmul_scribbles"

    def prepare(self, workload, consts, config):
        weight = consts[1]

        def kernel(inputs, outputs):
            np.matmul(inputs[0], weight, out=outputs[0])
            inputs[0][...] = 0.0
        return kernel


def measure(impl, rng, **kw):
    return measure_candidate(MATMUL, Candidate(impl, {}), rng=rng, warmup=1, repeats=3,
                             min_time=0.0, inputs_fn=random_inputs, reference_fn=reference, **kw)


def test_correct_kernel_is_ok_and_timed(rng):
    m = measure(NumpyMatMul(), rng)
    assert m.status is Status.OK, m.message
    assert len(m.times_s) >= 3 and all(t > 0 for t in m.times_s)
    assert m.spread_s[0] <= m.median_s <= m.spread_s[1]
    assert m.rel_l2_error < 1e-6
    assert m.workload_key == MATMUL.key and m.impl == "test.matmul"


def test_wrong_answer_is_caught(rng):
    m = measure(OffByALittle(), rng)
    assert m.status is Status.WRONG_ANSWER
    assert m.rel_l2_error == pytest.approx(0.01, rel=0.05)
    assert "exceeds" in m.message and not m.times_s


def test_partial_write_is_caught_by_the_nan_poison(rng):
    m = measure(WritesHalf(), rng)
    assert m.status is Status.WRONG_ANSWER
    assert "15 of 30 elements NaN" in m.message


def test_exceptions_become_statuses_with_messages(rng):
    run = measure(RaisesInRun(), rng)
    assert run.status is Status.RUNTIME_ERROR and "illegal memory access" in run.message
    compile_ = measure(RaisesInPrepare(), rng)
    assert compile_.status is Status.COMPILE_ERROR and "syntax error" in compile_.message


def test_second_input_set_catches_a_kernel_that_ignores_its_inputs(rng):
    m = measure(IgnoresItsInput(), rng)
    assert m.status is Status.WRONG_ANSWER and "second input set" in m.message


def test_a_kernel_that_overwrites_its_input_is_wrong(rng):
    m = measure(ScribblesOnItsInput(), rng)
    assert m.status is Status.WRONG_ANSWER and m.message == "the kernel overwrote its input 0"


def test_a_large_input_used_as_scratch_is_caught_by_its_sample(rng, monkeypatch):
    """Past OVERWRITE_CHECK_VALUES values an input is compared by a strided sample (here 8
    of the 6x8 input's 48 values): scratch use, which rewrites most of it, still shows."""
    import wpk.search.measure as measure_module

    monkeypatch.setattr(measure_module, "OVERWRITE_CHECK_VALUES", 8)
    m = measure(ScribblesOnItsInput(), rng)
    assert m.status is Status.WRONG_ANSWER and m.message == "the kernel overwrote its input 0"
    assert measure(NumpyMatMul(), rng).status is Status.OK


def test_loose_tolerance_accepts_small_errors(rng):
    assert measure(OffByALittle(), rng, tolerance=0.05).status is Status.OK


def test_timeout_status_when_a_run_is_too_slow(rng):
    assert measure(NumpyMatMul(), rng, timeout=0.0).status is Status.TIMEOUT


def test_adaptive_repeats_reach_min_time():
    calls = []

    def kernel(inputs, outputs):
        calls.append(1)
        sum(range(2000))
    times = time_kernel(kernel, [], [], warmup=2, repeats=5, max_repeats=40, min_time=10.0)
    assert len(times) == 40 and len(calls) == 42
    few = time_kernel(kernel, [], [], warmup=0, repeats=5, max_repeats=40, min_time=0.0)
    assert len(few) == 5


def test_compare_requires_matching_special_values():
    ref = np.array([1.0, np.inf, np.nan])
    assert compare([np.array([1.0, np.inf, np.nan], np.float32)], [ref]) == (0.0, "")
    error, why = compare([np.array([1.0, 2.0, np.nan], np.float32)], [ref])
    assert error == float("inf") and "inf/nan" in why


def test_compare_of_a_finite_reference_gives_the_relative_l2_error_and_finds_unwritten():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((4, 50))
    got = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(np.float32)
    error, why = compare([got], [ref])
    expected = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert why == "" and error == pytest.approx(expected, rel=1e-12)
    got[2, 7] = np.nan                                          # one element left unwritten
    error, why = compare([got], [ref])
    assert error == float("inf") and "1 of 200 elements NaN/inf" in why


def test_relative_l2_skips_matching_infinities_without_computing_inf_minus_inf():
    """A max pool's -inf over an empty window matches the reference's: the error is over
    the finite entries, and no NaN of inf - inf is computed on the way (numpy warns)."""
    from wpk.core.numerics import relative_l2

    got, ref = np.array([1.0, -np.inf, 2.0]), np.array([1.0, -np.inf, 2.5])
    with np.errstate(invalid="raise"):
        assert relative_l2(got, ref) == pytest.approx(0.5 / np.hypot(1.0, 2.5))
    assert relative_l2(np.array([1.0, np.inf, 2.0]), ref) == float("inf")


def test_compare_takes_inf_where_the_reference_is_beyond_float32s_range():
    """HF's `(1 - mask) * finfo(float32).min` on random inputs: the exact value can pass
    float32's largest, and inf with its sign is then the right float32 answer."""
    big = float(np.finfo(np.float32).max)
    ref = np.array([1.0, -1.5 * big, 2.0 * big, -0.5 * big])
    got = np.array([1.0, -np.inf, np.inf, -0.5 * big], np.float32)
    assert compare([got], [ref]) == (0.0, "")
    assert compare([np.array([1.0, -big, big, -0.5 * big], np.float32)], [ref])[0] < 1e-6
    error, why = compare([np.array([1.0, np.inf, np.inf, -0.5 * big], np.float32)], [ref])
    assert error == float("inf") and "beyond" in why        # the sign is wrong
    error, why = compare([np.array([1.0, -1.0, np.inf, -0.5 * big], np.float32)], [ref])
    assert error == float("inf") and "beyond" in why        # finite and in range
    error, why = compare([np.array([1.0, np.nan, np.inf, -0.5 * big], np.float32)], [ref])
    assert error == float("inf")                              # unwritten stays wrong
    error, why = compare([np.array([np.inf, -np.inf, np.inf, -0.5 * big], np.float32)], [ref])
    assert error == float("inf") and "NaN/inf" in why       # an in-range element overflowed


def test_measurement_json_round_trip(rng):
    m = measure(NumpyMatMul(), rng)
    again = Measurement.from_json(m.to_json())
    assert again == m
    failed = measure(RaisesInRun(), rng)
    assert Measurement.from_json(failed.to_json()).status is Status.RUNTIME_ERROR


def test_the_reference_and_the_timing_run_blas_on_one_thread(rng):
    """OpenBLAS's idle workers spin for about 0.1 s after a call; a reference computed on
    every core left one on the core a measured kernel's second thread needed."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [pool["num_threads"] for pool in threadpool_info()
                if pool["user_api"] == "blas"]

    if not blas_threads():
        pytest.skip("numpy has no BLAS library threadpoolctl can see")
    seen = {"reference": [], "kernel": []}

    def watched_reference(workload, inputs):
        seen["reference"] += blas_threads()
        return reference(workload, inputs)

    class Watched(NumpyMatMul):
        def prepare(self, workload, consts, config):
            inner = super().prepare(workload, consts, config)

            def kernel(inputs, outputs):
                seen["kernel"] += blas_threads()
                inner(inputs, outputs)
            return kernel

    m = measure_candidate(MATMUL, Candidate(Watched(), {}), rng=rng, warmup=1, repeats=3,
                          min_time=0.0, inputs_fn=random_inputs, reference_fn=watched_reference)
    assert m.status is Status.OK, m.message
    assert seen["reference"] and set(seen["reference"]) == {1}
    assert seen["kernel"] and set(seen["kernel"]) == {1}


def test_candidates_of_a_workload_share_input_sets_and_their_reference(monkeypatch):
    """A runner measures every candidate of a workload with the workload's seed: the
    inputs are drawn and the float64 reference computed once per input set, not once per
    candidate; each candidate still gets its own copy, so one that scribbles on its input
    is caught and does not spoil the next one's."""
    import wpk.kernels.reference as reference_module
    from wpk.search import input_sets
    from wpk.search.runner import LocalRunner

    calls = []
    real = reference_module.reference

    def counting(workload, inputs):
        calls.append(inputs[0].copy())
        return real(workload, inputs)

    monkeypatch.setattr(input_sets, "reference", counting)
    input_sets.clear()
    runner = LocalRunner(seed=5)
    impls = [NumpyMatMul(), ScribblesOnItsInput(), NumpyMatMul(), OffByALittle()]
    results = [runner.measure(MATMUL, Candidate(impl, {})) for impl in impls]
    assert [m.status for m in results] == [Status.OK, Status.WRONG_ANSWER, Status.OK,
                                           Status.WRONG_ANSWER]
    assert len(calls) == 2                   # the first and the second input set, once each
    assert not np.array_equal(calls[0], calls[1])
    assert runner.seed_of(MATMUL, Candidate(NumpyMatMul(), {})) == \
        runner.seed_of(MATMUL, Candidate(OffByALittle(), {"x": 1}))
    # another seed draws new inputs
    LocalRunner(seed=6).measure(MATMUL, Candidate(NumpyMatMul(), {}))
    assert len(calls) == 4


def test_a_shared_input_set_leaves_the_generator_where_a_draw_would(rng):
    from wpk.search import input_sets

    input_sets.clear()
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    first = input_sets.draw(MATMUL, a)
    again = input_sets.draw(MATMUL, b)        # from the cache
    assert a.bit_generator.state == b.bit_generator.state
    assert all(np.array_equal(x, y) for x, y in zip(first.inputs, again.inputs))
    assert first.inputs[0] is not again.inputs[0]
    second = input_sets.draw(MATMUL, a, first, kept=(1,))
    assert np.array_equal(second.inputs[1], first.inputs[1])
    assert not np.array_equal(second.inputs[0], first.inputs[0])


def test_a_build_lets_go_of_the_shared_input_sets(monkeypatch):
    from onnx import TensorProto, helper

    import wpk
    from wpk.search import input_sets

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    cached = []
    real = input_sets.draw

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        cached.append(len(input_sets._CACHE))
        return found

    monkeypatch.setattr(input_sets, "draw", spy)
    wpk.build(model, warmup=0, repeats=1, min_time=0.0, progress=False, partition=False)
    assert cached and max(cached) > 0      # the build's candidates shared input sets
    assert not input_sets._CACHE           # and the build let go of them


def test_a_step_the_plan_runs_on_its_inputs_buffer_is_timed_there(rng):
    """A Reshape (numpy.copy views its input) is verified on an output of its own, then
    timed writing onto its input's buffer, as a CPU plan's shared buffer runs it: the
    timed runs see one buffer; a Transpose keeps its own output."""
    from wpk.kernels.cpu.numpy_ops import NumpyCopy
    from wpk.search.measure import outputs_as_planned

    copy = NumpyCopy()
    reshape = Workload("Reshape", (TensorSpec((4, 6)), TensorSpec((2,), "int64")),
                       (TensorSpec((3, 8)),), (), static_inputs=((1, (3, 8)),))
    transpose = Workload("Transpose", (TensorSpec((4, 6)),), (TensorSpec((6, 4)),),
                         (("perm", (1, 0)),))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    own = [np.empty((3, 8), np.float32)]
    planned = outputs_as_planned(Candidate(copy, {}), reshape, [x, None], own)
    assert np.shares_memory(planned[0], x) and planned[0].shape == (3, 8)
    transposed = [np.empty((6, 4), np.float32)]
    assert outputs_as_planned(Candidate(copy, {}), transpose, [x], transposed) is transposed
    assert copy.algorithm(reshape, {}) == "view (no copy)"
    assert copy.algorithm(transpose, {}) == "copy"

    seen = []
    prepare = copy.prepare

    class Spy(NumpyCopy):
        def prepare(self, workload, consts, config):
            kernel = prepare(workload, consts, config)

            def spied(inputs, outputs):
                seen.append(np.shares_memory(inputs[0], outputs[0]))
                kernel(inputs, outputs)
            return spied

    result = measure_candidate(reshape, Candidate(Spy(), {}), rng=rng, warmup=1, repeats=3,
                               min_time=0.0)
    assert result.status is Status.OK
    assert seen[:2] == [False, False] and all(seen[2:]) and len(seen) >= 5


def test_a_kernel_with_a_native_form_is_timed_as_the_plan_runs_it(rng, monkeypatch):
    """A generated kernel is verified through its Python wrapper and timed through its
    native form (the chain driver calling the C function on the same buffers), as the
    runtime runs it; a kernel without one (numpy's) is timed as it is."""
    import wpk.search.measure as measure_module
    from wpk.kernels.generated import DSL_CPU, default_config
    from wpk.search.measure import as_run

    spec = TensorSpec((1, 37), "float32")
    add = Workload("Add", (spec, spec), (spec,))
    kernel = DSL_CPU.prepare(add, {}, default_config(add))
    a, b, out = (np.full((1, 37), v, np.float32) for v in (1.0, 2.0, 0.0))
    native = as_run(kernel, [a, b], [out])
    assert native is not kernel and hasattr(native, "timed")
    native([a, b], [out])
    assert np.all(out == 3.0)
    plain = NumpyMatMul().prepare(MATMUL, {1: np.ones((8, 5), np.float32)}, {})
    assert as_run(plain, [np.ones((6, 8), np.float32), None], [np.empty((6, 5))]) is plain

    timed = []
    real = measure_module._time_kernel

    def spy(kernel, inputs, outputs, **kw):
        timed.append(kernel)
        return real(kernel, inputs, outputs, **kw)

    monkeypatch.setattr(measure_module, "_time_kernel", spy)
    result = measure_candidate(add, Candidate(DSL_CPU, default_config(add)), rng=rng,
                               warmup=1, repeats=3, min_time=0.0)
    assert result.status is Status.OK and hasattr(timed[0], "timed")
    assert measure(NumpyMatMul(), rng).status is Status.OK
    assert not hasattr(timed[1], "timed")
