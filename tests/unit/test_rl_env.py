"""The RL environment (gymnasium + SB3 checks) and the PPO tuner on a known optimum."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="the rl extra (gymnasium) is not installed")
pytest.importorskip("torch", reason="the rl extra (torch) is not installed")
pytest.importorskip("stable_baselines3", reason="the rl extra (stable-baselines3) is not installed")

from wpk.core.errors import OptionError  # noqa: E402
from wpk.search.space import synthetic_space  # noqa: E402
from wpk.search.tuners import make_tuner  # noqa: E402
from wpk.search.tuners.rl import RLOptions  # noqa: E402
from wpk.search.tuners.rl_env import ScheduleEnv, move, observation, speedup_reward  # noqa: E402

BIG = (8, 6, 8, 5, 6)        # 11,520 points, 9,606 valid
RL_TRIALS = 500               # about 5% of BIG's valid points


class CountingCost:
    def __init__(self, problem):
        self.problem = problem
        self.calls = []

    def __call__(self, config):
        assert self.problem.space.is_valid(self.problem.space.indices(config)), config
        self.calls.append(tuple(config.values()))
        return self.problem.cost(config)


def make_env(problem, measure=None, **kwargs):
    return ScheduleEnv(problem.space, measure or problem.cost, problem.reference_cost, **kwargs)


def test_env_passes_gymnasium_and_sb3_checks():
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    problem = synthetic_space(BIG, seed=0)
    gym_check(make_env(problem), skip_render_check=True)
    sb3_check(make_env(problem), warn=True)


def test_env_rewards_are_log_speedups_and_points_are_measured_once():
    problem = synthetic_space(BIG, seed=0)
    cost = CountingCost(problem)
    env = make_env(problem, cost, horizon=6)
    obs, info = env.reset(seed=0, options={"start": problem.space.indices(problem.optimum)})
    assert obs.dtype == np.float32 and obs.shape == (len(BIG) + 1,)
    # Step off the optimum and back: the second visit of each point is not measured.
    rewards = []
    for action in (1, 0, 1, 0):
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if info["cost"] is not None:
            assert reward == pytest.approx(max(math.log(problem.reference_cost / info["cost"]),
                                               env.min_reward))
    assert rewards[0] == rewards[2] and rewards[1] == rewards[3]
    assert rewards[1] == pytest.approx(math.log(2.0))      # back at the optimum: 2x
    assert len(cost.calls) == len(set(cost.calls)) == 2
    env.step(2)
    _, _, terminated, truncated, _ = env.step(3)
    assert terminated and not truncated                    # horizon 6 reached
    with pytest.raises(OptionError, match="outside"):
        env.step(99)


def test_invalid_points_are_penalised_without_measuring():
    problem = synthetic_space(BIG, seed=0)
    cost = CountingCost(problem)
    env = make_env(problem, cost)
    top = (problem.space.dims[0] - 1, problem.space.dims[1] - 3, 0, 0, 2)   # next to invalid
    assert problem.space.is_valid(top)
    env.reset(seed=0, options={"start": top})
    _, reward, _, _, info = env.step(3)                     # raise knob 1 into the bad corner
    assert info["invalid"] and reward == env.min_reward and info["cost"] is None
    assert cost.calls == [] and env.costs == {}


def test_move_and_observation_functions():
    assert move((3, 4), (0, 3), 0) == (0, 3)                # knob 0 down at its floor
    assert move((3, 4), (0, 3), 1) == (1, 3)
    assert move((3, 4), (0, 3), 3) == (0, 3)                # knob 1 up at its ceiling
    assert move((3, 4), (0, 3), 2) == (0, 2)
    obs = observation((3, 4), (2, 1), step=4, horizon=8)
    assert obs.tolist() == pytest.approx([1.0, 1 / 3, 0.5])
    assert speedup_reward(None, 1.0, -4.0) == -4.0
    assert speedup_reward(0.5, 1.0, -4.0) == pytest.approx(math.log(2))
    assert speedup_reward(1e6, 1.0, -4.0) == -4.0
    with pytest.raises(OptionError, match="reference_time"):
        ScheduleEnv(synthetic_space(BIG).space, lambda c: 1.0, reference_time=0.0)


def test_sb3_ppo_learns_on_the_env_directly():
    """The standalone env works with PPO's own learn() loop (a tiny run)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(1)
    problem = synthetic_space(BIG, seed=0)
    cost = CountingCost(problem)
    model = PPO("MlpPolicy", make_env(problem, cost), n_steps=32, batch_size=32, n_epochs=2,
                seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    model.set_logger(Logger(folder=None, output_formats=[]))  # no log folder in /tmp
    model.learn(total_timesteps=64)
    assert 0 < len(cost.calls) <= 64 and len(cost.calls) == len(set(cost.calls))


def drive(tuner, cost, max_trials, batch=8):
    optimum = cost.problem.optimum_cost
    found, proposals = None, []
    while tuner.has_next() and tuner.trials < max_trials:
        configs = tuner.next_batch(batch)
        proposals += [tuple(c.values()) for c in configs]
        tuner.update(configs, [cost(c) for c in configs])
        if found is None and tuner.best[1] <= optimum:
            found = tuner.trials
    return found, proposals


@pytest.mark.parametrize("seed", [0, 1])
def test_rl_tuner_finds_the_optimum_within_500_trials(seed):
    """PPO finds BIG's optimum within RL_TRIALS = 500 measurements (of 9,606 valid
    points), measuring no point twice and no invalid point, and trains as it goes."""
    problem = synthetic_space(BIG, seed=0)
    cost = CountingCost(problem)
    tuner = make_tuner("rl", problem.space, seed=seed, reference_time=problem.reference_cost)
    found, proposals = drive(tuner, cost, RL_TRIALS)
    assert found is not None and found <= RL_TRIALS, f"best {tuner.best}"
    assert len(proposals) == len(set(proposals)) == len(cost.calls)
    assert tuner.updates >= 5                                # PPO updates happened
    assert tuner.invalid


def test_rl_tuner_is_deterministic_under_a_seed():
    problem = synthetic_space(BIG, seed=0)
    runs = []
    for seed in (3, 3, 4):
        tuner = make_tuner("rl", problem.space, seed=seed, n_steps=32)
        _, proposals = drive(tuner, CountingCost(problem), 96)
        assert tuner.updates >= 2
        runs.append(proposals)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_rl_tuner_covers_a_small_space_exactly_once():
    problem = synthetic_space((3, 3, 4), seed=1)
    cost = CountingCost(problem)
    tuner = make_tuner("rl", problem.space, seed=0, horizon=4, max_idle_steps=4)
    found, proposals = drive(tuner, cost, problem.space.size)
    assert found is not None
    assert len(proposals) == len(set(proposals)) == problem.valid_points()
    assert not tuner.has_next()


def test_rl_options_are_validated():
    with pytest.raises(OptionError, match="batch_size"):
        RLOptions(n_steps=16, batch_size=32)
    with pytest.raises(OptionError, match="restart_from_best"):
        RLOptions(restart_from_best=2.0)
