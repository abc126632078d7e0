"""Distributed tuning on a Ray cluster, on one machine (issue 15).

The tests start a Ray cluster with `ray.cluster_utils.Cluster`, every process
bound to 127.0.0.1 (the head serving Ray Client too), and shut it down at the
end: a head and a second node that measure, with no CPU for Ray tasks, a
node that only compiles (one CPU, no measuring slot), each node with its own
compile cache, so every generated library is compiled on the compiling node
and has to travel to the node that measures it, and a node whose C compiler
reports another version, so its fingerprint differs from the build's and it
must be refused. Builds are a seeded random search on a tiny model (a convolution, a
pooling and a GEMM workload) with `wpk build --cluster HOST:PORT`; a local
build of the same search is the reference. Nothing here is timed: measured
times are noise on two shared cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import onnx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'wpk[cluster]')")
from wpk.core.devices import restricted_cpu_flags  # noqa: E402

if restricted_cpu_flags() is not None:   # pytest --isa avx2: the nodes see the real CPU
    pytest.skip("the cluster's nodes would see this CPU unrestricted, a different target",
                allow_module_level=True)
from ray.cluster_utils import Cluster  # noqa: E402

from tests import models  # noqa: E402
from tests.unit import worker_fixtures  # noqa: E402
from wpk.cli import main  # noqa: E402
from wpk.kernels.cpu.target import compiler_version  # noqa: E402
from wpk.kernels.jobs import CandidateSpec  # noqa: E402
from wpk.kernels.target import create_target  # noqa: E402
from wpk.plans.planfile import read_plan  # noqa: E402
from wpk.search import recorded  # noqa: E402
from wpk.search.cluster import MEASURE_RESOURCE, Connection, parse_address, require_ray  # noqa: E402
from wpk.search.measure import Status  # noqa: E402
from wpk.search.records import FINAL, SEARCH, config_key, read_records  # noqa: E402
from wpk.search.workers import MeasureOptions  # noqa: E402

# The module's tests share one Ray test cluster and kill its nodes in turn: with pytest-xdist
# they all run on one worker (`--dist loadgroup`), never split over two clusters at once.
pytestmark = pytest.mark.xdist_group("ray_cluster")

BUILD = ["--cpu", "--search", "random", "--trials", "6", "--no-partition", "-q"]
OTHER_COMPILER = "othercc (wpk cluster test) 1.0"
FAKE_CC = f"""#!/bin/sh
if [ "$1" = --version ]; then echo "{OTHER_COMPILER}"; exit 0; fi
exec gcc "$@"
"""
WAIT_S = 120.0
TEST_LIMIT_S = 240   # per test
HANG_TIMEOUT_S = 4.0


@pytest.fixture(autouse=True)
def time_limit():
    """Every test here ends within `TEST_LIMIT_S` (the module's test bed starts before,
    within Ray's own limits): a cluster that stops answering fails the test with a
    TimeoutError instead of hanging the suite."""
    def expire(signum, frame):
        raise TimeoutError(f"cluster test over its {TEST_LIMIT_S} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ClusterBed:
    """The test cluster: its address, its nodes by name, and their compile caches."""

    def __init__(self, root: Path):
        self.root = root
        self.nodes: dict[str, object] = {}
        self.cluster: Cluster | None = None
        self.client_port = 0

    def node_args(self, name: str, cpus: int = 1, measures: bool = True, **env: str) -> dict:
        cache = self.root / f"cache-{name}"
        return {"node_ip_address": "127.0.0.1", "num_cpus": cpus, "include_dashboard": False,
                "resources": {MEASURE_RESOURCE: 1} if measures else {},
                "env_vars": {"WPK_CACHE_DIR": str(cache), **env}}

    def add(self, name: str, cpus: int = 1, measures: bool = True, **env: str):
        args = self.node_args(name, cpus, measures, **env)
        if self.cluster is None:
            self.client_port = free_port()   # the head serves Ray Client (ray://) too
            self.cluster = Cluster(initialize_head=True,
                                   head_node_args={**args,
                                                   "ray_client_server_port": self.client_port})
            node = self.cluster.head_node
        else:
            node = self.cluster.add_node(**args)
        self.nodes[name] = node
        return node

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def label(self, name: str) -> str:
        """How records name a node ('host/id prefix')."""
        return f"{socket.gethostname()}/{self.nodes[name].node_id[:12]}"

    @property
    def address(self) -> str:
        return self.cluster.address


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    fake = root / "othercc"
    fake.write_text(FAKE_CC)
    fake.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        require_ray(loopback=True)  # the driver connects to 127.0.0.1 as the nodes listen
        bed = ClusterBed(root)
        try:
            try:
                bed.add("head", cpus=0)
            except Exception as exc:  # Ray's own processes (GCS, raylet) cannot start here
                pytest.skip(f"Ray cannot start a cluster on this machine: "
                            f"{type(exc).__name__}: {exc}")
            bed.add("second", cpus=0)
            bed.add("compiler", measures=False)   # where every compile task runs
            bed.add("other", cpus=0, CC=str(fake))  # refused: its compiler differs
            bed.cluster.wait_for_nodes()
            yield bed
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if bed.cluster is not None:
                bed.cluster.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(models.tiny_conv_gemm(), str(path))
    return path


def search_identities(db: Path) -> Counter:
    """(workload, implementation, config, status) of every search record of a file."""
    return Counter((r.workload_key, r.impl, config_key(r.config), r.status.value)
                   for r in read_records(db) if r.phase == SEARCH)


def steps(plan) -> list[tuple[str, str]]:
    return [(s["node"], s["workload_key"]) for s in plan.manifest["steps"]]


@pytest.fixture(scope="module")
def local_build(model_path, tmp_path_factory):
    """The same seeded random search on this machine alone: (records file, plan)."""
    folder = tmp_path_factory.mktemp("local")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WPK_CACHE_DIR", str(folder / "cache"))
        patch.setattr(recorded, "CONTENDED", float("inf"))   # as records_never_contended
        code = main(["build", str(model_path), *BUILD, "--db", str(folder / "local.jsonl"),
                     "-o", str(folder / "local.wpk")])
    assert code == 0
    return folder / "local.jsonl", read_plan(folder / "local.wpk")


def build_command(model_path: Path, db: Path, out: Path, address: str) -> list[str]:
    return [sys.executable, "-m", "wpk.cli", "build", str(model_path), *BUILD, "--db", str(db),
            "-o", str(out), "--cluster", address]


def wait_for(condition, what: str, timeout: float = WAIT_S) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.05)


def lines(path: Path) -> list[dict]:
    """The complete JSON lines of a records file being written."""
    if not path.exists():
        return []
    found = []
    for raw in path.read_bytes().split(b"\n")[:-1]:
        try:
            found.append(json.loads(raw))
        except ValueError:
            continue
    return found


def shipped_libraries(bed: ClusterBed, name: str) -> list[Path]:
    """Libraries in a node's compile cache without their C source: compiled elsewhere."""
    return [lib for lib in (bed.root / f"cache-{name}").glob("compile/c_*.so")
            if not lib.with_suffix(".c").exists()]


def test_cluster_build_matches_a_local_build(testbed, model_path, local_build, tmp_path,
                                             capsys, records_never_contended):
    local_db, local_plan = local_build
    db, out = tmp_path / "cluster.jsonl", tmp_path / "cluster.wpk"
    code = main(["build", str(model_path), *BUILD, "--db", str(db), "-o", str(out),
                 "--cluster", testbed.address])
    err = capsys.readouterr().err
    assert code == 0, err

    # The same candidates measured, with the same outcomes, each once.
    assert search_identities(db) == search_identities(local_db)
    records = list(read_records(db))
    measuring = {testbed.label("head"), testbed.label("second")}
    assert {r.extra["node"] for r in records} == measuring   # both measured, nothing else
    finals = [r for r in records if r.phase == FINAL]
    assert finals and len({r.extra["node"] for r in finals}) == 1   # re-measured on one node
    # Compiled only where a CPU is offered, measured where the measuring slots are.
    compiled = {lib.name for lib in (testbed.root / "cache-compiler").glob("compile/c_*.so")}
    shipped = {lib.name for node in ("head", "second") for lib in
               shipped_libraries(testbed, node)}
    assert shipped and shipped <= compiled, "no library travelled from the compiling node"

    # The node with another compiler was refused, both fingerprints named.
    refused = [line for line in err.splitlines() if line.startswith("warning: cluster: refused")]
    assert len(refused) == 1 and testbed.label("other") in refused[0]
    assert OTHER_COMPILER in refused[0] and compiler_version() in refused[0]
    plan = read_plan(out)
    summary = plan.report["search"]["cluster"]
    assert set(summary["nodes"]) == measuring and len(summary["refused"]) == 1
    assert steps(plan) == steps(local_plan)

    # The records are a local build's: a rebuild here from them measures nothing and
    # makes the cluster's plan.
    again = tmp_path / "again.wpk"
    assert main(["build", str(model_path), *BUILD, "--db", str(db), "-o", str(again)]) == 0
    rebuilt = read_plan(again)
    assert rebuilt.report["search"]["measured"] == 0
    assert rebuilt.manifest["steps"] == plan.manifest["steps"]


def test_wpk_op_measures_on_the_cluster_through_ray_client(testbed, tmp_path, capsys):
    db = tmp_path / "op.jsonl"
    client = f"ray://127.0.0.1:{testbed.client_port}"
    code = main(["op", "Gemm", "--shape", "A=4x16", "--shape", "B=16x8", "--search", "random",
                 "--trials", "3", "--db", str(db), "--json", "--cluster", client])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert set(report["search"]["cluster"]["nodes"]) == {testbed.label("head"),
                                                         testbed.label("second")}
    assert all(r.extra["node"] in report["search"]["cluster"]["nodes"]
               for r in read_records(db))


def test_a_node_killed_mid_build_loses_only_its_trials(testbed, model_path, local_build,
                                                       tmp_path):
    testbed.add("doomed")
    doomed = testbed.label("doomed")
    db, out = tmp_path / "killed.jsonl", tmp_path / "killed.wpk"
    build = subprocess.Popen(build_command(model_path, db, out, testbed.address),
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(r["extra"].get("node") == doomed for r in lines(db)),
                 "a measurement on the doomed node")
        assert build.poll() is None, "the build ended before the node could be killed"
        testbed.remove("doomed")
        _, err = build.communicate(timeout=WAIT_S)
    finally:
        build.kill()
    assert build.returncode == 0, err
    assert f"lost node {doomed}" in err
    assert search_identities(db) == search_identities(local_build[0])   # each exactly once
    assert any(doomed in lost for lost in read_plan(out).report["search"]["cluster"]["lost"])


def test_the_candidate_in_flight_on_a_killed_node_is_measured_on_another(testbed):
    """Deterministic where the build above is not: every node is busy with a candidate that
    hangs until its measurement times out when one node is killed, so that node's
    candidate is certainly in flight, and must come back measured by another node."""
    from wpk.search.ray_runner import RayRunner

    testbed.add("victim")
    testbed.cluster.wait_for_nodes()
    victim = testbed.label("victim")
    hang = CandidateSpec(worker_fixtures.IMPLEMENTATIONS["hang"].name, {},
                         ("tests.unit.worker_fixtures",))
    options = MeasureOptions(warmup=0, repeats=1, min_time=0.0, timeout_s=HANG_TIMEOUT_S)
    runner = RayRunner(create_target("cpu"), Connection(parse_address(testbed.address)),
                       options)
    found: list = []
    try:
        assert victim in runner.admitted and len(runner.nodes) == 3   # head, second, victim
        thread = threading.Thread(target=lambda: found.extend(
            runner.stream(worker_fixtures.RELU_WORKLOAD, [hang] * 3)), daemon=True)
        thread.start()
        wait_for(lambda: all(slot.busy is not None for slot in list(runner.nodes.values())),
                 "a candidate in flight on every node")
        testbed.remove("victim")
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive(), "the stream did not end"
        assert any(victim in lost for lost in runner.lost)
    finally:
        runner.close()
    assert sorted(index for index, _ in found) == [0, 1, 2]   # the victim's one too
    assert all(m.status == Status.TIMEOUT for _, m in found), [m.message for _, m in found]
    nodes = Counter(m.extra["node"] for _, m in found)
    assert set(nodes) == {testbed.label("head"), testbed.label("second")}, nodes
    assert not ray.is_initialized()


def test_a_killed_build_resumes_from_its_records(testbed, model_path, local_build, tmp_path,
                                                 capsys, records_never_contended):
    db, out = tmp_path / "resumed.jsonl", tmp_path / "resumed.wpk"
    first = subprocess.Popen(build_command(model_path, db, out, testbed.address),
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(lines(db)) >= 8, "8 records")
        assert first.poll() is None, "the build ended before it could be killed"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
    kept = len(lines(db))
    assert not out.exists()

    code = main(["build", str(model_path), *BUILD, "--db", str(db), "-o", str(out),
                 "--cluster", testbed.address])
    assert code == 0, capsys.readouterr().err
    search = read_plan(out).report["search"]
    assert search["reused"] >= kept and search["measured"] > 0
    assert search_identities(db) == search_identities(local_build[0])   # nothing twice

    again = tmp_path / "again.wpk"
    assert main(["build", str(model_path), *BUILD, "--db", str(db), "-o", str(again),
                 "--cluster", testbed.address]) == 0
    assert read_plan(again).report["search"]["measured"] == 0


def test_wpk_tune_with_no_node_that_has_the_gpu_is_an_error(testbed, model_path, tmp_path,
                                                            capsys):
    plan = tmp_path / "h100.wpk"   # predicted for an H100, which no node here has
    assert main(["build", str(model_path), "--gpu", "h100", "--offline", "-o", str(plan),
                 "-q"]) == 0
    capsys.readouterr()
    assert main(["tune", str(plan), "--cluster", testbed.address]) == 2
    err = capsys.readouterr().err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "no node of cluster" in error[0], err
    assert error[0].count("cannot make the build target") == 3 and "h100" in error[0]
    assert "hint:" in err and "Traceback" not in err
    assert not ray.is_initialized()


def processes_mentioning(text: str) -> list[int]:
    """Ids of this machine's processes whose command line contains `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:   # ended meanwhile, or not ours to read
            continue
    return found


def test_a_local_test_cluster_starts_measures_and_stops_with_the_command():
    # A Ray temp folder of its own (short: Ray's socket paths must fit 107 bytes) tells
    # this cluster's processes from the test bed's.
    with tempfile.TemporaryDirectory(prefix="wr", dir="/tmp") as ray_tmp:
        done = subprocess.run(
            [sys.executable, "-m", "wpk.cli", "op", "Relu", "--shape", "X=64x64", "--search",
             "none", "--json", "--cluster", "local:2"],
            capture_output=True, text=True, timeout=WAIT_S,
            env=dict(os.environ, RAY_TMPDIR=ray_tmp))
        if "cannot start a local test cluster" in done.stderr:
            pytest.skip(f"Ray cannot start a cluster on this machine: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        cluster = json.loads(done.stdout)["search"]["cluster"]
        assert cluster["address"] == "local:2" and len(cluster["nodes"]) == 2
        assert "cluster: measuring on 2 node(s)" in done.stderr
        assert any(Path(ray_tmp).rglob("raylet*")), "the cluster did not use its temp folder"
        wait_for(lambda: not processes_mentioning(ray_tmp), "the local cluster to stop",
                 timeout=30)


def test_a_local_test_cluster_that_cannot_start_is_one_error_line(tmp_path):
    unusable = tmp_path / "file"
    unusable.write_text("not a folder")
    done = subprocess.run(
        [sys.executable, "-m", "wpk.cli", "op", "Relu", "--shape", "X=8x8", "--cluster",
         "local:1"], capture_output=True, text=True, timeout=WAIT_S,
        env=dict(os.environ, RAY_TMPDIR=str(unusable)))
    assert done.returncode == 2, done.stderr
    error, hint = done.stderr.strip().splitlines()
    assert error.startswith("error: --cluster local:1: cannot start a local test cluster: ")
    assert hint.startswith("hint:") and "RAY_TMPDIR" in hint


def test_local_n_in_a_process_connected_to_ray_already_is_an_error(testbed, capsys):
    ray.init(address=testbed.address, log_to_driver=False)
    try:
        code = main(["op", "Relu", "--shape", "X=8x8", "--cluster", "local:2"])
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    assert code == 2 and "error: --cluster local:2 starts a cluster of its own" in err, err
    assert "hint: call ray.shutdown() first" in err and "Traceback" not in err


def test_a_killed_ray_head_ends_the_build_with_an_error_and_it_resumes_locally(
        model_path, local_build, tmp_path, capsys):
    """The head node of the cluster (its GCS) killed mid-build: the build stops with one
    `error:` line and the resume hint (Ray would end it a little later with a log line),
    its records are complete, and the same command without --cluster finishes the search
    as a local build would have."""
    bed = ClusterBed(tmp_path)
    db, out = tmp_path / "headless.jsonl", tmp_path / "headless.wpk"
    try:
        bed.add("head")
        bed.add("second")
        bed.cluster.wait_for_nodes()
        address = bed.address
        build = subprocess.Popen(build_command(model_path, db, out, address),
                                 stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, RAY_gcs_rpc_server_reconnect_timeout_s="15"))
        try:
            wait_for(lambda: len(lines(db)) >= 8, "8 records")
            assert build.poll() is None, "the build ended before the head could be killed"
            bed.remove("head")
            _, err = build.communicate(timeout=WAIT_S)
        finally:
            build.kill()
    finally:
        bed.cluster.shutdown()
    assert build.returncode == 2, err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"lost the head of cluster {address}" in error[0], err
    assert "hint: the records so far are kept" in err and "Traceback" not in err
    kept = len(lines(db))
    assert not out.exists()

    assert main(["build", str(model_path), *BUILD, "--db", str(db), "-o", str(out)]) == 0
    search = read_plan(out).report["search"]
    assert search["reused"] >= kept and "cluster" not in search
    assert search_identities(db) == search_identities(local_build[0])   # nothing twice
