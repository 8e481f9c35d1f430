"""Asymmetric actor-critic with observation groups (hparam ``obs_groups``, rsl_rl 5's
fallbacks), and MLPModel's rsl_rl options: ``critic_hiddens``, ``init_noise_std``,
``noise_std_type``."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from group_envs import GroupCartPole
from gymnasium import spaces
from tensordict import TensorDict

from rl8 import PPO, Policy, load_policy, save_policy
from rl8.policies.distributions import Categorical, Normal
from rl8.policies.groups import resolve_obs_groups
from rl8.policies.models import MLPModel
from rl8.policies.recurrent import LSTMModel

BOX = spaces.Box(-1, 1, (2,), np.float32)
ACTION = spaces.Box(-1, 1, (1,), np.float32)


def dict_space(*keys: str, size: int = 2) -> spaces.Dict:
    return spaces.Dict([(k, spaces.Box(-1, 1, (size,), np.float32)) for k in keys])


@pytest.mark.parametrize(
    "keys, obs_groups, actor, critic",
    [
        (("policy", "critic"), None, ("policy",), ("critic",)),  # Isaac Lab: asymmetric with no option
        (("actor", "critic", "extra"), None, ("actor",), ("critic",)),  # mjlab's names
        (("policy", "height_scan"), None, ("policy",), ("policy",)),  # no critic group: policy
        (("a", "b"), None, None, None),  # neither: the whole observation to both
        (("policy", "critic"), {"critic": ["policy", "critic"]}, ("policy",), ("policy", "critic")),
        (("a", "b"), {"actor": ["b", "a"]}, ("b", "a"), None),
    ],
)
def test_resolution_follows_rsl_rl_fallbacks(keys, obs_groups, actor, critic):
    assert resolve_obs_groups(dict_space(*keys), obs_groups) == {"actor": actor, "critic": critic}
    assert resolve_obs_groups(BOX) == {"actor": None, "critic": None}


@pytest.mark.parametrize(
    "space, obs_groups, message",
    [
        (
            dict_space("policy", "critic"),
            {"critic": ["privileged"]},
            "obs_groups['critic']: the observation has no group 'privileged' (its groups: ['policy', 'critic'])",
        ),
        (BOX, {"actor": ["policy"]}, "obs_groups: needs a Dict observation space"),
        (dict_space("policy"), {"actor": "policy"}, "obs_groups: expected None or a dict"),
        (dict_space("policy"), {"policy": ["policy"]}, "obs_groups: expected None or a dict"),
        (dict_space("policy"), {"actor": []}, "obs_groups: expected None or a dict"),
    ],
)
def test_resolution_errors_name_the_groups(space, obs_groups, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_obs_groups(space, obs_groups)


def test_a_policy_and_critic_env_trains_asymmetric_by_default():
    algo = PPO(GroupCartPole, num_envs=8, horizon=16, seed=0, device="cpu", normalize_observations=True)
    model = algo.policy.model
    assert (model.actor_groups, model.critic_groups) == (("policy",), ("critic",))
    assert model.pi[0].in_features == 4 and model.vf[0].in_features == 5
    assert set(algo.policy.obs_normalizer.stats.keys()) == {"policy", "critic"}  # normalised per group
    algo.collect()
    assert math.isfinite(algo.update()["losses/total"])


def test_the_actor_never_reads_the_critics_group():
    algo = PPO(GroupCartPole, num_envs=8, horizon=16, seed=0, device="cpu")
    obs = algo.env.reset(seed=1)
    perturbed = obs.clone()
    perturbed["critic"] = perturbed["critic"] + 3.0
    model, policy = algo.policy.model, algo.policy
    with torch.no_grad():
        (params, values), (params2, values2) = model(obs), model(perturbed)
        assert torch.equal(params, params2) and torch.equal(model.actor_params(perturbed), params)
        assert not torch.allclose(values, values2) and torch.equal(model.value(perturbed), values2)
    actions, _ = policy.predict(obs.to_dict())
    assert np.array_equal(actions, policy.predict(perturbed.to_dict())[0])
    only_actor = TensorDict({"policy": obs["policy"]}, batch_size=[8])  # what an exported actor gets
    assert torch.equal(model.actor_params(only_actor), params)


def test_explicit_mapping_flattens_in_the_order_given():
    algo = PPO(
        GroupCartPole,
        num_envs=8,
        horizon=16,
        seed=0,
        device="cpu",
        obs_groups={"critic": ["critic", "policy"]},
    )
    model = algo.policy.model
    assert (model.actor_groups, model.critic_groups) == (("policy",), ("critic", "policy"))
    obs = algo.env.reset(seed=1)
    with torch.no_grad():
        expected = model.vf(torch.cat([obs["critic"], obs["policy"]], 1))[:, 0]
        assert torch.equal(model.value(obs), expected)
    assert algo.hparams.obs_groups == {
        "critic": ["critic", "policy"]
    }  # lists, as checkpoints store them


def test_obs_groups_errors():
    with pytest.raises(ValueError, match=r"obs_groups\['actor'\]: the observation has no group 'state'"):
        PPO(GroupCartPole, num_envs=8, horizon=16, device="cpu", obs_groups={"actor": ["state"]})
    with pytest.raises(ValueError, match="hparam obs_groups: expected None or a dict"):
        PPO(GroupCartPole, num_envs=8, horizon=16, device="cpu", obs_groups={"actor": "policy"})
    with pytest.raises(ValueError, match="hparam obs_groups: also given as model_config"):
        PPO(
            GroupCartPole,
            num_envs=8,
            horizon=16,
            device="cpu",
            obs_groups={"actor": ["policy"]},
            model_config={"obs_groups": {"actor": ["policy"]}},
        )
    with pytest.raises(ValueError, match="model_config shared: one trunk reads one observation"):
        PPO(GroupCartPole, num_envs=8, horizon=16, device="cpu", model_config={"shared": True})
    space = GroupCartPole.observation_space
    with pytest.raises(ValueError, match="LSTMModel runs one network for the actor and the critic"):
        LSTMModel(space, spaces.Discrete(2), Categorical)
    lstm = LSTMModel(
        space, spaces.Discrete(2), Categorical, obs_groups={"actor": ["policy"], "critic": ["policy"]}
    )
    assert lstm.actor_groups == ("policy",) and lstm.encoder[0].in_features == 4


def test_a_saved_policy_keeps_its_groups(tmp_path):
    algo = PPO(
        GroupCartPole,
        num_envs=8,
        horizon=16,
        seed=0,
        device="cpu",
        obs_groups={"critic": ["policy", "critic"]},
    )
    algo.collect()
    algo.update()
    loaded = load_policy(save_policy(algo.policy, tmp_path / "policy.pt"))
    assert (loaded.model.actor_groups, loaded.model.critic_groups) == (("policy",), ("policy", "critic"))
    obs = algo.env.reset(seed=2)
    # predict takes the whole observation (the space's) too; the actor reads its groups only
    assert np.array_equal(loaded.predict(obs.to_dict())[0], algo.policy.predict(obs.to_dict())[0])
    with torch.no_grad():
        assert torch.equal(loaded.model.value(obs), algo.policy.model.value(obs))


def test_acting_needs_only_the_actors_groups(tmp_path):
    algo = PPO(GroupCartPole, num_envs=8, horizon=16, seed=0, device="cpu", normalize_observations=True)
    algo.collect()
    algo.update()
    policy = load_policy(save_policy(algo.policy, tmp_path / "policy.pt"))
    assert policy.actor_observation_space == spaces.Dict(
        {"policy": GroupCartPole.observation_space["policy"]}
    )
    obs = algo.env.reset(seed=2)
    actions, _ = policy.predict(obs.to_dict())
    assert np.array_equal(policy.predict({"policy": obs["policy"].numpy()})[0], actions)
    assert np.array_equal(policy.predict({"policy": obs["policy"][0].tolist()})[0], actions[0])
    assert np.array_equal(policy(obs.select("policy")).numpy(), actions)
    missing = (
        "obs: expected the keys ['policy'] (the observation's ['critic'] may be given too; the actor "
        "does not read them), got ['critic'] (missing ['policy'])"
    )
    with pytest.raises(ValueError, match=re.escape(missing)):
        policy.predict({"critic": obs["critic"].numpy()})
    with pytest.raises(ValueError, match=re.escape("got ['policy', 'extra'] (unexpected ['extra'])")):
        policy.predict({"policy": obs["policy"].numpy(), "extra": 0.0})


class UnknownGroupModel(MLPModel):
    def __init__(self, *args, **config):
        super().__init__(*args, **config)
        self.actor_groups = ("policy", "lidar")


def test_actor_groups_the_space_lacks_are_refused_when_the_policy_is_built():
    message = (
        "UnknownGroupModel.actor_groups: ['lidar'] are not keys of the observation space "
        "(keys: ['critic', 'policy'])"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        Policy(GroupCartPole.observation_space, spaces.Discrete(2), model_cls=UnknownGroupModel)


def test_a_recurrent_policy_acts_on_its_groups_alone():
    groups = {"actor": ["policy"], "critic": ["policy"]}
    algo = PPO(
        GroupCartPole,
        num_envs=4,
        horizon=8,
        seed=0,
        device="cpu",
        model_cls=LSTMModel,
        obs_groups=groups,
    )
    obs, policy = algo.env.reset(seed=1), algo.policy
    actions, state = policy.predict(obs.to_dict())
    alone, alone_state = policy.predict({"policy": obs["policy"].numpy()})
    assert np.array_equal(alone, actions) and torch.equal(alone_state["h"], state["h"])
    again, _ = policy.predict({"policy": obs["policy"].numpy()}, state=state)
    assert np.array_equal(again, policy.predict(obs.to_dict(), state=state)[0])


def test_critic_hiddens_and_init_noise_std():
    model = MLPModel(BOX, ACTION, Normal, hiddens=(32,), critic_hiddens=(16, 8), init_noise_std=0.5)
    assert [m.out_features for m in model.vf if isinstance(m, torch.nn.Linear)] == [16, 8, 1]
    assert [m.out_features for m in model.pi if isinstance(m, torch.nn.Linear)] == [32, 1]
    assert torch.allclose(model.log_std, torch.tensor([math.log(0.5)]))
    with pytest.raises(ValueError, match="init_log_std=0.0 and init_noise_std=0.5 set the same thing"):
        MLPModel(BOX, ACTION, Normal, init_log_std=0.0, init_noise_std=0.5)
    with pytest.raises(ValueError, match="model_config init_noise_std: expected a number > 0"):
        MLPModel(BOX, ACTION, Normal, init_noise_std=0)
    with pytest.raises(ValueError, match="model_config critic_hiddens: expected a sequence of ints"):
        MLPModel(BOX, ACTION, Normal, critic_hiddens=(0,))


def test_noise_std_type_scalar_learns_the_std():
    model = MLPModel(BOX, ACTION, Normal, init_noise_std=0.5, noise_std_type="scalar")
    assert not hasattr(model, "log_std") and torch.allclose(model.std, torch.tensor([0.5]))
    params = model(torch.zeros(3, 2))[0]
    assert torch.allclose(params[:, 1], torch.full((3,), math.log(0.5)))
    params[:, 1].sum().backward()
    assert torch.allclose(model.std.grad, torch.tensor([3 / 0.5]))  # d log(std) / d std = 1 / std
    with pytest.raises(
        ValueError, match="model_config noise_std_type: expected 'log' or 'scalar', got 'exp'"
    ):
        MLPModel(BOX, ACTION, Normal, noise_std_type="exp")


@pytest.mark.slow
def test_asymmetric_cartpole_learns():
    """Balancing for all 200 steps of a deterministic evaluation (a reward of 1 per step) within
    100k env steps (about 25k with seed 0)."""
    algo = PPO(GroupCartPole, num_envs=32, horizon=64, seed=0, device="cpu")
    eval_env, best = GroupCartPole(16), 0.0
    while algo.env_steps < 100_000 and best < 199:
        algo.collect()
        algo.update()
        if algo.steps % 4 == 0:
            best = max(best, algo.evaluate(eval_env, num_steps=200)["rollout/reward_sum_mean"])
    assert best >= 199, (best, algo.env_steps)
