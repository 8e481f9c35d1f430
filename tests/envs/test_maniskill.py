"""ManiSkill3's tasks through rl8.envs.maniskill and TorchVectorEnv, with the real ManiSkill on its
CPU physics (one env per process) and a software Vulkan device. Skipped where ManiSkill is not
installed: it lives in a venv of its own (``.ci/run``'s maniskill step, ``docs/simulators.md``)."""

from __future__ import annotations

import pytest

pytest.importorskip("mani_skill")

import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

from rl8 import PPO, Trainer  # noqa: E402
from rl8.envs.base import validate_reset_output, validate_step_output  # noqa: E402
from rl8.envs.maniskill import make_maniskill_env  # noqa: E402
from rl8.envs.torch_vector import TorchVectorEnv  # noqa: E402

TASK = "PushCube-v1"


def test_unknown_task_is_an_error_with_close_names():
    with pytest.raises(
        ValueError, match=r"'PushCube-v9' is not in ManiSkill's registry .*'PushCube-v1'"
    ):
        make_maniskill_env("PushCube-v9", 1, device="cpu")


def test_spaces_and_step_output_of_the_real_env():
    env = make_maniskill_env(TASK, 1, device="cpu")
    assert isinstance(env, TorchVectorEnv) and env.device == torch.device("cpu")
    assert env.observation_space == spaces.Box(-float("inf"), float("inf"), (35,), "float32")
    assert env.action_space == spaces.Box(-1.0, 1.0, (8,), "float32")
    obs = env.reset(seed=0)
    validate_reset_output(obs, env)
    assert obs.shape == (1, 35) and obs.dtype == torch.float32
    out = env.step(torch.zeros(1, 8))
    validate_step_output(out, env)
    kept = out["obs"].clone()
    env.step(torch.ones(1, 8))
    assert torch.equal(out["obs"], kept)  # ManiSkill returns new tensors at every step
    env.close()


def test_time_out_truncates_with_the_true_final_observation_and_logs_success():
    env = make_maniskill_env(TASK, 1, device="cpu", max_episode_steps=4)
    env.reset(seed=0)
    for _ in range(3):
        out = env.step(torch.zeros(1, 8))
        assert not (out["truncated"].any() or out["terminated"].any())
    assert env.pop_log() == {}  # no episode ended yet
    before = out["obs"]
    out = env.step(torch.full((1, 8), 0.5))
    assert out["truncated"].all() and not out["terminated"].any()
    # ManiSkill reset the env in the step: obs is the new episode's, final_obs where the old one ended
    assert not torch.equal(out["final_obs"], out["obs"]) and not torch.equal(out["final_obs"], before)
    log = env.pop_log()
    assert log["success"] == 0.0 and log["episode/episode_len"] == 4.0
    assert set(log) >= {"episode/success_once", "episode/return"} and log["episode/return"] > 0
    assert env.pop_log() == {}
    env.close()


def test_state_dict_observations_make_a_dict_space():
    env = make_maniskill_env(TASK, 1, device="cpu", obs_mode="state_dict")
    assert isinstance(env.observation_space, spaces.Dict)
    obs = env.reset(seed=0)
    assert set(obs.keys()) == set(env.observation_space.keys()) >= {"agent", "extra"}
    validate_step_output(env.step(torch.zeros(1, 8)), env)
    env.close()


@pytest.mark.slow
def test_named_task_updates_with_real_stats_and_resumes():
    algo = PPO(
        f"maniskill:{TASK}",
        num_envs=1,
        horizon=32,
        num_minibatches=2,
        seed=0,
        env_kwargs={"max_episode_steps": 16},
    )
    assert algo.env.vector_env.base_env.spec.id == TASK
    with Trainer(algo, tracking=False, progress=False) as trainer:
        for _ in range(3):
            stats = trainer.step()
        path = trainer.save_checkpoint()
    assert stats["episodes/count"] >= 2 and 0 < stats["episodes/return_mean"] <= 16  # rewards in [0, 1]
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k.startswith("loss/"))
    assert 0.0 <= stats["env/Episode/success"] <= 1.0 and stats["env/episode/episode_len"] == 16.0
    assert algo.env.pop_log() == {}  # PPO took them
    with Trainer.from_checkpoint(path, tracking=False, progress=False) as resumed:
        assert resumed.algo.env_spec == f"maniskill:{TASK}" and resumed.algo.env_steps == 96
        assert resumed.step()["env/episode/episode_len"] == 16.0  # env_kwargs kept
