"""Tuning records: append-only JSON lines, one measurement a line (see DESIGN.md).

    fp = target_fingerprint()                       # this host, its gcc, the codegen version
    store = RecordStore("tuning.jsonl")             # reads what is there (tolerantly)
    record = TuningRecord.from_measurement(measurement, workload, fp)
    store.append(record)                            # one line, flushed and fsynced
    store.lookup(workload.key, fp, "dsl.conv2d", {"tile": 8})  -> TuningRecord | None
    store.best(workload.key, fp)                    -> fastest ok TuningRecord | None
    merge([a, b], out)                              -> MergeSummary (dedupes identical lines)

A record is self-describing: it holds the workload's JSON as well as its key,
and the target fingerprint (device arch/ISA, compiler version, codegen
version) as well as the fingerprint's key, so records from another machine or
an older compiler never match. `phase` tells a search measurement ("search")
from the re-measurement of a top candidate before the winner is chosen
("final"); `best` prefers a candidate's final record to its search records.

Each `append` is one `write` of one line followed by flush and fsync, so a
build killed at any point loses no completed record; a torn last line from a
kill is skipped with a warning when read, and the next append starts on a
fresh line. A corrupted line elsewhere is skipped with a warning naming
file:line. A record from a newer schema version raises `RecordError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wpk.core.errors import WpkError
from wpk.core.workload import Workload
from wpk.search.measure import Measurement, Status

SCHEMA_VERSION = 1
SEARCH = "search"   # measured while searching
FINAL = "final"     # re-measured alone, with more repeats, before the winner is chosen


class RecordError(WpkError):
    """A tuning record file cannot be used (newer schema, unreadable, unwritable)."""


class RecordWarning(UserWarning):
    """A line of a record file was skipped (torn by a kill, or corrupted)."""


def canonical_json(value: Any) -> str:
    """Sorted-keys, no-whitespace JSON (the identity of configs and fingerprints)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class TargetFingerprint:
    """What a measurement depends on besides the workload: device, compiler, code generator."""

    device: str      # e.g. 'cpu:x86_64:avx2,fma' or 'cuda:sm_90' (HardwareSpec.fingerprint)
    compiler: str    # first line of `gcc --version` / nvcc version
    codegen: str     # wpk.dsl.toolchain.CODEGEN_VERSION

    @property
    def key(self) -> str:
        """16 hex digits identifying the fingerprint."""
        return hashlib.sha256(canonical_json(self.to_json()).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"device": self.device, "compiler": self.compiler, "codegen": self.codegen}

    @staticmethod
    def from_json(data: Mapping) -> TargetFingerprint:
        return TargetFingerprint(str(data["device"]), str(data["compiler"]),
                                 str(data["codegen"]))


def target_fingerprint(hw=None, compiler: str | None = None) -> TargetFingerprint:
    """The fingerprint of `hw` (a `wpk.core.devices.HardwareSpec`; default: this host's CPU).

    `compiler` defaults to gcc's version for a CPU target and to nvcc's (or
    NVRTC's) for a CUDA one; 'none' when no compiler is found.
    """
    from wpk.dsl import toolchain

    if hw is None:
        from wpk.core.devices import host_cpu

        hw = host_cpu()
    if compiler is None:
        compiler = _compiler_version(hw.kind)
    return TargetFingerprint(hw.fingerprint, compiler, toolchain.CODEGEN_VERSION)


def _compiler_version(kind: str) -> str:
    from wpk.dsl import toolchain

    try:
        if kind == "cuda":
            from wpk.dsl import toolchain_cuda

            nvcc = toolchain_cuda.find_nvcc()
            if nvcc:
                return toolchain_cuda.tool_version(nvcc)
            return f"nvrtc {toolchain_cuda.nvrtc_version()}"
        return toolchain.compiler_version(toolchain.c_compiler())
    except Exception:  # no compiler: records still work, they just never match a real one
        return "none"


def _fingerprint_key(fingerprint: TargetFingerprint | str) -> str:
    return fingerprint.key if isinstance(fingerprint, TargetFingerprint) else fingerprint


def config_key(config: Mapping) -> str:
    """Canonical JSON of a config (tuples and lists compare equal)."""
    return canonical_json(json.loads(canonical_json(dict(config))))


@dataclass(frozen=True)
class TuningRecord:
    """One measurement of one candidate on one workload for one target, as stored."""

    workload_key: str
    workload: Mapping[str, Any]
    fingerprint: TargetFingerprint
    impl: str
    config: Mapping[str, Any]
    status: Status
    times_s: tuple[float, ...] = ()
    median_s: float = math.nan
    spread_s: tuple[float, float] = (math.nan, math.nan)
    rel_l2_error: float = math.nan
    error: str = ""
    kind: str = ""
    phase: str = SEARCH
    timestamp: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def fingerprint_key(self) -> str:
        return self.fingerprint.key

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """(workload key, fingerprint key, implementation, config key): what `lookup` matches."""
        return (self.workload_key, self.fingerprint.key, self.impl, config_key(self.config))

    @property
    def label(self) -> str:
        if not self.config:
            return self.impl
        args = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.impl}[{args}]"

    @staticmethod
    def from_measurement(measurement: Measurement, workload: Workload,
                         fingerprint: TargetFingerprint, phase: str = SEARCH,
                         timestamp: float | None = None) -> TuningRecord:
        """The record of `measurement` (of a candidate on `workload`) on `fingerprint`."""
        return TuningRecord(
            workload_key=workload.key, workload=workload.to_json(), fingerprint=fingerprint,
            impl=measurement.impl, config=json.loads(canonical_json(dict(measurement.config))),
            status=measurement.status, times_s=tuple(measurement.times_s),
            median_s=measurement.median_s, spread_s=tuple(measurement.spread_s),
            rel_l2_error=measurement.rel_l2_error, error=measurement.message,
            kind=measurement.kind, phase=phase,
            timestamp=time.time() if timestamp is None else timestamp,
            extra=dict(measurement.extra))

    def to_measurement(self) -> Measurement:
        """The `Measurement` this record stores (what a re-run gets instead of measuring)."""
        return Measurement(label=self.label, impl=self.impl, config=dict(self.config),
                           status=self.status, times_s=self.times_s, median_s=self.median_s,
                           spread_s=self.spread_s, rel_l2_error=self.rel_l2_error,
                           message=self.error, kind=self.kind, workload_key=self.workload_key,
                           extra={**self.extra, "from_record": True, "phase": self.phase})

    def to_workload(self) -> Workload:
        return Workload.from_json(self.workload)

    def to_json(self) -> dict:
        return {
            "schema_version": self.schema_version, "workload_key": self.workload_key,
            "fingerprint_key": self.fingerprint.key, "fingerprint": self.fingerprint.to_json(),
            "impl": self.impl, "kind": self.kind, "config": dict(self.config),
            "status": self.status.value, "phase": self.phase,
            "median_s": _finite_or_none(self.median_s),
            "spread_s": [_finite_or_none(v) for v in self.spread_s],
            "times_s": list(self.times_s), "rel_l2_error": _finite_or_none(self.rel_l2_error),
            "error": self.error, "timestamp": self.timestamp, "extra": dict(self.extra),
            "workload": dict(self.workload),
        }

    def to_line(self) -> str:
        """The record as one JSON line (with its newline)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")) + "\n"

    @staticmethod
    def from_json(data: Mapping) -> TuningRecord:
        """Parse a stored record (RecordError for a newer schema; KeyError/ValueError when
        a field is missing or malformed)."""
        version = int(data["schema_version"])
        if version > SCHEMA_VERSION:
            raise RecordError(
                f"tuning record schema version {version} is newer than this wpk's "
                f"({SCHEMA_VERSION})",
                hint="upgrade wpk, or give --db a record file written by this version")
        spread = data.get("spread_s") or (None, None)
        return TuningRecord(
            workload_key=str(data["workload_key"]), workload=dict(data["workload"]),
            fingerprint=TargetFingerprint.from_json(data["fingerprint"]),
            impl=str(data["impl"]), config=dict(data.get("config") or {}),
            status=Status(data["status"]),
            times_s=tuple(float(t) for t in data.get("times_s") or ()),
            median_s=_none_to_nan(data.get("median_s")),
            spread_s=(_none_to_nan(spread[0]), _none_to_nan(spread[1])),
            rel_l2_error=_none_to_nan(data.get("rel_l2_error")),
            error=str(data.get("error", "")), kind=str(data.get("kind", "")),
            phase=str(data.get("phase", SEARCH)), timestamp=float(data.get("timestamp", 0.0)),
            extra=dict(data.get("extra") or {}), schema_version=version)


def _finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _none_to_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def read_records(path: Path | str) -> Iterator[TuningRecord]:
    """Every readable record of a file, in order; torn or corrupted lines are skipped with a
    `RecordWarning` naming file:line. RecordError for a newer schema or an unreadable file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RecordError(f"cannot read tuning records {path}: {exc.strerror}",
                          hint="check the path and its permissions") from None
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number == len(lines)
        try:
            yield TuningRecord.from_json(json.loads(raw))
        except RecordError as exc:
            raise RecordError(f"{path}:{number}: {exc.message}", hint=exc.hint) from None
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            why = ("torn last line (a write was interrupted)" if last and torn_tail
                   else f"corrupted record ({type(exc).__name__}: {exc})")
            warnings.warn(f"{path}:{number}: {why}; skipped", RecordWarning, stacklevel=2)


class RecordStore:
    """An append-only JSON-lines file of `TuningRecord`s, indexed in memory.

    Opening reads every existing record. `appended` counts the records this
    instance wrote (the measurements a build actually made).
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.records: list[TuningRecord] = []
        self._index: dict[tuple[str, str, str, str], list[TuningRecord]] = {}
        self.appended = 0
        for record in read_records(self.path):
            self._add(record)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter(self.records)

    def _add(self, record: TuningRecord) -> None:
        self.records.append(record)
        self._index.setdefault(record.identity, []).append(record)

    def append(self, record: TuningRecord) -> None:
        """Write one record as one line, flushed and fsynced before returning."""
        line = record.to_line().encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RecordError(f"cannot write tuning records {self.path}: {exc.strerror}",
                              hint="check the path and its permissions") from None
        try:
            if _ends_without_newline(self.path):
                line = b"\n" + line  # a kill tore the last line: start a fresh one
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._add(record)
        self.appended += 1

    def lookup(self, workload_key: str, fingerprint: TargetFingerprint | str, impl: str,
               config: Mapping, phase: str | None = SEARCH) -> TuningRecord | None:
        """The latest record of this candidate (in `phase`; any phase with None), or None."""
        found = self._index.get((workload_key, _fingerprint_key(fingerprint), impl,
                                 config_key(config)), [])
        for record in reversed(found):
            if phase is None or record.phase == phase:
                return record
        return None

    def for_workload(self, workload_key: str,
                     fingerprint: TargetFingerprint | str | None = None) -> list[TuningRecord]:
        """Every record of a workload (on one fingerprint, or all), in file order."""
        key = None if fingerprint is None else _fingerprint_key(fingerprint)
        return [r for r in self.records if r.workload_key == workload_key
                and (key is None or r.fingerprint.key == key)]

    def best(self, workload_key: str,
             fingerprint: TargetFingerprint | str) -> TuningRecord | None:
        """The fastest ok candidate of a workload on a fingerprint, or None.

        A candidate's latest final record (re-measurement) stands for it when it
        has one, else its latest search record; ties go to the earlier record;
        records timed alone beat those timed concurrently (`extra["contended"]`).
        """
        return best_of(self.for_workload(workload_key, fingerprint))

    def workload_keys(self) -> list[str]:
        """Distinct workload keys, in order of first appearance."""
        return list(dict.fromkeys(r.workload_key for r in self.records))


def best_of(records: Iterable[TuningRecord]) -> TuningRecord | None:
    """`RecordStore.best` over any records (one fingerprint assumed)."""
    representative: dict[tuple, TuningRecord] = {}
    for record in records:
        ident = record.identity
        held = representative.get(ident)
        if held is None or record.phase == FINAL or held.phase != FINAL:
            representative[ident] = record
    ok = [r for r in representative.values() if r.ok and math.isfinite(r.median_s)]
    # Times taken concurrently with other candidates (--parallel-measure) rank, they do not
    # decide: a candidate timed alone wins over them whenever there is one.
    alone = [r for r in ok if not r.extra.get("contended")]
    return min(alone or ok, key=lambda r: r.median_s, default=None)


def _ends_without_newline(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except OSError:
        return False


@dataclass(frozen=True)
class MergeSummary:
    """What `merge` did: lines read, distinct records written, duplicates dropped."""

    read: int
    written: int
    duplicates: int
    out: Path


def merge(paths: Sequence[Path | str], out: Path | str) -> MergeSummary:
    """Merge record files into `out` (written atomically): every distinct record is kept, in
    order of first appearance; identical lines (same measurement) appear once."""
    seen: set[str] = set()
    lines: list[str] = []
    read = 0
    for path in paths:
        if not Path(path).exists():
            raise RecordError(f"tuning record file {path} does not exist",
                              hint="check the paths given to `wpk records merge`")
        for record in read_records(path):
            read += 1
            line = record.to_line()
            if line not in seen:
                seen.add(line)
                lines.append(line)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        handle.writelines(lines)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    return MergeSummary(read, len(lines), read - len(lines), out)
