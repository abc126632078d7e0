"""The one rule that picks a winner among measured candidates.

    candidate, measurement = choose(pairs)                      # fastest verified
    candidate, measurement = choose(pairs, prefer=joins, credit_s=20e-6)

Used by the planner (every workload's choice), by the tuning records (the best
record of a workload) and so by `wpk tune`. A measurement is anything with
`ok`, `median_s` and `extra` (a `Measurement`, a `TuningRecord`).

1. Only verified measurements with a finite time compete.
2. Times taken concurrently with other candidates (`extra["contended"]`, from
   `--parallel-measure`) rank but do not decide: a candidate timed alone wins
   whenever there is one.
3. The fastest wins; ties go to the earlier candidate.
4. With `prefer`, a preferred candidate at most `credit_s` slower than the
   winner wins instead (a step that keeps an onnxruntime region whole saves
   about a session call inside it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

C = TypeVar("C")


def _time(measurement: Any) -> float:
    return measurement.median_s


def eligible(pairs: Sequence[tuple[C, Any]]) -> list[tuple[C, Any]]:
    """The pairs that compete (rules 1 and 2), in order."""
    ok = [pair for pair in pairs if pair[1].ok and math.isfinite(pair[1].median_s)]
    alone = [pair for pair in ok if not pair[1].extra.get("contended")]
    return alone or ok


def ranked(pairs: Sequence[tuple[C, Any]]) -> list[tuple[C, Any]]:
    """The competing pairs, fastest first (stable: ties keep their order)."""
    return sorted(eligible(pairs), key=lambda pair: _time(pair[1]))


def choose(pairs: Sequence[tuple[C, Any]], prefer: Callable[[C], bool] | None = None,
           credit_s: float = 0.0) -> tuple[C, Any] | None:
    """The winning (candidate, measurement), or None when nothing verified (module
    docstring)."""
    order = ranked(pairs)
    if not order:
        return None
    best = order[0]
    if prefer is not None and not prefer(best[0]):
        preferred = next((pair for pair in order if prefer(pair[0])), None)
        if preferred is not None and _time(preferred[1]) <= _time(best[1]) + credit_s:
            return preferred
    return best
