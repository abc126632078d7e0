"""Genetic algorithm on DEAP: a chromosome is the vector of knob indices.

One generation: keep the `elite` best individuals unchanged, fill the rest with
children of tournament-selected parents (uniform crossover, then per-gene
mutation). Only individuals without a fitness are measured (DEAP's convention):
a child equal to a point already measured gets its known cost, an invalid child
gets `INVALID_COST` without being measured, and a child that repeats a visited
point is mutated again (up to `GAOptions.retries` times) so the budget goes to
new points. When a generation produces nothing new, random unvisited points
(immigrants) replace its worst children, so the search only stops when the space
is exhausted.

DEAP's operators draw from Python's global `random` module; the tuner swaps in its
own seeded state around every use, so a run depends on its seed only and not on
what else the process does with `random`.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass

from deap import base, creator, tools

from wpk.core.errors import OptionError
from wpk.search.space import Indices, SearchSpace
from wpk.search.tuners.base import INVALID_COST, Tuner

if not hasattr(creator, "WpkFitnessMin"):
    creator.create("WpkFitnessMin", base.Fitness, weights=(-1.0,))
if not hasattr(creator, "WpkIndividual"):
    creator.create("WpkIndividual", list, fitness=creator.WpkFitnessMin)


@dataclass(frozen=True)
class GAOptions:
    """Hyper-parameters of the genetic algorithm.

    population_size: individuals per generation (and points measured per generation
        at most).
    elite: best individuals copied unchanged into the next generation (elitism).
    tournament_size: contestants per tournament when selecting a parent.
    crossover_prob: probability that a pair of parents is recombined.
    gene_swap_prob: per-gene probability of swapping genes in uniform crossover.
    mutation_prob: per-gene probability of mutation; None means 1 / number of knobs.
    local_mutation_prob: a mutated gene moves one or two choices up or down with this
        probability (knob values are ordered, so neighbours tend to cost alike),
        otherwise it is redrawn uniformly.
    retries: extra mutations tried to turn a child that repeats a visited point into
        a new point.
    init_draws: draws per wanted individual when sampling the first generation (bounds
        the work in spaces that are mostly invalid).
    """

    population_size: int = 16
    elite: int = 2
    tournament_size: int = 3
    crossover_prob: float = 0.9
    gene_swap_prob: float = 0.5
    mutation_prob: float | None = None
    local_mutation_prob: float = 0.7
    retries: int = 20
    init_draws: int = 50

    def __post_init__(self):
        checks = [
            (self.population_size >= 2, "population_size must be at least 2"),
            (0 <= self.elite < self.population_size,
             "elite must be in [0, population_size)"),
            (self.tournament_size >= 1, "tournament_size must be at least 1"),
            (0.0 <= self.crossover_prob <= 1.0, "crossover_prob must be in [0, 1]"),
            (0.0 <= self.gene_swap_prob <= 1.0, "gene_swap_prob must be in [0, 1]"),
            (self.mutation_prob is None or 0.0 <= self.mutation_prob <= 1.0,
             "mutation_prob must be None or in [0, 1]"),
            (0.0 <= self.local_mutation_prob <= 1.0, "local_mutation_prob must be in [0, 1]"),
            (self.retries >= 0 and self.init_draws >= 1,
             "retries must be >= 0 and init_draws >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionError(f"GAOptions: {message} ({self})",
                                  hint="see GAOptions' docstring for each hyper-parameter")


def mutate_genes(individual: list, dims: tuple[int, ...], gene_prob: float,
                 local_prob: float) -> tuple[list]:
    """Per-gene mutation in place (DEAP operator signature): each gene mutates with
    probability `gene_prob`, by a +-1/+-2 step (`local_prob`) or a uniform redraw."""
    for k, d in enumerate(dims):
        if d < 2 or random.random() >= gene_prob:
            continue
        if random.random() < local_prob:
            step = random.choice((-2, -1, 1, 2))
            individual[k] = min(max(individual[k] + step, 0), d - 1)
        else:
            individual[k] = random.randrange(d)
    return (individual,)


class GATuner(Tuner):
    """Genetic algorithm (DEAP) over knob-index chromosomes."""

    name = "ga"

    def __init__(self, space: SearchSpace, seed: int = 0, options: GAOptions | None = None,
                 **overrides):
        super().__init__(space, seed)
        if options is None:
            options = GAOptions(**overrides)
        elif overrides:
            raise OptionError("pass either GAOptions or keyword overrides, not both",
                              hint="GATuner(space, seed, options=GAOptions(...))")
        self.options = options
        self._random_state = random.Random(self.seed).getstate()
        gene_prob = options.mutation_prob
        if gene_prob is None:
            gene_prob = 1.0 / len(space.dims)
        self.toolbox = base.Toolbox()
        self.toolbox.register("select", tools.selTournament, tournsize=options.tournament_size)
        self.toolbox.register("mate", tools.cxUniform, indpb=options.gene_swap_prob)
        self.toolbox.register("mutate", mutate_genes, dims=space.dims, gene_prob=gene_prob,
                              local_prob=options.local_mutation_prob)
        self.population: list = []
        self.generation = 0
        self._queue: list = []     # individuals to propose
        self._waiting: dict[Indices, list] = {}   # proposed, awaiting their cost

    @contextlib.contextmanager
    def _own_random(self):
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

    # ------------------------------------------------------------------ Tuner hooks
    def _propose(self, n: int) -> list[Indices]:
        with self._own_random():
            if not self._queue and not self._waiting:
                self._breed()
            batch, self._queue = self._queue[:n], self._queue[n:]
        out = []
        for ind in batch:
            point = tuple(ind)
            self._waiting.setdefault(point, []).append(ind)
            out.append(point)
        return out

    def _observe(self, points, costs, predicted) -> None:
        for point, cost in zip(points, costs):
            for ind in self._waiting.pop(point, []):
                ind.fitness.values = (cost,)

    # ------------------------------------------------------------------ generations
    def _breed(self) -> None:
        """Make the next generation (the first: random points) and queue its new points."""
        opts = self.options
        if not self.population:
            self.population = self._random_individuals(opts.population_size)
        else:
            elites = [self.toolbox.clone(i) for i in tools.selBest(self.population, opts.elite)]
            parents = self.toolbox.select(self.population, opts.population_size - opts.elite)
            children = [self.toolbox.clone(p) for p in parents]
            for a, b in zip(children[::2], children[1::2]):
                if random.random() < opts.crossover_prob:
                    self.toolbox.mate(a, b)
            for child in children:
                self.toolbox.mutate(child)
                del child.fitness.values
                self._settle(child)
            fresh = [c for c in children if not c.fitness.valid]
            if not fresh:   # nothing new: immigrants replace the worst children
                children.sort(key=lambda c: c.fitness.values[0])
                count = max(1, len(children) // 2)
                children[-count:] = self._random_individuals(count)
            self.population = elites + children
        self.generation += 1
        self._queue = [i for i in self.population if not i.fitness.valid]

    def _settle(self, child) -> None:
        """Give `child` a known cost, or make it a new point (claimed for measurement)."""
        retries = self.options.retries
        for attempt in range(retries + 1):
            point = tuple(child)
            if point not in self._visited:
                if not self._claim(point):      # new but invalid: penalised, not measured
                    child.fitness.values = (INVALID_COST,)
                return
            if attempt < retries:
                self.toolbox.mutate(child)
        if point in self._known:
            child.fitness.values = (self._known[point],)
        else:   # a point still being measured: share its pending result
            self._waiting.setdefault(point, []).append(child)
            child.fitness.values = (math.inf,)

    def _random_individuals(self, count: int) -> list:
        out = []
        for _ in range(count * self.options.init_draws):
            if len(out) == count or len(self._visited) >= self.space.size:
                break
            point = tuple(random.randrange(d) for d in self.space.dims)
            if self._claim(point):
                out.append(creator.WpkIndividual(point))
        if len(out) < count:    # draws kept missing: take unvisited points in order
            for point in self.space.points():
                if len(out) == count:
                    break
                if point not in self._visited and self._claim(point):
                    out.append(creator.WpkIndividual(point))
        return out
