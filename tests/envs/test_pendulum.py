"""Pendulum matches gymnasium's Pendulum-v1 step for step and honours the env contract."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from rl8.envs import Pendulum
from rl8.envs.base import validate_step_output


@pytest.mark.parametrize(
    "config", [None, {"g": 9.81, "m": 0.5, "l": 1.5, "dt": 0.02, "max_torque": 1.0}]
)
def test_one_step_matches_gymnasium(config):
    n = 300
    rng = np.random.default_rng(0)
    states = np.stack([rng.uniform(-3 * np.pi, 3 * np.pi, n), rng.uniform(-8, 8, n)], 1)
    states = states.astype(np.float32)
    actions = rng.uniform(-3.0, 3.0, (n, 1)).astype(np.float32)  # some outside the bounds
    gym_env = gymnasium.make("Pendulum-v1").unwrapped
    gym_env.reset(seed=0)
    for key, value in (config or {}).items():
        setattr(gym_env, key, value)

    env = Pendulum(n)
    env.reset(config=config, seed=0)
    env.state = torch.from_numpy(states)
    out = env.step(torch.from_numpy(actions))
    validate_step_output(out, env)
    assert not out["terminated"].any() and not out["truncated"].any()
    assert torch.equal(out["obs"], out["final_obs"])
    for i in range(n):
        gym_env.state = states[i].astype(np.float64)
        obs, reward, terminated, truncated, _ = gym_env.step(actions[i])
        np.testing.assert_allclose(out["obs"][i].numpy(), obs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(env.state[i].numpy(), gym_env.state, atol=1e-5, rtol=0)
        assert out["rewards"][i, 0].item() == pytest.approx(reward, abs=1e-5)
        assert not terminated


def test_truncation_after_200_steps_with_final_obs_and_auto_reset():
    n = 5
    env = Pendulum(n)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    for t in range(199):
        out = env.step(torch.rand(n, 1, generator=gen) * 4 - 2)
        assert not out["truncated"].any() and not out["terminated"].any(), t
    before = env.state.clone()
    action = torch.full((n, 1), 0.5)
    out = env.step(action)
    validate_step_output(out, env)
    assert out["truncated"].all() and not out["terminated"].any()
    assert (env.steps == 0).all()
    twin = Pendulum(n)
    twin.reset(config={"max_episode_steps": 1000})
    twin.state = before
    np.testing.assert_allclose(out["final_obs"], twin.step(action)["obs"], atol=1e-6)
    # obs is the fresh start: theta in [-pi, pi], theta_dot in [-1, 1]
    assert env.state[:, 1].abs().max() <= 1.0 and env.state[:, 0].abs().max() <= np.pi
    np.testing.assert_allclose(out["obs"][:, 0], env.state[:, 0].cos(), atol=1e-6)
    assert not torch.allclose(out["obs"], out["final_obs"])
    for _ in range(199):
        assert not env.step(action)["truncated"].any()
    assert env.step(action)["truncated"].all()


def test_config_changes_dynamics_and_horizon():
    a, b = Pendulum(3), Pendulum(3)
    a.reset(seed=1)
    b.reset(config={"g": 2.0, "max_episode_steps": 3}, seed=1)
    action = torch.zeros(3, 1)
    assert not torch.allclose(a.step(action)["obs"][:, 2], b.step(action)["obs"][:, 2])
    assert [b.step(action)["truncated"].all().item() for _ in range(5)] == [
        False,
        True,
        False,
        False,
        True,
    ]
    # the torque is clipped to max_torque
    c = Pendulum(1)
    c.reset(config={"max_torque": 0.5, "g": 0.0})
    c.state = torch.zeros(1, 2)
    out = c.step(torch.tensor([[2.0]]))
    assert out["obs"][0, 2].item() == pytest.approx(3.0 * 0.5 * 0.05)
    assert out["rewards"][0, 0].item() == pytest.approx(-0.001 * 0.25)


def test_unknown_config_key_names_the_allowed_keys():
    env = Pendulum(1)
    with pytest.raises(KeyError, match="gravity") as info:
        env.reset(config={"gravity": 1.0})
    for key in ("g", "m", "l", "dt", "max_speed", "max_torque", "max_episode_steps"):
        assert repr(key) in str(info.value)


def test_seeding():
    def trajectory(seed):
        env = Pendulum(8)
        obs = [env.reset(seed=seed)]
        gen = torch.Generator().manual_seed(0)
        for _ in range(30):
            obs.append(env.step(torch.rand(8, 1, generator=gen) * 4 - 2)["obs"])
        return torch.stack(obs)

    a, b, c = trajectory(7), trajectory(7), trajectory(8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert len({tuple(row.tolist()) for row in a[0]}) == 8


def test_render_frame():
    env = Pendulum(2)
    env.reset(seed=0)
    env.state = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    frame = env.render(0)
    assert frame.shape == (500, 500, 3) and frame.dtype == np.uint8
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) >= 3
    assert (frame[100:240, 250] != 255).any()  # upright rod above the pivot
    assert not np.array_equal(frame, env.render(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_without_host_sync():
    env = Pendulum(64, device="cuda")
    env.reset(seed=0)
    action = torch.rand(64, 1, device="cuda") * 6 - 3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(210):
            out = env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    validate_step_output(out, env)
    assert out["obs"].device.type == "cuda" and out["final_obs"].device.type == "cuda"
