"""Tuners of the schedule search: random, grid, genetic algorithm (DEAP), PPO (SB3).

    tuner = make_tuner("ga", space, seed=0, population_size=16)
    while tuner.has_next():
        configs = tuner.next_batch(8)
        tuner.update(configs, [measure(c) for c in configs])
    tuner.best   # (config, seconds)

The RL tuner needs the `rl` extra (stable-baselines3, gymnasium, torch) and is
imported only when asked for.
"""

from __future__ import annotations

from wpk.core.errors import OptionError
from wpk.search.space import SearchSpace
from wpk.search.tuners.base import INVALID_COST, Trial, Tuner
from wpk.search.tuners.ga import GATuner
from wpk.search.tuners.grid import GridTuner
from wpk.search.tuners.random import RandomTuner

TUNERS = ("random", "grid", "ga", "rl")

__all__ = ["INVALID_COST", "TUNERS", "Trial", "Tuner", "make_tuner"]


def make_tuner(name: str, space: SearchSpace, seed: int = 0, **options) -> Tuner:
    """A tuner by name ('random', 'grid', 'ga', 'rl'); `options` go to its options class
    (`GAOptions`, `RLOptions`; random and grid take none)."""
    if name == "random":
        _no_options(name, options)
        return RandomTuner(space, seed)
    if name == "grid":
        _no_options(name, options)
        return GridTuner(space, seed)
    if name == "ga":
        return GATuner(space, seed, **options)
    if name == "rl":
        try:  # optional: stable-baselines3, gymnasium and torch (the rl extra)
            from wpk.search.tuners.rl import RLTuner
        except ImportError as exc:
            raise OptionError(f"the rl tuner needs stable-baselines3, gymnasium and torch "
                              f"({exc})", hint="pip install 'wpk[rl]'") from exc
        return RLTuner(space, seed, **options)
    raise OptionError(f"unknown tuner {name!r}", hint=f"choose one of {', '.join(TUNERS)}")


def _no_options(name: str, options: dict) -> None:
    if options:
        raise OptionError(f"the {name} tuner takes no options, got {sorted(options)}",
                          hint="drop the options or pick the ga or rl tuner")
