"""A build's connection to a Ray cluster (`--cluster`); Ray is imported only when asked.

    address = parse_address("local:3")         # checked without importing Ray
    with Connection(address) as connection:    # ray.init (and a local test cluster)
        ...                                    # wpk.search.ray_runner.RayRunner measures
    why = refusal(report, target.fingerprint())   # None: the node may measure

Addresses (`parse_address`):

* `ray://HOST:PORT`: Ray Client, from any machine that reaches the head's
  client server (port 10001 unless `ray start --ray-client-server-port` says otherwise);
* `auto`: the cluster that `ray start` started on this machine;
* `HOST:PORT`: the head's GCS address, from a machine of the cluster;
* `local:N`: a test cluster of N nodes on this machine (`ray.cluster_utils`),
  every process bound to 127.0.0.1, shut down with the build.

A node measures when it offers one unit of the custom resource
`MEASURE_RESOURCE` (`ray start --resources='{"wpk_measure": 1}'`; a `local:N`
node does): the measuring actor of a build holds it, so two trials, or two
builds, never measure on one machine at once. Before it measures, a node makes
the build target itself and reports its fingerprint and hardware model
(`NodeReport`); `refusal` says why a node whose fingerprint (device and ISA,
compiler, code generator: what tuning records are keyed by) or hardware model
(CPU model name, GPU preset) differs from the build target's may not measure,
naming both.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from wpk.core.errors import ClusterError, OptionError
from wpk.kernels.target import TargetFingerprint

MEASURE_RESOURCE = "wpk_measure"
INSTALL_HINT = ("install Ray with `pip install 'wpk[cluster]'` (on this machine and on every "
                "node), or build without --cluster")
ADDRESS_HINT = ("use ray://HOST:PORT (Ray Client), auto (the cluster `ray start` started here), "
                "HOST:PORT (the head's GCS address) or local:N (a test cluster of N nodes here)")
MAX_LOCAL_NODES = 16
CONNECT_TIMEOUT_S = 10.0
# The head's Ray Client proxy starts a server per client connection; that start sometimes
# fails at once on a busy machine (Ray logs a gRPC fork warning, the server's log stays
# empty; seen in this project's CI-sized test runs), and a new connection starts another.
CLIENT_SERVER_FAILED = "Starting Ray client server failed"
# The same start, failing inside the proxy itself: the new server process already a zombie
# when the proxy reads its command line (psutil.ZombieProcess; seen in a fresh-clone test run).
CLIENT_SERVER_ZOMBIE = "ZombieProcess"
TRANSIENT_CLIENT_FAILURES = (CLIENT_SERVER_FAILED, CLIENT_SERVER_ZOMBIE)
CLIENT_SERVER_RETRIES = 2
CLIENT_SERVER_PAUSE_S = 1.0
# Ray on Linux turns a loopback bootstrap address into the host's outward address, where a
# cluster bound to 127.0.0.1 does not listen; its loopback mode (Ray's default on macOS)
# keeps the driver on 127.0.0.1.
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed `--cluster` value: the text, and N for `local:N` (0 otherwise)."""

    text: str
    local_nodes: int = 0

    @property
    def host_port(self) -> tuple[str, int] | None:
        """(host, port) of `ray://HOST:PORT` and `HOST:PORT`; None for auto and local:N."""
        if self.local_nodes or self.text == "auto":
            return None
        host, _, port = self.text.removeprefix("ray://").rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def loopback(self) -> bool:
        """Whether the cluster is on this machine's loopback interface."""
        if self.local_nodes:
            return True
        found = self.host_port
        if found is None:
            return False
        if found[0] == "localhost":
            return True
        try:
            return ipaddress.ip_address(found[0]).is_loopback
        except ValueError:
            return False


def parse_address(text: str) -> ClusterAddress:
    """The `ClusterAddress` of a `--cluster` value (OptionError naming the forms it takes)."""
    value = str(text).strip()
    if value.startswith("local:"):
        count = value.removeprefix("local:")
        if not count.isdigit() or not 1 <= int(count) <= MAX_LOCAL_NODES:
            raise OptionError(f"--cluster {value}: N of local:N must be a whole number from 1 "
                              f"to {MAX_LOCAL_NODES}", hint="e.g. --cluster local:3")
        return ClusterAddress(value, int(count))
    if value == "auto":
        return ClusterAddress(value)
    host, sep, port = value.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"--cluster: cannot read '{value}'", hint=ADDRESS_HINT)
    return ClusterAddress(value)


def require_ray(loopback: bool = False):
    """The `ray` module, or an OptionError naming the `cluster` extra. `loopback`: keep
    the driver on 127.0.0.1 (see `LOOPBACK_SWITCH`)."""
    if loopback:
        os.environ[LOOPBACK_SWITCH] = "0"
    try:
        import ray
    except ImportError as exc:
        raise OptionError(f"--cluster needs Ray, which this Python cannot import ({exc})",
                          hint=INSTALL_HINT) from None
    if loopback:  # already imported before the switch was set: Ray reads it at import
        constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = False
    return ray


def check_reachable(address: ClusterAddress, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ClusterError when nothing listens at the address's HOST:PORT (Ray itself would
    retry for minutes)."""
    found = address.host_port
    if found is None:
        return
    try:
        socket.create_connection(found, timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"--cluster {address.text}: nothing answers at "
                           f"{found[0]}:{found[1]} ({exc.strerror or exc})",
                           hint="start the head with `ray start --head ...` and give its "
                                "address (`ray status` on the head prints it)") from None


def start_local_cluster(ray, nodes: int):
    """A `ray.cluster_utils.Cluster` of `nodes` nodes on 127.0.0.1, each with one CPU (for
    compile tasks) and one measuring slot."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a test cluster reports nothing
    node = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "include_dashboard": False,
            "resources": {MEASURE_RESOURCE: 1}}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


class Connection:
    """This process's connection to a cluster: `ray.init` (unless Ray is connected
    already) and, for `local:N`, the test cluster it starts; `close` undoes both."""

    def __init__(self, address: ClusterAddress):
        self.address = address
        self.ray = require_ray(address.loopback)
        self.local = None
        self._owns = False
        if address.local_nodes:
            self._start_local()
        else:
            check_reachable(address)
        if not self.ray.is_initialized():
            self._init()

    def _start_local(self) -> None:
        if self.ray.is_initialized():
            raise ClusterError(f"--cluster {self.address.text} starts a cluster of its own, "
                               "and this process is connected to Ray already",
                               hint="call ray.shutdown() first, or give the address of the "
                                    "cluster it is connected to")
        try:
            self.local = start_local_cluster(self.ray, self.address.local_nodes)
        except Exception as exc:  # Ray's own errors: ports, /tmp/ray, processes
            raise ClusterError(f"--cluster {self.address.text}: cannot start a local test "
                               f"cluster: {type(exc).__name__}: {exc}",
                               hint="check that Ray's temp folder (/tmp/ray, or "
                                    "$RAY_TMPDIR/ray) is writable and memory is free; "
                                    "`wpk --debug ...` shows Ray's traceback") from None

    def _init(self) -> None:
        target = self.local.address if self.local is not None else self.address.text
        for attempt in range(CLIENT_SERVER_RETRIES + 1):
            try:
                self.ray.init(address=target, logging_level=logging.ERROR,
                              log_to_driver=False, configure_logging=True)
                break
            except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
                # a connection that failed half-way (a Ray Client server that did not
                # start) can leave Ray's client context connected; the next Connection
                # would then skip ray.init and use it (seen as an internal error)
                self.ray.shutdown()
                transient = any(mark in str(exc) for mark in TRANSIENT_CLIENT_FAILURES)
                if attempt < CLIENT_SERVER_RETRIES and transient:
                    time.sleep(CLIENT_SERVER_PAUSE_S)
                    continue
                self.close()
                raise ClusterError(f"--cluster {self.address.text}: cannot connect: {exc}",
                                   hint="check the address (`ray status` on the head prints "
                                        "it) and that this machine runs the same Ray version"
                                   ) from None
        self._owns = True

    def close(self) -> None:
        """Disconnect (when this connection connected) and stop a local test cluster."""
        if self._owns:
            self.ray.shutdown()
            self._owns = False
        if self.local is not None:
            self.local.shutdown()
            self.local = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cluster_runner(target, address: str, options=None, seed: int = 0):
    """A `RayRunner` measuring for `target` (a `Target`) on the cluster at `address`
    (OptionError without Ray, ClusterError when no node can measure)."""
    connection = Connection(parse_address(address))
    try:
        from wpk.search.ray_runner import RayRunner

        return RayRunner(target, connection, options, seed)
    except BaseException:
        connection.close()
        raise


# ----------------------------------------------------------------------------- admission
@dataclass(frozen=True)
class NodeReport:
    """What a node says of itself: its id, host and address, and the fingerprint and
    hardware model (CPU model name, GPU preset) of the build target made there (or why it
    could not make it)."""

    node_id: str
    host: str
    ip: str
    fingerprint: dict[str, Any] | None
    error: str = ""
    model: str = ""

    @property
    def name(self) -> str:
        """'host/id prefix': how records and messages name the node."""
        return f"{self.host}/{self.node_id[:12]}"


def describe_fingerprint(data: dict[str, Any]) -> str:
    """A fingerprint's fields (and the hardware model, when given) on one line."""
    keys = ("device", "compiler", "codegen") + (("model",) if data.get("model") else ())
    return ", ".join(f"{k}={data.get(k)!r}" for k in keys)


def refusal(report: NodeReport, expected: TargetFingerprint,
            model: str | None = None) -> str | None:
    """Why the node of `report` may not measure for a target of fingerprint `expected` and
    hardware `model` (its fingerprint or model differs, or it cannot make the target);
    None when it may."""
    if report.error:
        return (f"node {report.name} ({report.ip}) cannot make the build target: "
                f"{report.error}")
    wanted = {**expected.to_json(), "model": model}
    found = {**(report.fingerprint or {}), "model": report.model}
    differs = [k for k in ("device", "compiler", "codegen", "model")
               if found.get(k) != wanted[k] and (k != "model" or model is not None)]
    if not differs:
        return None
    return (f"node {report.name} ({report.ip}) has a different {' and '.join(differs)}: its "
            f"fingerprint is [{describe_fingerprint(found)}], the build target's is "
            f"[{describe_fingerprint(wanted)}]; its measurements would not be comparable")
