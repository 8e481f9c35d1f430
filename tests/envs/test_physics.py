"""The frame CartPole and Pendulum share: config validation and reset."""

from __future__ import annotations

import pytest
import torch

from rl8.envs import CartPole, Pendulum


@pytest.mark.parametrize("cls", [CartPole, Pendulum])
@pytest.mark.parametrize("steps", ["x", 0, 2.5, True])
def test_max_episode_steps_must_be_an_int(cls, steps):
    env = cls(2)
    with pytest.raises(
        ValueError, match=rf"{cls.__name__}: config 'max_episode_steps' must be an int >= 1, got"
    ):
        env.reset(config={"max_episode_steps": steps})
    assert env.params["max_episode_steps"] == cls.default_params["max_episode_steps"]  # unchanged


@pytest.mark.parametrize("cls", [CartPole, Pendulum])
def test_parameters_must_be_numbers(cls):
    env = cls(2)
    key = next(k for k in cls.default_params if k != "max_episode_steps")
    with pytest.raises(TypeError, match=rf"{cls.__name__}: config '{key}' must be a number, got 'big'"):
        env.reset(config={key: "big"})
    with pytest.raises(KeyError):
        env.reset(config={"no_such_parameter": 1.0})


@pytest.mark.parametrize("cls", [CartPole, Pendulum])
def test_reset_with_a_seed_repeats_and_zeroes_the_step_counters(cls):
    env = cls(3)
    first = env.reset(seed=4).clone()
    env.step(torch.zeros((3,), dtype=torch.int64) if cls is CartPole else torch.zeros(3, 1))
    assert bool((env.steps == 1).all())
    assert torch.equal(env.reset(seed=4), first)
    assert bool((env.steps == 0).all())
    params = env.params
    env.reset(config={"max_episode_steps": 7})
    assert env.params == {**params, "max_episode_steps": 7}
