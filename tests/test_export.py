"""Policy files: save_policy / load_policy from a file, a checkpoint, a folder and an MLflow run."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hparams import SMALL
from torch import nn

from rl8 import PPO, Policy, Trainer, load_policy, save_policy
from rl8.envs import CartPole, ContinuousDummyEnv
from rl8.io.checkpoint import CheckpointError, save_checkpoint
from rl8.io.export import policy_to_dict, read_policy, space_from_dict, space_to_dict
from rl8.mlflow_store import StoreSchemaError

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")


def same_actions(a: Policy, b: Policy, obs: torch.Tensor) -> bool:
    return torch.equal(a(obs), b(obs))


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (4,), np.float32),
        spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), (2,), np.float64),
        spaces.Box(0, 255, (3, 2, 2), np.uint8),
        spaces.Discrete(5, start=1),
        spaces.MultiDiscrete([3, 4]),
        spaces.MultiBinary(3),
        spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "mode": spaces.Discrete(2)}),
    ],
)
def test_spaces_round_trip_through_plain_data(space):
    plain = space_to_dict(space)
    assert space_from_dict(plain) == space
    if isinstance(space, spaces.Dict):
        assert list(space_from_dict(plain).spaces) == list(space.spaces)  # order kept


@pytest.mark.parametrize(
    "env, kwargs",
    [
        (CartPole, dict(normalize_observations=True)),
        (ContinuousDummyEnv, dict(model_config={"hiddens": [16], "activation": nn.ReLU})),
    ],
)
def test_save_and_load_a_policy_file(tmp_path, env, kwargs):
    algo = PPO(env, **SMALL, **kwargs)
    algo.collect(), algo.update()  # non-trivial weights and normaliser statistics
    path = save_policy(algo.policy, tmp_path / "sub" / "policy.pt")
    raw = torch.load(path, weights_only=True)  # plain data only: nothing is unpickled as code
    assert raw["format"] == "rl8-policy" and raw["version"] == 1
    policy = load_policy(path)
    assert isinstance(policy, Policy) and not policy.training
    assert policy.device == torch.device("cpu")
    obs = torch.randn(32, *env.observation_space.shape)
    assert same_actions(policy, algo.policy, obs)
    assert policy.model_config == algo.policy.model_config
    if kwargs.get("normalize_observations"):
        assert policy.obs_normalizer is not None


def test_save_policy_of_something_else_than_a_policy_is_a_type_error_saying_what_to_pass(tmp_path):
    algo = PPO(CartPole, **SMALL)
    with pytest.raises(
        TypeError,
        match=re.escape(
            "save_policy: policy must be a rl8.policies.policy.Policy, got a PPO (it holds one: pass "
            "its .policy, e.g. save_policy(algo.policy, path))"
        ),
    ):
        save_policy(algo, tmp_path / "policy.pt")
    with pytest.raises(TypeError, match=r"policy must be a rl8.policies.policy.Policy, got a str$"):
        save_policy("policy", tmp_path / "policy.pt")
    assert not (tmp_path / "policy.pt").exists()


def test_load_policy_from_checkpoint_folder_and_run_id(tmp_path, mlflow_uri):
    trainer = Trainer(PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False)
    trainer.step()
    first = trainer.save_checkpoint()
    trainer.step()
    latest = trainer.save_checkpoint()
    trainer.close()
    obs = torch.randn(32, 4)
    reference = trainer.algo.policy

    from_file = load_policy(latest)
    from_folder = load_policy(tmp_path / "ck")  # the latest checkpoint
    from_run = load_policy(trainer.run_id)  # the run's policy/policy.pt artifact
    from_uri = load_policy(f"runs:/{trainer.run_id}/policy/policy.pt", tracking_uri=mlflow_uri)
    for policy in (from_file, from_folder, from_run, from_uri):
        assert same_actions(policy, reference, obs)
    assert isinstance(load_policy(first), Policy)  # an older checkpoint of the run loads too
    assert read_policy(trainer.run_id)["env"]["spec"] == "rl8.envs.cartpole.CartPole"


def test_a_download_larger_than_the_limit_is_refused(tmp_path, mlflow_uri, monkeypatch):
    trainer = Trainer(PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False)
    trainer.step()
    trainer.save_checkpoint()
    trainer.close()
    monkeypatch.setenv("RL8_MAX_DOWNLOAD_MB", "0.001")  # 1 KiB: a policy file holds more
    for ref in (trainer.run_id, f"runs:/{trainer.run_id}/policy/policy.pt"):
        with pytest.raises(
            FileNotFoundError,
            match=r"refused to download .* MiB, more than the limit of 0.000999 MiB",
        ):
            load_policy(ref, tracking_uri=mlflow_uri)
    monkeypatch.setenv("RL8_MAX_DOWNLOAD_MB", "64")
    assert isinstance(load_policy(trainer.run_id, tracking_uri=mlflow_uri), Policy)
    monkeypatch.setenv("RL8_MAX_DOWNLOAD_MB", "lots")
    with pytest.raises(ValueError, match="RL8_MAX_DOWNLOAD_MB must be a number of MiB > 0, got 'lots'"):
        load_policy(trainer.run_id, tracking_uri=mlflow_uri)


def test_load_policy_by_run_id_from_a_store_of_a_newer_mlflow_says_what_to_install(
    newer_mlflow_store,
):
    for ref in ("0" * 32, "models:/cartpole-ppo@best"):
        with pytest.raises(StoreSchemaError) as caught:
            load_policy(ref)
        message = str(caught.value)
        assert "\n" not in message and newer_mlflow_store in message
        assert "newer MLflow" in message and 'python -m pip install -e ".[ui]"' in message


def test_load_policy_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no policy"):
        load_policy(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match="cannot download"):
        load_policy("0" * 32)  # looks like a run id, but no such run
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither"):
        load_policy(tmp_path / "empty")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_policy(bad)
    other = save_checkpoint({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="holds no policy"):
        load_policy(other)
    plain = policy_to_dict(PPO(CartPole, **SMALL).policy)
    plain["model_cls"] = "no_such_module.Model"
    save_checkpoint(plain, tmp_path / "unimportable.pt")
    with pytest.raises(CheckpointError, match="'no_such_module.Model', which is not registered"):
        load_policy(tmp_path / "unimportable.pt")


def test_rl8_eval_in_an_env_with_other_spaces_exits_2_naming_both(tmp_path, capsys):
    from rl8.cli import main

    path = save_policy(
        PPO(CartPole, **SMALL).policy,
        tmp_path / "policy.pt",
        env={"spec": "rl8.envs.cartpole.CartPole", "env_kwargs": {}, "env_config": {}},
    )
    assert main(["eval", str(path), "--env", "rl8.envs.Pendulum", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "'rl8.envs.Pendulum' has the observation space Box(" in err and "(3,)" in err
    assert "trained on the observation space Box(" in err and "(4,)" in err


def test_from_checkpoint_with_an_env_of_other_spaces_names_both(tmp_path):
    from rl8.envs import Pendulum

    with Trainer(PPO(CartPole, **SMALL), tracking=False, checkpoint_dir=tmp_path) as trainer:
        path = trainer.save_checkpoint()
    with pytest.raises(
        ValueError,
        match=r"env=<class 'rl8.envs.pendulum.Pendulum'> has the observation "
        r"space Box\(.*\(3,\).*trained on the observation space Box\(.*\(4,\)",
    ):
        Trainer.from_checkpoint(path, env=Pendulum, tracking=False)
