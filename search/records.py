"""Tuning records: the `Database` of measurements, append-only JSON lines (see DESIGN.md).

    db = RecordStore("tuning.jsonl")                # reads what is there (tolerantly)
    db = RecordStore(None)                          # in memory (a build without --db)
    record = TuningRecord.from_measurement(measurement, workload, target.fingerprint())
    db.commit(record)                               # one line, flushed and fsynced
    db.lookup(workload.key, fp, "dsl.cpu", {"tile_k": 8})  -> TuningRecord | None
    db.top_k(workload.key, fp, k=3)                 -> the k best candidates' records
    merge([a, b], out)                              -> MergeSummary (dedupes identical lines)

`Database` is the protocol the search and the planner use (lookup, commit,
top_k, records, len); `RecordStore` implements it over a JSON-lines file, or
in memory without a path.

A record is self-describing: it holds the workload's JSON as well as its key,
and the target fingerprint (device arch/ISA, compiler version, codegen
version) as well as the fingerprint's key, so records from another machine or
an older compiler never match. `phase` tells a search measurement ("search")
from the re-measurement of a top candidate before the winner is chosen
("final") and from the planner's last pass of a tuned build, which measures a
workload's finalists (library kernels, the untuned default schedules, each
family's tuned winner) side by side ("plan"); a candidate's final record stands
for it when ranking. A measurement verified under a tolerance other than the
default ("tolerance": the planner's pass over a node that onnxruntime's own
kernel computes only within a rounding-sized error) holds that tolerance in
`extra` and is neither ranked nor reused by a request under another one.

Each `commit` is one `write` of one line followed by flush and fsync, so a
build killed at any point loses no completed record; a torn last line from a
kill is skipped with a warning when read, and the next commit starts on a
fresh line. A corrupted line elsewhere is skipped with a warning naming
file:line. A record from a newer schema version raises `RecordError`.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from wpk.core.errors import WpkError
from wpk.core.numerics import finite_float
from wpk.core.safe_write import write_text
from wpk.core.workload import Workload
from wpk.kernels.target import TargetFingerprint
from wpk.search.choice import ranked
from wpk.search.measure import Measurement, Status

SCHEMA_VERSION = 1
MAX_INT_DIGITS = 19  # a record's integers (dims, configs, versions) fit in int64
SEARCH = "search"   # measured while searching
FINAL = "final"     # re-measured alone, with more repeats, before the winner is chosen
PLAN = "plan"       # the planner's last pass: a workload's finalists measured side by side
# Measured under an explicit tolerance (`MeasureOptions.tolerance`): the planner's second
# pass over a node whose result onnxruntime's own kernel misses the default tolerance by
# (`wpk.plans.planner.loosened_tolerance`). Reused only by a request under the same
# tolerance (`extra["tolerance"]`), never ranked with the other phases' records.
TOLERANCE = "tolerance"


class RecordError(WpkError):
    """A tuning record file cannot be used (newer schema, unreadable, unwritable)."""


class RecordWarning(UserWarning):
    """A line of a record file was skipped (torn by a kill, or corrupted)."""


def canonical_json(value: Any) -> str:
    """Sorted-keys, no-whitespace JSON (the identity of configs and fingerprints)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


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
        version = data["schema_version"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"schema_version {version!r} is not a version number")
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


def _int64(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits is out of range")
    return int(text)


def parse_line(raw: bytes | str) -> Any:
    """One JSON line of a record file, refusing (ValueError) numbers no record holds:
    literals out of float range (`1e400`) and integers beyond int64 (400 digits); a line
    nested deeper than Python's recursion limit raises RecursionError."""
    return json.loads(raw, parse_float=finite_float, parse_int=_int64)


def read_records(path: Path | str) -> Iterator[TuningRecord]:
    """Every readable record of a file, in order; torn or corrupted lines are skipped with a
    `RecordWarning` naming file:line. RecordError for a newer schema or an unreadable file."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a pipe would be read forever
        raise RecordError(f"tuning records {path} is not a regular file",
                          hint="give --db a JSON-lines file (it is created if missing)")
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
            yield TuningRecord.from_json(parse_line(raw))
        except RecordError as exc:
            raise RecordError(f"{path}:{number}: {exc.message}", hint=exc.hint) from None
        except (ValueError, KeyError, TypeError, IndexError, OverflowError,
                RecursionError) as exc:
            why = ("torn last line (a write was interrupted)" if last and torn_tail
                   else f"corrupted record ({type(exc).__name__}: {exc})")
            warnings.warn(f"{path}:{number}: {why}; skipped", RecordWarning, stacklevel=2)


class Database(Protocol):
    """Where measurements are kept and found again (after TVM MetaSchedule's database)."""

    def lookup(self, workload_key: str, fingerprint: TargetFingerprint | str, impl: str,
               config: Mapping, phase: str | None = SEARCH) -> TuningRecord | None:
        """The latest record of one candidate (in `phase`; any phase with None), or None."""

    def commit(self, record: TuningRecord) -> None:
        """Keep a record (durably, before returning, where the database is a file)."""

    def top_k(self, workload_key: str, fingerprint: TargetFingerprint | str, k: int = 1,
              impl: str | None = None) -> list[TuningRecord]:
        """The `k` best candidates of a workload (of implementation `impl`), best first."""

    def records(self, workload_key: str | None = None,
                fingerprint: TargetFingerprint | str | None = None) -> list[TuningRecord]:
        """Every record (of a workload, on a fingerprint), in commit order."""

    def __len__(self) -> int:
        """How many records it holds."""


class RecordStore:
    """The `Database` of `TuningRecord`s: an append-only JSON-lines file indexed in memory,
    or (`path` None) memory only.

    Opening reads every existing record. `appended` counts the records this
    instance committed (the measurements a build actually made).
    """

    def __init__(self, path: Path | str | None):
        self.path = None if path is None else Path(path)
        self._records: list[TuningRecord] = []
        self._index: dict[tuple[str, str, str, str], list[TuningRecord]] = {}
        self.appended = 0
        for record in read_records(self.path) if self.path is not None else ():
            self._add(record)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter(self._records)

    def _add(self, record: TuningRecord) -> None:
        self._records.append(record)
        self._index.setdefault(record.identity, []).append(record)

    def commit(self, record: TuningRecord) -> None:
        """Keep one record; in a file, one line, flushed and fsynced before returning."""
        if self.path is not None:
            self._write(record.to_line().encode())
        self._add(record)
        self.appended += 1

    def _write(self, line: bytes) -> None:
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

    def lookup(self, workload_key: str, fingerprint: TargetFingerprint | str, impl: str,
               config: Mapping, phase: str | None = SEARCH) -> TuningRecord | None:
        """The latest record of this candidate (in `phase`; any phase with None), or None."""
        found = self._index.get((workload_key, _fingerprint_key(fingerprint), impl,
                                 config_key(config)), [])
        for record in reversed(found):
            if phase is None or record.phase == phase:
                return record
        return None

    def records(self, workload_key: str | None = None,
                fingerprint: TargetFingerprint | str | None = None) -> list[TuningRecord]:
        """Every record (of a workload, on one fingerprint), in file order."""
        key = None if fingerprint is None else _fingerprint_key(fingerprint)
        return [r for r in self._records
                if (workload_key is None or r.workload_key == workload_key)
                and (key is None or r.fingerprint.key == key)]

    def top_k(self, workload_key: str, fingerprint: TargetFingerprint | str, k: int = 1,
              impl: str | None = None) -> list[TuningRecord]:
        """The `k` fastest ok candidates of a workload on a fingerprint (of `impl`), fastest
        first: a candidate's latest final record (re-measurement) stands for it when it has
        one, else its latest search record; ranked by `wpk.search.choice`."""
        found = [r for r in self.records(workload_key, fingerprint)
                 if impl is None or r.impl == impl]
        return top_records(found, k)

    def best(self, workload_key: str,
             fingerprint: TargetFingerprint | str) -> TuningRecord | None:
        """The best candidate's record of a workload on a fingerprint, or None."""
        best = self.top_k(workload_key, fingerprint, 1)
        return best[0] if best else None

    def workload_keys(self) -> list[str]:
        """Distinct workload keys, in order of first appearance."""
        return list(dict.fromkeys(r.workload_key for r in self._records))


def top_records(records: Iterable[TuningRecord], k: int = 1) -> list[TuningRecord]:
    """`RecordStore.top_k` over any records (one fingerprint assumed)."""
    representative: dict[tuple, TuningRecord] = {}
    for record in records:
        if record.phase == TOLERANCE:
            continue
        ident = record.identity
        held = representative.get(ident)
        if held is None or record.phase == FINAL or held.phase != FINAL:
            representative[ident] = record
    return [record for record, _ in ranked([(r, r) for r in representative.values()])][:k]


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
    write_text(out, "".join(lines), "-o")  # all read first: `-o` may be one of the inputs
    return MergeSummary(read, len(lines), read - len(lines), out)
