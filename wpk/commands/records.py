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

import click
from rich.table import Table
from rich.text import Text

from wpk.commands.common import echo
from wpk.search.records import RecordError, RecordStore, TuningRecord, merge, top_records


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
    records = _select(_open(path).records(), workload)
    if as_json:
        return _json_lines(records)
    return _table(records, f"{len(records)} tuning records in {path}")


def records_best(path: Path | str, workload: str | None = None,
                 as_json: bool = False) -> Table | str:
    """The fastest verified candidate of each (workload, target fingerprint)."""
    groups: dict[tuple[str, str], list[TuningRecord]] = {}
    for record in _select(_open(path).records(), workload):
        groups.setdefault((record.workload_key, record.fingerprint.key), []).append(record)
    best = [top[0] for top in (top_records(group) for group in groups.values()) if top]
    if as_json:
        return _json_lines(best)
    return _table(best, f"best of {len(groups)} workload/target pairs in {path}")


def records_merge(paths: Sequence[Path | str], out: Path | str) -> str:
    """Merge record files into `out`; a one-line summary."""
    summary = merge(paths, out)
    return (f"merged {len(paths)} files: {summary.read} records read, {summary.written} "
            f"written to {summary.out}, {summary.duplicates} duplicates dropped")


def _record_query(command):
    """The arguments of `wpk records list` and `best`: DB, --workload, --json."""
    command = click.option("--json", "as_json", is_flag=True,
                           help="Records as JSON lines.")(command)
    command = click.option("--workload", metavar="KEY",
                           help="Only this workload (a unique key prefix).")(command)
    return click.argument("db", type=click.Path(dir_okay=False, path_type=Path))(command)


@click.group("records")
def command() -> None:
    """Inspect and merge tuning records (JSON lines written by `wpk build --db`)."""


@command.command("list")
@_record_query
def list_command(db: Path, workload: str | None, as_json: bool) -> None:
    """Every measurement in DB."""
    echo(records_list(db, workload=workload, as_json=as_json))


@command.command("best")
@_record_query
def best_command(db: Path, workload: str | None, as_json: bool) -> None:
    """The fastest verified measurement of each workload and target in DB."""
    echo(records_best(db, workload=workload, as_json=as_json))


@command.command("merge")
@click.argument("dbs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Merged record file to write.")
def merge_command(dbs: tuple[Path, ...], output: Path) -> None:
    """Merge record files into one (identical lines dropped, repeats kept)."""
    click.echo(records_merge(list(dbs), output))
