"""ONNX's own backend tests, driven through `wpk.backend`.

Every case whose ops wpk claims (`wpk.kernels.support.is_supported`) must
pass with the tolerances of ONNX's runner (rtol 1e-3, atol 1e-7 unless the
case says otherwise), compared by the runner's own `assert_similar_outputs`.
Cases wpk cannot run are explicit skips naming the reason. At the end of the
module a summary line gives the counts:
"onnx backend: N passed, M failed, K skipped (reason: count, ...)".
"""

from __future__ import annotations

import collections
import contextlib
import json
import time

import numpy as np
import onnx
import pytest
from onnx.backend.test.runner import Runner

import wpk.backend as backend
from tests.integration import onnx_cases
from tests.integration.onnx_cases import SUMMARY_KEY, summary_lines

# The light CNNs are whole models: the compile cache is the run's, shared with the other
# whole-model tests (so are the node cases' small kernels).
pytestmark = pytest.mark.usefixtures("shared_compile_cache")
ALL_CASES = onnx_cases.node_cases() + onnx_cases.folder_cases() + onnx_cases.light_cases()
# With `pytest --onnx-fallback-runs`, unclaimed cases still run (wpk hands their ops to
# onnxruntime, or to onnx.reference where onnxruntime cannot run them or fails
# verification) and are counted apart; they are skips whatever the outcome, since wpk
# makes no claim about them, so CI leaves them out (scripts/conformance.py counts every
# case through wpk.backend).
# This suite checks answers, not speed: every candidate is still verified against the
# float64 reference, but timed once without warm-up.
# Conformance tests wpk's own kernels: no end-to-end switch to onnxruntime's whole model.
BUILD_OPTIONS = {"warmup": 0, "repeats": 1, "min_time": 0.0, "partition": False}
_FALLBACK_SECONDS = [0.0]
_OUTCOMES: dict[str, tuple[str, str, float, str]] = {}


def _is_supported(node: onnx.NodeProto) -> bool:
    """Whether wpk claims this node's op (the kernels' `SUPPORTED_OPS`)."""
    from wpk.kernels.support import SUPPORTED_OPS

    return node.domain in ("", "ai.onnx") and node.op_type in SUPPORTED_OPS


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    """Print the pass/skip/fail counts once the module is done; in a pytest-xdist worker,
    hand this worker's outcomes to the controller, which prints the merged counts
    (`tests/integration/conftest.py`)."""
    yield
    if not _OUTCOMES:
        return
    workeroutput = getattr(request.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[SUMMARY_KEY] = json.dumps([_OUTCOMES, _FALLBACK_SECONDS[0]])
        return
    write_lines(request.config, summary_lines(_OUTCOMES, _FALLBACK_SECONDS[0]))


def write_lines(config, lines: list[str]) -> None:
    """Lines on the terminal, past pytest's output capture."""
    plugins = config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for line in ["", *lines]:
            if reporter is not None:
                reporter.write_line(line)
            else:
                print(line)




def _unclaimed(model: onnx.ModelProto) -> str | None:
    """Why wpk makes no claim on this (specialized) model, or None when it claims all of it.

    The claim is on what remains after the frontend and the graph passes (a
    ConstantOfShape of a constant shape folds away, a Dropout in inference is
    removed): every workload must be one of wpk's own (`support.unsupported_reason`).
    """
    from wpk.frontend import load_model
    from wpk.kernels.support import unsupported_reason
    from wpk.passes import optimize
    from wpk.workloads import extract_workloads

    foreign = onnx_cases.unsupported_ops(model, _is_supported)
    try:
        graph, _ = optimize(load_model(model), "cpu")
    except Exception as exc:
        if foreign:  # ops wpk does not claim may well stop the frontend
            return f"unsupported op {', '.join(foreign)}"
        raise AssertionError(f"frontend/passes failed on claimed ops: {exc}") from exc
    for item in extract_workloads(graph):
        reason = unsupported_reason(item.workload)
        if reason is None:
            continue
        if reason.startswith("op ") and "not implemented" in reason:
            return f"unsupported op {item.workload.op}"
        return f"unsupported workload {item.workload.op}: {reason}"
    return None


def _check(rep, data_sets, case) -> None:
    for inputs, expected in data_sets:
        outputs = rep.run(inputs)
        Runner.assert_similar_outputs(list(expected), list(outputs), rtol=case.rtol,
                                      atol=case.atol, model_dir=case.name)


def _fallback_outcome(model, data_sets, case) -> str:
    """Run an unclaimed case anyway (wpk hands such ops to its fallbacks); 'passed' or why
    not."""
    start = time.perf_counter()
    try:
        _check(backend.prepare(model, "CPU", **BUILD_OPTIONS), data_sets, case)
    except Exception as exc:  # noqa: BLE001 - counted, never fails the suite
        return f"failed ({type(exc).__name__})"
    finally:
        _FALLBACK_SECONDS[0] += time.perf_counter() - start
    return "passed"


def _skip(key: str, reason: str, start: float, model=None, data_sets=None, case=None,
          fallback_runs: bool = False):
    fallback = ""
    if fallback_runs and model is not None:
        fallback = _fallback_outcome(model, data_sets, case)
    _OUTCOMES[key] = ("skipped", reason, time.perf_counter() - start, fallback)
    pytest.skip(f"{reason}" + (f" [fallback run {fallback}]" if fallback else ""))


def _run_case(case: onnx_cases.OnnxCase, config) -> None:
    key = f"{case.kind}::{case.name}"
    start = time.perf_counter()
    model, data_sets = case.load()
    reason = onnx_cases.skip_reason(model, data_sets)
    if reason is not None:
        foreign = onnx_cases.unsupported_ops(model, _is_supported)
        if foreign and reason == "zero-size tensor input":  # say the more basic reason
            reason = f"unsupported op {', '.join(foreign)}"
        _skip(key, reason, start)
    try:
        rep = backend.prepare(model, "CPU", lazy=True, **BUILD_OPTIONS)
        unclaimed = _unclaimed(rep.specialized_model(data_sets[0][0]))
    except BaseException:
        _OUTCOMES[key] = ("failed", "", time.perf_counter() - start, "")
        raise
    if unclaimed is not None:
        _skip(key, unclaimed, start, model, data_sets, case,
              config.getoption("--onnx-fallback-runs"))
    try:
        _check(rep, data_sets, case)
    except BaseException:
        _OUTCOMES[key] = ("failed", "", time.perf_counter() - start, "")
        raise
    _OUTCOMES[key] = ("passed", "", time.perf_counter() - start, "")


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.kind == "node"],
                         ids=lambda c: c.name)
def test_node_case(case, request):
    _run_case(case, request.config)


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.kind == "model-folder"],
                         ids=lambda c: c.name)
def test_model_folder_case(case, request):
    _run_case(case, request.config)


@pytest.mark.slow  # whole CNNs: 10-70 s each on 2 busy cores; still part of CI
@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.kind == "light"],
                         ids=lambda c: c.name)
def test_light_model(case, request):
    _run_case(case, request.config)


def test_case_collection_is_complete():
    """The harness sees ONNX's whole suite, so a pass count cannot hide missing cases."""
    kinds = collections.Counter(c.kind for c in ALL_CASES)
    assert kinds["node"] > 1500
    assert kinds["model-folder"] > 100
    assert kinds["light"] == 9
    assert len({c.name for c in ALL_CASES}) == len(ALL_CASES)


def test_skip_reason_names_unsupported_ops_and_types():
    """The classifiers are explicit: an unclaimed op and a sequence input give reasons."""
    from onnx import TensorProto, helper

    node = helper.make_node("Abs", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    data = [([np.ones(2, np.float32)], [np.ones(2, np.float32)])]
    assert onnx_cases.unsupported_ops(model, lambda n: False) == ["Abs"]
    assert onnx_cases.unsupported_ops(model, lambda n: True) == []
    assert onnx_cases.skip_reason(model, data) is None
    seq = helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [2])
    model.graph.input[0].CopyFrom(seq)
    assert onnx_cases.skip_reason(model, data) == "sequence type"


def test_unclaimed_names_ops_left_after_the_passes():
    """An op outside SUPPORTED_OPS is unclaimed; a claimed Relu model is claimed."""
    from onnx import TensorProto, helper

    def one_node(op):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    assert _unclaimed(one_node("Relu")) is None
    assert _unclaimed(one_node("Selu")) == "unsupported op Selu"
