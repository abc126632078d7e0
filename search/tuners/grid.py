"""Grid search: every point in flat (lexicographic) order, invalid ones skipped."""

from __future__ import annotations

from wpk.search.space import Indices, SearchSpace
from wpk.search.tuners.base import Tuner


class GridTuner(Tuner):
    """Exhaustive enumeration; the seed is accepted for a uniform interface and unused."""

    name = "grid"

    def __init__(self, space: SearchSpace, seed: int = 0):
        super().__init__(space, seed)
        self._next_flat = 0

    def _propose(self, n: int) -> list[Indices]:
        out: list[Indices] = []
        while len(out) < n and self._next_flat < self.space.size:
            point = self.space.unflat(self._next_flat)
            self._next_flat += 1
            if self._claim(point):
                out.append(point)
        return out

    def _more(self) -> bool:
        return self._next_flat < self.space.size
