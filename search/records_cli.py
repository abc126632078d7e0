"""What `wpk records {list,best,merge}` shows: rich tables, or JSON text with `as_json`.

    records_list(path, workload=None, as_json=False)  -> rich Table | str (JSON lines)
    records_best(path, workload=None, as_json=False)  -> rich Table | str (JSON lines)
    records_merge([a, b], out)                        -> str (one summary line)

`workload` filters by workload key (a unique prefix is enough). `best` shows
one row per (workload, target fingerprint): the fastest verified candidate,
its final re-measurement when there is one. A missing file is a `RecordError`
(exit code 2 in the CLI); skipped lines are `RecordWarning`s, which the CLI
can show as warnings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table
from rich.text import Text

from wpk.search.records import RecordError, RecordStore, TuningRecord, best_of, merge


def _open(path: Path | str) -> RecordStore:
    if not Path(path).exists():
        raise RecordError(f"tuning record file {path} does not exist",
                          hint="give the file a `wpk build --db FILE` wrote")
    return RecordStore(path)


def _select(records: Sequence[TuningRecord], workload: str | None) -> list[TuningRecord]:
    if not workload:
        return list(records)
    keys = {r.workload_key for r in records if r.workload_key.startswith(workload)}
    if not keys:
        raise RecordError(f"no records of a workload with key {workload!r}",
                          hint="`wpk records list` shows the workload keys")
    if len(keys) > 1:
        raise RecordError(f"workload key prefix {workload!r} matches {len(keys)} workloads",
                          hint="give more digits of the key")
    return [r for r in records if r.workload_key in keys]


def _workload_label(record: TuningRecord) -> str:
    try:
        return record.to_workload().label
    except Exception:  # records from another wpk version may not parse as today's Workload
        return str(record.workload.get("op", "?"))


def _micros(value: float) -> str:
    return f"{value * 1e6:.2f}" if math.isfinite(value) else "-"


def _table(records: Sequence[TuningRecord], title: str) -> Table:
    table = Table(title=title)
    for column in ("workload", "op", "target", "candidate", "status", "phase"):
        table.add_column(column)
    for column in ("median us", "q25-q75 us"):
        table.add_column(column, justify="right")
    table.add_column("error")
    for record in records:
        low, high = record.spread_s
        cells = (record.workload_key, _workload_label(record), record.fingerprint.device,
                 record.label, record.status.value, record.phase, _micros(record.median_s),
                 f"{_micros(low)}-{_micros(high)}" if record.ok else "", record.error[:80])
        table.add_row(*(Text(cell) for cell in cells))  # Text: no markup ('[tile=8]')
    return table


def _json_lines(records: Sequence[TuningRecord]) -> str:
    return "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records)


def records_list(path: Path | str, workload: str | None = None,
                 as_json: bool = False) -> Table | str:
    """Every record of the file (of one workload), in file order."""
    records = _select(_open(path).records, workload)
    if as_json:
        return _json_lines(records)
    return _table(records, f"{len(records)} tuning records in {path}")


def records_best(path: Path | str, workload: str | None = None,
                 as_json: bool = False) -> Table | str:
    """The fastest verified candidate of each (workload, target fingerprint)."""
    groups: dict[tuple[str, str], list[TuningRecord]] = {}
    for record in _select(_open(path).records, workload):
        groups.setdefault((record.workload_key, record.fingerprint.key), []).append(record)
    best = [b for b in (best_of(group) for group in groups.values()) if b is not None]
    if as_json:
        return _json_lines(best)
    return _table(best, f"best of {len(groups)} workload/target pairs in {path}")


def records_merge(paths: Sequence[Path | str], out: Path | str) -> str:
    """Merge record files into `out`; a one-line summary."""
    summary = merge(paths, out)
    return (f"merged {len(paths)} files: {summary.read} records read, {summary.written} "
            f"written to {summary.out}, {summary.duplicates} duplicates dropped")
