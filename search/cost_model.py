"""An online cost model and the filter that spends measurements on promising points only.

`CostModel` is scikit-learn's `GradientBoostingRegressor` fitted on the space's
feature vectors (`SearchSpace.features`) against log seconds of every successful
measurement so far; it ranks candidates by predicted time. Failed measurements
are kept apart (they have no time) and are not used for fitting.

`CostModelFilter` wraps any tuner: it asks the tuner for ``pool_factor x n``
candidates, measures only the `n` the model predicts fastest, and hands the
others back to the tuner with their predicted costs (``update(..., predicted=True)``:
they steer the search, are not measurements, and may be proposed again). Until the
model has `min_train` measurements it keeps the tuner's first `n` candidates.
`report()` says how many candidates were proposed, measured and skipped;
`quality_kept(cost)` uses a cost oracle (synthetic spaces, benchmarks) to say how
much of each batch's best the kept subset retained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor

from wpk.core.errors import OptionError
from wpk.search.space import SearchSpace
from wpk.search.tuners.base import Tuner


@dataclass(frozen=True)
class CostModelOptions:
    """Gradient-boosted trees' settings (see scikit-learn's GradientBoostingRegressor)
    and when the model starts filtering.

    n_estimators, max_depth, learning_rate, min_samples_leaf, subsample: the trees.
    min_train: successful measurements before the model ranks anything.
    """

    n_estimators: int = 150
    max_depth: int = 3
    learning_rate: float = 0.1
    min_samples_leaf: int = 2
    subsample: float = 0.8
    min_train: int = 8


class CostModel:
    """Predicts log seconds of a config from its features; trained on measured points."""

    def __init__(self, space: SearchSpace, seed: int = 0, options: CostModelOptions | None = None):
        self.space = space
        self.seed = int(seed)
        self.options = options or CostModelOptions()
        self._features: list[np.ndarray] = []
        self._log_costs: list[float] = []
        self._model: GradientBoostingRegressor | None = None
        self._fitted_on = 0

    @property
    def samples(self) -> int:
        """Successful measurements the model has seen."""
        return len(self._log_costs)

    @property
    def ready(self) -> bool:
        return self.samples >= self.options.min_train

    def add(self, configs: Sequence[Mapping], costs: Sequence[float | None]) -> None:
        """Record measurements (None or non-finite: failed, not used for fitting)."""
        keep = [(c, t) for c, t in zip(configs, costs)
                if t is not None and math.isfinite(t) and t > 0]
        if keep:
            feats = self.space.features([c for c, _ in keep])
            self._features.extend(feats)
            self._log_costs.extend(math.log(t) for _, t in keep)

    def fit(self) -> None:
        """(Re)fit on everything recorded (no-op when nothing new or too little data)."""
        if not self.ready or self._fitted_on == self.samples:
            return
        opts = self.options
        model = GradientBoostingRegressor(
            n_estimators=opts.n_estimators, max_depth=opts.max_depth,
            learning_rate=opts.learning_rate, min_samples_leaf=opts.min_samples_leaf,
            subsample=opts.subsample, random_state=self.seed)
        model.fit(np.asarray(self._features), np.asarray(self._log_costs))
        self._model, self._fitted_on = model, self.samples

    def predict(self, configs: Sequence[Mapping]) -> np.ndarray:
        """Predicted seconds of each config (OptionError before the model is ready)."""
        if not self.ready:
            raise OptionError(f"the cost model has {self.samples} measurements, needs "
                              f"{self.options.min_train}", hint="add measurements first")
        self.fit()
        return np.exp(self._model.predict(self.space.features(configs)))

    def rank(self, configs: Sequence[Mapping]) -> list[dict]:
        """The configs ordered from predicted fastest to slowest (stable for ties)."""
        predicted = self.predict(configs)
        order = np.argsort(predicted, kind="stable")
        return [dict(configs[i]) for i in order]


@dataclass(frozen=True)
class FilterReport:
    """What the filter did: candidates the tuner proposed, measured and skipped."""

    proposed: int
    measured: int
    skipped: int

    @property
    def skipped_fraction(self) -> float:
        return self.skipped / self.proposed if self.proposed else 0.0


class CostModelFilter:
    """Wraps a tuner (same interface): measure only the model's best of a larger pool."""

    def __init__(self, tuner: Tuner, pool_factor: int = 4, model: CostModel | None = None):
        if pool_factor < 1:
            raise OptionError(f"pool_factor must be at least 1, got {pool_factor}",
                              hint="use 1 (no filtering) or more")
        self.tuner = tuner
        self.pool_factor = int(pool_factor)
        self.model = model or CostModel(tuner.space, tuner.seed)
        self.batches: list[tuple[list[dict], list[dict]]] = []   # (kept, skipped) per batch

    def next_batch(self, n: int) -> list[dict]:
        """Up to `n` configs: the predicted fastest of ``pool_factor x n`` candidates."""
        pool = self.tuner.next_batch(n * self.pool_factor)
        if len(pool) <= n:
            self.batches.append((list(pool), []))
            return pool
        if not self.model.ready:
            kept, skipped = pool[:n], pool[n:]
            predicted = None
        else:
            costs = self.model.predict(pool)
            order = np.argsort(costs, kind="stable")
            kept = [pool[i] for i in order[:n]]
            skipped = [pool[i] for i in order[n:]]
            predicted = [float(costs[i]) for i in order[n:]]
        if skipped:
            if predicted is None:   # no model yet: hand them back without a cost estimate
                predicted = [self._typical_cost()] * len(skipped)
            self.tuner.update(skipped, predicted, predicted=True)
        self.batches.append((kept, skipped))
        return kept

    def update(self, configs: Sequence[Mapping], costs: Sequence[float | None]) -> None:
        """Measured costs go to the tuner and to the model."""
        self.tuner.update(configs, costs)
        self.model.add(configs, costs)
        self.model.fit()

    def has_next(self) -> bool:
        return self.tuner.has_next()

    @property
    def best(self):
        return self.tuner.best

    @property
    def history(self):
        return self.tuner.history

    @property
    def trials(self) -> int:
        return self.tuner.trials

    def report(self) -> FilterReport:
        kept = sum(len(k) for k, _ in self.batches)
        skipped = sum(len(s) for _, s in self.batches)
        return FilterReport(proposed=kept + skipped, measured=kept, skipped=skipped)

    def quality_kept(self, cost: Callable[[Mapping], float | None]) -> float:
        """Mean over filtered batches of (best true cost among all candidates) /
        (best true cost among the kept ones): 1.0 means the filter never dropped a
        batch's best point. Needs a cost oracle (synthetic spaces, benchmarks)."""
        ratios = []
        for kept, skipped in self.batches:
            if not skipped:
                continue
            best_all = _finite_min(cost(c) for c in kept + skipped)
            best_kept = _finite_min(cost(c) for c in kept)
            if math.isfinite(best_all):
                ratios.append(best_all / best_kept if math.isfinite(best_kept) else 0.0)
        return float(np.mean(ratios)) if ratios else 1.0

    def _typical_cost(self) -> float:
        measured = [t.cost for t in self.tuner.history if t.status == "ok"]
        return float(np.median(measured)) if measured else math.inf


def _finite_min(values) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return min(finite) if finite else math.inf
