"""The `.wpk` plan file: a zip of manifest, weights, kernels and report.

Members:

- `manifest.json`: `format_version` (FORMAT_VERSION), `wpk_version`,
  `target`, `device` (fingerprint of the build host), `requires` (what the
  plan needs of the host: `isa` flags, `machine` when it holds native code),
  `steps` in execution order (see `Step`), `workloads` by key
  (`Workload.to_json`), `buffers` (`BufferPlan.to_json`), `inputs`/`outputs`
  (name, shape, dtype), `constants` (the name table of `weights.npz`: entry i
  is stored under key `c{i}`, since tensor names can hold any character),
  `members` (sha256 of every other member) and `manifest_sha256` (sha256 of
  the canonical JSON of the manifest without that field).
- `weights.npz`: every constant the steps read (an npz, no pickle, each array's data
  64-byte aligned: `wpk.plans.weights_file`).
- `kernels/`: artifacts (sources, binaries) that implementations provide
  through the optional hook `artifacts(workload, config) -> {name: bytes}`;
  the runtime hands them back to `prepare_from_artifacts(workload, consts,
  config, artifacts)` when the implementation has it.
- `report.json`: the build report (`wpk.plans.report`).

Writing goes to a temporary file in the target folder, renamed into place
(`os.replace`); on any failure the temporary file is removed. Loading checks
that the file is a zip, the format version, every checksum and the device; the weights are
read into one buffer, each constant a view of it (`wpk.plans.weights_file`).

Reading is bounded: before any member is inflated, the sizes the zip declares
(`ZipInfo.file_size`, the compression ratio, the number of members) are checked
(`check_member_sizes`), a member is never read past its declared size, and the
header of every array in `weights.npz` is checked against the manifest before
numpy allocates it. `read_report` reads only the manifest and the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wpk.core.devices import cpu_fingerprint
from wpk.core.errors import PlanError
from wpk.core.limits import default_max_memory, format_bytes, tensor_bytes
from wpk.core.numerics import finite_float, is_ml_dtype
from wpk.core.safe_write import atomic_output
from wpk.core.version import __version__
from wpk.core.workload import Workload
from wpk.plans.buffers import BufferPlan
from wpk.plans.manifest_check import check_manifest
from wpk.plans.weights_file import aligned_buffer, npz_bytes, npz_views, read_stored_member

FORMAT_VERSION = 2   # 2: a tensor may lie at a byte offset inside its buffer (a placed part)
MANIFEST = "manifest.json"
WEIGHTS = "weights.npz"
REPORT = "report.json"
KERNELS = "kernels/"
REBUILD_HINT = "rebuild the plan with `wpk build`"
REQUIRED_KEYS = ("target", "steps", "workloads", "buffers", "inputs", "outputs", "members",
                 "manifest_sha256")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same plan gives the same bytes
MAX_MEMBERS = 10_000
MAX_JSON_BYTES = 256 << 20  # manifest.json, report.json
MAX_RATIO = 200  # inflated / compressed size of a member over RATIO_FLOOR bytes
RATIO_FLOOR = 1 << 20


@dataclass(frozen=True)
class Step:
    """One kernel call: the node it computes and the implementation chosen for it.

    `inputs` are tensor names in node-input order ("" for an absent optional
    input); `artifacts` are member names under `kernels/`.
    """

    node: str
    op: str
    workload_key: str
    impl: str
    config: Mapping[str, Any]
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    artifacts: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"node": self.node, "op": self.op, "workload_key": self.workload_key,
                "impl": self.impl, "config": dict(self.config), "kind": self.kind,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "artifacts": list(self.artifacts)}

    @staticmethod
    def from_json(data: Mapping) -> Step:
        return Step(data["node"], data["op"], data["workload_key"], data["impl"],
                    dict(data.get("config", {})), data.get("kind", ""),
                    tuple(data["inputs"]), tuple(data["outputs"]),
                    tuple(data.get("artifacts", ())))


@dataclass
class Plan:
    """A built plan in memory: manifest, constants by name, kernel artifacts, report."""

    manifest: dict
    weights: dict[str, np.ndarray]
    report: dict = field(default_factory=dict)
    kernels: dict[str, bytes] = field(default_factory=dict)

    @property
    def steps(self) -> list[Step]:
        return [Step.from_json(s) for s in self.manifest["steps"]]

    @property
    def workloads(self) -> dict[str, Workload]:
        return {k: Workload.from_json(v) for k, v in self.manifest["workloads"].items()}

    def workload(self, key: str) -> Workload:
        """The workload stored under `key` (KeyError if none), decoding only that one."""
        return Workload.from_json(self.manifest["workloads"][key])

    @property
    def buffer_plan(self) -> BufferPlan:
        return BufferPlan.from_json(self.manifest["buffers"])

    @property
    def inputs(self) -> list[dict]:
        return list(self.manifest["inputs"])

    @property
    def outputs(self) -> list[dict]:
        return list(self.manifest["outputs"])

    @property
    def target(self) -> str:
        return self.manifest["target"]

    def __repr__(self) -> str:
        names = ", ".join(e["name"] for e in self.manifest.get("inputs", []))
        return (f"<Plan {self.manifest.get('graph', '?')} for {self.manifest.get('target')}: "
                f"{len(self.manifest.get('steps', []))} steps, {len(self.weights)} constants, "
                f"inputs {names}>")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan atomically to `path`; returns the path."""
        return write_plan(self, path)

    @staticmethod
    def load(path: str | os.PathLike, check_device: bool = True) -> Plan:
        """Read and check a plan file (see `read_plan`)."""
        return read_plan(path, check_device=check_device)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _manifest_digest(manifest: Mapping) -> str:
    return _sha256(_canonical({k: v for k, v in manifest.items() if k != "manifest_sha256"}))


def _weights_bytes(manifest: dict, weights: Mapping[str, np.ndarray]) -> bytes:
    table, arrays = [], {}
    for index, (name, value) in enumerate(weights.items()):
        array = np.asarray(value)
        table.append({"name": name, "shape": list(array.shape), "dtype": _dtype_text(array)})
        arrays[f"c{index}"] = _raw(array) if is_ml_dtype(array.dtype) else array
    manifest["constants"] = table
    return npz_bytes(arrays)


def plan_members(plan: Plan) -> dict[str, bytes]:
    """Every member of the zip, the manifest (with its checksums) last."""
    manifest = dict(plan.manifest)
    manifest["format_version"] = FORMAT_VERSION
    members = {WEIGHTS: _weights_bytes(manifest, plan.weights),
               REPORT: json.dumps(plan.report, indent=1, allow_nan=False).encode()}
    for name, data in plan.kernels.items():
        members[KERNELS + name] = bytes(data)
    manifest["members"] = {name: _sha256(data) for name, data in members.items()}
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    members[MANIFEST] = json.dumps(manifest, indent=1, allow_nan=False).encode()
    return members


def write_plan(plan: Plan, path: str | os.PathLike, flag: str = "output") -> Path:
    """Write `plan` to a temporary file next to `path` and rename it into place
    (`wpk.core.safe_write`: OptionError naming `flag` when it cannot be written there)."""
    members = plan_members(plan)
    with atomic_output(path, flag) as stream, zipfile.ZipFile(stream, "w") as archive:
        for name in [MANIFEST, *[n for n in members if n != MANIFEST]]:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = (zipfile.ZIP_STORED if name == WEIGHTS
                                  else zipfile.ZIP_DEFLATED)
            archive.writestr(info, members[name])
    return Path(path)


def _member_cap(name: str, limit: int) -> int:
    return MAX_JSON_BYTES if name in (MANIFEST, REPORT) else limit


def check_member_sizes(archive: zipfile.ZipFile, path: str, limit: int | None = None) -> None:
    """Refuse, before inflating anything, a plan whose members declare more than `limit`
    bytes (default: half the RAM) in all, a JSON member over MAX_JSON_BYTES, a member
    compressed more than MAX_RATIO times (a zip bomb) or more than MAX_MEMBERS members."""
    limit = default_max_memory() if limit is None else limit
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise PlanError(f"plan '{path}' has {len(infos)} members, more than a plan has "
                        f"({MAX_MEMBERS})", hint=REBUILD_HINT)
    total = 0
    for info in infos:
        cap = _member_cap(info.filename, limit)
        if info.file_size > cap:
            raise PlanError(f"plan '{path}': member '{info.filename}' would inflate to "
                            f"{format_bytes(info.file_size)}, more than {format_bytes(cap)}",
                            hint=REBUILD_HINT)
        if (info.compress_type != zipfile.ZIP_STORED and info.file_size > RATIO_FLOOR
                and info.file_size > MAX_RATIO * max(info.compress_size, 1)):
            raise PlanError(f"plan '{path}': member '{info.filename}' would inflate "
                            f"{info.file_size // max(info.compress_size, 1)} times (to "
                            f"{format_bytes(info.file_size)}), which no plan does",
                            hint=REBUILD_HINT)
        total += info.file_size
    if total > limit:
        raise PlanError(f"plan '{path}' would inflate to {format_bytes(total)}, more than "
                        f"{format_bytes(limit)} (half the RAM)", hint=REBUILD_HINT)


def _read_member(archive: zipfile.ZipFile, name: str, path: str) -> bytes:
    """A member's bytes, never read past its declared size (nor the size caps)."""
    try:
        info = archive.getinfo(name)
        cap = min(info.file_size, _member_cap(name, default_max_memory()))
        with archive.open(info) as stream:
            data = stream.read(cap + 1)
    except KeyError:
        raise PlanError(f"plan '{path}' is missing member '{name}'", hint=REBUILD_HINT) from None
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError,
            RuntimeError) as exc:
        raise PlanError(f"plan '{path}': member '{name}' is corrupted ({exc})",
                        hint=REBUILD_HINT) from None
    if len(data) > cap:
        raise PlanError(f"plan '{path}': member '{name}' is longer than it declares",
                        hint=REBUILD_HINT)
    return data


def _check_version(manifest: Mapping, path: str) -> None:
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PlanError(f"plan '{path}' has no valid format version ({version!r})",
                        hint=REBUILD_HINT)
    if version > FORMAT_VERSION:
        raise PlanError(f"plan format version {version} is newer than this wpk supports "
                        f"({FORMAT_VERSION}); rebuild the plan or upgrade wpk",
                        hint=f"the plan was written by wpk {manifest.get('wpk_version', '?')}, "
                             f"this is wpk {__version__}")


def check_host(manifest: Mapping, path: str = "<plan>") -> None:
    """Raise PlanError when this host lacks what the plan needs (CPU ISA, machine)."""
    requires = manifest.get("requires", {})
    host = cpu_fingerprint()
    machine = requires.get("machine")
    if machine and machine != host["machine"]:
        raise PlanError(f"plan '{path}' holds native code for {machine}, "
                        f"this machine is {host['machine']}",
                        hint=REBUILD_HINT + " on this machine")
    missing = [flag for flag in requires.get("isa", []) if flag not in host["isa"]]
    if missing:
        raise PlanError(f"plan '{path}' needs CPU features this machine lacks: "
                        f"{', '.join(missing)}", hint=REBUILD_HINT + " on this machine")


def _open(name: str) -> zipfile.ZipFile:
    """The plan's zip, its declared member sizes checked (nothing inflated yet)."""
    if not os.path.exists(name):
        raise PlanError(f"plan '{name}' does not exist", hint="build one with `wpk build`")
    if not os.path.isfile(name):  # a device or pipe (/dev/zero) would be read forever
        raise PlanError(f"'{name}' is not a wpk plan (not a regular file)",
                        hint="give a .wpk file written by `wpk build`")
    if not zipfile.is_zipfile(name):
        raise PlanError(f"'{name}' is not a wpk plan (not a zip file)",
                        hint="give a .wpk file written by `wpk build`")
    try:
        archive = zipfile.ZipFile(name)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise PlanError(f"'{name}' is not a wpk plan ({exc})", hint=REBUILD_HINT) from None
    try:
        check_member_sizes(archive, name)
    except PlanError:
        archive.close()
        raise
    return archive


def _read_manifest(archive: zipfile.ZipFile, name: str) -> dict:
    """The checked manifest: JSON object, format version, required keys, its checksum."""
    if MANIFEST not in archive.namelist():
        raise PlanError(f"'{name}' is not a wpk plan (no {MANIFEST})",
                        hint="give a .wpk file written by `wpk build`")
    try:
        manifest = _strict_json(_read_member(archive, MANIFEST, name))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PlanError(f"plan '{name}': member '{MANIFEST}' is not valid JSON",
                        hint=REBUILD_HINT) from None
    if not isinstance(manifest, dict):
        raise PlanError(f"plan '{name}': member '{MANIFEST}' is not a manifest",
                        hint=REBUILD_HINT)
    _check_version(manifest, name)
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise PlanError(f"plan '{name}': the manifest lacks {', '.join(missing)}",
                        hint=REBUILD_HINT)
    if manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise PlanError(f"plan '{name}': member '{MANIFEST}' changed since it was written "
                        "(checksum mismatch)", hint=REBUILD_HINT)
    members = manifest["members"]
    if not isinstance(members, dict) or not all(isinstance(v, str) for v in members.values()):
        raise PlanError(f"plan '{name}': the manifest's member checksums are malformed",
                        hint=REBUILD_HINT)
    check_manifest(manifest, name)  # every field, before anything uses one
    return manifest


def _read_checked(archive: zipfile.ZipFile, member: str, digest: str, name: str) -> bytes:
    data = _read_member(archive, member, name)
    if _sha256(data) != digest:
        raise PlanError(f"plan '{name}': member '{member}' changed since it was written "
                        "(sha256 mismatch)", hint=REBUILD_HINT)
    return data


def _read_weights(archive: zipfile.ZipFile, digest: str, name: str) -> np.ndarray:
    """The weights member's bytes, checked, in one aligned buffer: read from the file
    straight into it where the member is stored (as `write_plan` stores it), else through
    zipfile and copied."""
    try:
        buffer = read_stored_member(name, archive.getinfo(WEIGHTS))
    except KeyError:
        raise PlanError(f"plan '{name}' is missing member '{WEIGHTS}'",
                        hint=REBUILD_HINT) from None
    except (OSError, EOFError) as exc:
        raise PlanError(f"plan '{name}': member '{WEIGHTS}' is corrupted ({exc})",
                        hint=REBUILD_HINT) from None
    if buffer is None:
        data = _read_member(archive, WEIGHTS, name)
        buffer = aligned_buffer(len(data))
        buffer[:] = np.frombuffer(data, dtype=np.uint8)
    if _sha256(buffer) != digest:
        raise PlanError(f"plan '{name}': member '{WEIGHTS}' changed since it was written "
                        "(sha256 mismatch)", hint=REBUILD_HINT)
    return buffer


def read_report(path: str | os.PathLike) -> tuple[dict, dict]:
    """(manifest, report) of a plan file, reading and checking only those two members
    (what `wpk report` shows): no weights or kernels are inflated, no device check."""
    name = os.fspath(path)
    with _open(name) as archive:
        manifest = _read_manifest(archive, name)
        digest = manifest["members"].get(REPORT)
        if digest is None:
            return manifest, {}
        data = _read_checked(archive, REPORT, digest, name)
    return manifest, _json_object(data, REPORT, name)


def _strict_json(data: bytes) -> Any:
    """JSON as wpk writes it: no NaN, Infinity or numbers that overflow to them."""
    def constant(text: str):
        raise ValueError(f"{text} is not JSON")

    return json.loads(data, parse_float=finite_float, parse_constant=constant)


def _json_object(data: bytes, member: str, path: str) -> dict:
    try:
        value = _strict_json(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise PlanError(f"plan '{path}': member '{member}' is not a JSON object",
                        hint=REBUILD_HINT)
    return value


def read_plan(path: str | os.PathLike, check_device: bool = True) -> Plan:
    """Read a plan file, checking format version, every checksum and (optionally) the device."""
    name = os.fspath(path)
    with _open(name) as archive:
        manifest = _read_manifest(archive, name)
        expected = manifest.get("members", {})
        unknown = sorted(set(archive.namelist()) - set(expected) - {MANIFEST})
        if unknown:
            raise PlanError(f"plan '{name}' holds members the manifest does not list: "
                            f"{', '.join(unknown)}", hint=REBUILD_HINT)
        if WEIGHTS not in expected:
            raise PlanError(f"plan '{name}' is missing member '{WEIGHTS}'", hint=REBUILD_HINT)
        weights_buffer = _read_weights(archive, expected[WEIGHTS], name)
        contents = {member: _read_checked(archive, member, digest, name)
                    for member, digest in expected.items() if member != WEIGHTS}
    _check_memory_bounds(manifest, name)
    if check_device:
        check_host(manifest, name)
    weights = _load_weights(weights_buffer, manifest.get("constants", []), name)
    report = _json_object(contents[REPORT], REPORT, name) if REPORT in contents else {}
    kernels = {m[len(KERNELS):]: d for m, d in contents.items() if m.startswith(KERNELS)}
    return Plan(manifest, weights, report, kernels)



def _dtype_text(array: np.ndarray) -> str:
    """The dtype as the manifest holds it: numpy's code ('<f4'), or the name of an
    ml_dtypes type (bfloat16, float8_e4m3fn, int4...), which npz stores as raw bytes."""
    return array.dtype.name if is_ml_dtype(array.dtype) else array.dtype.str


def _raw(array: np.ndarray) -> np.ndarray:
    """An ml_dtypes array as raw bytes of the same size (npz cannot name its dtype)."""
    return array.copy(order="C").view(np.dtype(f"V{array.dtype.itemsize}"))


def _as_manifest_dtype(array: np.ndarray, dtype: Any) -> np.ndarray | None:
    """The loaded array with the manifest's dtype (raw bytes viewed as an ml_dtypes type),
    or None when they do not match."""
    if array.dtype.str == dtype:
        return array
    if array.dtype.kind != "V" or not isinstance(dtype, str):
        return None
    try:
        wanted = np.dtype(dtype)
    except TypeError:
        return None
    if not is_ml_dtype(wanted) or wanted.itemsize != array.dtype.itemsize:
        return None
    return array.view(wanted)


def _load_weights(buffer: np.ndarray, table: Sequence[Mapping],
                  path: str) -> dict[str, np.ndarray]:
    """The constants of `weights.npz` (in `buffer`), views of it where they lie aligned, each
    array's header checked against the manifest's table before anything is copied."""
    try:
        if not isinstance(table, list):
            raise TypeError("the constants table is not a list")
        caps = {f"c{index}": tensor_bytes(entry["shape"], entry["dtype"]) + (64 << 10)
                for index, entry in enumerate(table)}
        arrays = npz_views(buffer, caps)
    except (ValueError, TypeError, KeyError, OSError, EOFError, zipfile.BadZipFile,
            zlib.error, MemoryError, NotImplementedError) as exc:
        raise PlanError(f"plan '{path}': member '{WEIGHTS}' is unreadable ({exc})",
                        hint=REBUILD_HINT) from None
    weights = {}
    for index, entry in enumerate(table):
        array = arrays.get(f"c{index}")
        if array is not None:
            array = _as_manifest_dtype(array, entry["dtype"])
        if array is None or list(array.shape) != list(entry["shape"]):
            raise PlanError(f"plan '{path}': constant '{entry['name']}' in '{WEIGHTS}' does "
                            "not match the manifest", hint=REBUILD_HINT)
        weights[entry["name"]] = array
    return weights


def _check_memory_bounds(manifest: Mapping, path: str) -> None:
    """The arena and every input and output fit the memory limit, so a tampered,
    re-checksummed manifest cannot make the runtime allocate a huge arena (the fields'
    types were checked by `check_manifest`)."""
    limit = default_max_memory()
    arena = BufferPlan.from_json(manifest["buffers"]).arena_bytes
    if arena > limit:
        raise PlanError(f"plan '{path}': the manifest's 'buffers' is malformed (an arena of "
                        f"{arena} bytes, more than {format_bytes(limit)})", hint=REBUILD_HINT)
    for field_name in ("inputs", "outputs"):
        for entry in manifest[field_name]:
            if tensor_bytes(entry["shape"], entry["dtype"]) > limit:
                raise PlanError(f"plan '{path}': the manifest's '{field_name}' is malformed "
                                f"({entry['name']} is too large)", hint=REBUILD_HINT)
