"""Reinforcement-learning tuner: PPO (stable-baselines3) walking the knob space.

Design. PPO's own `learn()` calls ``env.step`` synchronously, which would put the
measurement inside the search; a tuner here must hand points out (`next_batch`)
and get costs back later (`update`). So the tuner drives PPO step by step with
SB3's parts: the policy samples an action for the current state, `rl_env.move`
gives the next point, and the transition waits in a queue until its reward is
known. The state holds only the point and the episode's elapsed fraction, never a
measured value, so the walk can run ahead of the measurements: `next_batch(n)`
walks until it reaches `n` new points. A step onto a point already measured, a
predicted one or an invalid one gets its reward at once (invalid: `min_reward`,
not measured). `update` fills in the rewards; completed transitions go in order
into PPO's `RolloutBuffer`, and every `n_steps` transitions PPO computes the
advantages (GAE) and trains (clipped objective, `n_epochs` passes).

The first `random_starts` points are drawn uniformly (a broad first look, as
model-based tuners do before trusting a model). Episodes then start at the best
point measured so far with probability `restart_from_best` (exploit), else at a
random point (explore). If the walk goes
`max_idle_steps` steps without reaching a new point (the policy sits in a known
region), a random unvisited point is proposed directly, so the budget is spent and
the search only stops when the space is exhausted.

Determinism: the tuner keeps its own torch and numpy random states and swaps them
in around every use (SB3 samples actions with torch's global generator and shuffles
minibatches with numpy's), and sets ``torch.set_num_threads(1)``; same seed and
same costs give the same proposals.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.logger import Logger

from wpk.core.errors import OptionError
from wpk.search.space import Indices, SearchSpace
from wpk.search.tuners.base import Tuner
from wpk.search.tuners.rl_env import ScheduleEnv, move, observation, speedup_reward


@dataclass(frozen=True)
class RLOptions:
    """Hyper-parameters of the PPO tuner.

    reference_time: seconds of the best vendor kernel; rewards are log speed-ups over
        it. None: the first successful measurement serves as the reference.
    horizon: steps per episode.
    n_steps: transitions per PPO update (rollout length; small so it learns within
        a tuning budget).
    batch_size, n_epochs, learning_rate, gamma, gae_lambda, clip_range, ent_coef:
        PPO's own hyper-parameters (see stable-baselines3's PPO).
    hidden: sizes of the policy's and value function's hidden layers.
    min_reward: reward floor, also the reward of an invalid or failed point.
    restart_from_best: probability that an episode starts at the best point so far.
    random_starts: points drawn uniformly before the walk begins (a broad first look,
        so the first episodes start from a good point rather than one random one).
    max_idle_steps: steps without a new point before a random unvisited point is
        proposed directly.
    """

    reference_time: float | None = None
    horizon: int = 8
    n_steps: int = 32
    batch_size: int = 32
    n_epochs: int = 4
    learning_rate: float = 3e-3
    gamma: float = 0.9
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    hidden: tuple[int, ...] = (32, 32)
    min_reward: float = -4.0
    restart_from_best: float = 0.9
    random_starts: int = 12
    max_idle_steps: int = 32

    def __post_init__(self):
        checks = [
            (self.reference_time is None or self.reference_time > 0,
             "reference_time must be None or positive"),
            (self.horizon >= 1 and self.n_steps >= 2, "horizon >= 1 and n_steps >= 2"),
            (1 <= self.batch_size <= self.n_steps, "batch_size must be in [1, n_steps]"),
            (0.0 <= self.restart_from_best <= 1.0, "restart_from_best must be in [0, 1]"),
            (self.max_idle_steps >= 1, "max_idle_steps must be at least 1"),
            (self.random_starts >= 0, "random_starts must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionError(f"RLOptions: {message} ({self})",
                                  hint="see RLOptions' docstring for each hyper-parameter")


@dataclass
class _Step:
    obs: np.ndarray
    action: int
    value: torch.Tensor
    log_prob: torch.Tensor
    episode_start: bool
    point: Indices
    next_obs: np.ndarray
    done: bool
    reward: float | None = None


class RLTuner(Tuner):
    """PPO over knob moves; see the module docstring for how it meets next_batch/update."""

    name = "rl"

    def __init__(self, space: SearchSpace, seed: int = 0, options: RLOptions | None = None,
                 **overrides):
        super().__init__(space, seed)
        if options is None:
            options = RLOptions(**overrides)
        elif overrides:
            raise OptionError("pass either RLOptions or keyword overrides, not both",
                              hint="RLTuner(space, seed, options=RLOptions(...))")
        self.options = options
        self.reference_time = options.reference_time
        torch.set_num_threads(1)
        self._rng = np.random.default_rng(self.seed)
        self._torch_state = torch.Generator().manual_seed(self.seed).get_state()
        self._numpy_state = np.random.RandomState(self.seed).get_state()
        env = ScheduleEnv(space, _no_measure, 1.0, options.horizon, options.min_reward)
        with self._own_rngs():
            self.model = PPO("MlpPolicy", env, n_steps=options.n_steps,
                             batch_size=options.batch_size, n_epochs=options.n_epochs,
                             learning_rate=options.learning_rate, gamma=options.gamma,
                             gae_lambda=options.gae_lambda, clip_range=options.clip_range,
                             ent_coef=options.ent_coef, seed=self.seed, device="cpu",
                             policy_kwargs={"net_arch": list(options.hidden)}, verbose=0)
        # a Logger with no outputs: sb3's configure() would create a folder in /tmp per tuner
        self.model.set_logger(Logger(folder=None, output_formats=[]))
        self.updates = 0
        self._steps: list[_Step] = []
        self._predicted: dict[Indices, float] = {}
        self._point: Indices | None = None
        self._t = 0
        self._random_proposed = 0

    @contextlib.contextmanager
    def _own_rngs(self):
        outer_numpy = np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._torch_state)
            np.random.set_state(self._numpy_state)
            try:
                yield
            finally:
                self._torch_state = torch.get_rng_state()
                self._numpy_state = np.random.get_state()
                np.random.set_state(outer_numpy)

    # ------------------------------------------------------------------ Tuner hooks
    def _propose(self, n: int) -> list[Indices]:
        out: list[Indices] = []
        idle = 0
        with self._own_rngs():
            while len(out) < n and self._random_proposed < self.options.random_starts:
                point = self._random_new_point()
                self._random_proposed += 1
                if point is not None:
                    out.append(point)
            while len(out) < n and len(self._visited) < self.space.size:
                new = self._walk_one_step()
                if new is not None:
                    out.append(new)
                    idle = 0
                    continue
                idle += 1
                if idle >= self.options.max_idle_steps:
                    jump = self._random_new_point()
                    if jump is not None:
                        out.append(jump)
                    idle = 0
            self._flush()
        return out

    def _observe(self, points, costs, predicted) -> None:
        if self.reference_time is None:
            finite = [c for c in costs if np.isfinite(c)]
            if finite and not predicted:
                self.reference_time = finite[0]
        if predicted:
            self._predicted.update(zip(points, costs))
        for step in self._steps:
            if step.reward is None:
                step.reward = self._reward_of(step.point)
        with self._own_rngs():
            self._flush()

    # ------------------------------------------------------------------ walking
    def _walk_one_step(self) -> Indices | None:
        """One PPO step; the point reached when it is new and valid, else None."""
        opts, dims = self.options, self.space.dims
        episode_start = self._point is None
        if episode_start:
            self._point = self._episode_start_point()
            self._t = 0
        obs = observation(dims, self._point, self._t, opts.horizon)
        with torch.no_grad():
            action, value, log_prob = self.model.policy(torch.as_tensor(obs[None]))
        action = int(action.item())
        point = move(dims, self._point, action)
        self._t += 1
        done = self._t >= opts.horizon
        step = _Step(obs, action, value, log_prob, episode_start, point,
                     observation(dims, point, self._t, opts.horizon), done)
        new = None
        if point not in self._visited and point not in self._predicted and self._claim(point):
            new = point
        step.reward = None if new is not None else self._reward_of(point)
        self._steps.append(step)
        self._point = None if done else point
        return new

    def _reward_of(self, point: Indices) -> float | None:
        if point in self._known:
            cost = self._known[point]
        elif point in self._predicted:
            cost = self._predicted[point]
        elif self.space.invalid_reason(point) is not None:
            cost = None
        else:
            return None     # still being measured
        if self.reference_time is None:
            return 0.0 if cost is not None and np.isfinite(cost) else self.options.min_reward
        return speedup_reward(cost, self.reference_time, self.options.min_reward)

    def _episode_start_point(self) -> Indices:
        if self.best is not None and self._rng.random() < self.options.restart_from_best:
            return self.space.indices(self.best[0])
        return self.space.random_indices(self._rng)

    def _random_new_point(self) -> Indices | None:
        for _ in range(64):
            point = self.space.random_indices(self._rng)
            if point not in self._visited and self._claim(point):
                return point
        for point in self.space.points():
            if point not in self._visited and self._claim(point):
                return point
        return None

    # ------------------------------------------------------------------ learning
    def _flush(self) -> None:
        """Move transitions whose reward is known into PPO's buffer; train when full."""
        buffer = self.model.rollout_buffer
        while self._steps and self._steps[0].reward is not None:
            step = self._steps.pop(0)
            buffer.add(step.obs[None], np.array([[step.action]]), np.array([step.reward]),
                       np.array([step.episode_start]), step.value, step.log_prob)
            if buffer.full:
                with torch.no_grad():
                    last = self.model.policy.predict_values(torch.as_tensor(step.next_obs[None]))
                buffer.compute_returns_and_advantage(last_values=last,
                                                     dones=np.array([step.done]))
                self.model.train()
                self.model.policy.set_training_mode(False)
                buffer.reset()
                self.updates += 1


def _no_measure(config: dict) -> float:
    raise RuntimeError("the RL tuner measures outside the environment")  # pragma: no cover
