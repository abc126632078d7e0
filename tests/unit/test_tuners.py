"""Tuners (random, grid, GA) on synthetic spaces with a known optimum, and SearchSpace."""

from __future__ import annotations

import math

import pytest

from wpk.core.errors import OptionError
from wpk.search.space import SearchSpace, synthetic_space
from wpk.search.tuners import INVALID_COST, make_tuner
from wpk.search.tuners.ga import GAOptions

BIG = (8, 6, 8, 5, 6)        # 11,520 points, 9,606 valid
SMALL = (4, 4, 3, 4)          # 192 points
GA_TRIALS = 500               # about 5% of BIG's valid points


class CountingCost:
    """The synthetic cost as a measurement: counts calls, refuses invalid points."""

    def __init__(self, problem):
        self.problem = problem
        self.calls: list[tuple] = []

    def __call__(self, config):
        point = self.problem.space.indices(config)
        assert self.problem.space.is_valid(point), f"invalid point measured: {config}"
        self.calls.append(point)
        return self.problem.cost(config)


def drive(tuner, cost, max_trials: int, batch: int = 8):
    """Run the tuner; return (trial at which the optimum was first measured or None,
    every proposal in order)."""
    optimum = cost.problem.optimum_cost
    found, proposals = None, []
    while tuner.has_next() and tuner.trials < max_trials:
        configs = tuner.next_batch(batch)
        proposals += [tuple(c.values()) for c in configs]
        tuner.update(configs, [cost(c) for c in configs])
        if found is None and tuner.best is not None and tuner.best[1] <= optimum:
            found = tuner.trials
    return found, proposals


@pytest.mark.parametrize("name", ["random", "grid"])
def test_exhaustive_tuners_cover_every_valid_point_once_and_find_the_optimum(name):
    """Random and grid search find the optimum of SMALL within its number of valid
    points (each valid point measured exactly once, no invalid point measured)."""
    problem = synthetic_space(SMALL, seed=3)
    valid = problem.valid_points()
    cost = CountingCost(problem)
    tuner = make_tuner(name, problem.space, seed=7)
    found, proposals = drive(tuner, cost, max_trials=problem.space.size)
    assert found is not None and found <= valid
    assert tuner.best[0] == problem.optimum
    assert len(proposals) == len(set(proposals)) == valid == len(cost.calls)
    assert not tuner.has_next()
    assert tuner.next_batch(4) == []
    invalid = tuner.invalid
    assert len(invalid) == problem.space.size - valid > 0
    assert all(t.cost == INVALID_COST and t.reason for t in invalid)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ga_finds_the_optimum_within_500_trials(seed):
    """GA finds BIG's optimum within GA_TRIALS = 500 measurements (of 9,606 valid points),
    measuring no point twice and no invalid point."""
    problem = synthetic_space(BIG, seed=0)
    cost = CountingCost(problem)
    tuner = make_tuner("ga", problem.space, seed=seed)
    found, proposals = drive(tuner, cost, GA_TRIALS)
    assert found is not None and found <= GA_TRIALS, f"best {tuner.best}"
    assert len(proposals) == len(set(proposals)) == len(cost.calls)
    assert tuner.generation > 5
    assert tuner.invalid, "the space has invalid points the GA should have met"


def test_random_search_does_not_find_the_big_optimum_in_the_ga_budget():
    """The GA's budget is a real constraint: random search misses BIG's optimum with it."""
    problem = synthetic_space(BIG, seed=0)
    found, _ = drive(make_tuner("random", problem.space, seed=0), CountingCost(problem),
                     GA_TRIALS)
    assert found is None


def test_ga_is_deterministic_under_a_seed():
    problem = synthetic_space(BIG, seed=0)
    runs = []
    for seed in (5, 5, 6):
        _, proposals = drive(make_tuner("ga", problem.space, seed=seed),
                             CountingCost(problem), 120)
        runs.append(proposals)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_ga_does_not_depend_on_the_global_random_state():
    import random

    problem = synthetic_space(BIG, seed=0)
    first = make_tuner("ga", problem.space, seed=1)
    second = make_tuner("ga", problem.space, seed=1)
    a = first.next_batch(8)
    random.seed(12345)
    random.random()
    b = second.next_batch(8)
    assert a == b


def test_failed_measurements_are_recorded_and_never_best():
    problem = synthetic_space(SMALL, seed=3)
    tuner = make_tuner("ga", problem.space, seed=0, population_size=8)
    configs = tuner.next_batch(8)
    costs = [None, math.inf, -1.0] + [problem.cost(c) for c in configs[3:]]
    tuner.update(configs, costs)
    statuses = [t.status for t in tuner.history if t.measured]
    assert statuses[:3] == ["failed"] * 3
    assert tuner.best[1] == min(problem.cost(c) for c in configs[3:])
    assert tuner.trials == 8


def test_predicted_costs_steer_but_are_not_measurements():
    problem = synthetic_space(SMALL, seed=3)
    tuner = make_tuner("random", problem.space, seed=0)
    configs = tuner.next_batch(4)
    tuner.update(configs, [1e-6] * 4, predicted=True)
    assert tuner.best is None and tuner.trials == 0
    assert tuner.history == [] or all(t.status == "invalid" for t in tuner.history)
    _, proposals = drive(tuner, CountingCost(problem), problem.space.size)
    assert {tuple(c.values()) for c in configs} <= set(proposals)   # proposable again


@pytest.mark.parametrize("name", ["random", "grid", "ga"])
def test_points_known_from_records_are_never_proposed(name):
    """A resumed search: configs measured earlier (tuning records) are given to `update`
    before the first batch and never proposed again."""
    problem = synthetic_space(SMALL, seed=3)
    valid = [problem.space.config(p) for p in problem.space.points()
             if problem.space.is_valid(p)]
    earlier = valid[::3]
    tuner = make_tuner(name, problem.space, seed=0)
    tuner.update(earlier, [problem.cost(c) for c in earlier])
    assert tuner.trials == len(earlier)
    _, proposals = drive(tuner, CountingCost(problem), problem.space.size)
    assert not {tuple(c.values()) for c in earlier} & set(proposals)
    assert len(proposals) + len(earlier) == len(valid)
    assert tuner.best[0] == problem.optimum


def test_ga_options_are_validated():
    with pytest.raises(OptionError, match="elite"):
        GAOptions(population_size=4, elite=4)
    with pytest.raises(OptionError, match="mutation_prob"):
        GAOptions(mutation_prob=1.5)
    with pytest.raises(OptionError, match="either"):
        make_tuner("ga", synthetic_space(SMALL).space, options=GAOptions(), elite=1)


def test_make_tuner_rejects_unknown_names_and_options():
    space = synthetic_space(SMALL).space
    with pytest.raises(OptionError, match="unknown tuner"):
        make_tuner("annealing", space)
    with pytest.raises(OptionError, match="takes no options"):
        make_tuner("random", space, population_size=4)
    with pytest.raises(OptionError, match="SearchSpace"):
        make_tuner("grid", {"a": [1, 2]})
    with pytest.raises(OptionError, match="n >= 1"):
        make_tuner("grid", space).next_batch(0)
    tuner = make_tuner("grid", space)
    with pytest.raises(OptionError, match="2 configs but 1 costs"):
        tuner.update(tuner.next_batch(2), [1.0])


def test_search_space_addressing():
    space = SearchSpace({"a": [1, 2, 4], "b": ["x", "y"], "c": [0, 1, 2, 3]})
    assert space.size == 24 and space.dims == (3, 2, 4)
    for number in range(space.size):
        point = space.unflat(number)
        assert space.flat(point) == number
        assert space.indices(space.config(point)) == point
    assert list(space.points())[5] == space.unflat(5)
    assert sorted(space.neighbours((0, 1, 3))) == [(0, 0, 3), (0, 1, 2), (1, 1, 3)]
    feats = space.features([{"a": 4, "b": "y", "c": 0}])
    assert feats.shape == (1, 5)          # 3 normalised indices + 2 numeric knobs
    assert feats[0, :3].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(OptionError, match="not a choice"):
        space.indices({"a": 3, "b": "x", "c": 0})
    with pytest.raises(OptionError, match="lacks knob"):
        space.indices({"a": 1})
    with pytest.raises(OptionError, match="no choices"):
        SearchSpace({"a": []})


def test_synthetic_optimum_is_unique_and_valid():
    problem = synthetic_space(SMALL, seed=3)
    costs = sorted(problem.cost(problem.space.config(p)) for p in problem.space.points()
                   if problem.space.is_valid(p))
    assert costs[0] == problem.optimum_cost < costs[1]
    assert problem.space.is_valid(problem.space.indices(problem.optimum))


def test_space_from_the_dsl_conv_template():
    """A real template: the conv knob space and its validate() feed the tuners."""
    import numpy as np

    from wpk.dsl.compute import infer_bindings, specialize
    from wpk.kernels.dsl_library import load_operator
    from wpk.kernels.templates import template_for

    op = load_operator("conv2d")
    arrays = {"X": np.zeros((1, 8, 6, 6), np.float32), "Wt": np.zeros((8, 8, 3, 3), np.float32)}
    bindings = infer_bindings(op, arrays, {"pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 1})
    template = template_for(specialize(op, bindings), "cpu")
    space = SearchSpace.from_template(template)
    assert space.names == tuple(template.space())
    tuner = make_tuner("random", space, seed=0)
    configs = tuner.next_batch(6)
    assert len(configs) == 6
    assert all(template.validate(c) is None for c in configs)
