"""PPO(env) with an env already built (an rl8 Env, an rsl_rl VecEnv, a factory of one), named
tasks, checkpoints of such runs, and evaluation on a training env that cannot be built twice."""

from __future__ import annotations

import importlib.util
import sys

import gymnasium
import pytest
import torch
from sim_fakes import PointMassVecEnv

from rl8 import PPO, Trainer
from rl8.envs import CartPole, tasks
from rl8.envs.rsl_rl import RslRlEnv
from rl8.ppo.distributed import DistContext
from rl8.training.config import run_params


def test_num_envs_and_device_come_from_the_env():
    env = CartPole(6)
    algo = PPO(env, horizon=4, seed=0)
    assert algo.env is env and algo.hparams.num_envs == 6 and algo.hparams.device == "cpu"
    algo.collect()
    assert PPO(PointMassVecEnv(3), num_envs=3, device="auto", horizon=4).hparams.num_envs == 3


@pytest.mark.parametrize(
    "hparam, value, message",
    [
        (
            "num_envs",
            16,
            "hparam num_envs: the env RslRlEnv was built with num_envs=8, but num_envs=16 was given",
        ),
        (
            "device",
            "meta",
            "hparam device: the env RslRlEnv was built with device=cpu, but device=meta was given",
        ),
    ],
)
def test_an_hparam_that_disagrees_with_the_env_is_an_error(hparam, value, message):
    with pytest.raises(ValueError, match=message):
        PPO(PointMassVecEnv(8), **{hparam: value})


def test_a_factory_of_a_built_env_and_a_gymnasium_maker():
    made = []

    def make():
        made.append(RslRlEnv(PointMassVecEnv(4)))
        return made[-1]

    algo = PPO(make, horizon=4)
    assert algo.env is made[0] and algo.hparams.num_envs == 4 and len(made) == 1
    probes = []

    def make_gymnasium():
        probes.append(gymnasium.make("CartPole-v1"))
        return probes[-1]

    algo = PPO(make_gymnasium, num_envs=2, horizon=4)
    assert algo.env.num_envs == 2 and len(probes) == 4  # rl8's probe (closed), then GymnasiumEnv's 3
    algo.collect()


def test_a_factory_and_a_named_task_get_the_env_seed_and_device(monkeypatch):
    made = []

    def make(device, seed=None):  # the parameters it names are given
        made.append({"device": device, "seed": seed})
        return PointMassVecEnv(4, seed=seed, device=device)

    algo = PPO(make, horizon=4, seed=5)
    assert made == [{"device": torch.device("cpu"), "seed": 5}] and algo.env_seed == 5
    assert algo.env.device == torch.device("cpu")
    monkeypatch.setitem(tasks.TASK_PREFIXES, "mjlab", "sim_fakes.make_point_mass")
    named = PPO("mjlab:PointMass", num_envs=4, horizon=4, seed=6)
    assert named.env.vec_env.seed == 6
    given = PPO("mjlab:PointMass", num_envs=4, horizon=4, seed=6, env_kwargs={"seed": 9})
    assert given.env.vec_env.seed == 9  # rank 0 keeps an env_kwargs seed (other ranks derive theirs)


def test_named_tasks_resolve_through_the_fixed_table(monkeypatch):
    monkeypatch.setitem(tasks.TASK_PREFIXES, "gymnax", "rl8.envs.no_such_module.make_gymnax_env")
    with pytest.raises(
        ImportError,
        match=r"the prefix 'gymnax' needs rl8.envs.no_such_module.make_gymnax_env.*'gymnax' extra",
    ):
        PPO("gymnax:CartPole-v1", num_envs=2)

    def make_without_simulator(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'mjlab'", name="mjlab")

    monkeypatch.setitem(tasks.TASK_PREFIXES, "mjlab", f"{__name__}.make_without_simulator")
    monkeypatch.setattr(
        sys.modules[__name__], "make_without_simulator", make_without_simulator, raising=False
    )
    with pytest.raises(
        ImportError,
        match=r"the simulator's package 'mjlab' is not installed; install rl8 with the 'mjlab' extra",
    ):
        PPO("mjlab:Mjlab-Cartpole-Balance", num_envs=2)
    with pytest.raises(
        ValueError, match=r"a prefix of \['gymnax', 'isaaclab', 'maniskill', 'mjlab', 'playground'\]"
    ):
        tasks.make_task_env("nosuch:Cartpole", 2, None, device="cpu")
    monkeypatch.setitem(tasks.TASK_PREFIXES, "mjlab", "sim_fakes.make_point_mass")
    algo = PPO("mjlab:PointMass", num_envs=4, horizon=4, env_kwargs={"max_episode_length": 7})
    assert isinstance(algo.env, RslRlEnv) and algo.env.vec_env.max_episode_length == 7
    with Trainer(algo, tracking=False, progress=False) as trainer:
        trainer.step()
        path = trainer.save_checkpoint()
    with Trainer.from_checkpoint(path, tracking=False, progress=False) as resumed:
        assert resumed.algo.env_spec == "mjlab:PointMass" and resumed.algo.env_steps == 16


@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is not None, reason="Isaac Lab is installed")
def test_isaaclab_tasks_without_isaaclab_name_the_missing_simulator():
    with pytest.raises(
        ImportError,
        match=r"env 'isaaclab:Isaac-Cartpole-Direct': the simulator's package 'isaaclab\w*' is not "
        r"installed; install rl8 with the 'isaaclab' extra",
    ):
        PPO("isaaclab:Isaac-Cartpole-Direct", num_envs=2)
    with pytest.raises(ImportError, match=r"the simulator's package 'isaaclab\w*' is not installed"):
        tasks.task_runner_cfg("isaaclab:Isaac-Cartpole-Direct")


def test_runner_configs_of_named_tasks_resolve_through_their_table(monkeypatch):
    monkeypatch.setitem(tasks.TASK_RUNNER_CONFIGS, "mjlab", "sim_fakes.point_mass_runner_cfg")
    assert tasks.task_runner_cfg("mjlab:PointMass")["num_steps_per_env"] == 8
    with pytest.raises(ValueError, match=r"a prefix of \['isaaclab', 'mjlab'\] and a task name"):
        tasks.task_runner_cfg("gymnax:CartPole-v1")
    with pytest.raises(ValueError, match="unknown task 'Nope'"):
        tasks.task_runner_cfg("mjlab:Nope")


def test_maniskill_prefix_checks_device_and_num_envs_before_building():
    # ManiSkill's CPU physics runs one env per process; checked before ManiSkill is imported
    with pytest.raises(ValueError, match=r"num_envs must be 1 on the CPU, got 4"):
        PPO("maniskill:PushCube-v1", num_envs=4, device="cpu")
    with pytest.raises(
        ValueError, match=r"sim_backend 'physx_cuda' gives tensors on CUDA, but device is 'cpu'"
    ):
        PPO("maniskill:PushCube-v1", num_envs=1, device="cpu", env_kwargs={"sim_backend": "physx_cuda"})


def test_resume_a_run_of_a_built_env():
    algo = PPO(PointMassVecEnv(8), horizon=4, seed=0)
    with Trainer(algo, tracking=False, progress=False) as trainer:
        trainer.step()
        path = trainer.save_checkpoint()
        assert (
            run_params(algo, trainer.config, trainer.env_spec, DistContext())["env"]
            == "a sim_fakes.PointMassVecEnv object"
        )
        assert torch.load(path, weights_only=True)["env"] == {
            "spec": None,
            "class": "rl8.envs.rsl_rl.RslRlEnv",
        }
    with pytest.raises(ValueError, match=r"Trainer.from_checkpoint\(path, env=...\)"):
        Trainer.from_checkpoint(path, tracking=False)
    env = PointMassVecEnv(8)
    with Trainer.from_checkpoint(path, env=env, tracking=False, progress=False) as resumed:
        assert resumed.algo.env.vec_env is env and resumed.algo.env_steps == 32
        for name, tensor in algo.policy.state_dict().items():
            assert torch.equal(resumed.algo.policy.state_dict()[name], tensor)
        resumed.step()
    with pytest.raises(ValueError, match="num_envs=4, but num_envs=8"):
        Trainer.from_checkpoint(path, env=PointMassVecEnv(4), tracking=False)


def test_eval_runs_on_a_training_env_that_cannot_be_built_twice():
    vec = PointMassVecEnv(8, max_episode_length=10)
    algo = PPO(vec, horizon=4, seed=0)
    with Trainer(algo, tracking=False, progress=False) as trainer:
        trainer.step()
        resets = vec.reset_calls
        stats = trainer.eval()
        assert vec.reset_calls == resets + 1 and stats["eval/episodes/count"] == 8  # 10 steps: one each
        assert algo.next_collect_resets
        trainer.step()
        assert vec.reset_calls == resets + 2
        with pytest.raises(
            RuntimeError,
            match="recording a video needs a second instance of the env, but "
            "RslRlEnv.single_instance is True",
        ):
            trainer.record()
    with Trainer(
        PPO(CartPole(4), horizon=4), tracking=False, progress=False, eval_num_envs=2
    ) as trainer:
        with pytest.raises(
            RuntimeError,
            match=r"Trainer\(eval_num_envs=2\) needs a second instance of the env, "
            "but the env was given built",
        ):
            trainer.eval()
