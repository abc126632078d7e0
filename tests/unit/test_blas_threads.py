"""The runtime and the planner's timing run numpy's BLAS on one thread, then restore it."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from wpk.kernels.cpu.blas_threads import one_blas_thread
from wpk.search.measure import time_kernel


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture
def two_blas_threads():
    from threadpoolctl import threadpool_limits

    if not blas_threads():
        pytest.skip("numpy is linked to no BLAS threadpoolctl knows")
    with threadpool_limits(limits=2, user_api="blas"):
        yield


def test_one_blas_thread_inside_and_restored_after(two_blas_threads):
    assert blas_threads() == [2] * len(blas_threads())
    with one_blas_thread():
        assert set(blas_threads()) == {1}
    assert set(blas_threads()) == {2}


def test_the_library_scan_is_reused_until_a_module_is_imported(two_blas_threads, monkeypatch):
    """The planner enters the context once per candidate: the loaded libraries are scanned
    again only when a module was imported since (a new BLAS comes with one)."""
    import sys
    import types

    from wpk.kernels.cpu import blas_threads as module

    with one_blas_thread():
        pass
    scanned = module._shared[1]
    with one_blas_thread():
        with one_blas_thread():
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {1}
    assert set(blas_threads()) == {2}
    assert module._shared[1] is scanned
    monkeypatch.setitem(sys.modules, "wpk_test_imported_module", types.ModuleType("probe"))
    with one_blas_thread():
        assert set(blas_threads()) == {1}
    assert module._shared[1] is not scanned
    assert set(blas_threads()) == {2}


def test_timed_kernels_see_one_blas_thread(two_blas_threads):
    seen = []

    def kernel(inputs, outputs):
        seen.append(tuple(blas_threads()))
        np.matmul(inputs[0], inputs[1], out=outputs[0])

    a = np.ones((8, 8), np.float32)
    time_kernel(kernel, [a, a], [np.empty((8, 8), np.float32)], warmup=1, repeats=2)
    assert seen and all(set(threads) == {1} for threads in seen)
    assert set(blas_threads()) == {2}


def test_session_runs_with_one_blas_thread(two_blas_threads, tmp_path, rng):
    """A real plan through the runtime: its numpy kernels run under the one-thread limit."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import wpk

    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    plan = wpk.build(str(path), target="cpu", progress=False, warmup=0, repeats=1, min_time=0,
                     partition=False)
    plan.save(tmp_path / "m.wpk")
    session = wpk.load(str(tmp_path / "m.wpk"))
    seen = []
    original = session._calls[0][0]

    def probe(inputs, outputs):
        seen.append(tuple(blas_threads()))
        original(inputs, outputs)

    session._calls[0] = (probe, *session._calls[0][1:])
    x = rng.standard_normal((64, 64)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight_array(weight), rtol=1e-4, atol=1e-4)
    # Which candidate won is the measurement's call; the limit applies exactly when the
    # chosen implementation may call BLAS (numpy's matmul wins on most machines).
    from wpk.kernels import registry

    (step,) = session.plan.steps
    limited = 1 if registry.get(step.impl).uses_blas else 2
    assert seen == [(limited,) * len(blas_threads())]
    assert set(blas_threads()) == {2}


def weight_array(tensor):
    from onnx import numpy_helper

    return numpy_helper.to_array(tensor)

