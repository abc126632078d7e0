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

`explain(pairs, winner)` says which rule decided, for the report:

    explain(pairs, winner, prefer=joins)   # Reason(rule="region", over_s=4e-06, ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


# The rules that can decide a choice, as `Reason.rule` names them.
FASTEST = "fastest"              # rule 3: the fastest verified candidate
ONLY_VERIFIED = "only_verified"  # nothing else verified
TIMED_ALONE = "timed_alone"      # rule 2: a faster time was taken concurrently
REGION = "region"                # rule 4: slower, but keeps an onnxruntime region whole


@dataclass(frozen=True)
class Reason:
    """Why a winner won: the deciding rule, how many candidates verified, and for a winner
    that is not the fastest, the faster pair (`faster`) and how much slower it is (`over_s`).
    `runner_up` is the fastest other competitor (None when the winner stands alone)."""

    rule: str
    verified: int
    over_s: float = 0.0
    faster: Any = None
    runner_up: Any = None


def explain(pairs: Sequence[tuple[C, Any]], winner: tuple[C, Any],
            prefer: Callable[[C], bool] | None = None) -> Reason:
    """Which rule made `winner` (what `choose` returned for `pairs`) win."""
    competing = eligible(pairs)
    verified = [pair for pair in pairs if pair[1].ok and math.isfinite(pair[1].median_s)]
    others = [pair for pair in ranked(pairs) if pair is not winner]
    runner_up = others[0] if others else None
    if len(verified) == 1:
        return Reason(ONLY_VERIFIED, 1)
    fastest = ranked(pairs)[0]
    if fastest is not winner and prefer is not None and prefer(winner[0]):
        return Reason(REGION, len(verified), _time(winner[1]) - _time(fastest[1]), fastest,
                      runner_up)
    ids = {id(pair) for pair in competing}
    quicker = [pair for pair in verified if id(pair) not in ids
               and _time(pair[1]) < _time(winner[1])]
    if quicker:
        best = min(quicker, key=lambda pair: _time(pair[1]))
        return Reason(TIMED_ALONE, len(verified), _time(winner[1]) - _time(best[1]), best,
                      runner_up)
    return Reason(FASTEST, len(verified), runner_up=runner_up)
