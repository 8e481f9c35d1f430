"""TorchVectorEnv: a torch-batched gymnasium vector env (ManiSkill3, Isaac Lab's direct envs) as
an rl8 env (a torch point mass stands in, tests/envs/sim_fakes.py)."""

from __future__ import annotations

import pytest
import torch
from gymnasium.vector import AutoresetMode
from sim_fakes import PointMassVectorEnv

from rl8 import PPO
from rl8.envs.base import EnvOutputError, validate_reset_output, validate_step_output
from rl8.envs.torch_vector import TorchVectorEnv


def _run_to_time_out(vector_env: PointMassVectorEnv) -> tuple[torch.Tensor, dict]:
    """Steps to the first time-out: the observations before that step and its output."""
    env = TorchVectorEnv(vector_env)
    obs = env.reset(seed=0)
    validate_reset_output(obs, env)
    while True:
        out = env.step(torch.ones(env.num_envs, 1))
        validate_step_output(out, env)
        if out["truncated"].any():
            return obs, out
        obs = out["obs"]


def test_final_observation_from_info():
    vector_env = PointMassVectorEnv(3, max_episode_length=4)
    before, out = _run_to_time_out(vector_env)
    assert out["truncated"].all() and not out["terminated"].any()
    expected = before.clone()
    expected[:, 1] += 0.1
    expected[:, 0] += 0.1 * expected[:, 1]
    torch.testing.assert_close(out["final_obs"], expected)  # the true final state
    assert torch.equal(out["obs"][:, 1], torch.zeros(3))  # reset in the same step


def test_pre_step_observation_without_final_observation():
    before, out = _run_to_time_out(PointMassVectorEnv(3, max_episode_length=4, give_final_obs=False))
    assert torch.equal(out["final_obs"], before)


def test_needs_same_step_autoreset_and_a_device():
    vector_env = PointMassVectorEnv(2)
    vector_env.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    with pytest.raises(ValueError, match="autoreset_mode=AutoresetMode.SAME_STEP"):
        TorchVectorEnv(vector_env)
    vector_env = PointMassVectorEnv(2)
    vector_env.device = None
    with pytest.raises(ValueError, match="pass TorchVectorEnv"):
        TorchVectorEnv(vector_env)
    assert TorchVectorEnv(vector_env, device="cpu").device == torch.device("cpu")


def test_ppo_takes_the_vector_env_and_closes_nothing():
    vector_env = PointMassVectorEnv(8)
    algo = PPO(vector_env, horizon=8, seed=0)
    assert isinstance(algo.env, TorchVectorEnv) and algo.hparams.num_envs == 8
    assert algo.collect()["rewards/mean"] > 0
    algo.update()
    assert not vector_env.closed
    algo.env.close()
    assert vector_env.closed


def test_finished_episodes_final_info_is_averaged_until_pop_log():
    env = TorchVectorEnv(PointMassVectorEnv(3, max_episode_length=4))
    env.reset(seed=0)
    for _ in range(3):
        env.step(torch.zeros(3, 1))
    assert env.pop_log() == {}  # no episode ended
    out = env.step(torch.zeros(3, 1))
    assert out["truncated"].all()
    log = env.pop_log()
    assert set(log) == {"success", "episode/success_once", "episode/return", "episode/episode_len"}
    assert log["episode/episode_len"] == 4.0 and 0.0 <= log["success"] <= 1.0
    # the return of the finished episodes: the rewards 1 - |x| of their 4 steps
    assert 0.0 < log["episode/return"] <= 4.0
    assert env.pop_log() == {}
    quiet = TorchVectorEnv(PointMassVectorEnv(3, max_episode_length=4, give_final_obs=False))
    quiet.reset(seed=0)
    for _ in range(4):
        quiet.step(torch.zeros(3, 1))
    assert quiet.pop_log() == {}


def test_final_infos_reach_the_collect_and_eval_stats():
    # the values ManiSkill3 logs for ended episodes: 0-d tensors through PPO's one stat transfer
    algo = PPO(PointMassVectorEnv(4, max_episode_length=4), horizon=8, seed=0)
    stats = algo.collect()
    assert stats["env/episode/episode_len"] == 4.0 and 0.0 <= stats["env/Episode/success"] <= 1.0
    assert 0.0 < stats["env/episode/return"] <= 4.0
    evaluated = algo.evaluate(num_steps=8)
    assert evaluated["env/episode/episode_len"] == 4.0


def test_a_log_that_is_not_0d_tensors_is_a_clear_error():
    env = TorchVectorEnv(PointMassVectorEnv(2))
    algo = PPO(env, horizon=4, seed=0)
    env.pop_log = lambda: {"success": 0.5}
    with pytest.raises(
        EnvOutputError, match=r"TorchVectorEnv.pop_log: 'success' must be a 0-d tensor, got float"
    ):
        algo.collect()
    env.pop_log = lambda: {"success": torch.ones(2)}
    with pytest.raises(EnvOutputError, match=r"'success' must be a 0-d tensor, got shape \(2,\)"):
        algo.collect()
    env.pop_log = lambda: [torch.ones(())]
    with pytest.raises(EnvOutputError, match="expected a dict of 0-d tensors, got list"):
        algo.evaluate(num_steps=2)


def test_a_given_device_must_be_the_envs():
    with pytest.raises(
        ValueError, match=r"device is 'meta', but PointMassVectorEnv's tensors are on 'cpu'"
    ):
        TorchVectorEnv(PointMassVectorEnv(2), device="meta")
