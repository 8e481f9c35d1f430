"""RslRlEnv: rsl_rl's VecEnv interface as an rl8 env (a torch point mass stands in for Isaac Lab
and mjlab, tests/envs/sim_fakes.py)."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces
from sim_fakes import PointMassVecEnv
from tensordict import TensorDict

from rl8 import PPO
from rl8.envs.base import validate_reset_output, validate_step_output
from rl8.envs.rsl_rl import RslRlEnv
from rl8.ppo.buffer import compute_gae


def _step(env: RslRlEnv, a: float = 0.0) -> TensorDict:
    out = env.step(torch.full((env.num_envs, 1), a))
    validate_step_output(out, env)
    return out


def test_spaces_and_step_output():
    env = RslRlEnv(PointMassVecEnv(4))
    assert (
        env.num_envs == 4 and env.device == torch.device("cpu") and env.episodic and env.single_instance
    )
    assert env.observation_space == spaces.Dict(
        {
            "policy": spaces.Box(-float("inf"), float("inf"), (2,)),
            "critic": spaces.Box(-float("inf"), float("inf"), (3,)),
        }
    )
    assert env.action_space == spaces.Box(-float("inf"), float("inf"), (1,))
    validate_reset_output(env.reset(), env)
    out = _step(env)
    assert out["rewards"].dtype == torch.float32 and out["truncated"].shape == (4, 1)
    vec = PointMassVecEnv(4)
    vec.action_space = spaces.Box(-2.0, 2.0, (4, 1))  # batched, as the wrappers' action_space: not read
    vec.single_action_space = spaces.Box(-1.0, 1.0, (1,), dtype="float64")
    assert RslRlEnv(vec).action_space == spaces.Box(-1.0, 1.0, (1,))


def test_plain_tensor_observations_and_rsl_rl_2_groups():
    class Rsl2(PointMassVecEnv):  # rsl_rl 2: get_observations() -> (tensor, {"observations": groups})
        def get_observations(self):
            groups = super().get_observations()
            return groups["policy"], {"observations": {"critic": groups["critic"]}}

        def reset(self, env_ids=None):
            super().reset(env_ids)
            return self.get_observations()

    class Plain(PointMassVecEnv):
        def get_observations(self):
            return super().get_observations()["policy"]

    assert RslRlEnv(Plain(2)).observation_space == spaces.Box(-float("inf"), float("inf"), (2,))
    env = RslRlEnv(Rsl2(2))
    assert set(env.observation_space.spaces) == {"policy", "critic"}
    validate_reset_output(env.reset(), env)


def test_termination_and_truncation_are_split_by_time_outs():
    vec = PointMassVecEnv(3, max_episode_length=5)
    env = RslRlEnv(vec)
    env.reset()
    vec.state[0] = torch.tensor([1.99, 1.0])  # leaves |x| <= 2: terminated
    vec.episode_length_buf[1] = 4  # its 5th step: a time-out
    out = _step(env)
    assert out["terminated"][:, 0].tolist() == [True, False, False]
    assert out["truncated"][:, 0].tolist() == [False, True, False]


def test_genesis_flags_bool_dones_float_time_outs_int32_lengths():
    vec = PointMassVecEnv(3, max_episode_length=5, genesis_flags=True)
    env = RslRlEnv(vec, init_at_random_ep_len=True)
    env.reset()
    assert vec.episode_length_buf.dtype == torch.int32 and (vec.episode_length_buf < 5).all()
    vec.episode_length_buf[:] = torch.tensor([0, 4, 0], dtype=torch.int32)
    vec.state[0] = torch.tensor([1.99, 1.0])  # leaves |x| <= 2: terminated
    out = _step(env)
    assert out["terminated"][:, 0].tolist() == [True, False, False]
    assert out["truncated"][:, 0].tolist() == [False, True, False]


def test_truncated_steps_bootstrap_from_the_pre_step_observation():
    vec = PointMassVecEnv(2, max_episode_length=3)
    env = RslRlEnv(vec)
    env.reset()
    _step(env, 1.0)
    before = _step(env, 1.0)["obs"]
    out = _step(env, 1.0)  # the 3rd step: a time-out; the sim reset the envs inside step
    assert out["truncated"].all()
    assert torch.equal(out["final_obs"]["policy"], before["policy"])
    assert torch.equal(out["obs"]["policy"][:, 1], torch.zeros(2))  # a new episode


def test_true_final_observation_from_reset_envs():
    vec = PointMassVecEnv(2, max_episode_length=3, auto_reset=False)
    reset_ids = []
    env = RslRlEnv(vec, reset_envs=lambda ids: (reset_ids.append(ids.tolist()), vec.reset(ids))[1])
    env.reset()
    for _ in range(2):
        _step(env, 1.0)
    true_final = vec.state.clone()  # computed below by the same dynamics
    true_final[:, 1] += 0.1
    true_final[:, 0] += 0.1 * true_final[:, 1]
    out = _step(env, 1.0)
    assert out["truncated"].all() and reset_ids == [[0, 1]]
    torch.testing.assert_close(out["final_obs"]["policy"], true_final)
    assert torch.equal(out["obs"]["critic"][:, 2], torch.ones(2))  # both restarted


def test_true_final_observation_from_an_extras_key():
    vec = PointMassVecEnv(2, max_episode_length=2, final_obs_key="final_obs")
    env = RslRlEnv(vec, final_obs_key="final_obs")
    env.reset()
    _step(env, 1.0)
    out = _step(env, 1.0)
    assert out["truncated"].all()
    assert torch.equal(
        out["final_obs"]["critic"][:, 2], torch.zeros(2)
    )  # no steps left: the episode's end
    assert torch.equal(out["obs"]["critic"][:, 2], torch.ones(2))
    with pytest.raises(ValueError, match="not both"):
        RslRlEnv(vec, final_obs_key="final_obs", reset_envs=vec.reset)


def test_pre_step_bootstrap_equals_rsl_rl_time_out_bootstrap():
    """rl8's GAE with final_obs = the pre-step observation gives rsl_rl's advantages, which add
    gamma * V(s_t) to the reward of a timed-out step and end the episode there."""
    algo = PPO(
        PointMassVecEnv(8, max_episode_length=6), horizon=16, seed=0, normalize_rewards=False, gamma=0.9
    )
    algo.collect()
    data, h = algo.buffer.data, 16
    with torch.no_grad():
        advantages, returns = algo.compute_advantages()
    values, truncated, terminated = data["values"], data["truncated"][:, :h], data["terminated"][:, :h]
    assert truncated.any() and terminated.sum() < truncated.sum()
    rewards = data["rewards"][:, :h] + 0.9 * values[:, :h] * truncated  # rsl_rl's process_env_step
    expected, expected_returns = compute_gae(
        rewards, values, gamma=0.9, gae_lambda=algo.hparams.gae_lambda, terminated=terminated | truncated
    )
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected_returns)


def test_reset_random_episode_lengths_and_config():
    vec = PointMassVecEnv(64, max_episode_length=50)
    env = RslRlEnv(vec, init_at_random_ep_len=True)
    calls = vec.reset_calls
    env.reset(seed=3)
    assert vec.reset_calls == calls + 1
    assert vec.episode_length_buf.max() < 50 and len(vec.episode_length_buf.unique()) > 10
    with pytest.raises(KeyError, match="unknown config key 'gravity'"):
        env.reset(config={"gravity": 1.0})
    assert env.params == {"max_episode_steps": 50} and env.state_dict() is None


def test_logged_episode_values_are_averaged_until_popped():
    vec = PointMassVecEnv(2, max_episode_length=2)
    env = RslRlEnv(vec)
    env.reset()
    for _ in range(4):  # two rounds of time-outs, each logging
        _step(env)
    log = env.pop_log()
    assert log["Episode_Termination/time_out"] == 2.0 and set(log) == {
        "Episode_Reward/return",
        "Episode_Termination/time_out",
    }
    assert env.pop_log() == {}
    for _ in range(600):  # 300 logging steps: summed once on the way, then at the pop
        _step(env)
    assert env.pop_log()["Episode_Termination/time_out"] == 2.0


@pytest.mark.slow
def test_ppo_learns_the_point_mass_through_the_adapter():
    algo = PPO(
        PointMassVecEnv(64), horizon=32, seed=0, lr=3e-3, num_sgd_iters=4, normalize_observations=True
    )
    returns = []
    while algo.env_steps < 65_536:  # a random policy scores about 23, a good one about 46
        returns.append(algo.collect()["episodes/return_mean"])
        algo.update()
        if returns[-1] >= 42.0:
            break
    assert returns[-1] >= 42.0, returns
