"""Tuning budgets: which workloads get time first, how much, and when a search stops early.

    order = by_latency_share(entries)            # largest vendor time x node count first
    slice_s = time_slice(remaining_s, share, remaining_shares)
    trials = split_trials(16, 2)                 # a workload's trials among its families
    stopper = EarlyStop(patience=16, min_gain=0.01)
    stopper.observe(best_so_far) -> True when the best has not improved by more than
                                    `min_gain` (relative) over the last `patience` trials

A build's `--budget SECONDS` is spent on the workloads in order of their share of
the model's latency (the vendor kernel's time times the number of nodes that
share the workload); each gets a slice of the time left proportional to its
share among the workloads still to tune, so time a workload does not use (it
converged or ran out of trials) flows to the next ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from wpk.core.errors import OptionError


@dataclass(frozen=True)
class ShareEntry:
    """One workload's weight in the model: its key, vendor seconds and node count."""

    key: str
    vendor_s: float
    count: int

    @property
    def latency_s(self) -> float:
        return (self.vendor_s if math.isfinite(self.vendor_s) else 0.0) * self.count


def by_latency_share(entries: Sequence[ShareEntry]) -> list[ShareEntry]:
    """Entries largest share of the model latency first (ties keep graph order)."""
    return sorted(entries, key=lambda e: -e.latency_s)


def shares(entries: Sequence[ShareEntry]) -> dict[str, float]:
    """Each entry's fraction of the total latency (equal shares when nothing is known)."""
    total = sum(e.latency_s for e in entries)
    if total <= 0:
        return {e.key: 1.0 / max(len(entries), 1) for e in entries}
    return {e.key: e.latency_s / total for e in entries}


def split_trials(total: int, parts: int) -> list[int]:
    """A workload's `total` trials split evenly among the `parts` searches that tune it (its
    generated families, as its time is), the first ones taking the remainder: 5 in 2 is
    [3, 2]; a part may get 0 when `total` < `parts`."""
    if parts < 1:
        return []
    base, extra = divmod(max(int(total), 0), parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def time_slice(remaining_s: float, share: float, remaining_share: float,
               minimum_s: float = 0.0) -> float:
    """Seconds for one workload: its share of what is left among the shares still to go,
    at least `minimum_s` (never more than what is left)."""
    if remaining_s <= 0:
        return 0.0
    part = remaining_s * (share / remaining_share if remaining_share > 0 else 1.0)
    return min(remaining_s, max(part, minimum_s))


@dataclass
class EarlyStop:
    """Stop when the best cost has not improved by more than `min_gain` (relative) during
    the last `patience` measured trials."""

    patience: int = 16
    min_gain: float = 0.01
    best: float = math.inf
    since: int = 0
    history: list[float] = field(default_factory=list)

    def __post_init__(self):
        if self.patience < 1 or not 0 <= self.min_gain < 1:
            raise OptionError(f"early stop needs patience >= 1 and 0 <= min_gain < 1, got "
                              f"{self.patience} and {self.min_gain}")

    def observe(self, cost: float | None) -> bool:
        """Take one trial's cost (None/inf when it failed); True when the search should stop."""
        value = math.inf if cost is None or not math.isfinite(cost) else float(cost)
        if value < self.best * (1.0 - self.min_gain):
            self.since = 0
        else:
            self.since += 1
        self.best = min(self.best, value)
        self.history.append(self.best)
        return self.since >= self.patience

    @property
    def stopped(self) -> bool:
        return self.since >= self.patience
