"""CartPole matches gymnasium's CartPole-v1 step for step and honours the env contract."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from rl8.envs import CartPole
from rl8.envs.base import validate_step_output

THETA_LIMIT = 12 * 2 * np.pi / 360


def balance(state: torch.Tensor) -> torch.Tensor:
    """A linear controller that keeps the pole up for well over 500 steps."""
    x, x_dot, theta, theta_dot = state.unbind(1)
    return (10 * theta + 2 * theta_dot + 0.5 * x + x_dot > 0).long()


def random_states(n: int, rng: np.random.Generator) -> np.ndarray:
    """States all over the valid region, a third of them near the termination thresholds."""
    states = np.stack(
        [
            rng.uniform(-2.4, 2.4, n),
            rng.uniform(-3.0, 3.0, n),
            rng.uniform(-THETA_LIMIT, THETA_LIMIT, n),
            rng.uniform(-3.0, 3.0, n),
        ],
        1,
    )
    k = n // 3
    sign = rng.choice([-1.0, 1.0], (k, 2))
    states[:k, 0] = sign[:, 0] * rng.uniform(2.35, 2.4, k)
    states[:k, 2] = sign[:, 1] * rng.uniform(THETA_LIMIT - 0.03, THETA_LIMIT, k)
    return states.astype(np.float32)


def gym_step(gym_env, state: np.ndarray, action: int):
    gym_env.state = state.astype(np.float64)
    gym_env.steps_beyond_terminated = None
    obs, reward, terminated, truncated, _ = gym_env.step(action)
    return obs, reward, terminated


@pytest.mark.parametrize("config", [None, {"gravity": 20.0, "masspole": 0.3, "tau": 0.01}])
def test_one_step_matches_gymnasium(config):
    n = 300
    rng = np.random.default_rng(0)
    states = random_states(n, rng)
    actions = rng.integers(0, 2, n)
    gym_env = gymnasium.make("CartPole-v1").unwrapped
    gym_env.reset(seed=0)
    for key, value in (config or {}).items():
        setattr(gym_env, key, value)
    gym_env.total_mass = gym_env.masspole + gym_env.masscart
    gym_env.polemass_length = gym_env.masspole * gym_env.length

    env = CartPole(n)
    env.reset(config=config, seed=0)
    env.state = torch.from_numpy(states)
    out = env.step(torch.from_numpy(actions))
    validate_step_output(out, env)

    terminated_any = False
    for i in range(n):
        obs, reward, terminated = gym_step(gym_env, states[i], int(actions[i]))
        np.testing.assert_allclose(out["final_obs"][i].numpy(), obs, atol=1e-5, rtol=0)
        assert out["rewards"][i, 0].item() == reward == 1.0
        assert out["terminated"][i, 0].item() == terminated
        assert not out["truncated"][i, 0].item()
        if terminated:
            terminated_any = True
            assert out["obs"][i].abs().max() <= 0.05
        else:
            assert torch.equal(out["obs"][i], out["final_obs"][i])
    assert terminated_any
    assert 0 < out["terminated"].sum() < n


def test_terminating_step_gives_reward_and_resets():
    env = CartPole(3)
    env.reset(seed=1)
    env.state = torch.tensor([[2.39, 2.0, 0.0, 0.0], [0.0, 0.0, -0.2, -2.0], [0.0, 0.0, 0.0, 0.0]])
    for _ in range(3):
        env.step(torch.tensor([1, 0, 1]))  # advance the step counters
    env.state = torch.tensor([[2.39, 2.0, 0.0, 0.0], [0.0, 0.0, -0.2, -2.0], [0.0, 0.0, 0.0, 0.0]])
    out = env.step(torch.tensor([1, 0, 1]))
    assert out["terminated"].squeeze(1).tolist() == [True, True, False]
    assert out["truncated"].sum() == 0
    assert out["rewards"].squeeze(1).tolist() == [1.0, 1.0, 1.0]
    assert out["final_obs"][0, 0] > 2.4 and out["final_obs"][1, 2] < -THETA_LIMIT
    assert out["obs"][:2].abs().max() <= 0.05
    assert env.steps.squeeze(1).tolist() == [0, 0, 4]


def test_truncation_after_500_steps_with_final_obs_and_auto_reset():
    n = 4
    env = CartPole(n)
    obs = env.reset(seed=2)
    for t in range(499):
        out = env.step(balance(obs))
        assert not out["terminated"].any() and not out["truncated"].any(), t
        obs = out["obs"]
    before = env.state.clone()
    action = balance(obs)
    out = env.step(action)
    validate_step_output(out, env)
    assert out["truncated"].all() and not out["terminated"].any()
    assert (env.steps == 0).all()
    # final_obs is the continuation of the episode, obs is a fresh start
    twin = CartPole(n)
    twin.reset(config={"max_episode_steps": 10_000})
    twin.state = before
    np.testing.assert_allclose(out["final_obs"], twin.step(action)["obs"], atol=1e-6)
    assert out["obs"].abs().max() <= 0.05
    assert (out["final_obs"] - out["obs"]).abs().max() > 0.05
    # the next episode is again 500 steps long
    obs = out["obs"]
    for _ in range(499):
        out = env.step(balance(obs))
        obs = out["obs"]
        assert not out["truncated"].any()
    assert env.step(balance(obs))["truncated"].all()


def test_config_max_episode_steps_and_gravity():
    env = CartPole(2)
    env.reset(config={"max_episode_steps": 7}, seed=0)
    flags = [env.step(balance(env.state))["truncated"].all().item() for _ in range(14)]
    assert flags == [False] * 6 + [True] + [False] * 6 + [True]

    light, heavy = CartPole(2), CartPole(2)
    light.reset(seed=5)
    heavy.reset(config={"gravity": 30.0}, seed=5)
    action = torch.tensor([0, 1])
    a, b = light.step(action)["obs"], heavy.step(action)["obs"]
    assert (a[:, 3] - b[:, 3]).abs().min() > 1e-3  # stronger gravity, faster falling pole
    assert heavy.params["gravity"] == 30.0 and light.params["gravity"] == 9.8
    # parameters persist over later resets without a config
    heavy.reset()
    assert heavy.params["gravity"] == 30.0


def test_unknown_config_key_names_the_allowed_keys():
    env = CartPole(2)
    with pytest.raises(KeyError, match="gravty") as info:
        env.reset(config={"gravty": 1.0})
    keys = ("gravity", "masscart", "masspole", "length", "force_mag", "tau", "max_episode_steps")
    for key in keys:
        assert key in str(info.value)
    with pytest.raises(ValueError, match="max_episode_steps"):
        env.reset(config={"max_episode_steps": 0})


def test_seeding():
    def trajectory(seed):
        env = CartPole(16)
        states = [env.reset(seed=seed)]
        gen = torch.Generator().manual_seed(0)
        for _ in range(60):
            states.append(env.step(torch.randint(0, 2, (16,), generator=gen))["obs"])
        return torch.stack(states)

    a, b, c = trajectory(3), trajectory(3), trajectory(4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    first = a[0]
    assert first.abs().max() <= 0.05
    assert len({tuple(row.tolist()) for row in first}) == 16
    env = CartPole(4)
    assert not torch.equal(env.reset(seed=1), env.reset())  # None continues the stream


def test_render_frame():
    env = CartPole(2)
    env.reset(seed=0)
    env.state = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.15, 0.0]])
    frame = env.render(1)
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) >= 3
    assert not np.array_equal(frame, env.render(0))
    assert env.metadata["render_fps"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_without_host_sync():
    env = CartPole(64, device="cuda")
    env.reset(seed=0)
    action = torch.randint(0, 2, (64,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(520):
            out = env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    validate_step_output(out, env)
    assert out["obs"].device.type == "cuda" and out["final_obs"].device.type == "cuda"
