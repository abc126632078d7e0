"""Tuning records: durable appends, tolerant reads, lookup/best/merge, the CLI views, and
resuming an interrupted tuning loop (real worker, real kernels) without losing a record
or measuring anything twice."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from tests.isa import current_isa
from tests.unit import worker_fixtures as F
from wpk.commands.records import records_best, records_list, records_merge
from wpk.commands.render import search_lines
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels.jobs import CandidateSpec, CompileJob
from wpk.kernels.target import TargetFingerprint, create_target
from wpk.plans.planner import PlanOptions, plan
from wpk.search import recorded as recorded_module
from wpk.search.compile_pool import CompilePool
from wpk.search.measure import Measurement, Status
from wpk.search.recorded import RecordedRunner
from wpk.search.records import (
    SCHEMA_VERSION,
    RecordError,
    RecordStore,
    RecordWarning,
    TuningRecord,
    merge,
)
from wpk.search.runner import IsolatedRunner
from wpk.search.workers import MeasureOptions, MeasureWorker

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

REPO = Path(__file__).resolve().parents[2]
FP = TargetFingerprint("cpu:x86_64:avx2", "gcc (test) 1.0", "1")
OTHER_FP = TargetFingerprint("cpu:x86_64:avx512f", "gcc (test) 1.0", "1")
WORKLOAD = F.RELU_WORKLOAD
FIXTURES = "tests.unit.worker_fixtures"
QUICK = MeasureOptions(warmup=1, repeats=3, max_repeats=10, min_time=0.001, timeout_s=30.0)


def measurement(impl: str, config: dict, median: float | None, status=Status.OK,
                message: str = "") -> Measurement:
    times = () if median is None else (median * 0.9, median, median * 1.2)
    return Measurement(label=impl, impl=impl, config=config, status=status, times_s=times,
                       median_s=float("nan") if median is None else median,
                       spread_s=(float("nan"),) * 2 if median is None else (times[0], times[2]),
                       rel_l2_error=1e-7 if status is Status.OK else float("nan"),
                       message=message, workload_key=WORKLOAD.key)


def record(impl="k", config=None, median=1e-3, status=Status.OK, fp=FP, phase="search",
           message="") -> TuningRecord:
    return TuningRecord.from_measurement(measurement(impl, config or {}, median, status,
                                                     message), WORKLOAD, fp, phase=phase)


# ----------------------------------------------------------------------------- store
def test_records_round_trip_and_are_self_describing(tmp_path):
    path = tmp_path / "db.jsonl"
    store = RecordStore(path)
    first = record("k", {"tile": 8, "order": [0, 1]}, 2e-3)
    failed = record("k", {"tile": 16}, None, Status.TIMEOUT, message="no result within 5 s")
    store.commit(first)
    store.commit(failed)
    assert store.appended == 2
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    data = json.loads(lines[0])
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["workload_key"] == WORKLOAD.key and data["workload"]["op"] == "Relu"
    assert data["fingerprint"] == FP.to_json() and data["fingerprint_key"] == FP.key
    assert json.loads(lines[1])["median_s"] is None  # NaN is stored as null

    reread = RecordStore(path)
    assert reread.appended == 0 and len(reread) == 2
    got = reread.lookup(WORKLOAD.key, FP, "k", {"order": (0, 1), "tile": 8})  # tuple == list
    assert got == first
    assert got.to_workload() == WORKLOAD
    assert got.to_measurement().median_s == 2e-3
    timeout = reread.lookup(WORKLOAD.key, FP.key, "k", {"tile": 16})
    assert timeout.status is Status.TIMEOUT and timeout.error == "no result within 5 s"
    assert reread.lookup(WORKLOAD.key, OTHER_FP, "k", {"tile": 16}) is None
    assert reread.lookup(WORKLOAD.key, FP, "k", {"tile": 32}) is None


def test_best_prefers_final_remeasurements_and_ignores_failures_and_other_targets(tmp_path):
    store = RecordStore(tmp_path / "db.jsonl")
    for rec in (record("a", {}, 3e-3), record("b", {}, 1e-3),
                record("c", {}, None, Status.WRONG_ANSWER), record("d", {}, 1e-4, fp=OTHER_FP),
                record("b", {}, 4e-3, phase="final"),
                record("a", {}, 2.5e-3, phase="final")):
        store.commit(rec)
    best = store.best(WORKLOAD.key, FP)
    assert (best.impl, best.phase, best.median_s) == ("a", "final", 2.5e-3)
    assert store.best(WORKLOAD.key, OTHER_FP).impl == "d"
    assert store.best("0" * 16, FP) is None
    assert store.lookup(WORKLOAD.key, FP, "b", {}).median_s == 1e-3       # search phase
    assert store.lookup(WORKLOAD.key, FP, "b", {}, phase="final").median_s == 4e-3


def test_torn_last_line_is_skipped_with_a_warning_and_the_next_append_starts_fresh(tmp_path):
    path = tmp_path / "db.jsonl"
    RecordStore(path).commit(record("a"))
    line = record("b").to_line()
    with open(path, "a") as handle:  # what a kill in the middle of a write leaves
        handle.write(line[: len(line) // 2])
    with pytest.warns(RecordWarning, match=r"db\.jsonl:2: torn last line"):
        store = RecordStore(path)
    assert [r.impl for r in store] == ["a"]
    store.commit(record("c"))
    with pytest.warns(RecordWarning, match=r"db\.jsonl:2: corrupted record"):
        assert [r.impl for r in RecordStore(path)] == ["a", "c"]


def test_corrupted_lines_warn_with_file_and_line_and_never_crash(tmp_path):
    path = tmp_path / "db.jsonl"
    good = record("a").to_line()
    missing_field = json.dumps({"schema_version": 1, "impl": "x"}) + "\n"
    path.write_text(good + "{not json\n" + missing_field + "\n" + good)
    with pytest.warns(RecordWarning) as caught:
        store = RecordStore(path)
    assert len(store) == 2
    messages = [str(w.message) for w in caught]
    assert any(f"{path}:2: corrupted record" in m for m in messages)
    assert any(f"{path}:3: corrupted record" in m for m in messages)


def test_a_newer_schema_is_a_clear_error(tmp_path):
    path = tmp_path / "db.jsonl"
    data = record("a").to_json() | {"schema_version": SCHEMA_VERSION + 1}
    path.write_text(record("a").to_line() + json.dumps(data) + "\n")
    with pytest.raises(RecordError, match=rf"db\.jsonl:2: .*schema version {SCHEMA_VERSION + 1}"
                       ) as error:
        RecordStore(path)
    assert "upgrade wpk" in error.value.hint


def test_merge_keeps_every_distinct_measurement_once(tmp_path):
    shared, only_a, only_b = record("s", {}, 1e-3), record("a", {}, 2e-3), record("b", {}, 3e-3)
    again = record("s", {}, 1.1e-3)  # the same candidate measured again: distinct, kept
    for name, records in (("a", [shared, only_a]), ("b", [shared, only_b, again])):
        store = RecordStore(tmp_path / f"{name}.jsonl")
        for rec in records:
            store.commit(rec)
    summary = merge([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out.jsonl")
    assert (summary.read, summary.written, summary.duplicates) == (5, 4, 1)
    merged = RecordStore(tmp_path / "out.jsonl")
    assert [r.to_line() for r in merged] == [r.to_line() for r in (shared, only_a, only_b, again)]
    with pytest.raises(RecordError, match="does not exist"):
        merge([tmp_path / "missing.jsonl"], tmp_path / "x.jsonl")


def test_target_fingerprint_names_this_host_and_its_compiler():
    fingerprint = create_target("cpu").fingerprint()
    assert fingerprint.device.startswith("cpu:")
    assert "gcc" in fingerprint.compiler.lower() or fingerprint.compiler == "none"
    assert fingerprint.key == TargetFingerprint.from_json(fingerprint.to_json()).key
    assert fingerprint.key != FP.key


# ----------------------------------------------------------------------------- kill -9
APPENDER = textwrap.dedent("""
    import sys
    from tests.unit.test_records import record
    from wpk.search.records import RecordStore
    store = RecordStore(sys.argv[1])
    index = 0
    while True:
        store.commit(record("appender", {"index": index}))
        print(index, flush=True)
        index += 1
""")


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))


def test_kill_minus_nine_while_appending_loses_no_acknowledged_record(tmp_path):
    path = tmp_path / "db.jsonl"
    child = subprocess.Popen([sys.executable, "-c", APPENDER, str(path)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True, env=child_env())
    acknowledged = []
    for line in child.stdout:
        acknowledged.append(int(line))
        if len(acknowledged) >= 50:
            break
    os.kill(child.pid, signal.SIGKILL)
    acknowledged += [int(line) for line in child.stdout if line.strip()]
    child.wait()
    assert child.returncode == -signal.SIGKILL
    indices = [r.config["index"] for r in RecordStore(path)]
    # Every record the writer saw written is there, in order, with nothing lost between.
    assert indices[: len(acknowledged)] == acknowledged
    assert indices == list(range(len(indices)))
    assert len(indices) - len(acknowledged) <= 1


# ----------------------------------------------------------------------------- resume
TUNING_LOOP = textwrap.dedent("""
    import signal, sys, time
    # Ctrl-C in a terminal raises KeyboardInterrupt; a child of a process that ignores
    # SIGINT (a test runner's worker may) would inherit the ignoring and run to the end.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tests.isa import force_isa
    force_isa(sys.argv[2])  # the CPU the test process sees (pytest --isa)
    from tests.unit.test_records import loop_candidates, QUICK
    from tests.unit.worker_fixtures import RELU_WORKLOAD
    from wpk.kernels.target import create_target
    from wpk.search.recorded import RecordedRunner
    from wpk.search.records import RecordStore
    from wpk.search.runner import IsolatedRunner
    from wpk.search.workers import MeasureWorker
    with MeasureWorker(QUICK) as worker:
        measurer = RecordedRunner(IsolatedRunner(worker=worker), RecordStore(sys.argv[1]),
                                  create_target("cpu").fingerprint())
        for spec in loop_candidates():
            measurer.measure(RELU_WORKLOAD, spec)
            print(worker.process.pid, flush=True)
            time.sleep(0.2)
""")


def running(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def loop_candidates() -> list[CandidateSpec]:
    """Six configs of the tunable kernel and a wrong kernel, in the loop's order."""
    tiled = [CandidateSpec(F.TILED.name, c, (FIXTURES,)) for c in F.TILED.configs(WORKLOAD)]
    return tiled + [CandidateSpec("test.worker.wrong", {}, (FIXTURES,))]


def recorded(path: Path, worker: MeasureWorker) -> RecordedRunner:
    """A runner through the records at `path`, measuring in `worker`."""
    return RecordedRunner(IsolatedRunner(options=QUICK, worker=worker), RecordStore(path),
                          create_target("cpu").fingerprint())


def run_tuning(path: Path, worker: MeasureWorker):
    """The whole loop in this process: measure every candidate, then pick the winner."""
    measurer = recorded(path, worker)
    results = [measurer.measure(WORKLOAD, spec) for spec in loop_candidates()]
    winner = measurer.finalize(WORKLOAD, k=2, factor=2)
    return measurer, results, winner


@pytest.mark.parametrize("interrupt", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_interrupted_tuning_resumes_and_a_complete_rebuild_measures_nothing(
        tmp_path, monkeypatch, interrupt):
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path / "cache"))
    with CompilePool(jobs=2) as pool:  # the compile step of a build, in parallel
        jobs = [CompileJob.c_source(F.tiled_source(s.config)) for s in loop_candidates()[:-1]]
        jobs.append(CompileJob.c_source(F.source_of("wrong")))
        assert all(r.ok for r in pool.compile(jobs, timeout_s=120))
    path = tmp_path / "db.jsonl"

    child = subprocess.Popen([sys.executable, "-c", TUNING_LOOP, str(path), current_isa()],
                             cwd=REPO,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    worker_pids = {int(child.stdout.readline()), int(child.stdout.readline())}
    os.kill(child.pid, interrupt)  # after two measurements, maybe within the third
    _, stderr = child.communicate(timeout=30)
    assert child.returncode == -interrupt  # Python re-raises an unhandled Ctrl-C's SIGINT
    assert ("KeyboardInterrupt" in stderr) == (interrupt == signal.SIGINT)
    deadline = time.monotonic() + 10   # a killed parent's worker gets its SIGKILL
    while any(running(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)               # asynchronously: soon, later on a busy machine
    assert not any(running(pid) for pid in worker_pids), "a worker outlived the loop"
    done_before = len(RecordStore(path))
    assert 2 <= done_before < len(loop_candidates()), "the loop was not interrupted midway"

    with MeasureWorker(QUICK) as worker:
        resumed, results, winner = run_tuning(path, worker)
    assert resumed.reused == done_before
    assert resumed.measured == len(loop_candidates()) - done_before + 2  # + 2 re-measured
    assert [r.status for r in results] == [Status.OK] * 6 + [Status.WRONG_ANSWER]
    store = RecordStore(path)
    search = [(r.impl, json.dumps(r.config, sort_keys=True)) for r in store
              if r.phase == "search"]
    assert len(search) == len(set(search)) == len(loop_candidates())  # each exactly once
    assert sum(r.phase == "final" for r in store) == 2
    assert winner is not None and winner.ok and winner.extra["phase"] == "final"

    idle = MeasureWorker(QUICK)  # never started unless something is measured
    rebuilt, again, same_winner = run_tuning(path, idle)
    assert (rebuilt.measured, idle.measurements, idle.starts) == (0, 0, 0)
    assert rebuilt.reused == len(loop_candidates())
    assert len(RecordStore(path)) == len(store)
    assert (same_winner.impl, dict(same_winner.config), same_winner.median_s) == \
        (winner.impl, dict(winner.config), winner.median_s)
    assert [m.status for m in again] == [m.status for m in results]


@dataclass
class NodeWorkload:
    node: str
    workload: Workload


MATMUL = Workload("MatMul", (TensorSpec((6, 8)), TensorSpec((8, 5))), (TensorSpec((6, 5)),),
                  const_inputs=(1,))


def test_planner_through_records_rebuilds_the_same_plan_with_zero_measurements(tmp_path):
    matmul = MATMUL
    nodes = [NodeWorkload("mm0", matmul), NodeWorkload("mm1", matmul), NodeWorkload("r", WORKLOAD)]
    options = PlanOptions(warmup=1, repeats=3, min_time=0.001)
    path = tmp_path / "db.jsonl"
    cpu = create_target("cpu")
    with MeasureWorker(QUICK) as worker:
        first = recorded(path, worker)
        planned = plan(nodes, cpu.candidates, first, options)
    assert first.measured == len(RecordStore(path)) >= 3 and first.reused == 0
    idle = MeasureWorker(QUICK)
    again = recorded(path, idle)
    replanned = plan(nodes, cpu.candidates, again, options)
    assert (again.measured, idle.starts) == (0, 0) and again.reused == first.measured
    assert [(c.candidate.label, c.measurement.median_s) for c in replanned] == \
        [(c.candidate.label, c.measurement.median_s) for c in planned]


def test_records_timed_with_other_kernel_code_are_measured_again(tmp_path, monkeypatch,
                                                                 request):
    """The fingerprint's codegen carries a digest of the kernel code (`codegen_version`): a
    rebuild after a kernel module changed measures again (its records verified and timed
    the old code); with the code as it was, the records are reused. Shown on a package of
    its own standing in for wpk's kernel packages."""
    from wpk.dsl.toolchain import CODEGEN_VERSION
    from wpk.kernels import target as target_module

    real = target_module.codegen_version()
    assert real.startswith(f"{CODEGEN_VERSION}+")
    assert create_target("cpu").fingerprint().codegen == real
    package = tmp_path / "code" / "stand_in_kernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "template.py").write_text("SOURCE = 'y[i] = a[i] * b[i];'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setattr(target_module, "KERNEL_CODE", ("stand_in_kernels",))
    request.addfinalizer(target_module.codegen_version.cache_clear)
    target_module.codegen_version.cache_clear()
    before = target_module.codegen_version()
    path = tmp_path / "db.jsonl"
    with MeasureWorker(QUICK) as worker:
        first = planned_through(path, worker)
    assert first.measured >= 1

    (package / "template.py").write_text("SOURCE = 'y[i] = a[i] + b[i];'\n")
    target_module.codegen_version.cache_clear()
    assert target_module.codegen_version() != before
    with MeasureWorker(QUICK) as worker:
        changed = planned_through(path, worker)
    assert (changed.reused, changed.measured) == (0, first.measured)

    (package / "template.py").write_text("SOURCE = 'y[i] = a[i] * b[i];'\n")
    target_module.codegen_version.cache_clear()
    assert target_module.codegen_version() == before
    idle = MeasureWorker(QUICK)
    again = planned_through(path, idle)
    assert (again.measured, again.reused, idle.starts) == (0, first.measured, 0)


def planned_through(path: Path, worker: MeasureWorker) -> RecordedRunner:
    """The runner of a plan of one MatMul through the records at `path`, measuring in
    `worker` what they lack."""
    runner = recorded(path, worker)
    plan([NodeWorkload("mm", MATMUL)], create_target("cpu").candidates, runner,
         PlanOptions(warmup=1, repeats=3, min_time=0.001))
    return runner


def test_the_planners_last_pass_measures_its_finalists_side_by_side_once(
        tmp_path, records_never_contended):
    """Records taken while searching are not reused by the last pass (their window's load
    differs from one to the next); the last pass's own records are, so a rebuild measures
    nothing, and searching again reuses them like any record."""
    matmul = MATMUL
    nodes = [NodeWorkload("mm", matmul), NodeWorkload("r", WORKLOAD)]
    options = PlanOptions(warmup=1, repeats=3, min_time=0.001)
    path = tmp_path / "db.jsonl"
    cpu = create_target("cpu")
    with MeasureWorker(QUICK) as worker:
        runner = recorded(path, worker)
        plan(nodes, cpu.candidates, runner, options)
        searched = runner.measured
        with runner.side_by_side():
            last = plan(nodes, cpu.candidates, runner, options)
        assert runner.phase == "search"
    assert (runner.measured, runner.reused) == (2 * searched, 0)
    phases = [r.phase for r in RecordStore(path)]
    assert phases == ["search"] * searched + ["plan"] * searched
    assert all(m.extra.get("from_record") is None for c in last for m in c.measurements)

    idle = MeasureWorker(QUICK)
    again = recorded(path, idle)
    with again.side_by_side():
        rebuilt = plan(nodes, cpu.candidates, again, options)
    assert (again.measured, idle.starts, again.reused) == (0, 0, searched)
    assert [(c.candidate.label, c.measurement.median_s) for c in rebuilt] == \
        [(c.candidate.label, c.measurement.median_s) for c in last]
    assert all(m.extra["phase"] == "plan" for c in rebuilt for m in c.measurements)


def test_a_measurement_under_an_explicit_tolerance_answers_only_that_tolerance(tmp_path):
    """The planner measures a node onnxruntime's own kernel misses the tolerance on again
    within twice onnxruntime's error (`wpk.plans.planner.loosened_tolerance`): such
    records carry their tolerance, are reused only by a request under the same one, and a
    default request (the search, another build) neither reuses nor ranks them."""
    tiled = loop_candidates()[0]
    path = tmp_path / "db.jsonl"
    loose, looser = dataclasses.replace(QUICK, tolerance=1e-3), \
        dataclasses.replace(QUICK, tolerance=2e-3)
    with MeasureWorker(QUICK) as worker:
        runner = recorded(path, worker)
        assert runner.measure(WORKLOAD, tiled, loose).ok
        only_loose = RecordStore(path)
        assert [(r.phase, r.extra["tolerance"]) for r in only_loose] == [("tolerance", 1e-3)]
        assert only_loose.best(WORKLOAD.key, runner.fingerprint) is None
        assert runner.best(WORKLOAD) is None
        assert runner.measure(WORKLOAD, tiled, loose).extra.get("from_record")
        assert runner.measured == 1
        runner.measure(WORKLOAD, tiled)       # the default tolerance: measured again
        runner.measure(WORKLOAD, tiled, looser)
        assert runner.run(WORKLOAD, [tiled], looser)[0].extra.get("from_record")
    assert (runner.measured, runner.reused) == (3, 2)
    store = RecordStore(path)
    assert [(r.phase, r.extra.get("tolerance")) for r in store] == \
        [("tolerance", 1e-3), ("search", None), ("tolerance", 2e-3)]
    assert store.best(WORKLOAD.key, runner.fingerprint).phase == "search"


def _search_then_final_records(path: Path, worker, nodes, options, scale: float):
    """A search pass through records at `path`, then each search record re-recorded in the
    final phase at `scale` times its time (what the last pass compares itself with)."""
    runner = recorded(path, worker)
    plan(nodes, create_target("cpu").candidates, runner, options)
    for rec in list(RecordStore(path)):
        if rec.ok:
            runner.database.commit(dataclasses.replace(rec, phase="final",
                                                       median_s=rec.median_s * scale))
    return runner


def _counting_inner(runner: RecordedRunner, monkeypatch) -> list[str]:
    """The workload keys of the inner runner's interleaved measurements, as they happen."""
    calls, inner = [], runner.runner.run_interleaved

    def counted(workload, *args, **kwargs):
        calls.append(workload.key)
        return inner(workload, *args, **kwargs)

    monkeypatch.setattr(runner.runner, "run_interleaved", counted)
    return calls


def test_a_last_pass_far_slower_than_the_search_is_measured_again_then_marked(
        tmp_path, monkeypatch):
    """The search's records of the same candidates 100x faster than the last pass measures
    them (as when a test suite ran beside the build): the first workload's finalists are
    measured again RETRIES times, the second's not (the machine is busy), both recorded as
    contended and listed; a rebuild measures them again instead of reusing them, and the
    build's summary says so."""
    monkeypatch.setattr(recorded_module, "CONTENDED_FLOOR_S", 0.0)
    monkeypatch.setattr(recorded_module, "CONTENDED_PAUSE_S", 0.0)
    nodes = [NodeWorkload("mm", MATMUL), NodeWorkload("r", WORKLOAD)]
    options = PlanOptions(warmup=1, repeats=3, min_time=0.001)
    path = tmp_path / "db.jsonl"
    with MeasureWorker(QUICK) as worker:
        runner = _search_then_final_records(path, worker, nodes, options, scale=0.01)
        calls = _counting_inner(runner, monkeypatch)
        with runner.side_by_side():
            plan(nodes, create_target("cpu").candidates, runner, options)
    keys = [MATMUL.key, WORKLOAD.key]
    assert calls == [keys[0]] * (1 + recorded_module.RETRIES) + [keys[1]]
    assert runner.contended == keys
    last = [r for r in RecordStore(path) if r.phase == "plan"]
    assert last and all(r.extra["contended"] >= recorded_module.CONTENDED for r in last if r.ok)

    again = recorded(path, MeasureWorker(QUICK))
    with again.side_by_side():
        plan(nodes, create_target("cpu").candidates, again, options)
    assert (again.measured, again.reused) == (len(last), 0)
    lines = search_lines({"search": {"search": "ga", "contended": keys}})
    assert any(line.startswith("warning: the last pass of 2 workloads ran at least 3x")
               for line in lines)


def test_a_last_pass_as_fast_as_the_search_is_measured_once(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded_module, "CONTENDED_FLOOR_S", 0.0)
    nodes = [NodeWorkload("mm", MATMUL), NodeWorkload("r", WORKLOAD)]
    options = PlanOptions(warmup=1, repeats=3, min_time=0.001)
    with MeasureWorker(QUICK) as worker:   # the search records 100x slower than now
        runner = _search_then_final_records(tmp_path / "db.jsonl", worker, nodes, options,
                                            scale=100.0)
        calls = _counting_inner(runner, monkeypatch)
        with runner.side_by_side():
            plan(nodes, create_target("cpu").candidates, runner, options)
    assert calls == [MATMUL.key, WORKLOAD.key] and runner.contended == []
    assert search_lines({"search": {"search": "ga", "contended": []}})[1:] == []


# ----------------------------------------------------------------------------- CLI views
def render(renderable) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_records_cli_list_best_and_merge(tmp_path):
    path = tmp_path / "db.jsonl"
    store = RecordStore(path)
    for rec in (record("fast", {"tile": 8}, 1e-4), record("slow", {}, 1e-3),
                record("broken", {}, None, Status.RUNTIME_ERROR,
                       message="worker killed by SIGSEGV")):
        store.commit(rec)
    text = render(records_list(path))
    assert "3 tuning records" in text and "fast[tile=8]" in text and "SIGSEGV" in text
    assert "Relu 64x64 -> 64x64" in text and "100.00" in text
    listed = [json.loads(line) for line in records_list(path, as_json=True).splitlines()]
    assert [r["impl"] for r in listed] == ["fast", "slow", "broken"]
    best = [json.loads(line) for line in
            records_best(path, workload=WORKLOAD.key[:6], as_json=True).splitlines()]
    assert [(b["impl"], b["median_s"]) for b in best] == [("fast", 1e-4)]
    assert "fast[tile=8]" in render(records_best(path))
    with pytest.raises(RecordError, match="no records of a workload"):
        records_list(path, workload="zzzz")
    with pytest.raises(RecordError, match="does not exist"):
        records_list(tmp_path / "nope.jsonl")
    summary = records_merge([path, path], tmp_path / "merged.jsonl")
    assert "6 records read, 3 written" in summary and "3 duplicates" in summary
