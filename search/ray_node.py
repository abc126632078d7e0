"""What runs on the nodes of a Ray cluster for `wpk.search.ray_runner.RayRunner`.

    ref = compile_remote.remote(job)          # a CompileJob, wherever Ray places it
    actor = NodeMeasurer.options(...).remote(target.name, target.create_options(),
                                             options, seed)
    report = ray.get(actor.describe.remote())  # NodeReport: the target's fingerprint here
    m = ray.get(actor.measure.remote(workload, spec, options, seed, [ref]))

A compile task returns the library it built as bytes with its path inside the
compile cache (`artifact_of`); the measuring node writes it into its own cache
(`install_artifact`) before measuring, so its `prepare` finds it there. The
measuring actor keeps one `IsolatedRunner` (wpk's worker process) for the
build and tags every measurement with its node (`extra["node"]`).
"""

from __future__ import annotations

import importlib
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from wpk.core.errors import WpkError
from wpk.core.workload import Workload
from wpk.dsl.toolchain import atomic_write, cache_root
from wpk.kernels.jobs import CandidateSpec, CompileJob
from wpk.kernels.target import create_target
from wpk.search.cluster import NodeReport
from wpk.search.measure import Measurement
from wpk.search.runner import IsolatedRunner
from wpk.search.workers import MeasureOptions

COMPILE_WAIT_S = 300.0     # how long a measuring node waits for a remote compile


def artifact_of(result: Any) -> tuple[str, bytes] | None:
    """(path relative to the compile cache's root, bytes) of what a compile job returned,
    when that is a file in this machine's compile cache; else None."""
    if not isinstance(result, str):
        return None
    root = cache_root().resolve()
    path = Path(result).resolve()
    if root not in path.parents or not path.is_file():
        return None
    return str(path.relative_to(root)), path.read_bytes()


def install_artifact(artifact: tuple[str, bytes] | None) -> None:
    """Put a library compiled on another node where this node's compile cache has it."""
    if artifact is None:
        return
    relative, data = artifact
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        return
    path = cache_root() / relative
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)


@ray.remote(num_cpus=1, max_retries=2)
def compile_remote(job: CompileJob) -> tuple[str, bytes] | None:
    """Run a compile job on the node Ray placed it on: the library as `artifact_of` gives it,
    or None when it failed (the measuring node's `prepare` then says why)."""
    module, _, name = job.function.partition(":")
    try:
        result = getattr(importlib.import_module(module), name)(**dict(job.kwargs))
    except Exception:  # reported where the candidate is measured
        return None
    return artifact_of(result)


@ray.remote(num_cpus=0, max_restarts=0)
class NodeMeasurer:
    """A build's measuring actor on one node (it holds the node's `wpk_measure` slot):
    makes the build target there and reports it, then measures one candidate at a time in
    the node's isolated worker process."""

    def __init__(self, target_name: str, target_options: dict, options: MeasureOptions,
                 seed: int):
        self.target_name = target_name
        self.target_options = dict(target_options)
        self.options = options
        self.seed = seed
        self.timer = "host"
        self.runner: IsolatedRunner | None = None
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = socket.gethostname()
        self.name = f"{self.host}/{self.node_id[:12]}"

    def describe(self) -> NodeReport:
        """This node, and the fingerprint and hardware model of the build target made
        here."""
        ip = ray.util.get_node_ip_address()
        try:
            target = create_target(self.target_name, **self.target_options)
            fingerprint = target.fingerprint().to_json()
        except WpkError as exc:
            return NodeReport(self.node_id, self.host, ip, None, exc.message)
        except Exception as exc:  # reported as the reason this node cannot measure
            return NodeReport(self.node_id, self.host, ip, None, f"{type(exc).__name__}: {exc}")
        self.timer = target.timer
        return NodeReport(self.node_id, self.host, ip, fingerprint,
                          model=target.hardware.description)

    def measure(self, workload: Workload, spec: CandidateSpec, options: MeasureOptions,
                seed: int, compiled: list | None) -> Measurement:
        """One candidate in this node's isolated worker, tagged with the node."""
        install_artifact(self._artifact(compiled))
        if self.runner is None:
            self.runner = IsolatedRunner(self.timer, self.options, self.seed)
        measurement = self.runner.measure(workload, spec, options, seed)
        return replace(measurement, extra={**measurement.extra, "node": self.name})

    @staticmethod
    def _artifact(compiled: list | None) -> tuple[str, bytes] | None:
        if not compiled:
            return None
        try:
            return ray.get(compiled[0], timeout=COMPILE_WAIT_S)
        except RayError:  # lost or too slow: prepare compiles it here
            return None

    def close(self) -> None:
        """End the worker process."""
        if self.runner is not None:
            self.runner.close()
