"""The online cost model (gradient-boosted trees) and the filter in front of a tuner."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from wpk.core.errors import OptionError
from wpk.search.cost_model import CostModel, CostModelFilter, CostModelOptions
from wpk.search.space import synthetic_space
from wpk.search.tuners import make_tuner

BIG = (8, 6, 8, 5, 6)
FAST = CostModelOptions(n_estimators=60)
FILTERED_TRIALS = 300        # GA behind the filter: measurements to find BIG's optimum


def sample_valid(problem, count, rng):
    out = []
    while len(out) < count:
        point = problem.space.random_indices(rng)
        if problem.space.is_valid(point):
            out.append(problem.space.config(point))
    return out


def test_model_ranks_unseen_points_after_150_measurements():
    problem = synthetic_space(BIG, seed=0)
    rng = np.random.default_rng(0)
    train, test = sample_valid(problem, 150, rng), sample_valid(problem, 300, rng)
    model = CostModel(problem.space, seed=0, options=FAST)
    model.add(train, [problem.cost(c) for c in train])
    predicted = model.predict(test)
    rho = spearmanr(predicted, [problem.cost(c) for c in test]).statistic
    assert rho > 0.8, rho
    ranked = model.rank(test)
    assert [problem.space.indices(c) for c in ranked][:1] == \
        [problem.space.indices(test[int(np.argmin(predicted))])]


def test_model_needs_enough_measurements_and_ignores_failures():
    problem = synthetic_space(BIG, seed=0)
    configs = sample_valid(problem, 10, np.random.default_rng(1))
    model = CostModel(problem.space, options=CostModelOptions(min_train=8))
    model.add(configs, [None, float("inf")] + [problem.cost(c) for c in configs[2:7]])
    assert model.samples == 5 and not model.ready
    with pytest.raises(OptionError, match="needs 8"):
        model.predict(configs)
    model.add(configs[7:], [problem.cost(c) for c in configs[7:]])
    assert model.ready and model.predict(configs).shape == (10,)


def test_filter_measures_only_the_predicted_best_and_keeps_quality():
    """GA behind the filter (pool 4 x batch) finds BIG's optimum within FILTERED_TRIALS = 300
    measurements; the report counts the skipped candidates, and the kept subsets retain
    most of each batch's best (true costs checked with the synthetic oracle)."""
    problem = synthetic_space(BIG, seed=0)
    measured = []
    tuner = CostModelFilter(make_tuner("ga", problem.space, seed=0), pool_factor=4,
                            model=CostModel(problem.space, seed=0, options=FAST))
    found = None
    while tuner.has_next() and tuner.trials < FILTERED_TRIALS:
        configs = tuner.next_batch(8)
        assert len(configs) <= 8
        measured += [tuple(c.values()) for c in configs]
        tuner.update(configs, [problem.cost(c) for c in configs])
        if found is None and tuner.best[1] <= problem.optimum_cost:
            found = tuner.trials
    assert found is not None and found <= FILTERED_TRIALS
    assert len(measured) == len(set(measured))
    report = tuner.report()
    assert report.measured == len(measured) and report.skipped > 0
    assert report.proposed == report.measured + report.skipped
    assert 0 < report.skipped_fraction < 1
    assert tuner.quality_kept(problem.cost) > 0.9


def test_filter_spends_measurements_on_better_points_than_plain_random_search():
    """The model's ranking is worth measurements: over 120 trials, random search behind the
    filter measures points whose median time is well below plain random search's."""
    problem = synthetic_space(BIG, seed=0)
    medians = {}
    for filtered in (False, True):
        tuner = make_tuner("random", problem.space, seed=0)
        if filtered:
            tuner = CostModelFilter(tuner, pool_factor=4,
                                    model=CostModel(problem.space, seed=0, options=FAST))
        while tuner.trials < 120:
            configs = tuner.next_batch(8)
            tuner.update(configs, [problem.cost(c) for c in configs])
        later = [t.cost for t in tuner.history if t.status == "ok"][16:]
        medians[filtered] = float(np.median(later))
    assert medians[True] < 0.5 * medians[False], medians


def test_filter_rejects_a_bad_pool_factor():
    problem = synthetic_space((3, 3), seed=0)
    with pytest.raises(OptionError, match="pool_factor"):
        CostModelFilter(make_tuner("random", problem.space), pool_factor=0)
