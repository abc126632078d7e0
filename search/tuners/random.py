"""Random search: uniformly drawn points without replacement (seeded)."""

from __future__ import annotations

import numpy as np

from wpk.search.space import Indices, SearchSpace
from wpk.search.tuners.base import Tuner

# Draws that hit visited points before the tuner switches to enumerating what is left.
REJECTION_TRIES = 64


class RandomTuner(Tuner):
    """Points drawn uniformly from the unvisited part of the space."""

    name = "random"

    def __init__(self, space: SearchSpace, seed: int = 0):
        super().__init__(space, seed)
        self._rng = np.random.default_rng(self.seed)

    def _propose(self, n: int) -> list[Indices]:
        out: list[Indices] = []
        misses = 0
        while len(out) < n and len(self._visited) < self.space.size:
            if misses >= REJECTION_TRIES:
                # Nearly exhausted: draw from the explicit list of unvisited points.
                rest = [p for p in self.space.points() if p not in self._visited]
                point = rest[int(self._rng.integers(len(rest)))]
            else:
                point = self.space.random_indices(self._rng)
            if point in self._visited:
                misses += 1
                continue
            misses = 0
            if self._claim(point):
                out.append(point)
        return out
