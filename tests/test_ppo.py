"""PPO's contract: reset rules, validation, stats, determinism, spaces, options."""

from __future__ import annotations

import copy
import hashlib
import math
import re

import hparams
import pytest
import torch
from gymnasium import spaces
from markers import needs_cpu_bfloat16
from tensordict import TensorDict

from rl8 import PPO, Env, EnvOutputError
from rl8.envs import CartPole, ContinuousDummyEnv, DiscreteDummyEnv, Pendulum
from rl8.ppo import algorithm, buffer
from rl8.ppo.buffer import compute_gae, normalized_advantages

SMALL = {**hparams.SMALL, "sgd_minibatch_size": 32, "num_sgd_iters": 2}


class CountingEnv(Env):
    """Infinite-horizon env that counts resets; obs is the step counter."""

    observation_space = spaces.Box(-1e6, 1e6, (1,))
    action_space = spaces.Discrete(2)

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", bad=None):
        super().__init__(num_envs, horizon, device=device)
        self.resets = 0
        self.t = torch.zeros(num_envs, 1, device=self.device)
        self.bad = bad
        self.configs = []

    def reset(self, *, config=None, seed=None):
        self.resets += 1
        self.configs.append(config)
        self.t = torch.zeros(self.num_envs, 1, device=self.device)
        return self.t

    def step(self, action):
        self.t = self.t + 1
        out = {"obs": self.t, "rewards": torch.ones(self.num_envs, 1, device=self.device)}
        if self.bad == "missing_rewards":
            del out["rewards"]
        elif self.bad == "reward_shape":
            out["rewards"] = torch.ones(self.num_envs, device=self.device)
        elif self.bad == "nan":
            obs = self.t.clone()
            obs[3] = float("nan") if int(self.t[0]) == 5 else obs[3]
            out["obs"] = obs
        elif self.bad == "not_td":
            return out
        return TensorDict(out, batch_size=[self.num_envs])


class EpisodeEnv(Env):
    """Episodes of fixed length L; reward 1 per step; truncated (not terminated) at L."""

    observation_space = spaces.Box(0, 100, (1,))
    action_space = spaces.Discrete(3)
    episodic = True

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", length=5, terminate=False):
        super().__init__(num_envs, horizon, device=device)
        self.length, self.terminate = length, terminate
        self.t = torch.zeros(num_envs, 1)

    def reset(self, *, config=None, seed=None):
        self.t = torch.zeros(self.num_envs, 1)
        return self.t

    def step(self, action):
        t = self.t + 1
        done = t >= self.length
        self.t = torch.where(done, torch.zeros_like(t), t)
        flag_t = done if self.terminate else torch.zeros_like(done)
        flag_tr = torch.zeros_like(done) if self.terminate else done
        return TensorDict(
            {
                "obs": self.t,
                "rewards": torch.ones(self.num_envs, 1),
                "terminated": flag_t,
                "truncated": flag_tr,
                "final_obs": t,
            },
            batch_size=[self.num_envs],
        )


class MaskedEnv(Env):
    """Dict observation with an action mask that allows only action (step % 4)."""

    observation_space = spaces.Dict({"x": spaces.Box(-1, 1, (2,)), "action_mask": spaces.MultiBinary(4)})
    action_space = spaces.Discrete(4)

    def __init__(self, num_envs, /, horizon=None, *, device="cpu"):
        super().__init__(num_envs, horizon, device=device)
        self.k = 0
        self.violations = 0

    def _obs(self):
        mask = torch.zeros(self.num_envs, 4, dtype=torch.bool)
        mask[:, self.k % 4] = True
        return TensorDict(
            {"x": torch.zeros(self.num_envs, 2), "action_mask": mask}, batch_size=[self.num_envs]
        )

    def reset(self, *, config=None, seed=None):
        self.k = 0
        return self._obs()

    def step(self, action):
        self.violations += int((action != self.k % 4).sum())
        self.k += 1
        return TensorDict(
            {"obs": self._obs(), "rewards": torch.zeros(self.num_envs, 1)}, batch_size=[self.num_envs]
        )


def test_reset_rules():
    algo = PPO(CountingEnv, horizons_per_env_reset=2, **SMALL)
    for _ in range(5):
        algo.collect()
    assert algo.env.resets == 3 and algo.env_resets == 3  # collects 0, 2, 4
    once = PPO(CountingEnv, horizons_per_env_reset=-1, **SMALL)
    for _ in range(4):
        once.collect()
    assert once.env.resets == 1
    # the obs keeps counting across collects when envs are not reset
    assert once.buffer["obs"][0, -1, 0].item() == 4 * SMALL["horizon"]


def test_env_config_is_applied_at_resets():
    algo = PPO(CountingEnv, horizons_per_env_reset=1, env_config={"a": 1}, **SMALL)
    algo.collect(env_config={"b": 2})
    assert algo.env.configs[-1] == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "bad, match",
    [
        ("missing_rewards", r"missing key 'rewards'"),
        ("reward_shape", r"'rewards' has shape \(16,\), expected \(16, 1\)"),
        ("not_td", r"must return a TensorDict, got dict"),
    ],
)
def test_bad_env_output_is_reported_on_first_step(bad, match):
    algo = PPO(CountingEnv, env_kwargs={"bad": bad}, **SMALL)
    with pytest.raises(EnvOutputError, match=match):
        algo.collect()


class BadEpisodeEnv(EpisodeEnv):
    """EpisodeEnv whose step or reset output breaks the contract in one way."""

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", bad=None):
        super().__init__(num_envs, horizon, device=device)
        self.bad = bad

    def reset(self, *, config=None, seed=None):
        obs = super().reset(config=config, seed=seed)
        if self.bad == "reset_shape":
            return torch.zeros(self.num_envs, 2)
        if self.bad == "reset_batch":
            return torch.zeros(self.num_envs + 1, 1)
        if self.bad == "reset_dtype":
            return obs.double()
        return obs

    def step(self, action):
        out = super().step(action)
        if self.bad == "no_terminated":
            del out["terminated"]
        elif self.bad == "float64_rewards":
            out["rewards"] = out["rewards"].double()
        elif self.bad == "float64_obs":
            out["obs"] = out["obs"].double()
        return out


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            "no_terminated",
            r"BadEpisodeEnv.step: missing key 'terminated'; an episodic env returns both "
            r"'terminated' and 'truncated' \(\[16, 1\] bool.*got keys \['final_obs', 'obs', "
            r"'rewards', 'truncated'\]",
        ),
        (
            "float64_rewards",
            r"BadEpisodeEnv.step: 'rewards' has dtype torch.float64, expected torch.float32",
        ),
        ("float64_obs", r"BadEpisodeEnv.step: 'obs' has dtype torch.float64, expected torch.float32"),
        ("reset_shape", r"BadEpisodeEnv.reset: 'obs' has shape \(16, 2\), expected \(16, 1\)"),
        ("reset_batch", r"BadEpisodeEnv.reset: 'obs' has shape \(17, 1\), expected \(16, 1\)"),
        ("reset_dtype", r"BadEpisodeEnv.reset: 'obs' has dtype torch.float64, expected torch.float32"),
    ],
)
def test_bad_episodic_env_output_names_key_expected_and_given(bad, match):
    """issue 11: these were accepted (or failed inside the model's matmul)."""
    algo = PPO(BadEpisodeEnv, env_kwargs={"bad": bad}, **SMALL)
    with pytest.raises(EnvOutputError, match=match):
        algo.collect()


def test_evaluate_checks_the_reset_output():
    algo = PPO(EpisodeEnv, **SMALL)
    with pytest.raises(
        EnvOutputError, match=r"BadEpisodeEnv.reset: 'obs' has shape \(4, 2\), expected \(4, 1\)"
    ):
        algo.evaluate(BadEpisodeEnv(4, bad="reset_shape"))


def test_nan_observation_reports_env_and_step():
    algo = PPO(CountingEnv, env_kwargs={"bad": "nan"}, **SMALL)
    with pytest.raises(EnvOutputError, match=r"non-finite values .* in 'obs' at \(env 3, step 5\)"):
        algo.collect()
    quiet = PPO(CountingEnv, env_kwargs={"bad": "nan"}, check_finite_collects=0, **SMALL)
    quiet.collect()  # checking switched off


def test_step_before_collect_is_an_error():
    with pytest.raises(RuntimeError, match="needs a collect"):
        PPO(DiscreteDummyEnv, **SMALL).update()


def test_stat_names():
    algo = PPO(CartPole, **SMALL)
    rollout = algo.collect()
    update = algo.update()
    for key in (
        "rollout/reward_sum_min",
        "rollout/reward_sum_max",
        "rollout/reward_sum_mean",
        "rollout/reward_sum_std",
        "rewards/min",
        "rewards/max",
        "rewards/mean",
        "rewards/std",
        "episodes/return_mean",
        "episodes/length_mean",
        "episodes/count",
    ):
        assert key in rollout
    assert set(update) == {
        "losses/policy",
        "losses/vf",
        "losses/entropy",
        "losses/total",
        "monitors/kl_div",
        "monitors/clip_fraction",
        "monitors/explained_variance",
        "monitors/grad_norm",
        "coefficients/entropy",
        "coefficients/vf",
        "coefficients/lr",
    }
    assert all(isinstance(v, float) for v in update.values())
    infinite = PPO(DiscreteDummyEnv, **SMALL).collect()
    assert not any(k.startswith("episodes/") for k in infinite)


@pytest.mark.parametrize("terminate", [False, True])
def test_episode_stats_across_collects(terminate):
    # length-5 episodes, horizon 8: episodes end at steps 5, 10, 15, ... of each env
    algo = PPO(EpisodeEnv, env_kwargs={"length": 5, "terminate": terminate}, **SMALL)
    first = algo.collect()
    assert first["episodes/count"] == 16 and first["episodes/return_mean"] == 5.0
    second = algo.collect()  # steps 9..16: episodes end at 10 and 15
    assert second["episodes/count"] == 32
    assert second["episodes/return_mean"] == 5.0 and second["episodes/length_mean"] == 5.0
    algo.update()


def test_no_finished_episode_gives_nan_mean():
    algo = PPO(EpisodeEnv, env_kwargs={"length": 100}, **SMALL)
    stats = algo.collect()
    assert stats["episodes/count"] == 0 and math.isnan(stats["episodes/return_mean"])


def test_truncation_bootstraps_from_final_obs_value():
    algo = PPO(EpisodeEnv, env_kwargs={"length": 3}, normalize_rewards=False, **SMALL)
    algo.collect()
    data, hp = algo.buffer.data, algo.hparams
    trunc = data["truncated"][:, :8]
    assert trunc.any()
    with torch.no_grad():
        final = algo.policy.value(data["final_obs"][:, :8].reshape(-1, 1)).reshape(16, 8) * trunc
        expected, _ = compute_gae(
            data["rewards"][:, :8],
            data["values"],
            gamma=hp.gamma,
            gae_lambda=hp.gae_lambda,
            terminated=data["terminated"][:, :8],
            truncated=trunc,
            final_values=final,
        )
        advantages, _ = algo.compute_advantages()
    torch.testing.assert_close(advantages, expected)


def test_action_mask_is_honoured():
    algo = PPO(MaskedEnv, **SMALL)
    for _ in range(3):
        algo.collect()
        algo.update()
    assert algo.env.violations == 0


def test_same_seed_gives_identical_losses():
    def run():
        algo = PPO(CartPole, **SMALL)
        out = []
        for _ in range(3):
            algo.collect()
            out.append(algo.update())
        return out

    assert run() == run()


def test_building_a_ppo_leaves_torchs_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    PPO(CartPole, **SMALL)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("env_cls", [CartPole, Pendulum])
def test_a_run_does_not_depend_on_torchs_global_rng(env_cls):
    def run(global_seed):
        torch.manual_seed(global_seed)
        algo = PPO(env_cls, **SMALL)
        weights = [p.detach().clone() for p in algo.policy.parameters()]
        losses = []
        for _ in range(2):
            algo.collect()
            losses.append(algo.update())
        return weights, losses

    (weights_a, losses_a), (weights_b, losses_b) = run(1), run(2)
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
    assert losses_a == losses_b


def test_different_seeds_differ():
    a = PPO(CartPole, **{**SMALL, "seed": 1})
    b = PPO(CartPole, **{**SMALL, "seed": 2})
    a.collect(), b.collect()
    assert a.update() != b.update()


def test_state_dict_resume_gives_identical_losses():
    reference = PPO(CartPole, **SMALL)
    for _ in range(2):
        reference.collect()
        reference.update()
    state = copy.deepcopy(reference.state_dict())  # state_dict shares parameter storage
    expected = []
    for _ in range(2):
        reference.collect()
        expected.append(reference.update())
    resumed = PPO(CartPole, **{**SMALL, "seed": 123})
    resumed.load_state_dict(state)
    got = []
    for _ in range(2):
        resumed.collect()
        got.append(resumed.update())
    assert got == expected


def test_schedules_and_options():
    algo = PPO(
        DiscreteDummyEnv,
        lr_schedule=[(0, 1e-3), (128, 1e-4)],
        entropy_coeff_schedule=[(0, 0.1), (256, 0.0)],
        schedule_kind="linear",
        dual_clip_param=3.0,
        vf_clip_param=1.0,
        accumulate_grads=True,
        target_kl_div=1e-9,
        max_grad_norm=None,
        **SMALL,
    )
    algo.collect()
    first = algo.update()
    assert first["coefficients/lr"] == pytest.approx(1e-4)  # 128 env steps collected
    assert first["coefficients/entropy"] == pytest.approx(0.05)
    assert math.isfinite(first["losses/total"])


@needs_cpu_bfloat16
def test_bf16_autocast_on_cpu():
    def first_update(enable_amp):
        algo = PPO(CartPole, enable_amp=enable_amp, **SMALL)
        algo.collect()
        return algo, algo.update()

    algo, stats = first_update(True)
    assert algo.amp_dtype == torch.bfloat16
    assert math.isfinite(stats["losses/total"])
    # the same seed's float32 update differs: the forward passes did run in bfloat16
    assert stats["losses/total"] != first_update(False)[1]["losses/total"]


def test_evaluate_respects_reset_boundaries():
    algo = PPO(CartPole, horizons_per_env_reset=-1, **SMALL)
    stats = algo.evaluate()  # before the first collect: allowed
    assert "rollout/reward_sum_mean" in stats
    algo.collect()
    with pytest.raises(RuntimeError, match="env-reset boundary"):
        algo.evaluate()
    dedicated = CartPole(8)
    out = algo.evaluate(dedicated, num_steps=600)
    assert out["episodes/count"] >= 8
    steps_before = algo.env_steps
    algo.collect()
    assert algo.env_steps == steps_before + 128


@pytest.mark.parametrize(
    "action_space",
    [spaces.Box(-2, 2, (2,)), spaces.MultiDiscrete([3, 2]), spaces.MultiBinary(3)],
)
def test_action_spaces_flow_through(action_space):
    class Env_(Env):
        observation_space = spaces.Box(-1, 1, (3,))

        def __init__(self, num_envs, /, horizon=None, *, device="cpu"):
            super().__init__(num_envs, horizon, device=device)
            self.action_space = action_space
            self.seen = []

        def reset(self, *, config=None, seed=None):
            return torch.zeros(self.num_envs, 3)

        def step(self, action):
            self.seen.append(action)
            return TensorDict(
                {"obs": torch.rand(self.num_envs, 3), "rewards": torch.zeros(self.num_envs, 1)},
                batch_size=[self.num_envs],
            )

    algo = PPO(Env_, **SMALL)
    algo.collect()
    algo.update()
    act = torch.stack(algo.env.seen)
    assert act.shape[1:] == (16, *action_space.shape)
    if isinstance(action_space, spaces.Box):
        assert act.min() >= -2 and act.max() <= 2
    else:
        assert act.dtype == torch.int64


def test_normalize_observations_updates_statistics():
    algo = PPO(ContinuousDummyEnv, normalize_observations=True, **SMALL)
    algo.collect()
    algo.update()
    stats = algo.policy.obs_normalizer.stats["obs"]
    assert stats.count.item() == 128


def test_unknown_hparam_is_an_error():
    with pytest.raises(TypeError, match="did you mean 'horizon'"):
        PPO(CartPole, horizn=8)


def test_each_ppo_object_owns_its_random_stream():
    def losses(algo, n=2):
        out = []
        for _ in range(n):
            algo.collect()
            out.append(algo.update()["losses/total"])
        return out

    alone = losses(PPO(CartPole, **SMALL))
    a, b = PPO(CartPole, **SMALL), PPO(CartPole, **{**SMALL, "seed": 7})
    interleaved = []
    for _ in range(2):
        a.collect()
        b.collect()
        interleaved.append(a.update()["losses/total"])
        b.update()
        torch.rand(10)  # user code drawing from the global RNG in between
    assert interleaved == alone


@pytest.mark.parametrize("shared", [False, True])
def test_mlp_model_is_plain_sequential_networks(shared):
    """MLPModel's policy and value are plain modules called directly: the outputs (with and
    without autograd, inside and outside Model.rollout()) are those of pi and vf."""
    from rl8.policies.distributions import Categorical
    from rl8.policies.models import MLPModel

    env = CartPole(64)
    model = MLPModel(
        env.observation_space,
        env.action_space,
        Categorical,
        hiddens=(32, 16),
        activation="relu",
        shared=shared,
    )
    obs = torch.randn(64, 4)
    if shared:
        assert isinstance(model.trunk, torch.nn.Sequential)
        assert isinstance(model.pi, torch.nn.Linear) and isinstance(model.vf, torch.nn.Linear)
        expected = model.pi(model.trunk(obs)), model.vf(model.trunk(obs))[:, 0]
    else:
        assert isinstance(model.pi, torch.nn.Sequential) and isinstance(model.vf, torch.nn.Sequential)
        assert [type(m) for m in model.pi] == [torch.nn.Linear, torch.nn.ReLU] * 2 + [torch.nn.Linear]
        expected = model.pi(obs), model.vf(obs)[:, 0]
    params, value = model(obs)
    torch.testing.assert_close(params, expected[0])
    torch.testing.assert_close(value, expected[1])
    torch.testing.assert_close(model.value(obs), expected[1])
    with torch.no_grad(), model.rollout():
        rollout_params, rollout_value = model(obs)
    torch.testing.assert_close(rollout_params, expected[0])
    torch.testing.assert_close(rollout_value, expected[1])


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("activation", ["elu", "relu", "leaky_relu", "tanh"])
def test_mlp_activations_in_place_give_the_out_of_place_outputs_and_gradients(activation, shared):
    """ELU, ReLU and LeakyReLU run in place on their Linear layer's output (no output of their
    own to allocate; ELU's backward reads its output instead of taking an exp); the outputs and
    gradients are those of the same model with out-of-place activations."""
    from rl8.policies.distributions import Normal
    from rl8.policies.models import INPLACE_ACTIVATIONS, MLPModel

    env = Pendulum(64)
    torch.manual_seed(0)
    model = MLPModel(
        env.observation_space,
        env.action_space,
        Normal,
        hiddens=(32, 16),
        activation=activation,
        shared=shared,
    )
    activations = [m for m in model.modules() if isinstance(m, INPLACE_ACTIVATIONS + (torch.nn.Tanh,))]
    assert len(activations) == (2 if shared else 4)
    assert all(getattr(m, "inplace", False) == (activation != "tanh") for m in activations)
    reference = copy.deepcopy(model)
    for module in reference.modules():
        if getattr(module, "inplace", False):
            module.inplace = False
    obs = torch.randn(64, 3) * 3
    outputs = []
    for net in (model, reference):
        params, value = net(obs)
        (params.square().sum() + value.square().sum()).backward()
        outputs.append((params, value, [p.grad for p in net.parameters()]))
    (params, value, grads), (ref_params, ref_value, ref_grads) = outputs
    torch.testing.assert_close(params, ref_params, rtol=0, atol=0)
    torch.testing.assert_close(value, ref_value, rtol=0, atol=0)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_collect_sees_parameters_updated_by_step():
    """A collect after update() acts with the updated parameters: its stored log-probs equal a
    fresh evaluation of the new policy."""
    algo = PPO(CartPole, num_envs=32, horizon=8, sgd_minibatch_size=64, seed=0)
    algo.collect()
    algo.update()
    algo.collect()
    data = algo.buffer.data
    obs = data["obs"][:, :8].reshape(-1, 4)
    actions = data["actions"][:, :8].reshape(-1)
    with torch.no_grad():
        logp, _, values = algo.policy.evaluate(TensorDict(obs=obs, actions=actions, batch_size=[256]))
    torch.testing.assert_close(data["logp"][:, :8].reshape(-1), logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(data["values"][:, :8].reshape(-1), values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env_cls", [DiscreteDummyEnv, CartPole])
def test_rollout_stats_values(env_cls):
    """rollout/reward_sum_* (per env, over the horizon) and rewards/* are the statistics of the
    buffer's rewards (population std)."""
    algo = PPO(env_cls, num_envs=16, horizon=12, sgd_minibatch_size=48, seed=3)
    for _ in range(2):
        stats = algo.collect()
    rewards = algo.buffer.data["rewards"][:, :12].double()
    reward_sums = rewards.sum(1)
    for prefix, x in (("rollout/reward_sum_", reward_sums), ("rewards/", rewards.reshape(-1))):
        assert stats[f"{prefix}min"] == pytest.approx(x.min().item(), abs=1e-6)
        assert stats[f"{prefix}max"] == pytest.approx(x.max().item(), abs=1e-6)
        assert stats[f"{prefix}mean"] == pytest.approx(x.mean().item(), rel=1e-6, abs=1e-9)
        assert stats[f"{prefix}std"] == pytest.approx(x.std(unbiased=False).item(), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("accumulate_grads", [False, True])
def test_update_stats_values(accumulate_grads):
    """losses/* and monitors/* of step() are the minibatch means of the plain PPO losses,
    checked against the loss written out here and an autograd gradient norm: one minibatch, or
    two whose gradients are accumulated into one optimizer step (so both see the same weights)."""
    minibatches = 2 if accumulate_grads else 1
    hp = dict(
        num_envs=8,
        horizon=6,
        num_sgd_iters=1,
        sgd_minibatch_size=48 // minibatches,
        shuffle_minibatches=False,
        normalize_advantages=False,
        normalize_rewards=False,
        entropy_coeff=0.05,
        vf_coeff=0.7,
        vf_clip_param=0.5,
        clip_param=0.2,
        max_grad_norm=None,
        accumulate_grads=accumulate_grads,
        seed=4,
    )
    algo = PPO(CartPole, **hp)
    algo.collect()
    algo.update()
    algo.collect()
    torch.manual_seed(0)
    with torch.no_grad():  # move the policy away from the collecting one: ratios != 1
        for p in algo.policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    policy = copy.deepcopy(algo.policy)
    data = algo.buffer.data
    with torch.no_grad():
        advantages, returns = algo.compute_advantages()
    flat = lambda x: x[:, :6].reshape(48, *x.shape[2:])  # noqa: E731
    obs, actions, old_logp, old_values = (flat(data[k]) for k in ("obs", "actions", "logp", "values"))
    advantages, returns = advantages.reshape(-1), returns.reshape(-1)
    expected = {k: 0.0 for k in ("policy", "vf", "kl", "clip", "entropy", "total")}
    grads = [torch.zeros_like(p) for p in policy.parameters()]
    size = 48 // minibatches
    for j in range(minibatches):
        rows = slice(j * size, (j + 1) * size)
        minibatch = TensorDict(obs=obs[rows], actions=actions[rows], batch_size=[size])
        logp, entropy, values = policy.evaluate(minibatch)
        ratio, adv, ret = (logp - old_logp[rows]).exp(), advantages[rows], returns[rows]
        terms = {
            "policy": -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean(),
            "vf": 0.5
            * torch.max(
                (values - ret) ** 2,
                (old_values[rows] + (values - old_values[rows]).clamp(-0.5, 0.5) - ret) ** 2,
            ).mean(),
            "kl": (ratio - 1 - ratio.log()).mean(),
            "clip": ((ratio - 1).abs() > 0.2).float().mean(),
        }
        total = terms["policy"] + 0.7 * terms["vf"] - 0.05 * entropy.mean()
        for key, value in terms.items():
            expected[key] += value.item() / minibatches
        expected["entropy"] += -entropy.mean().item() / minibatches
        expected["total"] += total.item() / minibatches
        for g, d in zip(grads, torch.autograd.grad(total / minibatches, list(policy.parameters()))):
            g += d
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    stats = algo.update()
    names = {
        "policy": "losses/policy",
        "vf": "losses/vf",
        "kl": "monitors/kl_div",
        "clip": "monitors/clip_fraction",
        "entropy": "losses/entropy",
        "total": "losses/total",
    }
    for key, name in names.items():
        assert stats[name] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), name
    assert stats["monitors/grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert stats["monitors/kl_div"] > 1e-4 and stats["monitors/clip_fraction"] > 0
    explained = 1 - (returns - old_values).var() / returns.var()
    assert stats["monitors/explained_variance"] == pytest.approx(explained.item(), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("env_cls", [DiscreteDummyEnv, CartPole, Pendulum, MaskedEnv])
def test_stacked_and_per_step_buffer_writes_agree(monkeypatch, env_cls):
    """Small observations, values and rewards are kept through a collect and stacked into the
    buffer once; big observations (here: any, via the size limit) are copied step by step.
    Both fill the buffer identically, over collects that do and do not reset the envs."""

    def run():
        algo = PPO(
            env_cls, num_envs=6, horizon=5, sgd_minibatch_size=10, horizons_per_env_reset=2, seed=9
        )
        for _ in range(3):
            algo.collect()
        return algo

    stacked = run()
    monkeypatch.setattr(buffer, "STACKED_OBS_MAX_BYTES", -1)
    per_step = run()
    assert ("obs" in stacked.buffer.stacked) == (env_cls is not MaskedEnv)
    assert "obs" not in per_step.buffer.stacked
    a, b = stacked.buffer.data, per_step.buffer.data
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert torch.equal(a[key], b[key]), key
    # the rows are the collected steps: obs[t + 1] is what the env returned after step t
    if env_cls is DiscreteDummyEnv:
        obs, rewards = a["obs"][:, :, 0], a["rewards"]
        torch.testing.assert_close(rewards[:, :5], -obs[:, 1:].abs())


def test_adam_is_fused_by_default_unless_the_kwargs_choose():
    """Adam/AdamW default to the public ``fused=True`` option on CPU; an explicit ``fused`` or
    ``foreach`` in optimizer_kwargs is kept."""
    assert PPO(CartPole, num_envs=8, horizon=8, seed=0).optimizer.defaults["fused"] is True
    chosen = PPO(CartPole, num_envs=8, horizon=8, seed=0, optimizer_kwargs={"foreach": True})
    assert not chosen.optimizer.defaults["fused"]
    assert chosen.optimizer.defaults["foreach"] is True


def test_every_optimizer_step_goes_through_the_optimizer_api(monkeypatch):
    """PPO steps and zeroes its optimizer only through ``optimizer.step()`` and
    ``optimizer.zero_grad()``: a patched ``Adam.step`` sees every minibatch (no direct kernel
    calls around it)."""
    calls = {"step": 0, "zero_grad": 0}
    step, zero_grad = torch.optim.Adam.step, torch.optim.Adam.zero_grad

    def counting_step(self, *args, **kwargs):
        calls["step"] += 1
        return step(self, *args, **kwargs)

    def counting_zero_grad(self, *args, **kwargs):
        calls["zero_grad"] += 1
        return zero_grad(self, *args, **kwargs)

    algo = PPO(CartPole, num_envs=8, horizon=8, sgd_minibatch_size=16, num_sgd_iters=2, seed=5)
    monkeypatch.setattr(torch.optim.Adam, "step", counting_step)
    monkeypatch.setattr(torch.optim.Adam, "zero_grad", counting_zero_grad)
    for _ in range(3):
        algo.collect()
        algo.update()
    assert calls == {"step": 3 * 2 * 4, "zero_grad": 3 * 2 * 4}


@pytest.mark.parametrize("max_grad_norm", [None, 0.01])
def test_grad_norm_is_the_global_norm_before_clipping(max_grad_norm):
    """``monitors/grad_norm`` is the global 2-norm of the gradients before clipping (also
    without clipping), as ``torch.nn.utils.clip_grad_norm_`` reports it."""
    algo = PPO(
        CartPole,
        num_envs=8,
        horizon=8,
        sgd_minibatch_size=64,
        num_sgd_iters=1,
        seed=3,
        max_grad_norm=max_grad_norm,
    )
    seen = []
    algo.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            torch.linalg.vector_norm(
                torch.stack(
                    [
                        torch.linalg.vector_norm(p.grad)
                        for p in algo.policy.parameters()
                        if p.grad is not None
                    ]
                )
            ).item()
        )
    )
    algo.collect()
    stats = algo.update()
    assert len(seen) == 1
    if max_grad_norm is None:
        assert stats["monitors/grad_norm"] == pytest.approx(seen[0], rel=1e-5)
    else:  # the gradients reaching the optimizer were scaled down to max_grad_norm
        assert seen[0] == pytest.approx(max_grad_norm, rel=1e-3)
        assert stats["monitors/grad_norm"] > max_grad_norm


@pytest.mark.parametrize("num_minibatches", [1, 4])
def test_normalized_advantages_per_minibatch(num_minibatches):
    """Each minibatch's advantages are centred and divided by their sample std (+ 1e-8)."""
    algo = PPO(DiscreteDummyEnv, num_envs=8, horizon=8, sgd_minibatch_size=64 // num_minibatches, seed=0)
    torch.manual_seed(1)
    adv = 3.0 * torch.randn(64) + 2.0
    got = normalized_advantages(adv.clone(), num_minibatches, algo.dist)
    rows = adv.reshape(num_minibatches, -1)
    expected = (rows - rows.mean(1, keepdim=True)) / (rows.std(1, keepdim=True) + 1e-8)
    torch.testing.assert_close(got, expected.reshape(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recurrent", [False, True])
def test_rollout_advantage_normalization_is_over_the_whole_rollout_once(recurrent, monkeypatch):
    """normalize_advantages_over="rollout": the minibatches' advantages are the rollout's, centred
    and divided by the rollout's sample std (+ 1e-8), as rsl_rl 5 normalises them (not each
    minibatch's own moments); for sequences [S, T] too."""
    hp = dict(num_envs=8, horizon=8, num_minibatches=4, num_sgd_iters=2, normalize_rewards=False)
    if recurrent:
        hp.update(
            model_cls="rl8.policies.recurrent.LSTMModel", seq_len=4, model_config={"hidden_size": 8}
        )
    algo = PPO(CartPole, **hp, normalize_advantages_over="rollout", seed=0)
    algo.collect()
    with torch.no_grad():
        advantages = algo.compute_advantages()[0].reshape(-1)
    expected = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    seen = []

    def recorded(*args, **kwargs):  # the minibatches the update trains on
        for minibatch in buffer.minibatches(*args, **kwargs):
            seen.append(minibatch)
            yield minibatch

    monkeypatch.setattr(algorithm, "minibatches", recorded)
    algo.update()
    assert len(seen) == 8  # 2 passes of 4 minibatches
    for one_pass in (seen[:4], seen[4:]):
        got = torch.cat([mb["advantages"].reshape(-1) for mb in one_pass])
        assert not torch.allclose(got, expected)  # shuffled, drawn from the whole rollout ...
        torch.testing.assert_close(got.sort().values, expected.sort().values)  # ... normalised once
        means = [float(mb["advantages"].mean()) for mb in one_pass]
        assert max(abs(m) for m in means) > 1e-3  # a minibatch's own mean is not taken out


# --------------------------------------------------------------------------------------------
# the default minibatch


def test_default_minibatch_works_on_a_small_batch():
    """issue 12: PPO(CartPole, num_envs=64, horizon=16) was refused (minibatch 2048 > 1024)."""
    algo = PPO(CartPole, num_envs=64, horizon=16, seed=0)
    assert algo.minibatch_size == 256
    algo.collect()
    algo.update()
    steps = {int(s["step"]) for s in algo.optimizer.state.values()}
    assert steps == {algo.hparams.num_sgd_iters * 4}  # 4 minibatches per pass


def test_hparams_stored_by_rl8_1_0_still_load():
    """Checkpoints of rl8 1.0.0 hold sgd_minibatch_size=2048 and no num_minibatches."""
    algo = PPO(CartPole, num_envs=32, horizon=128, seed=0)
    algo.collect()
    state = algo.state_dict()
    old = {k: v for k, v in state["hparams"].items() if k != "num_minibatches"}
    old["sgd_minibatch_size"] = 2048
    restored = PPO(CartPole, **old)
    restored.load_state_dict(state)
    assert restored.minibatch_size == 2048 and algo.minibatch_size == 1024
    restored.step()


# --------------------------------------------------------------------------------------------
# hyper-parameters that used to fail deep inside torch


def test_bad_model_config_names_the_option():
    with pytest.raises(
        ValueError, match=r"model_config hiddens: expected a sequence of ints >= 1, got -5"
    ):
        PPO(CartPole, model_config={"hiddens": -5}, **SMALL)
    with pytest.raises(
        ValueError, match=r"model_config hiddens: expected a sequence of ints >= 1, got \[64, 1.5\]"
    ):
        PPO(CartPole, model_config={"hiddens": [64, 1.5]}, **SMALL)


def test_bad_optimizer_kwargs_name_the_field():
    with pytest.raises(ValueError) as err:
        PPO(CartPole, optimizer_kwargs={"betas": "x"}, **SMALL)
    message = str(err.value)
    assert message.startswith("hparam optimizer_kwargs: torch.optim.adam.Adam refused {'betas': 'x'} (")
    assert "expected its keyword arguments: betas=(0.9, 0.999), eps=1e-08" in message
    with pytest.raises(ValueError, match=r"optimizer_kwargs: .*SGD refused \{'nesterov': True\}"):
        PPO(CartPole, optimizer_cls=torch.optim.SGD, optimizer_kwargs={"nesterov": True}, **SMALL)


def test_a_buffer_larger_than_memory_is_refused_before_allocating():
    with pytest.raises(
        ValueError,
        match=r"hparam num_envs, horizon: a rollout buffer of num_envs=1000000000000 envs "
        r"x \(horizon=1 \+ 1\) steps needs about \d+ bytes .*; cpu has \d+ bytes .* in all",
    ):
        PPO(CartPole, num_envs=10**12, horizon=1)


def test_the_buffer_estimate_counts_the_spaces(monkeypatch):
    import rl8.ppo.buffer

    # 16 envs x 9 steps: CartPole obs + final_obs 2 * 16 B, action 8 B, 12 B, flags 2 B
    need = 16 * 9 * (32 + 8 + 12 + 2)
    monkeypatch.setattr(rl8.ppo.buffer, "device_memory", lambda device: need - 1)
    with pytest.raises(ValueError, match=rf"needs about {need} bytes"):
        PPO(CartPole, **SMALL)
    monkeypatch.setattr(rl8.ppo.buffer, "device_memory", lambda device: need)
    PPO(CartPole, **SMALL)


def test_overlap_mode_counts_both_buffers(monkeypatch):
    import rl8.ppo.buffer

    # collect_mode="overlap" allocates a second buffer for the collector: twice the estimate above
    need = 2 * 16 * 9 * (32 + 8 + 12 + 2)
    monkeypatch.setattr(rl8.ppo.buffer, "device_memory", lambda device: need - 1)
    with pytest.raises(
        ValueError,
        match=rf"2 rollout buffers \(collect_mode='overlap'\) of num_envs=16 .* "
        rf"need about {need} bytes",
    ):
        PPO(CartPole, collect_mode="overlap", **SMALL)
    monkeypatch.setattr(rl8.ppo.buffer, "device_memory", lambda device: need)
    PPO(CartPole, collect_mode="overlap", **SMALL).close()


class OutOfMemoryEnv(CartPole):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 bytes.")


def test_an_env_constructor_out_of_memory_is_reported_for_the_envs():
    with pytest.raises(
        ValueError,
        match=r"^hparam num_envs: building num_envs=16 envs ran out of memory "
        r"\(.*you tried to allocate 99 bytes.\). Use fewer envs$",
    ):
        PPO(OutOfMemoryEnv, **SMALL)


def test_a_failed_allocation_names_num_envs_horizon_and_bytes(monkeypatch):
    import rl8.ppo.buffer

    def fail(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 123 bytes."
        )

    monkeypatch.setattr(rl8.ppo.buffer, "RolloutBuffer", fail)
    with pytest.raises(
        ValueError,
        match=r"num_envs=16 envs x \(horizon=8 \+ 1\) steps needs about \d+ bytes .*"
        r"allocating memory failed \(.*can't allocate memory: you tried to allocate 123 bytes.\)",
    ):
        PPO(CartPole, **SMALL)

    def other(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(rl8.ppo.buffer, "RolloutBuffer", other)
    with pytest.raises(RuntimeError, match="^something else$"):
        PPO(CartPole, **SMALL)


class RewardsOfWrongShapeWhenBroken(CartPole):
    """CartPole whose step output is malformed once its ``broken`` flag (part of its state) is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.broken = False

    def step(self, action):
        out = super().step(action)
        if self.broken:
            out["rewards"] = out["rewards"][:, 0]
        return out


def test_the_first_step_after_a_resume_is_validated():
    algo = PPO(RewardsOfWrongShapeWhenBroken, **SMALL)
    algo.collect()
    state = algo.state_dict()
    state["env"]["broken"] = True
    resumed = PPO(RewardsOfWrongShapeWhenBroken, **SMALL)
    resumed.load_state_dict(state)
    with pytest.raises(EnvOutputError, match="rewards"):
        resumed.collect()


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("reset", 1, r"'reset' is not an entry of CartPole's state; expected some of \["),
        ("__class__", "x", "'__class__' is not an entry"),
        ("state", "abc", r"'state' must be a torch.float32 tensor, got 'abc' \(str\)"),
        (
            "state",
            torch.zeros(16, 4, dtype=torch.int64),
            "'state' must be a torch.float32 tensor, got a torch.int64",
        ),
    ],
)
def test_env_load_state_dict_accepts_only_the_envs_own_entries(key, value, expected):
    env = CartPole(4, 8)
    state = env.state_dict()
    assert "state" in state  # the entry the crafted values replace
    state[key] = value
    with pytest.raises(ValueError, match=expected):
        env.load_state_dict(state)
    assert not isinstance(env.reset, int) and type(env) is CartPole


def test_a_stored_env_state_is_ignored_for_an_env_that_saves_none():
    algo = PPO("CartPole-v1", **SMALL)
    algo.collect()
    state = algo.state_dict()
    assert state["env"] is None and state["obs"] is None  # GymnasiumEnv.state_dict() is None
    state["env"] = {"reset": 1}
    state["obs"] = {"tensor": torch.zeros(SMALL["num_envs"], 4)}
    resumed = PPO("CartPole-v1", **SMALL)
    resumed.load_state_dict(state)
    resumed.collect()  # the envs are reset, not patched
    assert callable(resumed.env.reset)


def test_step_is_a_deprecated_name_of_update():
    algo = PPO(DiscreteDummyEnv, **SMALL)
    algo.collect()
    with pytest.warns(DeprecationWarning, match=r"PPO.step\(\) is renamed PPO.update\(\)"):
        stats = algo.step()
    assert algo.steps == 1 and "losses/total" in stats


def test_episode_tracker_carries_episodes_across_collects():
    """EpisodeTracker sums whole episodes that end in a collect (steps of earlier collects
    included) and carries the unfinished ones, through its state_dict too."""
    from rl8.envs.episodes import EpisodeTracker

    tracker = EpisodeTracker(2, "cpu")
    rewards = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    dones = torch.tensor([[False, False, False], [False, True, False]])
    first = tracker.advance(rewards, dones)
    assert {k: v.item() for k, v in first.items()} == {
        "episodes/return_sum": 2.0,
        "episodes/length_sum": 2.0,
        "episodes/count": 1.0,
    }
    restored = EpisodeTracker(2, "cpu")
    restored.load_state_dict(tracker.state_dict())
    second = restored.advance(rewards, torch.tensor([[True, False, False], [False, False, False]]))
    assert second["episodes/return_sum"].item() == 7.0  # 1 + 2 + 3 + 1
    assert second["episodes/length_sum"].item() == 4.0
    torch.testing.assert_close(restored.returns, torch.tensor([5.0, 4.0]))


def test_rollout_stats_is_a_pure_function():
    """rollout_stats reads its arguments only: the same call twice gives the same stats and
    leaves the episode tracker (advanced by the caller) as it was."""
    from rl8.envs.episodes import EpisodeTracker
    from rl8.ppo.distributed import DistContext
    from rl8.ppo.stats import rollout_stats

    rewards = torch.arange(12.0).reshape(3, 4)
    dones = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    tracker = EpisodeTracker(3, torch.device("cpu"))
    sums = tracker.advance(rewards, dones)
    before = tracker.state_dict()
    first, _ = rollout_stats(DistContext(), rewards, sums)
    second, _ = rollout_stats(DistContext(), rewards, sums)
    assert first == second
    assert first["episodes/count"] == 2 and first["episodes/return_mean"] == (1.0 + 22.0) / 2
    assert all(torch.equal(before[k], v) for k, v in tracker.state_dict().items())


@pytest.mark.parametrize(
    "name, pointer",
    [
        (
            "learn",
            "Stable-Baselines3's model.learn(total_timesteps) is rl8.Trainer(algo).learn(total_timesteps)",
        ),
        ("predict", "Stable-Baselines3's model.predict(obs) is algo.policy.predict(obs)"),
        ("save", "Stable-Baselines3's model.save(path) is rl8.save_policy(algo.policy, path)"),
        ("load", "Stable-Baselines3's PPO.load(path) is rl8.load_policy(path)"),
        ("num_timesteps", "Stable-Baselines3's model.num_timesteps is algo.env_steps"),
        ("get_env", "Stable-Baselines3's model.get_env() is algo.env"),
    ],
)
def test_stable_baselines3s_names_are_attribute_errors_saying_rl8s_way(name, pointer):
    algo = PPO(CartPole, **SMALL)
    with pytest.raises(AttributeError) as error:
        getattr(algo, name)
    assert str(error.value).startswith(f"'PPO' object has no attribute {name!r}: {pointer}")
    assert error.value.name == name and error.value.obj is algo
    assert not hasattr(algo, name)
    if name == "load":  # SB3's PPO.load is read on the class
        with pytest.raises(
            AttributeError, match=rf"^type object 'PPO' has no attribute 'load': {re.escape(pointer)}"
        ):
            PPO.load
        assert not hasattr(PPO, "load")


# ----------------------------------------------------------------- every training path, as recorded
#: The sha256 of the weights and optimizer state after three collect + update iterations of a
#: seeded PPO on CPU, one per mode of collection and update, recorded before PPO's update and
#: collection became an update step and a collector chosen at construction: a restructuring of
#: them keeps training bit-identical. (Recorded with torch 2.x on x86-64; a change of torch's CPU
#: kernels may change them, and is then recorded again from the code before the change.)
RECORDED_PARAMETERS = {
    "accumulate_grads": "3d3b1d9989a88f8dcfb23ae186b5ad69563880f1f648f321bc1ac63f51bb6958",
    "desired_kl": "1e76e18001e3fb7d95eeb668f009752b2ed804483269d7de1ab8ab8721f1978e",
    "eager": "2bd7eeb6ece95735e95f694f3ca72fb662c2074cb70de2eaa86cde4701118037",
    "normalizers": "298168a804189e83ef99ce586c3b941f9397e6c9c60bed57d3ed89daab907918",
    "overlap": "1680a0dbab88ec79e5bdb5b8fd5dfbf6bb859e1b8ae0a2f8c59969cdb59ac373",
    "recurrent": "d3bb5863da5667097f9e724a9a83cfb20a4864ea38d1d474dd3c2b6ad54578ee",
    "rnd": "668ae5d9de725e957d7a5adf88d80f96f33822aee0f4134b994bc2879c20fb41",
    "symmetry": "47cbf925a7e2853059c45723aef1c3f88527a042644a5a3dc629a463a033696e",
    "target_kl_div": "3ae69fc8f7bf23c4cb05562a9d16fdf028055f8648ae9fe3c8f62196d83c45a3",
}
_MIRROR = {
    "data_augmentation_func": Pendulum.mirror,
    "use_data_augmentation": True,
    "use_mirror_loss": True,
    "mirror_loss_coeff": 1.0,
}
_RND = {
    "weight": 0.5,
    "predictor_hidden_dims": [32],
    "target_hidden_dims": [32],
    "num_outputs": 4,
    "state_normalization": True,
    "reward_normalization": True,
}
TRAINING_PATHS = {
    "eager": (CartPole, {}),
    "accumulate_grads": (CartPole, {"accumulate_grads": True, "sgd_minibatch_size": 16}),
    "desired_kl": (Pendulum, {"desired_kl": 0.001, "lr": 1e-2}),
    "target_kl_div": (CartPole, {"target_kl_div": 1e-4, "lr": 1e-2, "num_sgd_iters": 4}),
    "normalizers": (Pendulum, {"normalize_observations": True, "normalize_rewards": True}),
    "recurrent": (CartPole, {"model_cls": "rl8.policies.recurrent.LSTMModel", "seq_len": 4}),
    "symmetry": (Pendulum, {"symmetry": _MIRROR}),
    "rnd": (CartPole, {"rnd": _RND}),
    "overlap": (CartPole, {"collect_mode": "overlap"}),
}


def parameters_digest(algo: PPO) -> str:
    """sha256 of the policy's and RND's weights, the optimizer's moments and its lr."""
    digest = hashlib.sha256()
    tensors = dict(algo.policy.state_dict())
    if algo.rnd is not None:
        tensors.update({f"rnd.{k}": v for k, v in algo.rnd.state_dict().items()})
    for i, state in algo.optimizer.state_dict()["state"].items():
        tensors.update({f"optimizer.{i}.{k}": v for k, v in state.items()})
    for name, tensor in tensors.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(repr(algo.optimizer.param_groups[0]["lr"]).encode())
    return digest.hexdigest()


def trained_digest(path: str) -> str:
    env_cls, options = TRAINING_PATHS[path]
    algo = PPO(env_cls, **{**SMALL, **options})
    for _ in range(3):
        algo.collect()
        algo.update()
    algo.close()
    return parameters_digest(algo)


@pytest.mark.parametrize("path", sorted(TRAINING_PATHS))
def test_every_training_path_trains_as_recorded(path, one_torch_thread):
    # one intra-op thread, as the digests were recorded: the order of torch's reductions (so
    # the last bits of every weight) depends on the thread count
    assert trained_digest(path) == RECORDED_PARAMETERS[path]


def test_updates_count_the_update_calls_and_steps_still_answers():
    algo = PPO(CartPole, **SMALL)
    for _ in range(2):
        algo.collect()
        algo.update()
    assert algo.updates == 2 and algo.env_steps == 2 * hparams.STEP
    assert algo.state_dict()["counters"]["steps"] == 2  # the checkpoint's name, as before
    with pytest.warns(DeprecationWarning, match="PPO.steps is renamed PPO.updates"):
        assert algo.steps == 2
    with pytest.warns(DeprecationWarning, match="PPO.steps is renamed PPO.updates"):
        algo.steps = 5
    assert algo.updates == 5
