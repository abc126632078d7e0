"""The schedule-search environment for reinforcement learning (gymnasium).

State: the current point of the space (each knob's index scaled to [0, 1]) and
the fraction of the episode elapsed. Action: move one knob one choice up or down
(`Discrete(2 * knobs)`: action ``2k`` lowers knob k, ``2k + 1`` raises it; a move
past the end stays put). Reward: the log of the speed-up of the point reached over
the reference time (the best vendor kernel), ``log(reference / time)``, floored at
`min_reward`; an invalid point (the space's `validate` rejects it) or a failed
measurement earns `min_reward` without being measured. An episode lasts `horizon`
steps; the elapsed fraction is part of the state, so its end is a true terminal.

`ScheduleEnv` is the standalone form: its `step` calls a measurement callback
(memoised, so a point is measured once). The RL tuner (`wpk.search.tuners.rl`)
uses the same `move`, `observation` and `speedup_reward` functions but keeps the
measurement outside, to fit the ``next_batch / update`` interface.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wpk.core.errors import OptionError
from wpk.search.space import Indices, SearchSpace

MeasureFn = Callable[[dict], "float | None"]


def move(dims: Sequence[int], point: Sequence[int], action: int) -> Indices:
    """The point after `action` (knob ``action // 2`` down for even, up for odd actions)."""
    knob, up = divmod(int(action), 2)
    out = list(point)
    out[knob] = min(max(out[knob] + (1 if up else -1), 0), dims[knob] - 1)
    return tuple(out)


def observation(dims: Sequence[int], point: Sequence[int], step: int, horizon: int
                ) -> np.ndarray:
    """Knob indices scaled to [0, 1], then the elapsed fraction of the episode."""
    scaled = [i / (d - 1) if d > 1 else 0.0 for i, d in zip(point, dims)]
    return np.asarray(scaled + [min(step / horizon, 1.0)], dtype=np.float32)


def speedup_reward(cost: float | None, reference: float, min_reward: float) -> float:
    """``log(reference / cost)`` floored at `min_reward` (also for a failed/invalid point)."""
    if cost is None or not math.isfinite(cost) or cost <= 0:
        return float(min_reward)
    return max(math.log(reference / cost), float(min_reward))


class ScheduleEnv(gym.Env):
    """Walk a schedule space knob by knob; reward = log speed-up over the reference."""

    metadata = {"render_modes": []}

    def __init__(self, space: SearchSpace, measure: MeasureFn, reference_time: float,
                 horizon: int = 16, min_reward: float = -4.0, start: Sequence[int] | None = None):
        if not (reference_time > 0 and math.isfinite(reference_time)):
            raise OptionError(f"reference_time must be a positive number of seconds, got "
                              f"{reference_time}", hint="time the vendor kernel first")
        if horizon < 1:
            raise OptionError(f"horizon must be at least 1, got {horizon}",
                              hint="use a few times the number of knobs")
        self.space = space
        self.measure = measure
        self.reference_time = float(reference_time)
        self.horizon = int(horizon)
        self.min_reward = float(min_reward)
        self.start = None if start is None else tuple(int(i) for i in start)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(len(space.dims) + 1,),
                                            dtype=np.float32)
        self.action_space = spaces.Discrete(2 * len(space.dims))
        self.costs: dict[Indices, float | None] = {}   # measured points (the memo: a point
        # is measured once per environment, so `len(costs)` counts the measurements)
        self.point: Indices = tuple(0 for _ in space.dims)
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        start = (options or {}).get("start", self.start)
        if start is None:
            start = tuple(int(self.np_random.integers(d)) for d in self.space.dims)
        self.point = tuple(int(i) for i in start)
        self.steps = 0
        return self._obs(), {"config": self.space.config(self.point)}

    def step(self, action):
        if not self.action_space.contains(action):
            raise OptionError(f"action {action!r} is outside {self.action_space}",
                              hint="actions are integers in [0, 2 * number of knobs)")
        self.point = move(self.space.dims, self.point, int(action))
        self.steps += 1
        reason = self.space.invalid_reason(self.point)
        if reason is None and self.point not in self.costs:
            self.costs[self.point] = self.measure(self.space.config(self.point))
        cost = self.costs.get(self.point) if reason is None else None
        reward = speedup_reward(cost, self.reference_time, self.min_reward)
        terminated = self.steps >= self.horizon
        info = {"config": self.space.config(self.point), "cost": cost, "invalid": reason}
        return self._obs(), reward, terminated, False, info

    def _obs(self) -> np.ndarray:
        return observation(self.space.dims, self.point, self.steps, self.horizon)
