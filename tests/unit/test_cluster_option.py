"""`--cluster` without a cluster: address parsing, the node fingerprint check, Ray imported
only with the flag, and a clear error when Ray is not installed (issue 15)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import onnx
import pytest

from tests import models
from wpk.cli import main
from wpk.core.errors import OptionError
from wpk.kernels.target import TargetFingerprint, create_target
from wpk.search.cluster import NodeReport, parse_address, refusal

ROOT = Path(__file__).resolve().parents[2]
FINGERPRINT = TargetFingerprint("cpu:x86_64:avx2,fma", "gcc (Debian 12.2.0-14) 12.2.0", "3")


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (its own imports, its own sys.modules)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("text, local, host_port, loopback", [
    ("local:3", 3, None, True),
    ("auto", 0, None, False),
    ("ray://10.0.0.5:10001", 0, ("10.0.0.5", 10001), False),
    ("127.0.0.1:6379", 0, ("127.0.0.1", 6379), True),
    ("localhost:6379", 0, ("localhost", 6379), True),
    ("head.example:6379", 0, ("head.example", 6379), False),
])
def test_cluster_addresses_parse(text, local, host_port, loopback):
    address = parse_address(text)
    assert (address.local_nodes, address.host_port, address.loopback) == \
        (local, host_port, loopback)


@pytest.mark.parametrize("text", ["local:0", "local:x", "local:99", "head", "ray://head",
                                  "head:port", "head:70000", ""])
def test_bad_cluster_addresses_name_the_forms(text):
    with pytest.raises(OptionError) as caught:
        parse_address(text)
    assert "local:N" in caught.value.message + (caught.value.hint or "")


def test_a_node_with_another_fingerprint_or_model_is_refused_naming_both():
    same = NodeReport("a" * 56, "node1", "10.0.0.1", FINGERPRINT.to_json())
    assert refusal(same, FINGERPRINT) is None
    other = dict(FINGERPRINT.to_json(), compiler="clang version 18.1.8")
    why = refusal(NodeReport("b" * 56, "node2", "10.0.0.2", other), FINGERPRINT)
    assert "node2/bbbbbbbbbbbb" in why and "different compiler" in why
    assert "clang version 18.1.8" in why and "gcc (Debian 12.2.0-14) 12.2.0" in why
    broken = NodeReport("c" * 56, "node3", "10.0.0.3", None, "no GPU is present")
    assert "cannot make the build target: no GPU is present" in refusal(broken, FINGERPRINT)
    intel = NodeReport("d" * 56, "node4", "10.0.0.4", FINGERPRINT.to_json(), model="Xeon 8480")
    assert refusal(intel, FINGERPRINT, "Xeon 8480") is None
    why = refusal(intel, FINGERPRINT, "AMD EPYC 7B13")
    assert "different model" in why and "Xeon 8480" in why and "AMD EPYC 7B13" in why


def test_the_host_makes_its_own_target_again():
    target = create_target("cpu")
    again = create_target(target.name, **target.create_options())
    assert again.fingerprint() == target.fingerprint()


def test_cluster_flag_needs_a_readable_address(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(models.tiny_conv_gemm(), str(model))
    code = main(["build", str(model), "--cpu", "--cluster", "head-without-port", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "error: --cluster: cannot read 'head-without-port'" in err
    assert "hint:" in err and "Traceback" not in err


def test_cluster_flag_refuses_an_offline_build(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(models.tiny_conv_gemm(), str(model))
    code = main(["build", str(model), "--gpu", "h100", "--offline", "--cluster", "local:2"])
    err = capsys.readouterr().err
    assert code == 2 and "--offline build predicts" in err


def test_without_the_flag_ray_is_never_imported(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(models.tiny_conv_gemm(), str(model))
    done = run_python(f"""
        import sys
        from wpk.cli import main
        code = main(["build", {str(model)!r}, "--cpu", "--db", {str(tmp_path / 'r.jsonl')!r},
                     "-o", {str(tmp_path / 'm.wpk')!r}, "-q"])
        assert code == 0, code
        assert main(["op", "Relu", "--shape", "X=8x8", "--json"]) == 0
        loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
        print("ray modules:", loaded)
    """)
    assert done.returncode == 0, done.stderr
    assert "ray modules: []" in done.stdout


# Makes this interpreter one without Ray: its import machinery finds no `ray` (nor any
# `ray.` submodule), as when the package is not installed.
HIDE_RAY = """
    import importlib.abc
    import sys

    class HideRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, HideRay())
"""


@pytest.mark.parametrize("command", ["build", "op"])
def test_without_ray_the_flag_is_a_clear_error(tmp_path, command):
    model = tmp_path / "m.onnx"
    onnx.save(models.tiny_conv_gemm(), str(model))
    args = {"build": ["build", str(model), "--cpu", "--cluster", "local:2", "-q"],
            "op": ["op", "Relu", "--shape", "X=8x8", "--cluster", "local:2"]}[command]
    done = run_python(HIDE_RAY + f"""
    try:
        import ray
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("ray is not hidden")
    from wpk.cli import main
    sys.exit(main({args!r}))
    """)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "error: --cluster needs Ray, which this Python cannot import " \
                       "(No module named 'ray')", done.stderr
    assert lines[1].startswith("hint:") and "pip install 'wpk[cluster]'" in lines[1]
    assert len(lines) == 2 and "Traceback" not in done.stderr


def test_the_cluster_extra_pins_ray_and_the_test_extra_holds_it():
    """Every node must run the build's Ray version, and CI (`.ci/run` installs `.[dev]`)
    must start the cluster tests with that version."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    (ray_pin,) = extras["cluster"]
    assert ray_pin.startswith("ray[client]==")
    assert ray_pin in extras["dev"]
    assert '".[dev]"' in (ROOT / ".ci" / "run").read_text()


class FlakyRay:
    """A stand-in for the `ray` module whose `init` fails with `errors` in turn, then
    connects."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.inits = self.shutdowns = 0
        self.connected = False

    def is_initialized(self) -> bool:
        return self.connected

    def init(self, **kwargs) -> None:
        self.inits += 1
        if self.errors:
            raise self.errors.pop(0)
        self.connected = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.connected = False


def _connect_with(monkeypatch, fake: FlakyRay):
    from wpk.search import cluster

    monkeypatch.setattr(cluster, "require_ray", lambda loopback=False: fake)
    monkeypatch.setattr(cluster, "check_reachable", lambda address: None)
    monkeypatch.setattr(cluster, "CLIENT_SERVER_PAUSE_S", 0.0)
    return cluster.Connection(parse_address("ray://10.0.0.5:10001"))


def test_a_ray_client_server_that_did_not_start_is_retried(monkeypatch):
    """Ray's per-client server failing to start (a Ray flake on busy machines; also as the
    proxy finding the new server a zombie) costs a retry, up to two; any other failure is
    the error at once."""
    from wpk.core.errors import ClusterError
    from wpk.search.cluster import CLIENT_SERVER_FAILED

    flake = RuntimeError(f"Initialization failure from server: {CLIENT_SERVER_FAILED}. See "
                         "ray_client_server_23000.err for detailed logs.")
    fake = FlakyRay(flake, flake)
    connection = _connect_with(monkeypatch, fake)
    assert fake.inits == 3 and fake.connected and connection._owns
    connection.close()
    assert not fake.connected
    always = FlakyRay(flake, flake, flake)
    with pytest.raises(ClusterError, match="cannot connect"):
        _connect_with(monkeypatch, always)
    assert always.inits == 3 and not always.connected
    zombie = RuntimeError("Initialization failure from server:\n  File \"proxier.py\", line 396"
                          "\npsutil.ZombieProcess: PID still exists but it's a zombie")
    fake = FlakyRay(zombie)
    connection = _connect_with(monkeypatch, fake)
    assert fake.inits == 2 and fake.connected
    connection.close()
    other = FlakyRay(ConnectionError("connection refused"))
    with pytest.raises(ClusterError, match="connection refused"):
        _connect_with(monkeypatch, other)
    assert other.inits == 1
