"""hparam symmetry (rsl_rl 5's symmetry_cfg): mirrored minibatches, the mirror loss, its checks."""

from __future__ import annotations

import pytest
import torch
from group_envs import GroupCartPole
from tensordict import TensorDict

import rl8
from rl8 import PPO, HParams
from rl8.envs import CartPole, Pendulum
from rl8.policies.recurrent import LSTMModel
from rl8.ppo.losses import ppo_loss
from rl8.ppo.symmetry import Symmetry

SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=32, num_sgd_iters=2, seed=0)
AUGMENT = {"data_augmentation_func": CartPole.mirror, "use_data_augmentation": True}
MIRROR = {
    "data_augmentation_func": Pendulum.mirror,
    "use_data_augmentation": True,
    "use_mirror_loss": True,
    "mirror_loss_coeff": 1.0,
}


def mirror_groups(env=None, obs=None, actions=None):
    """GroupCartPole's mirror: both groups' state negated, the critic's elapsed time kept."""
    if obs is not None:
        flip = obs["critic"].new_tensor([-1.0, -1.0, -1.0, -1.0, 1.0])
        mirrored = TensorDict(
            {"policy": -obs["policy"], "critic": obs["critic"] * flip}, batch_size=obs.batch_size
        )
        obs = torch.cat([obs, mirrored])
    return obs, None if actions is None else torch.cat([actions, 1 - actions])


def first_minibatch(algo: PPO) -> TensorDict:
    algo.collect()
    with torch.no_grad():
        advantages, returns = algo.compute_advantages()
    return algo.buffer.training_samples(advantages, returns)[:32]


def test_augment_appends_the_mirrored_copies_and_repeats_the_rest():
    algo = PPO(CartPole, **SMALL, symmetry=AUGMENT)
    minibatch = first_minibatch(algo)
    augmented = algo.symmetry.augment(minibatch)
    assert augmented.batch_size == torch.Size([64])
    torch.testing.assert_close(augmented["obs"], torch.cat([minibatch["obs"], -minibatch["obs"]]))
    torch.testing.assert_close(
        augmented["actions"], torch.cat([minibatch["actions"], 1 - minibatch["actions"]])
    )
    for key in ("logp", "values", "advantages", "returns"):  # as rsl_rl: the originals' repeated
        torch.testing.assert_close(augmented[key], minibatch[key].repeat(2))
    assert augmented["collected"].tolist() == [True] * 32 + [False] * 32


def test_augment_mirrors_dict_observations_group_by_group():
    algo = PPO(GroupCartPole, **SMALL, symmetry={**AUGMENT, "data_augmentation_func": mirror_groups})
    minibatch = first_minibatch(algo)
    augmented = algo.symmetry.augment(minibatch)
    torch.testing.assert_close(augmented["obs", "policy"][32:], -minibatch["obs", "policy"])
    torch.testing.assert_close(augmented["obs", "critic"][32:, 4], minibatch["obs", "critic"][:, 4])
    assert algo.update()["losses/symmetry"] >= 0


def test_the_augmented_loss_is_ppos_loss_over_both_halves_with_monitors_over_the_collected():
    """The log-probabilities of the mirrored actions come from the policy on the mirrored
    observations, against the collected actions' old log-probabilities (rsl_rl's); entropy,
    KL and clip fraction are measured on the collected samples only."""
    algo = PPO(CartPole, **SMALL, symmetry=AUGMENT)
    augmented = algo.symmetry.augment(first_minibatch(algo))
    with torch.no_grad():
        for layer in algo.policy.model.pi[::2]:  # an asymmetric policy, far from the collecting one
            torch.nn.init.normal_(layer.bias)
        logp, entropy, values = algo.policy.evaluate(augmented)
        old = {k: augmented[k] for k in ("logp", "advantages", "values", "returns")}
        args = (logp, values, entropy, old["logp"], old["advantages"], old["values"], old["returns"])
        both = ppo_loss(*args, clip_param=0.2, collected=augmented["collected"])
        plain = ppo_loss(*args, clip_param=0.2)
        collected = ppo_loss(*(a[:32] for a in args), clip_param=0.2)
    torch.testing.assert_close(both.policy_loss, plain.policy_loss)
    torch.testing.assert_close(both.value_loss, plain.value_loss)
    for name in ("entropy", "approx_kl", "clip_fraction"):
        torch.testing.assert_close(getattr(both, name), getattr(collected, name))
    assert not torch.allclose(plain.approx_kl, collected.approx_kl)


def test_data_augmentation_changes_the_update_and_reports_the_mirror_loss():
    plain, mirrored = PPO(CartPole, **SMALL), PPO(CartPole, **SMALL, symmetry=AUGMENT)
    plain.collect(), mirrored.collect()
    a, b = plain.update(), mirrored.update()
    assert "losses/symmetry" not in a and b["losses/symmetry"] >= 0
    assert a["losses/policy"] != b["losses/policy"]


def test_reported_only_the_mirror_loss_leaves_the_update_alone():
    """Both flags off: rsl_rl's logging-only mode, the update is PPO's own."""
    plain = PPO(Pendulum, **SMALL)
    logged = PPO(Pendulum, **SMALL, symmetry={"data_augmentation_func": Pendulum.mirror})
    plain.collect(), logged.collect()
    a, b = plain.update(), logged.update()
    assert a["losses/policy"] == b["losses/policy"] and b["losses/symmetry"] > 0


def test_the_mirror_loss_is_zero_for_a_symmetric_actor_and_trains_the_actor_towards_one():
    algo = PPO(Pendulum, **SMALL, symmetry=MIRROR)
    model = algo.policy.model
    with torch.no_grad():  # odd in (sin, theta_dot), even in cos: the actor mirrors exactly
        for layer in model.pi:
            if isinstance(layer, torch.nn.Linear):
                layer.bias.zero_()
        model.pi[0].weight[:, 0] = 0.0
    obs = algo.env.reset(seed=0)
    assert algo.symmetry.mirror_loss(algo.policy, obs, obs.shape[0]).item() < 1e-10

    def mirror_loss_after(symmetry: dict, updates: int = 6) -> float:
        algo = PPO(Pendulum, **SMALL, symmetry=symmetry)
        for _ in range(updates):
            algo.collect()
            stats = algo.update()
        return stats["losses/symmetry"]

    logged = {"data_augmentation_func": Pendulum.mirror}
    heavy = {**MIRROR, "use_data_augmentation": False, "mirror_loss_coeff": 100.0}
    assert mirror_loss_after(heavy) < 0.2 * mirror_loss_after(logged)


def test_a_registered_name_serves_configs_and_checkpoints():
    rl8.register(CartPole.mirror, name="tests.cartpole_mirror")
    hp = HParams.from_config(
        {"symmetry": {**AUGMENT, "data_augmentation_func": "tests.cartpole_mirror"}}
    )
    algo = PPO(CartPole, **{**SMALL, **hp.to_dict(), **SMALL})
    assert algo.symmetry.func is CartPole.mirror
    plain = HParams(symmetry=AUGMENT).to_plain()["symmetry"]
    assert plain["data_augmentation_func"] == "rl8.envs.cartpole.CartPole.mirror"
    rl8.register(CartPole.mirror)  # under its qualified name: a checkpoint's hparams read back
    assert HParams.from_config(HParams(symmetry=AUGMENT).to_plain()).symmetry == plain


@pytest.mark.parametrize(
    "symmetry, match",
    [
        (
            {"use_data_augmentation": True},
            r"hparam symmetry\['data_augmentation_func'\]: missing \(expected a function",
        ),
        (
            {"data_augmentation_func": "no.such.mirror"},
            r"hparam symmetry\['data_augmentation_func'\]: 'no.such.mirror' is not registered in this "
            r"process; define the function and register it under that name, rl8.register\(my_function, "
            r"name='no.such.mirror'\)",
        ),
        (
            {"data_augmentation_func": CartPole},
            r"hparam symmetry\['data_augmentation_func'\]: expected a function \(env=, obs=, actions=\)",
        ),
        (
            {**AUGMENT, "use_mirror_loss": 1},
            r"hparam symmetry\['use_mirror_loss'\]: expected a bool, got 1",
        ),
        (
            {**AUGMENT, "mirror_loss_coeff": -1.0},
            r"hparam symmetry\['mirror_loss_coeff'\]: expected a number >= 0, got -1.0",
        ),
        (
            {**AUGMENT, "mirror_coef": 1.0},
            r"hparam symmetry: unknown key 'mirror_coef'; did you mean 'mirror_loss_coeff' or "
            r"'use_mirror_loss'\? "
            r"\(expected keys among \['data_augmentation_func', 'use_data_augmentation', "
            r"'use_mirror_loss', 'mirror_loss_coeff'\]\), got \{",
        ),
        (
            {"data_augmentation_func": 3},
            r"hparam symmetry\['data_augmentation_func'\]: expected a function \(env=, obs=, "
            r"actions=\) -> \(obs, actions\) or the name it is registered under, got 3",
        ),
        ([CartPole.mirror], r"hparam symmetry: expected None or a dict"),
    ],
)
def test_bad_symmetry_hparams_name_the_field(symmetry, match):
    with pytest.raises(ValueError, match=match):
        HParams(symmetry=symmetry)


def only_originals(env=None, obs=None, actions=None):
    return obs, actions


def wrong_groups(env=None, obs=None, actions=None):
    return None if obs is None else torch.cat([obs, obs]).exclude("critic"), actions


def wrong_dtype(env=None, obs=None, actions=None):
    obs = None if obs is None else torch.cat([obs, obs])
    return obs, None if actions is None else torch.cat([actions, actions]).float()


@pytest.mark.parametrize(
    "env_cls, func, match",
    [
        (
            CartPole,
            only_originals,
            r"only_originals returned obs of shape \[32, 4\] \(torch.float32\) for \[32, 4\] "
            r"\(torch.float32\); expected the 32 originals followed by their mirrored copies: "
            r"\[k \* 32, 4\] with k >= 2",
        ),
        (
            GroupCartPole,
            wrong_groups,
            r"wrong_groups returned obs \['policy'\] for a minibatch whose obs have the groups "
            r"\['critic', 'policy'\]; expected the same groups",
        ),
        (
            CartPole,
            wrong_dtype,
            r"wrong_dtype returned actions of shape \[64\] \(torch.float32\) for \[32\] \(torch.int64\); "
            r"expected the 32 originals followed by their mirrored copies: \[k \* 32\] with k >= 2, of "
            r"torch.int64",
        ),
    ],
)
def test_a_function_that_returns_the_wrong_batch_is_an_error_naming_it(env_cls, func, match):
    algo = PPO(
        env_cls, **SMALL, symmetry={"data_augmentation_func": func, "use_data_augmentation": True}
    )
    algo.collect()
    with pytest.raises(ValueError, match=match):
        algo.update()


def test_recurrent_models_and_discrete_mirror_losses_are_refused():
    with pytest.raises(
        ValueError, match=r"hparam symmetry: not supported with a recurrent model \(LSTMModel\)"
    ):
        PPO(CartPole, **SMALL, model_cls=LSTMModel, seq_len=4, symmetry=AUGMENT)
    with pytest.raises(
        ValueError,
        match=r"hparam symmetry\['use_mirror_loss'\]: needs float raw actions .* but Categorical "
        r"samples torch.int64; use use_data_augmentation alone",
    ):
        PPO(CartPole, **SMALL, symmetry={**AUGMENT, "use_mirror_loss": True})


def test_the_function_gets_an_rsl_rl_envs_vec_env():
    from envs.sim_fakes import PointMassVecEnv

    vec_env = PointMassVecEnv(4)
    seen = []

    def mirror(env=None, obs=None, actions=None):
        seen.append(env)
        return (
            None if obs is None else torch.cat([obs, obs]),
            None if actions is None else torch.cat([actions, actions]),
        )

    algo = PPO(vec_env, horizon=8, num_sgd_iters=1, seed=0, symmetry={"data_augmentation_func": mirror})
    assert isinstance(algo.symmetry, Symmetry)
    algo.collect()
    algo.update()
    assert seen and all(env is vec_env for env in seen)


def test_compile_runs_the_fused_step_with_data_augmentation_and_refuses_it_for_the_mirror_loss():
    augmented = PPO(CartPole, **SMALL, compile=True, symmetry=AUGMENT)
    assert augmented.compiled.train_step_kind == "fused"
    mirrored = PPO(Pendulum, **SMALL, compile=True, symmetry=MIRROR)
    assert mirrored.compiled.train_step_kind == "loss"
    assert mirrored.compiled.train_step_fallback == (
        "hparam symmetry's use_mirror_loss adds a loss that calls data_augmentation_func, the user's "
        "own Python, between the forward pass and backward"
    )


@pytest.mark.slow
def test_compiled_symmetric_updates_match_the_plain_ones():
    plain = PPO(CartPole, **SMALL, symmetry=AUGMENT)
    compiled = PPO(CartPole, **SMALL, symmetry=AUGMENT, compile=True)
    for algo in (plain, compiled):
        algo.collect()
    a, b = plain.update(), compiled.update()
    for name in ("losses/policy", "losses/vf", "losses/symmetry", "monitors/kl_div"):
        assert a[name] == pytest.approx(b[name], rel=1e-4, abs=1e-6), name


def test_the_extensions_see_each_minibatch_rnd_first():
    """RND trains its predictor on the collected minibatch, before symmetry's mirrored copies."""
    rnd = {"weight": 0.5, "predictor_hidden_dims": [8], "target_hidden_dims": [8]}
    algo = PPO(CartPole, **SMALL, symmetry=AUGMENT, rnd=rnd)
    assert algo.extensions == (algo.rnd, algo.symmetry)
    seen = []
    train_step = algo.rnd.train_step
    algo.rnd.train_step = lambda obs, average: seen.append(obs.shape[0]) or train_step(obs, average)
    algo.collect()
    stats = algo.update()
    assert seen == [32] * 8  # 128 transitions, minibatches of 32, two passes: never the copies
    assert {"losses/rnd", "losses/symmetry"} <= set(stats)
    assert PPO(CartPole, **SMALL).extensions == ()
