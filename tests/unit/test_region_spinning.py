"""`spin_threads`: NCHWc region sessions spin only during a run, nothing burns CPU after it
returns; off by default."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest

import wpk
from tests.unit.test_nchwc_gate import _se_model
from wpk.kernels.cpu.ort_node import session_options
from wpk.runtime import Session

from .plan_helpers import without_micro_kernels


def _cpu_seconds_while_idle(seconds: float = 0.1) -> float:
    """CPU time this process uses while its main thread sleeps (spinning pool threads)."""
    start = time.process_time()
    time.sleep(seconds)
    return time.process_time() - start


@pytest.fixture(scope="module")
def se_region_plan():
    """A squeeze-excite model's plan, measured as `wpk build` does by default (a one-shot
    measurement can let a lone step beat the region by noise). The micro-kernels' default
    configs, which may win a conv (the 3-channel first one too) or a fused block and leave
    no region, are not offered here (as in test_nchwc_region)."""
    model = _se_model(np.random.default_rng(2))
    with without_micro_kernels():
        plan = wpk.build(model, target="cpu", progress=False, partition=False)
    return model, plan


def test_spin_during_run_options():
    options = session_options(spin_during_run=True)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_region_leaves_no_thread_spinning_after_a_run(se_region_plan):
    model, plan = se_region_plan
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 12, 12), np.float32)}
    session = Session(plan, spin_threads=True)
    assert any(".." in name for name in session._step_names)  # at least one region
    options = ort.SessionOptions()  # onnxruntime's default: spinning, no stop
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    peer = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])

    def after(engine_run) -> float:
        for _ in range(3):
            engine_run()
        return _cpu_seconds_while_idle()

    # a few tries each, so that a busy machine (threads descheduled) cannot decide it
    spun = max(after(lambda: peer.run(None, feeds)) for _ in range(5))
    assert spun > 0.005  # the measurement sees spinning threads
    _cpu_seconds_while_idle(0.3)  # let the peer's threads go to sleep
    ours = min(after(lambda: session.run(feeds)) for _ in range(3))
    assert ours < max(0.005, spun / 4)


def test_spinning_is_opt_in(tmp_path, se_region_plan):
    _, plan = se_region_plan
    path = plan.save(tmp_path / "se.wpk")
    assert not wpk.load(path).spin_threads
    session = wpk.load(path, spin_threads=True)
    assert session.spin_threads
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 12, 12), np.float32)}
    np.testing.assert_allclose(session.run(feeds)["y"], Session(plan).run(feeds)["y"],
                               rtol=1e-5, atol=1e-6)


def test_cli_run_takes_spin_threads(tmp_path):
    from click.testing import CliRunner

    from wpk.cli import cli

    model = _se_model(np.random.default_rng(2))
    path = wpk.build(model, target="cpu", progress=False, warmup=0, repeats=1,
                     min_time=0, partition=False).save(tmp_path / "se.wpk")
    outputs = {}
    for flag in ([], ["--spin-threads"]):
        out = tmp_path / f"out{len(flag)}.npz"
        result = CliRunner().invoke(cli, ["run", str(path), "--repeat", "2", "--output",
                                          str(out), *flag])
        assert result.exit_code == 0, result.output
        with np.load(out) as data:
            outputs[len(flag)] = data["y"]
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
