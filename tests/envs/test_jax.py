"""The JAX simulators (rl8/envs/jax.py): gymnax and MuJoCo Playground through jit + vmap + DLPack."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl8.envs.base import validate_reset_output, validate_step_output

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from rl8.envs.jax import (  # noqa: E402
    GymnaxEnv,
    JaxEnv,
    PlaygroundEnv,
    jax_device,
    make_gymnax_env,
    make_playground_env,
)

_BUILT: dict = {}  # one env per kind, reused: each new env compiles its reset and step


def gymnax_env(env_id="CartPole-v1", num_envs=4):
    """A cached gymnax env with its default parameters."""
    pytest.importorskip("gymnax")
    if (env_id, num_envs) not in _BUILT:
        env = make_gymnax_env(env_id, num_envs, None, device="cpu")
        _BUILT[env_id, num_envs] = env, env.params
    env, defaults = _BUILT[env_id, num_envs]
    env.params = defaults
    return env


def playground_env():
    """A cached Playground CartpoleBalance of 4 envs, MJX in JAX."""
    pytest.importorskip("mujoco_playground")
    if "playground" not in _BUILT:
        _BUILT["playground"] = make_playground_env(
            "CartpoleBalance", 4, None, device="cpu", config_overrides={"impl": "jax"}
        )
    return _BUILT["playground"]


def rollout(env, actions):
    return [env.step(a) for a in actions]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnax_outputs_meet_the_step_contract(env_id):
    env = gymnax_env(env_id, 16)
    validate_reset_output(env.reset(seed=0), env)
    for _ in range(3):
        out = env.step(torch.as_tensor(np.stack([env.action_space.sample() for _ in range(16)])))
        validate_step_output(out, env)


def test_gymnax_cartpole_terminates_when_the_pole_falls_and_truncates_at_the_time_limit():
    env, left = gymnax_env(), torch.zeros(4, dtype=torch.int64)
    env.reset(seed=1, config={"max_steps_in_episode": 100})
    twins = rollout(env, [left] * 5)
    env.reset(seed=1, config={"max_steps_in_episode": 5})
    outs = rollout(env, [left] * 5)
    for out in outs[:4]:
        assert not out["truncated"].any() and not out["terminated"].any()
        assert torch.equal(out["obs"], out["final_obs"])
    assert outs[4]["truncated"].all() and not outs[4]["terminated"].any()
    assert torch.equal(outs[4]["final_obs"], twins[4]["obs"])  # the state the step reached
    assert (outs[4]["obs"].abs() <= 0.05).all()  # a fresh episode
    env.reset(seed=1, config={"max_steps_in_episode": 100})
    fallen = [out for out in rollout(env, [left] * 25) if out["terminated"].any()]
    assert fallen and not fallen[0]["truncated"].any()
    assert (
        fallen[0]["final_obs"][fallen[0]["terminated"][:, 0], 2].abs() > 0.2
    ).all()  # past 12 degrees


def test_gymnax_config_changes_the_dynamics_and_refuses_unknown_keys():
    env, action = gymnax_env(), torch.ones(4, dtype=torch.int64)
    env.reset(seed=0)
    plain = env.step(action)["obs"]
    env.reset(seed=0, config={"gravity": 30.0})
    assert not torch.equal(plain, env.step(action)["obs"])
    with pytest.raises(KeyError, match="gravityy"):
        env.reset(config={"gravityy": 1.0})


def test_seeds_reproduce_a_rollout_and_different_seeds_differ():
    env = gymnax_env()
    actions = [torch.randint(0, 2, (4,), generator=torch.Generator().manual_seed(i)) for i in range(40)]
    first, outs = env.reset(seed=7), rollout(env, actions)
    assert torch.equal(first, env.reset(seed=7))
    for x, y in zip(outs, rollout(env, actions)):
        assert (x == y).all()
    assert not torch.equal(env.reset(seed=7), env.reset(seed=8))
    torch.manual_seed(3)
    first = Groups(2).key
    torch.manual_seed(3)
    assert np.array_equal(first, Groups(2).key)  # a new env's key comes from torch's RNG


def test_dlpack_hands_jax_buffers_to_torch_and_actions_back_without_copies():
    env = gymnax_env("Pendulum-v1", 16)
    env.reset(seed=0)
    action = torch.linspace(-2, 2, 16).reshape(16, 1)
    assert action.data_ptr() % 64 == 0
    as_jax = env.to_jax(action)
    assert as_jax.unsafe_buffer_pointer() == action.data_ptr()
    _, _, out = env.step_jit(env.key, env.sim_state, as_jax, env.params)
    for name, array in out.items():
        assert env.to_torch(array).data_ptr() == array.unsafe_buffer_pointer(), name
    assert env.to_torch(out["terminated"]).dtype == torch.bool
    discrete = torch.tensor([0, 1, 1, 0], dtype=torch.int64)
    as_jax = env.to_jax(discrete)  # int64 -> int32: a copy, the values kept
    assert as_jax.dtype == jnp.int32 and np.array_equal(np.asarray(as_jax), discrete.numpy())


def test_actions_are_clipped_to_the_box():
    env = gymnax_env("Pendulum-v1", 16)
    env.reset(seed=0)
    clipped = env.step(torch.full((16, 1), 50.0))
    env.reset(seed=0)
    assert (clipped == env.step(torch.full((16, 1), 2.0))).all()


class Groups(JaxEnv):
    """A toy JAX env with two observation groups: a counter that terminates at 3."""

    observation_space = spaces.Dict(
        {
            "state": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "privileged_state": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        }
    )
    action_space = spaces.Discrete(2)

    def reset_batch(self, keys, params):
        count = jnp.zeros(self.num_envs)
        return count, self.observe(count)

    def observe(self, count):
        return {"state": jnp.stack([count] * 2, 1), "privileged_state": jnp.stack([count] * 3, 1)}

    def step_batch(self, keys, count, action, params):
        reached = count + action
        terminated = reached >= 3
        count = jnp.where(terminated, 0.0, reached)
        return count, {
            "obs": self.observe(count),
            "final_obs": self.observe(reached),
            "rewards": action,
            "terminated": terminated,
            "truncated": jnp.zeros_like(terminated),
        }


def test_observation_groups_become_a_tensordict_and_the_state_round_trips():
    env = Groups(2)
    obs = env.reset(seed=0)
    validate_reset_output(obs, env)
    ones = torch.ones(2, dtype=torch.int64)
    outs = rollout(env, [ones] * 2)
    saved = copy.deepcopy(env.state_dict())
    out = env.step(ones)
    validate_step_output(out, env)
    assert out["terminated"].all() and (out["final_obs", "privileged_state"] == 3).all()
    assert (out["obs", "state"] == 0).all() and (outs[1]["obs", "state"] == 2).all()
    env.load_state_dict(saved)
    assert (env.step(ones) == out).all()
    with pytest.raises(ValueError, match="leaf 1 must be a torch.float32 tensor of shape"):
        env.load_state_dict({"leaves": [saved["leaves"][0], torch.zeros(5)]})


@pytest.mark.skipif(
    not torch.cuda.is_available() or not any(d.platform == "gpu" for d in jax.devices()),
    reason="needs CUDA in torch and in JAX",
)
def test_dlpack_hands_cuda_buffers_both_ways_without_copies():
    env = Groups(16, device="cuda")
    env.reset(seed=0)
    action = torch.ones(16, dtype=torch.int64, device="cuda")
    validate_step_output(env.step(action), env)
    _, _, out = env.step_jit(env.key, env.sim_state, env.to_jax(action), env.params)
    for name in ("state", "privileged_state"):
        assert env.to_torch(out["obs"])[name].data_ptr() == out["obs"][name].unsafe_buffer_pointer()
    floats = torch.linspace(-1, 1, 64, device="cuda").reshape(16, 4)
    as_jax = env.to_jax(floats)
    assert as_jax.unsafe_buffer_pointer() == floats.data_ptr()
    assert torch.equal(torch.from_dlpack(as_jax), floats)


def test_unknown_env_ids_and_devices_are_clear_errors():
    with pytest.raises(ValueError, match="unknown gymnax env 'CartPole-v9'.*CartPole-v1"):
        gymnax_env("CartPole-v9")
    pytest.importorskip("mujoco_playground")
    with pytest.raises(ValueError, match="unknown MuJoCo Playground env 'Cartpole'.*CartpoleBalance"):
        make_playground_env("Cartpole", 2, None, device="cpu")
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(ValueError, match="JAX has no device for torch device 'cuda:0'"):
            jax_device(torch.device("cuda:0"))


def test_ppo_resumes_a_gymnax_run_from_its_state_dict():
    pytest.importorskip("gymnax")
    from rl8 import PPO

    def make():
        return PPO(GymnaxEnv, env_kwargs={"env_id": "CartPole-v1"}, num_envs=8, horizon=16, seed=0)

    algo = make()
    algo.collect()
    algo.update()
    state = copy.deepcopy(algo.state_dict())
    assert state["env"] is not None
    expected = algo.collect()
    resumed = make()
    resumed.load_state_dict(state)

    def rollout_stats(stats):
        return {k: v for k, v in stats.items() if k.startswith("rollout/")}

    assert rollout_stats(resumed.collect()) == rollout_stats(expected) != {}


@pytest.mark.heavy_sim
def test_playground_truncates_with_the_true_final_observation():
    env, actions = playground_env(), [torch.full((4, 1), 0.5)] * 6
    env.reset(seed=2, config={"episode_length": 50})
    twins = rollout(env, actions)
    validate_reset_output(env.reset(seed=2, config={"episode_length": 5}), env)
    outs = rollout(env, actions)
    for out in outs:
        validate_step_output(out, env)
        assert not out["terminated"].any()
    assert [bool(out["truncated"].all()) for out in outs] == [False] * 4 + [True, False]
    assert torch.equal(outs[4]["final_obs"], twins[4]["obs"])  # the state the step reached
    assert not torch.equal(outs[4]["obs"], twins[4]["obs"])  # restarted from a fresh reset
    assert torch.equal(outs[3]["obs"], outs[3]["final_obs"])
    with pytest.raises(ValueError, match="config episode_length: expected an int, got 2.5"):
        env.reset(config={"episode_length": 2.5})


def train_until(algo, eval_env, *, target, max_env_steps, eval_steps, eval_every):
    """Train; every ``eval_every`` updates evaluate deterministically; the env steps at ``target``."""
    best = -float("inf")
    while algo.env_steps < max_env_steps:
        algo.collect()
        algo.update()
        if algo.steps % eval_every == 0:
            best = max(best, algo.evaluate(eval_env, num_steps=eval_steps)["episodes/return_mean"])
            if best >= target:
                return algo.env_steps
    pytest.fail(f"the eval return reached only {best:.1f} < {target} within {max_env_steps} env steps")


@pytest.mark.slow
def test_gymnax_cartpole_is_solved_with_ppo_defaults():
    pytest.importorskip("gymnax")
    from rl8 import PPO

    algo = PPO(GymnaxEnv, env_kwargs={"env_id": "CartPole-v1"}, seed=0)
    assert (
        train_until(
            algo,
            gymnax_env(num_envs=32),
            target=475,
            max_env_steps=300_000,
            eval_steps=500,
            eval_every=2,
        )
        <= 300_000
    )  # seed 0: about 115k


@pytest.mark.slow
@pytest.mark.heavy_sim
def test_playground_cartpole_balance_is_learned():
    pytest.importorskip("mujoco_playground")
    from rl8 import PPO

    algo = PPO(
        PlaygroundEnv,
        env_kwargs={"env_id": "CartpoleBalance", "config_overrides": {"impl": "jax"}},
        seed=0,
        num_envs=256,
        horizon=32,
        model_config={"hiddens": (64, 64)},
    )
    eval_env = make_playground_env(
        "CartpoleBalance", 16, None, device="cpu", config_overrides={"impl": "jax"}
    )
    assert (
        train_until(algo, eval_env, target=900, max_env_steps=700_000, eval_steps=1000, eval_every=5)
        <= 700_000
    )  # seed 0: about 450k
