"""Gymnasium envs through the adapter learn: fixed seeds, bounded env steps."""

from __future__ import annotations

import pytest

from rl8 import PPO
from rl8.envs import GymnasiumEnv

pytestmark = pytest.mark.slow

# The hyper-parameters of examples/gymnasium_cartpole.py and examples/gymnasium_pendulum.py.
CARTPOLE = dict(num_envs=16, horizon=64, sgd_minibatch_size=256, num_sgd_iters=8)
PENDULUM = dict(num_envs=64, horizon=128, gamma=0.95, lr=3e-3, num_sgd_iters=8, sgd_minibatch_size=2048)


def train(env_id: str, hparams: dict, *, target: float, eval_steps: int, max_env_steps: int) -> float:
    algo = PPO(env_id, seed=0, **hparams)
    eval_env = GymnasiumEnv(16, env=env_id)
    best = -float("inf")
    try:
        while algo.env_steps < max_env_steps:
            algo.collect()
            algo.update()
            if algo.steps % 4 == 0:
                value = algo.evaluate(eval_env, num_steps=eval_steps)["episodes/return_mean"]
                best = max(best, value)
                if value >= target:
                    return value
    finally:
        eval_env.close()
        algo.env.close()
    pytest.fail(
        f"{env_id}: best deterministic return {best:.1f} < {target} in {max_env_steps} env steps"
    )


def test_cartpole_v1_reaches_475():
    assert train("CartPole-v1", CARTPOLE, target=475, eval_steps=500, max_env_steps=150_000) >= 475


def test_pendulum_v1_reaches_minus_200():
    assert train("Pendulum-v1", PENDULUM, target=-200, eval_steps=200, max_env_steps=400_000) >= -200
