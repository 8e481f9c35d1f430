"""RslRlEnv: rsl_rl's VecEnv interface as an rl8 env (a torch point mass stands in for Isaac Lab
and mjlab, tests/envs/sim_fakes.py)."""

from __future__ import annotations

import math

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


def test_finite_horizon_tasks_without_time_outs_terminate_every_episode():
    vec = PointMassVecEnv(2, max_episode_length=2, finite_horizon=True)  # no extras["time_outs"]
    env = RslRlEnv(vec)
    env.reset()
    _step(env)
    out = _step(env)
    assert out["terminated"].all() and not out["truncated"].any()


def test_rewards_and_flags_outlive_the_env_buffers_they_came_from():
    vec = PointMassVecEnv(2, max_episode_length=2)
    env = RslRlEnv(vec)
    env.reset()
    out = _step(env, 1.0)
    kept = out.clone()
    _step(env, 1.0)  # rewrites vec.reward_buf and vec.reset_time_outs in place
    assert not torch.equal(vec.reward_buf, kept["rewards"][:, 0]) and vec.reset_time_outs.all()
    assert torch.equal(out["rewards"], kept["rewards"]) and torch.equal(
        out["truncated"], kept["truncated"]
    )


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
    first = _step(env, 1.0)  # no env finished: the sim gives no final_obs (Isaac Lab's way)
    assert torch.equal(first["final_obs"]["policy"], first["obs"]["policy"])
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


@pytest.mark.parametrize("mode", ["auto", "stale", "partial", "genesis"])
def test_logged_values_are_per_episode_means_of_the_ended_episodes(mode):
    """extras["log"] (mjlab: empty on steps without resets; Isaac Lab: the last values stay;
    mjlab's auto_reset=False: at reset(env_ids)) and Genesis' extras["episode"] give the mean
    over the episodes that ended, whatever the steps they ended at."""
    n, limit = 6, 7
    vec = PointMassVecEnv(
        n,
        max_episode_length=limit,
        auto_reset=mode != "partial",
        stale_log=mode == "stale",
        log_key="episode" if mode == "genesis" else "log",
        dt=0.5,
    )
    env = RslRlEnv(vec, reset_envs=vec.reset if mode == "partial" else None)
    env.reset()
    generator, returns = torch.Generator().manual_seed(0), torch.zeros(n)
    ended_returns, out_of_bounds = [], 0
    for _ in range(40):
        out = env.step(torch.randn(n, 1, generator=generator))
        returns += out["rewards"][:, 0]
        done = (out["terminated"] | out["truncated"])[:, 0]
        ended_returns += (returns[done] / limit).tolist()
        out_of_bounds += int(out["terminated"].sum())
        returns[done] = 0.0
    episodes = len(ended_returns)
    assert episodes > 20 and 5 < out_of_bounds < episodes - 5  # both ends, at many steps
    log = {key: value.item() for key, value in env.pop_log().items()}
    assert log == pytest.approx(
        {
            "Episode_Reward/return": sum(ended_returns) / episodes,
            "Episode_Termination/time_out": 1 - out_of_bounds / episodes,  # fractions of episodes
            "Episode_Termination/out_of_bounds": out_of_bounds / episodes,
        }
    )
    assert env.pop_log() == {}


def test_a_direct_envs_stale_success_rate_counts_each_ended_episode_once():
    """Isaac Lab's direct cartpole leaves Metrics/success_rate in extras["log"] after each reset,
    reset() included (a fraction of sub-envs that never ended an episode there): the mean is the
    fraction of the ended episodes that timed out, whatever the steps in between."""
    n, limit = 6, 7
    vec = PointMassVecEnv(n, max_episode_length=limit, direct_log=True, dt=0.5)
    env = RslRlEnv(vec)
    env.reset()
    assert "Metrics/success_rate" in vec.extras["log"]  # the reset's, of no ended episode
    out = env.step(torch.zeros(n, 1))  # nothing moves far enough to end in one step
    assert not (out["terminated"] | out["truncated"]).any()
    assert math.isnan(env.pop_log()["Metrics/success_rate"].item())
    generator, ended, timed_out, quiet_steps = torch.Generator().manual_seed(0), 0, 0, 0
    for _ in range(40):
        out = env.step(torch.randn(n, 1, generator=generator))
        done = out["terminated"] | out["truncated"]
        ended, timed_out = ended + int(done.sum()), timed_out + int(out["truncated"].sum())
        quiet_steps += not done.any() and "Metrics/success_rate" in vec.extras["log"]
    assert ended > 20 and 5 < timed_out < ended - 5 and quiet_steps > 5  # stale on quiet steps
    rate = env.pop_log()["Metrics/success_rate"].item()
    assert rate == pytest.approx(timed_out / ended)


@pytest.mark.slow
def test_env_terms_reach_the_collect_and_eval_stats_mlflow_and_not_the_progress_line(
    migrated_store, capsys
):
    from mlflow.tracking import MlflowClient

    from rl8 import Trainer
    from rl8.training.conditions import HitsUpperBound

    limit = 8
    algo = PPO(PointMassVecEnv(16, max_episode_length=limit), horizon=16, seed=0)
    # the fake's Episode_Reward/return is the mean return of the ended episodes / the limit
    stats = algo.collect()
    assert stats["env/Episode_Reward/return"] == pytest.approx(stats["episodes/return_mean"] / limit)
    assert stats["env/Episode_Termination/time_out"] + stats[
        "env/Episode_Termination/out_of_bounds"
    ] == pytest.approx(1.0)
    evaluated = algo.evaluate(num_steps=2 * limit)
    assert evaluated["env/Episode_Reward/return"] == pytest.approx(
        evaluated["episodes/return_mean"] / limit
    )
    logged = []
    with Trainer(algo, progress=True, progress_every_s=1e-9) as trainer:
        trainer.run(
            stop_conditions=HitsUpperBound("env/steps", algo.env_steps + 3 * 256),
            callbacks=lambda _, step_stats: logged.append(dict(step_stats)),
        )
    client = MlflowClient(migrated_store)
    history = client.get_metric_history(trainer.run_id, "env/Episode_Reward/return")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [s["env/Episode_Reward/return"] for s in logged]
    )
    assert len(history) == 3 and {"env/Episode_Termination/time_out", "env/steps"} <= set(
        client.get_run(trainer.run_id).data.metrics
    )
    err = capsys.readouterr().err
    assert "Episode_" not in err and max(map(len, err.splitlines())) < 200, err


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
