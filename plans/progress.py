"""A progress bar over workloads for long builds (rich, on stderr).

    with progress_bar(enabled=options.progress) as on_progress:
        plan(workloads, target, options, on_progress)

The bar shows only when enabled and stderr is a terminal; otherwise the
callback does nothing, so logs and pipes stay clean.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from wpk.plans.planner import ProgressCallback


def _ignore(done: int, total: int, label: str) -> None:
    return None


def wants_progress(enabled: bool, stream: TextIO | None = None) -> bool:
    """True when a bar should show: enabled and the stream is a terminal."""
    stream = stream if stream is not None else sys.stderr
    return bool(enabled) and hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def progress_bar(enabled: bool = True, description: str = "tuning",
                 stream: TextIO | None = None) -> Iterator[ProgressCallback]:
    """Yield an `on_progress(done, total, label)` callback driving a bar on `stream`."""
    stream = stream if stream is not None else sys.stderr
    if not wants_progress(enabled, stream):
        yield _ignore
        return
    console = Console(file=stream)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[label]}"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None, label="")

        def on_progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)
        yield on_progress
