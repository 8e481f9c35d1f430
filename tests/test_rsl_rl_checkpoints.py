"""rsl_rl checkpoints as rl8 policies (rl8.io.export.load_rsl_rl_policy, load_policy): the key
layout rsl_rl 5.5.1's runners save, written here with plain tensors, and the actions its actor
computes, written out in plain torch (its MLPModel's forward: normalise, MLP, Gaussian mean)."""

from __future__ import annotations

import pytest
import torch
from envs.sim_fakes import PointMassVecEnv
from tensordict import TensorDict

from rl8 import Distillation, load_policy
from rl8.cli import main
from rl8.envs.rsl_rl import RslRlEnv, space_of
from rl8.io.checkpoint import CheckpointError
from rl8.io.export import load_rsl_rl_policy

EPS = 1e-2  # rsl_rl's EmpiricalNormalization: (x - mean) / (std + eps)


def mlp_weights(prefix, sizes, generator):
    """``{prefix}.{0, 2, 4...}.weight/bias``: an MLP as rsl_rl's ``MLP`` (nn.Sequential) names it."""
    out = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        out[f"{prefix}.{2 * i}.weight"] = torch.randn(b, a, generator=generator) / a**0.5
        out[f"{prefix}.{2 * i}.bias"] = torch.randn(b, generator=generator) * 0.1
    return out


def normalizer(prefix, width, generator):
    """rsl_rl's EmpiricalNormalization buffers, as its state_dict holds them ([1, width])."""
    mean = torch.randn(1, width, generator=generator) * 2
    std = torch.rand(1, width, generator=generator) + 0.5
    return {
        f"{prefix}_mean": mean,
        f"{prefix}_var": std**2,
        f"{prefix}_std": std,
        f"{prefix}count": torch.tensor(1000, dtype=torch.int64),
    }


def rsl_rl_5_checkpoint(path, *, width=5, hiddens=(16, 8), actions=2, std_type="scalar", seed=0):
    """The dict rsl_rl 5.5.1's OnPolicyRunner.save writes (PPO.save, then iter and infos): the
    actor is an MLPModel with obs_normalization and a GaussianDistribution; the keys and shapes
    were read from rsl_rl 5.5.1's modules themselves."""
    g = torch.Generator().manual_seed(seed)
    actor = {
        **normalizer("obs_normalizer.", width, g),
        **mlp_weights("mlp", [width, *hiddens, actions], g),
    }
    key = "distribution.std_param" if std_type == "scalar" else "distribution.log_std_param"
    std = torch.rand(actions, generator=g) + 0.3
    actor[key] = std if std_type == "scalar" else std.log()
    critic = {**normalizer("obs_normalizer.", width, g), **mlp_weights("mlp", [width, *hiddens, 1], g)}
    params = list(actor.values())
    optimizer = torch.optim.Adam(
        [torch.nn.Parameter(p.float()) for p in params if p.is_floating_point()]
    )
    state = {
        "actor_state_dict": actor,
        "critic_state_dict": critic,
        "optimizer_state_dict": optimizer.state_dict(),
        "iter": 7,
        "infos": None,
    }
    torch.save(state, path)
    return actor, std


def rsl_rl_actions(actor, x, prefix="mlp", norm="obs_normalizer."):
    """rsl_rl's deterministic actor output (the Gaussian mean) on flat observations ``x``."""
    if norm + "_mean" in actor:
        x = (x - actor[norm + "_mean"]) / (actor[norm + "_std"] + EPS)
    i = 0
    while f"{prefix}.{i + 2}.weight" in actor:
        x = torch.nn.functional.elu(x @ actor[f"{prefix}.{i}.weight"].T + actor[f"{prefix}.{i}.bias"])
        i += 2
    return x @ actor[f"{prefix}.{i}.weight"].T + actor[f"{prefix}.{i}.bias"]


@pytest.mark.parametrize("std_type", ["scalar", "log"])
def test_an_rsl_rl_5_checkpoint_acts_as_its_actor(tmp_path, std_type):
    actor, std = rsl_rl_5_checkpoint(tmp_path / "model_7.pt", std_type=std_type)
    obs = TensorDict({"policy": torch.randn(32, 2), "privileged": torch.randn(32, 3)}, batch_size=[32])
    policy = load_rsl_rl_policy(
        tmp_path / "model_7.pt", observation_space=space_of(obs), obs_groups=["policy", "privileged"]
    )
    expected = rsl_rl_actions(actor, torch.cat([obs["policy"], obs["privileged"]], 1))
    torch.testing.assert_close(policy(obs), expected, rtol=1e-5, atol=1e-5)
    dist, _ = policy.distribution(obs)
    torch.testing.assert_close(dist.deterministic_sample(), expected, rtol=1e-5, atol=1e-5)
    learned = policy.model.std if std_type == "scalar" else policy.model.log_std.exp()
    torch.testing.assert_close(learned, std)
    # load_policy reads the same file on flat observations (rl8 eval, rl8 export)
    flat = load_policy(tmp_path / "model_7.pt")
    torch.testing.assert_close(flat(torch.cat([obs["policy"], obs["privileged"]], 1)), expected)


def test_older_actor_critic_checkpoints_load_too(tmp_path):
    # rsl_rl 2's ActorCritic: model_state_dict with actor.* and std, the normaliser apart
    g = torch.Generator().manual_seed(1)
    model = {
        **mlp_weights("actor", [4, 8, 2], g),
        **mlp_weights("critic", [4, 8, 1], g),
        "std": torch.ones(2),
    }
    norm = {k.removeprefix("n."): v for k, v in normalizer("n.", 4, g).items()}
    torch.save(
        {
            "model_state_dict": model,
            "optimizer_state_dict": {},
            "iter": 3,
            "infos": None,
            "obs_norm_state_dict": norm,
        },
        tmp_path / "model_3.pt",
    )
    x = torch.randn(16, 4)
    expected = rsl_rl_actions(
        {**model, **{"n._mean": norm["_mean"], "n._std": norm["_std"]}}, x, "actor", "n."
    )
    torch.testing.assert_close(load_policy(tmp_path / "model_3.pt")(x), expected, rtol=1e-5, atol=1e-5)


def test_layouts_rl8_cannot_map_are_refused_naming_the_keys(tmp_path):
    g = torch.Generator().manual_seed(2)
    rnn = {**mlp_weights("mlp", [8, 2], g), "rnn.rnn.weight_ih_l0": torch.zeros(32, 5)}
    torch.save({"actor_state_dict": rnn, "iter": 1, "infos": None}, tmp_path / "model_1.pt")
    with pytest.raises(
        CheckpointError,
        match=r"not an MLP actor rl8 can map: expected the keys mlp.0.weight.*"
        r"which rl8 cannot map: \['rnn.rnn.weight_ih_l0'\]",
    ):
        load_policy(tmp_path / "model_1.pt")
    torch.save({"policy": {}, "iter": 1}, tmp_path / "other.pt")
    with pytest.raises(
        CheckpointError,
        match=r"is not an rsl_rl checkpoint: expected an 'iter' entry .*found \['iter', 'policy'\]",
    ):
        load_rsl_rl_policy(tmp_path / "other.pt")
    rsl_rl_5_checkpoint(tmp_path / "model_7.pt", width=5)
    obs = TensorDict({"policy": torch.zeros(1, 2)}, batch_size=[1])
    with pytest.raises(
        CheckpointError, match="the model reads 5 observation values, but the observation space groups"
    ):
        load_rsl_rl_policy(
            tmp_path / "model_7.pt", observation_space=space_of(obs), obs_groups=["policy"]
        )


def test_a_pickled_object_in_an_rsl_rl_checkpoint_is_never_run(tmp_path):
    rsl_rl_5_checkpoint(tmp_path / "model_7.pt")
    state = torch.load(tmp_path / "model_7.pt", weights_only=True)
    state["infos"] = {"env_cfg": PointMassVecEnv}  # a class: unpickling it would import code
    torch.save(state, tmp_path / "model_7.pt")
    with pytest.raises(CheckpointError, match="not a safe rl8 checkpoint"):
        load_rsl_rl_policy(tmp_path / "model_7.pt")


def test_an_rsl_rl_teacher_reads_its_privileged_group(tmp_path):
    # the teacher: an rsl_rl actor of the privileged 'critic' group (3 values); the student: 'policy'
    actor, _ = rsl_rl_5_checkpoint(tmp_path / "model_7.pt", width=3, hiddens=(8,), actions=1)
    env = RslRlEnv(PointMassVecEnv(16))
    teacher = load_rsl_rl_policy(
        tmp_path / "model_7.pt", observation_space=env.observation_space, obs_groups=["critic"]
    )
    algo = Distillation(
        env,
        teacher=teacher,
        horizon=8,
        obs_groups={"actor": ["policy"]},
        lr=3e-3,
        num_sgd_iters=4,
        seed=0,
    )
    losses = [algo.update()["losses/behavior"] for _ in range(8) if algo.collect() is not None]
    assert losses[-1] < 0.5 * losses[0]
    obs = env.vec_env.get_observations()
    torch.testing.assert_close(teacher(obs), rsl_rl_actions(actor, obs["critic"]), rtol=1e-5, atol=1e-5)


def test_rl8_export_writes_an_rsl_rl_actor_as_torchscript(tmp_path, capsys, monkeypatch):
    actor, _ = rsl_rl_5_checkpoint(tmp_path / "model_7.pt")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "model_7.pt", "--format", "torchscript", "-o", "actor.pt"]) == 0
    assert capsys.readouterr().out.strip() == "actor.pt"
    exported = torch.jit.load(tmp_path / "actor.pt")
    x = torch.randn(8, 5)
    torch.testing.assert_close(exported(x), rsl_rl_actions(actor, x), rtol=1e-5, atol=1e-5)
