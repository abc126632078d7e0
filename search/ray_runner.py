"""Measuring on a Ray cluster: many nodes measure, the build's process plans and records.

    runner = create_runner(target, cluster="ray://head:10001")   # a RayRunner
    with runner:
        for index, m in runner.stream(workload, specs): ...   # on every admitted node
        m = runner.measure(workload, spec)                      # on the reference node

Imported only for `--cluster` (it imports Ray; `wpk.search.cluster` checks first).

Nodes. At start, every live node offering the `wpk_measure` resource gets a
`NodeMeasurer` actor, pinned to it and holding that resource, which makes the
build target on its node and reports the fingerprint (`NodeReport`). A node
whose fingerprint differs from the build target's is refused with a message
naming both (`wpk.search.cluster.refusal`) and never measures. Nodes that join
later are admitted the same way between measurements.

Compiling. A generated candidate's compile job (`GeneratedKernels.compile_jobs`)
runs as a Ray task needing one CPU, wherever Ray's scheduler puts it (this
machine first, then the least loaded nodes). The library comes back as bytes
and the measuring node puts it in its own compile cache before measuring, so
its `prepare` finds it there; a node that misses it (no CPU in the cluster, a
job that returns no file) compiles it itself, and a failed compile is reported
by the node's `prepare` as a compile_error, as on one machine.

Measuring. One candidate at a time per node, in the node's `IsolatedRunner`
(wpk's worker process: a crash, a hang or a wrong answer is a measurement),
with the seed the candidate has on one machine. `stream` keeps every admitted
node busy and hands each measurement back as it arrives, tagged with its node
(`extra["node"]`, 'host/node id'). A node that dies, or whose actor dies or
stops answering, loses only its in-flight candidate, which goes back to the
queue for another node (after `MAX_TRIES` such losses it is a runtime_error);
a node still alive gets a fresh actor. `measure`, one candidate alone (the final
re-measurement of the top candidates, `RecordedRunner.finalize`), always runs
on one node, the reference node, so the times that pick a winner are comparable.

The head. Ray ends a driver whose head (its GCS) is gone for a minute, and Ray
calls that need the head wait for it meanwhile; `HeadWatch` ends the build a
little sooner with an `error:` line and the resume hint (exit 2).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from wpk.core.errors import ClusterError
from wpk.core.workload import Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.target import Target
from wpk.search.cluster import MEASURE_RESOURCE, Connection, NodeReport, refusal
from wpk.search.measure import Measurement, Status
from wpk.search.ray_node import COMPILE_WAIT_S, NodeMeasurer, compile_remote
from wpk.search.records import config_key
from wpk.search.runner import AnyCandidate, Runner, failed
from wpk.search.workers import MeasureOptions

MAX_TRIES = 3              # losses of one candidate with its node before it is a runtime_error
MAX_ACTOR_STARTS = 3       # measuring actors made on one node (the first, then after losses)
STARTUP_TIMEOUT_S = 60.0   # for the nodes' actors to start and report
SCAN_INTERVAL_S = 5.0      # between looks for nodes that joined or came back
HEAD_CHECK_S = 2.0         # between looks at the head's GCS port (and how long one may take)
POLL_S = 0.5               # how long one wait for a result lasts
MAX_PENDING_COMPILES = 256   # compiled libraries held here for candidates not yet measured
NODE_HINT = ("start measuring nodes on machines like this one (same CPU or GPU, compiler and "
             "wpk) with `ray start --address=HEAD:6379 --resources='{\"wpk_measure\": 1}'`")
RESUME_HINT = ("the records so far are kept (--db): rerun the same command to resume, with "
               "the cluster back or without --cluster")


# ----------------------------------------------------------------------------- the driver
@dataclass
class Slot:
    """An admitted node: what it reported, its actor, and its running measurement."""

    report: NodeReport
    actor: Any
    busy: Any = None       # ObjectRef of the measurement it runs
    since: float = 0.0


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def _kill(actor: Any) -> None:
    with contextlib.suppress(Exception):  # already gone with its node
        ray.kill(actor)


def _gcs_address() -> str | None:
    """HOST:PORT of the cluster's GCS on its head, when this driver knows it."""
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # Ray Client: the driver runs on the head, not here
        return None


def head_grace_s() -> float:
    """How long the head's GCS may stay silent before `HeadWatch` ends the build: a little
    less than Ray waits (`RAY_gcs_rpc_server_reconnect_timeout_s`, 60 s by default) before
    it ends the process itself, with its own message."""
    try:
        ray_waits = float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", 60))  # noqa: SIM112
    except ValueError:
        ray_waits = 60.0
    return max(HEAD_CHECK_S * 2, ray_waits - 10.0)


class HeadWatch:
    """A thread that looks at the head's GCS port every `HEAD_CHECK_S`; when it has not
    answered for `grace_s`, it ends this process with an `error:` line and the resume hint
    (exit 2), as Ray would moments later with a log line and exit 1: Ray calls that need the
    head wait for it meanwhile, so the build cannot say it. The records are complete (one
    fsync per record; a torn last line is skipped when read)."""

    def __init__(self, address: str, gcs: str, grace_s: float):
        host, _, port = gcs.rpartition(":")
        self.address, self.gcs, self.grace_s = address, (host, int(port)), grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="wpk-head-watch", daemon=True)
        self._thread.start()

    def answers(self) -> bool:
        """Whether the GCS accepts a connection now."""
        try:
            socket.create_connection(self.gcs, timeout=HEAD_CHECK_S).close()
        except OSError:
            return False
        return True

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(HEAD_CHECK_S):
            if self.answers():
                last = time.monotonic()
            elif time.monotonic() - last >= self.grace_s and not self._stop.is_set():
                sys.stderr.write(f"error: lost the head of cluster {self.address}: its GCS at "
                                 f"{self.gcs[0]}:{self.gcs[1]} has not answered for "
                                 f"{self.grace_s:.0f} s\nhint: {RESUME_HINT}\n")
                sys.stderr.flush()
                os._exit(2)

    def stop(self) -> None:
        """End the watch (the build is closing its connection)."""
        self._stop.set()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class RayRunner(Runner):
    """Measures on the admitted nodes of a cluster (module docstring); closing it ends its
    actors and `connection`."""

    compiles = True

    def __init__(self, target: Target, connection: Connection,
                 options: MeasureOptions | None = None, seed: int = 0,
                 log: Callable[[str], None] | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        super().__init__(options, seed)
        self.target = target
        self.connection = connection
        self.expected = target.fingerprint()
        self.log = log or _stderr
        self.startup_timeout_s = startup_timeout_s
        self.nodes: dict[str, Slot] = {}              # node id -> admitted slot
        self.pending: dict[Any, tuple[str, Any]] = {}  # describe ref -> (node id, actor)
        self.refused: dict[str, str] = {}             # node id -> why
        self.lost: list[str] = []
        self.admitted: list[str] = []
        self.starts: Counter[str] = Counter()
        self.compiled: dict[tuple[str, str, str], list] = {}
        self.reference: str | None = None
        self._next_scan = 0.0
        gcs = _gcs_address()
        self.watch = (HeadWatch(connection.address.text, gcs, head_grace_s())
                      if gcs and ":" in gcs else None)
        try:
            self.remote_compile = ray.cluster_resources().get("CPU", 0) >= 1
            self._start()
        except BaseException:
            self.close()
            raise

    # --------------------------------------------------------------------- nodes
    def _start(self) -> None:
        self._discover()
        give_up = time.monotonic() + self.startup_timeout_s
        while self.pending and time.monotonic() < give_up:
            self._admit(min(POLL_S * 4, max(0.0, give_up - time.monotonic())))
        if not self.nodes:
            raise ClusterError(self._none_left(), hint=NODE_HINT)
        waiting = ", ".join(node[:12] for node, _ in self.pending.values())
        self.log(f"cluster: measuring on {len(self.nodes)} node(s): "
                 f"{', '.join(s.report.name for s in self.nodes.values())}"
                 + (f"; still starting: {waiting}" if waiting else ""))

    def _none_left(self) -> str:
        text = f"no node of cluster {self.connection.address.text} can measure for this build"
        reasons = list(self.refused.values()) + self.lost
        if reasons:
            return f"{text}: " + "; ".join(reasons)
        return f"{text}: no live node offers the '{MEASURE_RESOURCE}' resource"

    def _discover(self) -> None:
        """Start an actor on every live measuring node that has none."""
        starting = {node for node, _ in self.pending.values()}
        for node in ray.nodes():
            node_id = node["NodeID"]
            if (not node.get("Alive") or node.get("Resources", {}).get(MEASURE_RESOURCE, 0) < 1
                    or node_id in self.nodes or node_id in self.refused
                    or node_id in starting or self.starts[node_id] >= MAX_ACTOR_STARTS):
                continue
            self.starts[node_id] += 1
            actor = NodeMeasurer.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                resources={MEASURE_RESOURCE: 1},
            ).remote(self.target.name, self.target.create_options(), self.options, self.seed)
            self.pending[actor.describe.remote()] = (node_id, actor)

    def _admit(self, timeout: float) -> None:
        """Admit or refuse the nodes whose actors reported within `timeout` seconds."""
        if not self.pending:
            return
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        for ref in ready:
            node_id, actor = self.pending.pop(ref)
            try:
                report = ray.get(ref)
            except RayError as exc:
                self._refuse(node_id, actor, f"node {node_id[:12]} cannot measure: its "
                                             f"measuring actor failed ({_last_line(exc)})")
                continue
            why = refusal(report, self.expected, self.target.hardware.description)
            if why is not None:
                self._refuse(node_id, actor, why)
                continue
            self.nodes[node_id] = Slot(report, actor)
            if report.name not in self.admitted:
                self.admitted.append(report.name)
            if self.reference is None:
                self.reference = node_id

    def _refuse(self, node_id: str, actor: Any, why: str) -> None:
        self.refused[node_id] = why
        self.log(f"warning: cluster: refused {why}")
        _kill(actor)

    def _lose(self, slot: Slot, why: str) -> None:
        """Drop a node whose actor died or stopped answering (a live node gets a new one)."""
        node_id = slot.report.node_id
        self.nodes.pop(node_id, None)
        self.lost.append(f"lost node {slot.report.name}: {why}")
        self.log(f"warning: cluster: lost node {slot.report.name} ({why}); "
                 "its candidate goes to another node")
        _kill(slot.actor)
        if self.reference == node_id:
            self.reference = None
        self._next_scan = 0.0

    def _refresh(self) -> None:
        if time.monotonic() >= self._next_scan:
            self._discover()
            self._next_scan = time.monotonic() + SCAN_INTERVAL_S
        self._admit(0)

    def _await_slot(self) -> None:
        """Wait until some admitted node is free; ClusterError when none can come."""
        give_up = time.monotonic() + self.startup_timeout_s
        while not any(slot.busy is None for slot in self.nodes.values()):
            if self.nodes:
                self._collect({})
                continue
            self._next_scan = 0.0
            self._refresh()
            if not self.pending or time.monotonic() > give_up:
                raise ClusterError(self._none_left(), hint=RESUME_HINT)
            self._admit(POLL_S)

    @property
    def slots(self) -> int:
        """Admitted nodes: each measures one candidate at a time."""
        return max(1, len(self.nodes))

    # --------------------------------------------------------------------- measuring
    def _compile(self, workload: Workload, spec: CandidateSpec) -> list | None:
        """[ObjectRef] of the candidate's remote compile (submitted once), or None when it
        has no compile job or the cluster no CPU to run one."""
        generated = self.target.family(spec.impl)
        if not self.remote_compile or generated is None:
            return None
        key = self._compile_key(workload, spec)
        if key not in self.compiled:
            job = generated.compile_jobs(workload, [spec.config])[0]
            if len(self.compiled) >= MAX_PENDING_COMPILES:
                self.compiled.pop(next(iter(self.compiled)))
            self.compiled[key] = [compile_remote.remote(job)]
        return self.compiled[key]

    @staticmethod
    def _compile_key(workload: Workload, spec: CandidateSpec) -> tuple[str, str, str]:
        return workload.key, spec.impl, config_key(spec.config)

    def _forget(self, workload: Workload, spec: CandidateSpec) -> None:
        """Drop a measured candidate's library (a later measurement compiles it again,
        from the compiling node's cache)."""
        self.compiled.pop(self._compile_key(workload, spec), None)

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        """Start compiling the generated candidates on the cluster."""
        for candidate in candidates:
            self._compile(workload, CandidateSpec.of(candidate))

    def _call_timeout(self, options: MeasureOptions | None) -> float:
        return (options or self.options).timeout_s + COMPILE_WAIT_S + 60.0

    def _submit(self, slot: Slot, workload: Workload, spec: CandidateSpec,
                options: MeasureOptions, seed: int) -> Any:
        slot.busy = slot.actor.measure.remote(workload, spec, options, seed,
                                              self._compile(workload, spec))
        slot.since = time.monotonic()
        return slot.busy

    def _collect(self, running: dict[Any, int]) -> list[tuple[Any, Measurement | str]]:
        """Wait up to `POLL_S` for a node to finish: (ref, measurement, or why it was lost)
        for the refs of `running` that ended; results of other refs (a closed stream's)
        are dropped. A node past its call timeout is lost."""
        busy = {slot.busy: slot for slot in self.nodes.values() if slot.busy is not None}
        if not busy:
            return []
        ready, _ = ray.wait(list(busy), num_returns=1, timeout=POLL_S)
        ended: list[tuple[Any, Measurement | str]] = []
        for ref in ready:
            slot = busy.pop(ref)
            slot.busy = None
            try:
                outcome: Measurement | str = ray.get(ref)
            except RayError as exc:
                outcome = _last_line(exc)
                self._lose(slot, outcome)
            if ref in running:
                ended.append((ref, outcome))
        now = time.monotonic()
        for ref, slot in busy.items():
            limit = self._call_timeout(None)
            if now - slot.since > limit:
                why = f"no answer within {limit:.0f} s"
                self._lose(slot, why)
                if ref in running:
                    ended.append((ref, why))
        return ended

    def _pick(self, queue: deque, compiled: list) -> int:
        """The next queued candidate to measure: the first whose compile is done (or that
        needs none), else the first."""
        refs = {id(compiled[i][0]): compiled[i][0] for i in queue if compiled[i]}
        finished: set[int] = set()
        if refs:
            done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
            finished = {id(ref) for ref in done}
        for index in queue:
            if compiled[index] is None or id(compiled[index][0]) in finished:
                queue.remove(index)
                return index
        return queue.popleft()

    def stream(self, workload: Workload, candidates: Sequence[AnyCandidate],
               options: MeasureOptions | None = None, deadline: float | None = None
               ) -> Iterator[tuple[int, Measurement]]:
        """(index, measurement) as each node finishes; every free admitted node gets the
        next candidate; none starts after `deadline` once one is done (a closed stream's
        in-flight candidates finish on their nodes and are dropped)."""
        options = options or self.options
        specs = [CandidateSpec.of(c) for c in candidates]
        compiled = [self._compile(workload, spec) for spec in specs]
        queue = deque(range(len(specs)))
        losses: Counter[int] = Counter()
        running: dict[Any, int] = {}
        done = 0
        while queue or running:
            self._refresh()
            late = deadline is not None and time.monotonic() >= deadline
            room = 0 if late and (done or running) else (1 if late else len(queue))
            for slot in [s for s in self.nodes.values() if s.busy is None][:room]:
                if not queue:
                    break
                index = self._pick(queue, compiled)
                ref = self._submit(slot, workload, specs[index], options,
                                   self.seed_of(workload, specs[index]))
                running[ref] = index
            if not running:
                if not queue or late and done:
                    return
                self._await_slot()
                continue
            for ref, outcome in self._collect(running):
                index = running.pop(ref)
                if isinstance(outcome, Measurement):
                    self._forget(workload, specs[index])
                    done += 1
                    yield index, outcome
                    continue
                losses[index] += 1
                if losses[index] < MAX_TRIES:
                    queue.appendleft(index)
                    continue
                done += 1
                yield index, failed(workload, specs[index], Status.RUNTIME_ERROR,
                                    f"lost with its node {MAX_TRIES} times (last: {outcome})")

    def run(self, workload: Workload, candidates: Sequence[AnyCandidate],
            options: MeasureOptions | None = None) -> list[Measurement]:
        """One measurement per candidate, in order, measured across the nodes."""
        found = dict(self.stream(workload, candidates, options))
        return [found[index] for index in range(len(candidates))]

    def _reference_slot(self) -> Slot:
        """The node that measures candidates alone, once it is free (a new one when it is
        lost)."""
        while True:
            slot = self.nodes.get(self.reference) if self.reference else None
            if slot is None:
                if not self.nodes:
                    self._await_slot()
                self.reference = next(iter(self.nodes))
                continue
            if slot.busy is None:
                return slot
            self._collect({})

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        """One candidate alone, on the reference node (final re-measurements are comparable)."""
        spec = CandidateSpec.of(candidate)
        seed = self.seed_of(workload, spec) if seed is None else seed
        why = ""
        for _ in range(MAX_TRIES):
            slot = self._reference_slot()
            ref = self._submit(slot, workload, spec, options or self.options, seed)
            try:
                measurement = ray.get(ref, timeout=self._call_timeout(options))
                self._forget(workload, spec)
                return measurement
            except GetTimeoutError:
                why = f"no answer within {self._call_timeout(options):.0f} s"
                self._lose(slot, why)
            except RayError as exc:
                why = _last_line(exc)
                self._lose(slot, why)
            finally:
                slot.busy = None
        return failed(workload, spec, Status.RUNTIME_ERROR,
                      f"lost with its node {MAX_TRIES} times (last: {why})")

    # --------------------------------------------------------------------- the rest
    def summary(self) -> dict:
        """Where it measured, for the build report: address, admitted, refused and lost
        nodes, and the reference node of the final re-measurements."""
        reference = self.nodes.get(self.reference) if self.reference else None
        return {"address": self.connection.address.text, "nodes": list(self.admitted),
                "refused": list(self.refused.values()), "lost": list(self.lost),
                "reference": None if reference is None else reference.report.name}

    def close(self) -> None:
        """End the actors (each closes its worker process) and the connection."""
        if self.watch is not None:
            self.watch.stop()
        slots = list(self.nodes.values())
        closing = [slot.actor.close.remote() for slot in slots]
        if closing:
            with contextlib.suppress(RayError):
                ray.wait(closing, num_returns=len(closing), timeout=10)
        for actor in [s.actor for s in slots] + [a for _, a in self.pending.values()]:
            _kill(actor)
        self.nodes.clear()
        self.pending.clear()
        self.connection.close()
