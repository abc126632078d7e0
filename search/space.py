"""The space a tuner searches: ordered knobs with their choices, and which points are legal.

A point is addressed three ways:

* a *config*: ``{knob: value}``, what templates and kernels take;
* an *index vector*: one choice index per knob (a GA chromosome, an RL state);
* a *flat index*: the mixed-radix number of the index vector (grid and random search).

`SearchSpace.from_template(template)` wraps a DSL schedule template (its
`KnobSpace` and its `validate`). `synthetic_space()` builds a test space with a
known unique optimum, separable terms plus knob interactions and a region of
invalid points, so tests can check that a tuner finds the optimum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import OptionError

Indices = tuple[int, ...]
ValidateFn = Callable[[dict], "str | None"]


class SearchSpace:
    """Ordered knobs (name -> choices) and an optional ``validate(config) -> reason | None``."""

    def __init__(self, knobs: Mapping[str, Sequence], validate: ValidateFn | None = None,
                 name: str = "space"):
        if not knobs:
            raise OptionError(f"search space {name!r} has no knobs",
                             hint="give at least one knob with one choice")
        for knob, choices in knobs.items():
            if len(choices) == 0:
                raise OptionError(f"knob {knob!r} of search space {name!r} has no choices",
                                 hint="every knob needs at least one choice")
        self.name = name
        self.names: tuple[str, ...] = tuple(knobs)
        self.choices: tuple[tuple, ...] = tuple(tuple(v) for v in knobs.values())
        self.dims: tuple[int, ...] = tuple(len(v) for v in self.choices)
        self._validate = validate
        self._reasons: dict[Indices, str | None] = {}

    @classmethod
    def from_template(cls, template, name: str | None = None) -> SearchSpace:
        """The space of a DSL schedule template (`space()` and `validate(config)`)."""
        return cls(template.space(), template.validate,
                   name=name or getattr(template, "name", "template"))

    # ------------------------------------------------------------------ addressing
    @property
    def size(self) -> int:
        """Number of points (valid or not)."""
        return math.prod(self.dims)

    def config(self, indices: Sequence[int]) -> dict:
        """The config of an index vector."""
        return {n: c[i] for n, c, i in zip(self.names, self.choices, indices)}

    def indices(self, config: Mapping) -> Indices:
        """The index vector of a config (OptionError for an unknown knob or value)."""
        out = []
        for knob, choices in zip(self.names, self.choices):
            if knob not in config:
                raise OptionError(f"config {dict(config)} lacks knob {knob!r} of space "
                                 f"{self.name!r}", hint=f"knobs: {', '.join(self.names)}")
            try:
                out.append(choices.index(config[knob]))
            except ValueError:
                raise OptionError(f"knob {knob}={config[knob]!r} is not a choice of space "
                                 f"{self.name!r}", hint=f"choices: {list(choices)}") from None
        return tuple(out)

    def flat(self, indices: Sequence[int]) -> int:
        """Mixed-radix number of an index vector (the first knob is the most significant)."""
        value = 0
        for i, d in zip(indices, self.dims):
            value = value * d + int(i)
        return value

    def unflat(self, number: int) -> Indices:
        """Index vector of a flat index."""
        out = []
        for d in reversed(self.dims):
            number, i = divmod(int(number), d)
            out.append(i)
        return tuple(reversed(out))

    def random_indices(self, rng: np.random.Generator) -> Indices:
        """A uniformly drawn index vector."""
        return tuple(int(rng.integers(d)) for d in self.dims)

    def neighbours(self, indices: Sequence[int]) -> list[Indices]:
        """Index vectors one step (+-1 in one knob) away, in knob order."""
        out = []
        for k, d in enumerate(self.dims):
            for step in (-1, 1):
                j = indices[k] + step
                if 0 <= j < d:
                    out.append(tuple(indices[:k]) + (j,) + tuple(indices[k + 1:]))
        return out

    def points(self) -> Iterator[Indices]:
        """Every index vector, in flat order."""
        for number in range(self.size):
            yield self.unflat(number)

    # ------------------------------------------------------------------ legality
    def invalid_reason(self, indices: Sequence[int]) -> str | None:
        """Why the point is illegal (None when it is legal); cached per point."""
        key = tuple(indices)
        if key not in self._reasons:
            self._reasons[key] = None if self._validate is None else \
                self._validate(self.config(key))
        return self._reasons[key]

    def is_valid(self, indices: Sequence[int]) -> bool:
        return self.invalid_reason(indices) is None

    # ------------------------------------------------------------------ features
    def features(self, configs: Sequence[Mapping]) -> np.ndarray:
        """Feature matrix for the cost model: per knob its normalised index and, for
        numeric knobs, log2(1 + value)."""
        rows = []
        numeric = [all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in ch)
                   for ch in self.choices]
        for config in configs:
            idx = self.indices(config)
            row = [i / max(d - 1, 1) for i, d in zip(idx, self.dims)]
            row += [math.log2(1 + abs(float(config[n]))) for n, num in zip(self.names, numeric)
                    if num]
            rows.append(row)
        return np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)

    def __repr__(self) -> str:
        knobs = ", ".join(f"{n}[{d}]" for n, d in zip(self.names, self.dims))
        return f"SearchSpace({self.name}: {knobs}; {self.size} points)"


# ----------------------------------------------------------------------------- synthetic
@dataclass(frozen=True)
class SyntheticProblem:
    """A space with a known optimum: `cost(config)` in seconds, None for invalid points."""

    space: SearchSpace
    optimum_indices: Indices
    weights: tuple[float, ...]
    interaction: float
    ruggedness: float

    @property
    def optimum(self) -> dict:
        return self.space.config(self.optimum_indices)

    @property
    def optimum_cost(self) -> float:
        return self.cost(self.optimum)

    @property
    def reference_cost(self) -> float:
        """A stand-in for the vendor kernel's time: twice the optimum."""
        return 2.0 * self.optimum_cost

    def cost(self, config: Mapping) -> float | None:
        """Seconds of a config; None for an invalid point."""
        idx = self.space.indices(config)
        if not self.space.is_valid(idx):
            return None
        dims = self.space.dims
        delta = [(i - o) / max(d - 1, 1) for i, o, d in zip(idx, self.optimum_indices, dims)]
        separable = 1.5 * sum(w * x * x for w, x in zip(self.weights, delta))
        pairs = [(a, a + 1) for a in range(0, len(delta) - 1, 2)][:2]
        coupled = 1.5 * self.interaction * sum((delta[a] - delta[b]) ** 2 for a, b in pairs)
        bump = 0.0
        if idx != self.optimum_indices:
            bump = self.ruggedness * (1 + sum((k + 3) * i for k, i in enumerate(idx)) % 5) / 5
        return 1e-3 * math.exp(separable + coupled + bump)

    def valid_points(self) -> int:
        """Number of valid points (enumerates the space)."""
        return sum(1 for p in self.space.points() if self.space.is_valid(p))


def synthetic_space(dims: Sequence[int] = (8, 6, 8, 5, 6), seed: int = 0,
                    interaction: float = 0.6, ruggedness: float = 0.08) -> SyntheticProblem:
    """A synthetic tuning problem with a unique optimum.

    cost = 1 ms * exp(separable + coupling + bumps): a quadratic bowl in each knob's
    index around a seeded optimum, a coupling of knob pairs (0,1) and (2,3) that
    rewards moving them together, and a deterministic bumpy term that is zero only at
    the optimum. Knob values are powers of two (like tile sizes). Points where knobs
    0 and 1 are both in their top third are invalid ("out of registers"), and so are
    points whose index sum is a positive multiple of 11; the optimum is always valid.
    """
    rng = np.random.default_rng(seed)
    while True:
        opt = tuple(int(rng.integers(1, max(d - 1, 2))) for d in dims)
        if not _synthetic_invalid(dims, opt):
            break
    weights = tuple(float(w) for w in rng.uniform(0.8, 1.6, len(dims)))
    knobs = {f"k{i}": [2 ** j for j in range(d)] for i, d in enumerate(dims)}

    def validate(config: dict) -> str | None:
        idx = [int(math.log2(config[f"k{i}"])) for i in range(len(dims))]
        if _synthetic_invalid(dims, idx):
            return "synthetic constraint: register budget exceeded"
        return None

    space = SearchSpace(knobs, validate, name=f"synthetic{tuple(dims)}")
    return SyntheticProblem(space, opt, weights, interaction, ruggedness)


def _synthetic_invalid(dims: Sequence[int], idx: Sequence[int]) -> bool:
    top = [i >= d - max(d // 3, 1) for i, d in zip(idx[:2], dims[:2])]
    return all(top) or (len(idx) > 2 and sum(idx) > 0 and sum(idx) % 11 == 0)
