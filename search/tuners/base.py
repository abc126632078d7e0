"""The tuner interface (after TVM autotvm): ``next_batch / update / has_next``.

A driver loop::

    while tuner.has_next() and budget_left:
        configs = tuner.next_batch(8)
        costs = [measure(c) for c in configs]      # seconds, or None when it failed
        tuner.update(configs, costs)

Guarantees of every tuner:

* a point is proposed at most once (`next_batch` never returns a visited point);
* a point the space's `validate` rejects is never proposed: it is recorded in
  `history` with status ``invalid`` and its reason, and the search sees it with the
  cost `INVALID_COST` (a penalty), so nothing is compiled or measured for it;
* `update` with ``None`` or a non-finite cost records a failed measurement, which
  the search also sees as `INVALID_COST`;
* `update` also takes configs the tuner did not propose (measurements from tuning
  records): they become known and visited, so a resumed search measures them never
  again;
* ``update(..., predicted=True)`` feeds the search with costs a model predicted
  (see `wpk.search.cost_model.CostModelFilter`): they steer the search but are not
  measurements, so they enter neither `history` nor `best`, and the points become
  proposable again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wpk.core.errors import OptionError
from wpk.search.space import Indices, SearchSpace

INVALID_COST = math.inf


@dataclass(frozen=True)
class Trial:
    """One point a tuner dealt with: measured (``ok``/``failed``) or rejected (``invalid``)."""

    config: dict
    cost: float
    status: str          # "ok" | "failed" | "invalid"
    reason: str = ""

    @property
    def measured(self) -> bool:
        return self.status != "invalid"


class Tuner:
    """Base class. Subclasses implement `_propose(n) -> list[Indices]` (new, valid,
    unvisited points claimed with `_claim`) and may override `_observe` and `_more`."""

    name = "tuner"

    def __init__(self, space: SearchSpace, seed: int = 0):
        if not isinstance(space, SearchSpace):
            raise OptionError(f"a tuner needs a SearchSpace, got {type(space).__name__}",
                             hint="wrap knobs with wpk.search.space.SearchSpace")
        self.space = space
        self.seed = int(seed)
        self.history: list[Trial] = []
        self.best: tuple[dict, float] | None = None
        self._visited: set[Indices] = set()     # proposed (pending or measured) or invalid
        self._pending: set[Indices] = set()     # proposed, not yet updated
        self._known: dict[Indices, float] = {}  # cost the search knows (measured or invalid)

    # ------------------------------------------------------------------ public API
    def next_batch(self, n: int) -> list[dict]:
        """Up to `n` new valid points to measure (fewer, or none, when the search has
        no more to offer now)."""
        if n < 1:
            raise OptionError(f"next_batch needs n >= 1, got {n}", hint="ask for one or more")
        proposed = self._propose(n) if self.has_next() else []
        return [self.space.config(p) for p in proposed]

    def update(self, configs: Sequence[Mapping], costs: Sequence[float | None],
               predicted: bool = False) -> None:
        """Report the cost (seconds; None or inf when it failed) of proposed configs."""
        if len(configs) != len(costs):
            raise OptionError(f"update got {len(configs)} configs but {len(costs)} costs",
                             hint="pass one cost per config")
        points = [self.space.indices(c) for c in configs]
        clean = [_clean(c) for c in costs]
        for point, cost in zip(points, clean):
            self._pending.discard(point)
            if predicted:
                self._visited.discard(point)
                continue
            self._visited.add(point)     # also for configs it did not propose (records)
            config = self.space.config(point)
            status = "ok" if math.isfinite(cost) else "failed"
            self.history.append(Trial(config, cost, status))
            self._known[point] = cost
            if status == "ok" and (self.best is None or cost < self.best[1]):
                self.best = (config, cost)
        self._observe(points, clean, predicted)

    def has_next(self) -> bool:
        """False once the space is exhausted or the search has nothing more to propose."""
        return len(self._visited) < self.space.size and self._more()

    @property
    def trials(self) -> int:
        """Number of measured points (ok or failed)."""
        return sum(1 for t in self.history if t.measured)

    @property
    def invalid(self) -> list[Trial]:
        """Points rejected by `validate` without being measured."""
        return [t for t in self.history if t.status == "invalid"]

    # ------------------------------------------------------------------ for subclasses
    def _claim(self, point: Indices) -> bool:
        """Mark `point` visited. True when it is new and valid (so it can be proposed);
        an invalid new point is recorded as such and given `INVALID_COST`."""
        point = tuple(int(i) for i in point)
        if point in self._visited:
            return False
        self._visited.add(point)
        reason = self.space.invalid_reason(point)
        if reason is not None:
            self.history.append(Trial(self.space.config(point), INVALID_COST, "invalid", reason))
            self._known[point] = INVALID_COST
            return False
        self._pending.add(point)
        return True

    def _propose(self, n: int) -> list[Indices]:
        raise NotImplementedError

    def _observe(self, points: list[Indices], costs: list[float], predicted: bool) -> None:
        """Hook: the search learns the costs of `points`."""

    def _more(self) -> bool:
        return True


def _clean(cost: float | None) -> float:
    if cost is None:
        return INVALID_COST
    cost = float(cost)
    return cost if math.isfinite(cost) and cost > 0 else INVALID_COST
