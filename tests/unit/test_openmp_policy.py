"""The OpenMP wait policy: the first call decides, the user's variables win, and a session
picks the long spin only for a plan that runs nothing but generated kernels."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from wpk.dsl import build
from wpk.runtime import openmp_spin_count
from wpk.search import measure


@pytest.fixture
def no_policy(monkeypatch):
    """A process in which nothing has chosen the policy yet (restored afterwards)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)


def test_the_first_call_decides(no_policy):
    build.openmp_defaults(1234)
    build.openmp_defaults(build.OPENMP_SPIN_COUNT)
    assert os.environ["OMP_WAIT_POLICY"] == "passive"
    assert os.environ["GOMP_SPINCOUNT"] == "1234"


@pytest.mark.parametrize("variable", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"])
def test_the_users_variables_win(no_policy, monkeypatch, variable):
    monkeypatch.setenv(variable, "active" if variable == "OMP_WAIT_POLICY" else "7")
    build.openmp_defaults(build.OPENMP_IDLE_SPIN_COUNT)
    other = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} - {variable}
    assert not other & set(os.environ)


def _plan(*impls: str):
    return SimpleNamespace(steps=[SimpleNamespace(impl=name) for name in impls])


def test_a_plan_of_generated_kernels_spins_as_long_as_onnxruntime():
    plan = _plan("micro.nchwc", "micro.inverted_residual", "native.nchwc", "numpy.copy")
    assert openmp_spin_count(plan) == build.OPENMP_IDLE_SPIN_COUNT
    assert build.OPENMP_IDLE_SPIN_COUNT > 10 * build.OPENMP_SPIN_COUNT


@pytest.mark.parametrize("numpy_kernel", ["numpy.sum", "numpy.softmax", "numpy.layernorm",
                                          "numpy.batchnorm", "numpy.elementwise"])
def test_numpy_kernels_that_call_no_blas_let_a_plan_spin_long(numpy_kernel):
    """numpy's ufuncs and reductions compute on the calling thread: such a step neither
    wakes a pool of its own nor needs BLAS limited (they were marked as BLAS users, the
    default, so a plan holding one kept the brief spin)."""
    from wpk.kernels import registry

    implementation = registry.get(numpy_kernel)
    assert not implementation.uses_blas and implementation.one_pool
    assert openmp_spin_count(_plan("micro.nchwc", numpy_kernel)) == \
        build.OPENMP_IDLE_SPIN_COUNT


@pytest.mark.parametrize("other", ["ort.nchwc", "ort.model", "ort.fallback", "numpy.gemm",
                                   "no.such.implementation"])
def test_a_plan_that_shares_the_cores_spins_briefly(other):
    """An onnxruntime step or BLAS has threads of its own that a spinning OpenMP thread
    would keep from a core; an unknown implementation is reported when the steps are
    prepared, not here."""
    assert openmp_spin_count(_plan("micro.nchwc", other)) == build.OPENMP_SPIN_COUNT


@pytest.mark.parametrize("env, long", [
    ({}, False), ({"GOMP_SPINCOUNT": str(build.OPENMP_SPIN_COUNT)}, False),
    ({"GOMP_SPINCOUNT": str(build.OPENMP_IDLE_SPIN_COUNT)}, True),
    ({"GOMP_SPINCOUNT": str(build.MAX_WAITED_SPIN_COUNT + 1)}, False),
    ({"GOMP_SPINCOUNT": "infinite"}, False), ({"OMP_WAIT_POLICY": "active"}, False),
    ({"OMP_WAIT_POLICY": "passive"}, False)])
def test_which_policies_spin_long(no_policy, monkeypatch, env, long):
    """Long, but over in time: threads that never stop are not waited for (a measurement
    would wait out `wait_until_idle`'s limit for every candidate)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert build.threads_spin_long() is long


def test_a_measurement_waits_for_long_spinning_threads(monkeypatch):
    """In a process whose OpenMP threads spin long (a session loaded a plan of only
    generated kernels first), each candidate is timed after they stop: an onnxruntime
    candidate timed right after a generated one would share the cores with them."""
    waits = []
    monkeypatch.setattr(measure, "wait_until_idle", lambda: waits.append(1) or 0.0)
    arrays = [np.zeros(4, np.float32)]

    def time_once():
        measure.time_kernel(lambda inputs, outputs: None, arrays, arrays, warmup=1,
                            repeats=2, max_repeats=2)

    monkeypatch.setenv("GOMP_SPINCOUNT", str(build.OPENMP_SPIN_COUNT))
    time_once()
    assert waits == []
    monkeypatch.setenv("GOMP_SPINCOUNT", str(build.OPENMP_IDLE_SPIN_COUNT))
    time_once()
    assert waits == [1]
