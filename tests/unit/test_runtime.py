"""Runtime: both run signatures, input validation, reused buffers, artifacts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wpk.core.errors import InputError, PlanError
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.registry import Candidate, Implementation
from wpk.plans.assemble import assemble_plan
from wpk.plans.planfile import Plan
from wpk.plans.planner import Choice, PlanChoices
from wpk.runtime import Session
from wpk.search.measure import Measurement, Status

from .plan_helpers import (
    IMPLEMENTATIONS,
    TEST_TARGET,
    NodeWorkload,
    register_test_implementations,
    tiny_plan,
)


@pytest.fixture
def session(rng, tmp_path):
    graph, plan = tiny_plan(rng)
    session = Session.load(plan.save(tmp_path / "tiny.wpk"))
    session.weight = graph.constants["w/0:weird name"]
    return session


def expected(session, x):
    t = x @ session.weight
    return np.maximum(t, 0) + t


def test_dict_and_onnxruntime_signatures(session, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    as_dict = session.run({"x": x})
    assert list(as_dict) == ["y"]
    np.testing.assert_allclose(as_dict["y"], expected(session, x), rtol=1e-6)
    [y_all] = session.run(None, {"x": x})
    [y_named] = session.run(["y"], {"x": x})
    np.testing.assert_array_equal(y_all, as_dict["y"])
    np.testing.assert_array_equal(y_named, as_dict["y"])


def test_outputs_are_copies(session, rng):
    x1 = rng.standard_normal((2, 8)).astype(np.float32)
    x2 = rng.standard_normal((2, 8)).astype(np.float32)
    first = session.run({"x": x1})["y"]
    kept = first.copy()
    second = session.run({"x": x2})["y"]
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(second, expected(session, x2), rtol=1e-6)


def test_profile_times_every_step(session, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    rows = session.profile({"x": x}, repeats=3)
    assert [r["node"] for r in rows] == ["mm", "relu", "add"]
    assert all(0 < r["min_s"] <= r["median_s"] for r in rows)
    np.testing.assert_allclose(session.run({"x": x})["y"], expected(session, x), rtol=1e-6)


def test_metadata_like_onnxruntime(session):
    [inp], [out] = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.shape, inp.type) == ("x", [2, 8], "tensor(float)")
    assert (out.name, out.shape, out.type) == ("y", [2, 5], "tensor(float)")


def test_input_validation_messages(session):
    good = np.zeros((2, 8), np.float32)
    with pytest.raises(InputError, match=r"^input 'x' has shape \(1,3,32,32\) but the plan "
                                         r"expects \(2,8\)$") as info:
        session.run({"x": np.zeros((1, 3, 32, 32), np.float32)})
    assert "--input-shape x=1x3x32x32" in info.value.hint
    with pytest.raises(InputError, match="input 'x' has dtype float64 but the plan expects "
                                         "float32") as info:
        session.run({"x": good.astype(np.float64)})
    assert "astype(np.float32)" in info.value.hint
    with pytest.raises(InputError, match="unknown input 'z'") as info:
        session.run({"x": good, "z": good})
    assert "'x'" in info.value.hint
    with pytest.raises(InputError, match=r"missing input 'x' \(shape \(2,8\), float32\)"):
        session.run({})
    with pytest.raises(InputError, match="unknown output 'nope'"):
        session.run(["nope"], {"x": good})
    with pytest.raises(InputError, match="feeds must be a dict"):
        session.run(None, [good])
    assert session.run({"x": good.tolist()})["y"].shape == (2, 5)  # lists take the plan dtype


def chain_plan(length, impl=None, config=None, shape=(3, 4)):
    """a1 = x + x, a(k+1) = a(k) + a(k), y = a(length) + x: intermediates share buffers."""
    spec = TensorSpec(shape)
    tensors = {"x": TensorInfo(shape)}
    nodes, previous = [], "x"
    for k in range(1, length + 1):
        nodes.append(Node("Add", [previous, previous], [f"a{k}"], f"add{k}"))
        tensors[f"a{k}"] = TensorInfo(shape)
        previous = f"a{k}"
    nodes.append(Node("Add", [previous, "x"], ["y"], "last"))
    tensors["y"] = TensorInfo(shape)
    graph = Graph(nodes, ["x"], ["y"], tensors)
    workload = Workload("Add", (spec, spec), (spec,))
    impl = impl or IMPLEMENTATIONS[2]
    measurement = Measurement(impl.name, impl.name, {}, Status.OK, median_s=1e-6)
    choice = Choice(workload, [n.name for n in nodes], ["Add"] * len(nodes),
                    Candidate(impl, config or {}), measurement, [measurement])
    return assemble_plan(graph, [NodeWorkload(n, workload) for n in nodes],
                         PlanChoices({workload.key: choice}))


def test_reused_buffers_give_right_answers(rng, tmp_path):
    register_test_implementations()
    plan = chain_plan(6)
    buffers = plan.buffer_plan
    assert len({buffers.assignment[f"a{k}"] for k in range(1, 7)}) == 2
    assert buffers.arena_bytes == buffers.no_reuse_bytes / 2
    session = Session.load(plan.save(tmp_path / "chain.wpk"))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(session.run({"x": x})["y"], 65 * x, rtol=1e-6)


def test_the_arena_is_mapped_at_load(tmp_path):
    """The intermediates' pages are mapped when the plan loads, not by the first run's
    kernels (a fresh allocation's pages fault in where first written)."""
    from .test_aligned import mapped_pages

    register_test_implementations()
    plan = chain_plan(3, shape=(2048, 4096))   # 32 MiB tensors, two buffers: above glibc's
    session = Session.load(plan.save(tmp_path / "big.wpk"))   # mmap threshold, fresh pages
    mapped, pages = mapped_pages(session._arena)
    assert pages >= 2 * 8192 and mapped == pages


def test_runs_from_several_threads_get_their_own_results(rng, tmp_path):
    """One session run by four threads at once: every run returns its own input's result
    (the runs share the arena, so they take turns; unserialized, they read each other's)."""
    import sys
    import threading

    register_test_implementations()
    session = Session.load(chain_plan(4, shape=(64, 1024)).save(tmp_path / "threads.wpk"))
    feeds = [rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(4)]
    wrong = []

    def work(x):
        for _ in range(25):
            y = session.run({"x": x})["y"]
            [y_list] = session.run(["y"], {"x": x})
            wrong.extend(not np.array_equal(out, 17 * x) for out in (y, y_list))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # switch threads often, as a busy server would
    try:
        threads = [threading.Thread(target=work, args=(x,)) for x in feeds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(wrong) == 200 and not any(wrong)


class PreparesWithBlas(Implementation):
    """An Add whose prepare records how many threads BLAS may use there."""

    name = "runtime_test.prepares_with_blas"
    target = TEST_TARGET
    seen: list[int] = []

    def unsupported_reason(self, workload):
        return None

    def prepare(self, workload, consts, config):
        from threadpoolctl import threadpool_info

        self.seen.append(max(i["num_threads"] for i in threadpool_info()
                             if i["user_api"] == "blas"))
        return lambda inputs, outputs: np.add(inputs[0], inputs[1], out=outputs[0])


def test_steps_are_prepared_with_one_blas_thread(tmp_path):
    """A prepare's BLAS call (a filter transform, a packing) runs on the loading thread:
    OpenBLAS's idle workers spin for about 0.1 s after a call, taking the cores from the
    first run's kernels. The limit ends with the load."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    if blas_threads() < 2:
        pytest.skip("BLAS runs one thread here already")
    before = blas_threads()
    register_test_implementations()
    impl = PreparesWithBlas()
    if impl.name not in registry._REGISTRY:
        registry.register(impl)
    impl.seen.clear()
    Session.load(chain_plan(2, impl).save(tmp_path / "blas-prepare.wpk"))
    assert impl.seen and set(impl.seen) == {1}
    assert blas_threads() == before


class ScaledAdd(Implementation):
    """Adds with a scale that lives in a kernel artifact (as a compiled binary would)."""

    name = "runtime_test.scaled_add"
    target = TEST_TARGET

    def unsupported_reason(self, workload):
        return None

    def artifacts(self, workload, config):
        return {"scale.txt": f"{config['scale']}".encode()}

    def prepare(self, workload, consts, config):
        raise AssertionError("the runtime should load from the artifact")

    def prepare_from_artifacts(self, workload, consts, config, artifacts):
        scale = np.float32(float(artifacts["scale.txt"].decode()))
        return lambda inputs, outputs: np.multiply(inputs[0] + inputs[1], scale, out=outputs[0])


def test_kernel_artifacts_travel_in_the_plan(rng, tmp_path):
    register_test_implementations()
    impl = ScaledAdd()
    if impl.name not in registry._REGISTRY:
        registry.register(impl)
    plan = chain_plan(1, impl, {"scale": 0.5})
    assert list(plan.kernels) == [f"{plan.steps[0].workload_key}/{impl.name}/scale.txt"]
    assert plan.manifest["requires"]["machine"]  # native code is tied to the machine
    session = Session.load(plan.save(tmp_path / "art.wpk"))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    # a1 = (x + x) / 2 = x, y = (a1 + x) / 2 = x
    np.testing.assert_allclose(session.run({"x": x})["y"], x, rtol=1e-6)


def test_an_unknown_implementation_is_a_plan_error(rng, tmp_path):
    register_test_implementations()
    plan = chain_plan(1)
    manifest = dict(plan.manifest)
    manifest["steps"] = [dict(s, impl="gone.impl") for s in manifest["steps"]]
    path = Plan(manifest, plan.weights).save(tmp_path / "gone.wpk")
    with pytest.raises(PlanError, match="uses implementation 'gone.impl' \\(node 'add1'\\)"):
        Session.load(path)


def test_blas_is_limited_only_for_plans_that_may_call_it(tmp_path):
    """Entering the one-BLAS-thread context costs about 10 us a run: skipped when no step's
    implementation may call BLAS (onnxruntime, copies, elementwise numpy)."""
    from wpk.kernels.cpu.blas_threads import OneBlasThread
    from wpk.kernels.cpu.numpy_ops import NumpyElementwise

    register_test_implementations()
    blas_free = registry.get(NumpyElementwise.name)
    assert not blas_free.uses_blas and registry.get("ort.nchwc").uses_blas is False
    session = Session.load(chain_plan(2, blas_free).save(tmp_path / "free.wpk"))
    assert not isinstance(session._one_blas_thread, OneBlasThread)
    assert registry.get("numpy.gemm").uses_blas
    plan = chain_plan(2)
    assert registry.get(plan.steps[0].impl).uses_blas  # the default: it may
    session = Session.load(plan.save(tmp_path / "blas.wpk"))
    assert isinstance(session._one_blas_thread, OneBlasThread)


@st.composite
def random_programs(draw):
    """Random DAGs of Add/Relu over (3, 4) tensors, with one or more outputs."""
    names, nodes = ["x"], []
    for index in range(draw(st.integers(1, 14))):
        if draw(st.booleans()):
            nodes.append(Node("Add", [draw(st.sampled_from(names)), draw(st.sampled_from(names))],
                              [f"t{index}"], f"add{index}"))
        else:
            nodes.append(Node("Relu", [draw(st.sampled_from(names))], [f"t{index}"],
                              f"relu{index}"))
        names.append(f"t{index}")
    outputs = draw(st.lists(st.sampled_from(names[1:]), min_size=1, max_size=3, unique=True))
    return nodes, outputs


@settings(max_examples=40, deadline=None)
@given(random_programs())
def test_random_programs_match_direct_evaluation(program):
    register_test_implementations()
    nodes, outputs = program
    spec = TensorSpec((3, 4))
    graph = Graph(nodes, ["x"], outputs, {name: TensorInfo((3, 4)) for name in
                                          ["x", *(n.outputs[0] for n in nodes)]})
    by_op = {"Add": (Workload("Add", (spec, spec), (spec,)), IMPLEMENTATIONS[2]),
             "Relu": (Workload("Relu", (spec,), (spec,)), IMPLEMENTATIONS[1])}
    choices = {}
    for workload, impl in by_op.values():
        measurement = Measurement(impl.name, impl.name, {}, Status.OK, median_s=1e-6)
        choices[workload.key] = Choice(workload, [], [], Candidate(impl, {}), measurement)
    items = [NodeWorkload(n, by_op[n.op][0]) for n in nodes]
    session = Session(assemble_plan(graph, items, PlanChoices(choices)))
    x = np.random.default_rng(len(nodes)).standard_normal((3, 4)).astype(np.float32)
    values = {"x": x}
    for node in nodes:
        args = [values[i] for i in node.inputs]
        values[node.outputs[0]] = args[0] + args[1] if node.op == "Add" else np.maximum(args[0], 0)
    for _ in range(2):  # a second run reuses every buffer
        got = session.run({"x": x})
        for name in outputs:
            np.testing.assert_array_equal(got[name], values[name])
