"""hparam rnd (rsl_rl 5's rnd_cfg): the intrinsic reward, its weight schedule and
normalisation, the predictor's training, the stats and the checkpoint round trip."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from envs.sim_fakes import PointMassVecEnv
from group_envs import GroupCartPole
from gymnasium import spaces

from rl8 import PPO, HParams
from rl8.envs import CartPole, Pendulum
from rl8.envs.base import Env
from rl8.ppo.buffer import compute_gae
from rl8.ppo.rnd import RandomNetworkDistillation

SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=32, num_sgd_iters=2, seed=0)
RND = {"weight": 0.5, "predictor_hidden_dims": [32], "target_hidden_dims": [32], "num_outputs": 4}


def test_the_intrinsic_reward_is_the_embedding_distance_of_the_states_reached():
    algo = PPO(Pendulum, **SMALL, rnd=RND)
    algo.collect()
    next_obs = algo.buffer.data["obs"][:, 1:]  # as rsl_rl: the observation after each step
    rnd = algo.rnd
    with torch.no_grad():
        distance = (rnd.target(next_obs) - rnd.predictor(next_obs)).norm(dim=-1)
    torch.testing.assert_close(algo.intrinsic_rewards, 0.5 * distance)
    assert [p.requires_grad for p in rnd.target.parameters()] == [False] * 4


def test_the_intrinsic_reward_goes_into_the_advantages():
    """GAE is linear in the rewards: the advantages with RND are those without plus the GAE of
    the intrinsic rewards over zero values."""
    algo = PPO(CartPole, **SMALL, rnd=RND)
    algo.collect()
    with torch.no_grad():
        with_rnd, _ = algo.compute_advantages()
        intrinsic, algo.intrinsic_rewards = algo.intrinsic_rewards, None
        without, _ = algo.compute_advantages()
        data = algo.buffer.data
        expected, _ = compute_gae(
            intrinsic,
            torch.zeros_like(data["values"]),
            gamma=algo.hparams.gamma,
            gae_lambda=algo.hparams.gae_lambda,
            terminated=data["terminated"][:, :8],
            truncated=data["truncated"][:, :8],
            final_values=torch.zeros_like(intrinsic),
        )
    torch.testing.assert_close(with_rnd - without, expected)


@pytest.mark.parametrize(
    "schedule, weights",
    [
        (None, [0.5] * 8),
        ({"mode": "constant"}, [0.5] * 8),
        ({"mode": "step", "final_step": 4, "final_value": 2.0}, [0.5] * 3 + [2.0] * 5),
        (
            {"mode": "linear", "initial_step": 2, "final_step": 6, "final_value": 2.5},
            [0.5, 0.5, 1.0, 1.5, 2.0, 2.5, 2.5, 2.5],
        ),
    ],
)
def test_the_weight_schedule_counts_env_steps_per_env_as_rsl_rl(schedule, weights):
    rnd = RandomNetworkDistillation(
        {**RND, "weight_schedule": schedule}, Pendulum.observation_space, step_dt=None, device="cpu"
    )
    assert [rnd.weight_at(step) for step in range(1, 9)] == pytest.approx(weights)
    scheduled = PPO(Pendulum, **SMALL, rnd={**RND, "weight_schedule": schedule})
    constant = PPO(Pendulum, **SMALL, rnd=RND)  # the same networks: the same seed
    for algo in (scheduled, constant, scheduled, constant):  # the second collect: steps 9 to 16
        algo.collect()
    ratio = scheduled.intrinsic_rewards / constant.intrinsic_rewards
    expected = torch.tensor([rnd.weight_at(step) / 0.5 for step in range(9, 17)])
    torch.testing.assert_close(ratio, expected.expand(16, 8))


def test_reward_normalization_divides_by_the_std_of_the_discounted_sum():
    config = {**RND, "weight": 1.0, "reward_normalization": True}
    raw = RandomNetworkDistillation(
        {**RND, "weight": 1.0}, Pendulum.observation_space, step_dt=None, device="cpu"
    )
    normalized = RandomNetworkDistillation(
        config, Pendulum.observation_space, step_dt=None, device="cpu"
    )
    normalized.load_state_dict(raw.state_dict(), strict=False)
    obs = torch.randn(5, 6, 3, generator=torch.Generator().manual_seed(0))
    rewards = raw.rewards(obs, 0)
    discounted, seen, expected = torch.zeros(5, dtype=torch.float64), [], []
    for k in range(6):
        discounted = 0.99 * discounted + rewards[:, k].double()
        seen.append(discounted)
        expected.append(rewards[:, k] / torch.cat(seen).var(unbiased=False).sqrt().float())
    torch.testing.assert_close(normalized.rewards(obs, 0), torch.stack(expected, 1))


def test_state_normalization_uses_the_moments_of_the_rollouts_after_each_update():
    algo = PPO(Pendulum, **SMALL, rnd={**RND, "state_normalization": True})
    algo.collect()
    algo.update()
    obs = algo.buffer.data["obs"][:, :8].reshape(-1, 3).double()
    normalizer = algo.rnd.state_normalizer
    torch.testing.assert_close(normalizer.mean, obs.mean(0))
    torch.testing.assert_close(normalizer.var, obs.var(0, unbiased=False))
    x = obs[:4].float()
    expected = (x - obs.mean(0).float()) / (obs.var(0, unbiased=False).sqrt().float() + 1e-2)
    torch.testing.assert_close(algo.rnd.state(x), expected)


def test_the_predictor_learns_the_target_and_the_intrinsic_reward_fades():
    algo = PPO(Pendulum, **{**SMALL, "num_sgd_iters": 8}, rnd={**RND, "learning_rate": 1e-2})
    algo.collect()
    first, first_reward = algo.update()["losses/rnd"], algo.intrinsic_rewards.mean()
    for _ in range(3):
        algo.collect()
        last = algo.update()["losses/rnd"]
    assert last < 0.2 * first
    assert algo.intrinsic_rewards.mean() < 0.5 * first_reward


def test_stats_report_the_intrinsic_rewards_and_the_rnd_loss_beside_the_envs_rewards():
    plain, curious = PPO(CartPole, **SMALL), PPO(CartPole, **SMALL, rnd=RND)
    a, b = plain.collect(), curious.collect()
    assert {k: v for k, v in b.items() if not k.startswith("rewards/intrinsic_")} == pytest.approx(
        a, nan_ok=True
    )
    intrinsic = curious.intrinsic_rewards.double()
    assert b["rewards/intrinsic_mean"] == pytest.approx(intrinsic.mean().item())
    assert b["rewards/intrinsic_std"] == pytest.approx(intrinsic.std(unbiased=False).item())
    update = curious.update()
    assert update["losses/rnd"] > 0 and "losses/rnd" not in plain.update()


def test_the_rnd_state_is_checkpointed_and_resumed_weights_only():
    config = {**RND, "state_normalization": True, "reward_normalization": True}
    algo = PPO(Pendulum, **SMALL, rnd=config)
    for _ in range(2):
        algo.collect()
        algo.update()
    saved = io.BytesIO()
    torch.save(algo.state_dict(), saved)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    again = PPO(Pendulum, **{**SMALL, "seed": 1}, rnd=config)  # another random target
    again.load_state_dict(state)
    for a in (algo, again):
        a.collect()
    torch.testing.assert_close(again.intrinsic_rewards, algo.intrinsic_rewards)
    assert again.update() == algo.update()
    with pytest.raises(ValueError, match=r"hparam rnd is on, but the state has no 'rnd' entry"):
        again.load_state_dict({**state, "rnd": None})


def test_state_groups_follow_rsl_rls_fallbacks():
    default = PPO(GroupCartPole, **SMALL, rnd=RND)  # no rnd_state group: the policy group
    assert default.rnd.groups == ("policy",)
    chosen = PPO(GroupCartPole, **SMALL, rnd={**RND, "state_groups": ["critic"]})
    assert chosen.rnd.groups == ("critic",) and chosen.rnd.predictor[0].in_features == 5
    chosen.collect()
    assert chosen.update()["losses/rnd"] > 0
    with pytest.raises(
        ValueError,
        match=r"hparam rnd\['state_groups'\]: the observation has no group 'rnd' \(its groups: "
        r"\['critic', 'policy'\]\)",
    ):
        PPO(GroupCartPole, **SMALL, rnd={**RND, "state_groups": ["rnd"]})
    with pytest.raises(
        ValueError, match=r"hparam rnd\['state_groups'\]: needs a Dict observation space"
    ):
        PPO(CartPole, **SMALL, rnd={**RND, "state_groups": ["policy"]})


def test_the_weight_is_scaled_by_the_envs_step_dt_as_rsl_rl():
    vec_env = PointMassVecEnv(4)
    vec_env.step_dt = 0.02  # Isaac Lab's and mjlab's envs say it
    algo = PPO(vec_env, horizon=8, seed=0, rnd={**RND, "scale_by_step_dt": True})
    assert algo.rnd.weight == pytest.approx(0.5 * 0.02)
    with pytest.raises(
        ValueError, match=r"hparam rnd\['scale_by_step_dt'\]: True, but the env has no step_dt"
    ):
        PPO(CartPole, **SMALL, rnd={**RND, "scale_by_step_dt": True})


@pytest.mark.parametrize(
    "rnd, match",
    [
        (
            {"wieght": 1.0},
            r"hparam rnd: unknown key 'wieght'; did you mean 'weight'\? \(expected keys among "
            r"\['weight', 'weight_schedule',.*\]\), got \{'wieght': 1.0\}",
        ),
        ({"reward_normalization": 1}, r"hparam rnd\['reward_normalization'\]: expected a bool, got 1"),
        (
            {"state_groups": []},
            r"hparam rnd\['state_groups'\]: expected None or a non-empty list of observation groups, "
            r"got \[\]",
        ),
        ({"weight": -1}, r"hparam rnd\['weight'\]: expected a number >= 0, got -1"),
        ({"learning_rate": 0}, r"hparam rnd\['learning_rate'\]: expected a number > 0, got 0"),
        ({"num_outputs": 0}, r"hparam rnd\['num_outputs'\]: expected an int >= 1, got 0"),
        (
            {"predictor_hidden_dims": [0]},
            r"hparam rnd\['predictor_hidden_dims'\]: expected a list of ints >= 1 or -1",
        ),
        ({"activation": "relu6"}, r"hparam rnd\['activation'\]: expected one of \["),
        ({"activation": ["elu"]}, r"hparam rnd\['activation'\]: expected one of \[.*\], got \['elu'\]"),
        (
            {"weight_schedule": {"mode": "cosine"}},
            r"hparam rnd\['weight_schedule'\]: expected None or a dict with 'mode' one of "
            r"\['constant', 'step', 'linear'\], got \{'mode': 'cosine'\}",
        ),
        (
            {"weight_schedule": {"mode": "step", "final_value": 1.0}},
            r"hparam rnd\['weight_schedule'\]\['final_step'\]: missing \(mode 'step' takes "
            r"\['final_step', 'final_value'\]\)",
        ),
        (
            {
                "weight_schedule": {
                    "mode": "linear",
                    "initial_step": 5,
                    "final_step": 5,
                    "final_value": 0,
                }
            },
            r"hparam rnd\['weight_schedule'\]\['final_step'\]: expected an int > initial_step=5, got 5",
        ),
        (0.5, r"hparam rnd: expected None or a dict"),
    ],
)
def test_bad_rnd_hparams_name_the_field(rnd, match):
    with pytest.raises(ValueError, match=match):
        HParams(rnd=rnd)


def test_rnd_hparams_round_trip_through_plain_values():
    hp = HParams(rnd={**RND, "weight_schedule": {"mode": "step", "final_step": 10, "final_value": 0.0}})
    assert HParams.from_config(hp.to_plain()).rnd == hp.rnd


class Chain(Env):
    """A corridor of ``length`` cells seen as one-hot vectors: every episode starts in cell 0,
    action 1 moves right and 0 left; the only reward, 1.0, is for reaching the last cell (which
    ends the episode); episodes are truncated after ``max_steps`` steps. A uniformly random walk
    reaches the end of 32 cells within 48 steps about once in a million episodes."""

    episodic = True
    action_space = spaces.Discrete(2)

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", length=32, max_steps=48):
        super().__init__(num_envs, horizon, device=device)
        self.length, self.max_steps = length, max_steps
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self._generator = self.make_generator()
        self.cell = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.t = torch.zeros_like(self.cell)

    def _observe(self, cell):
        return torch.nn.functional.one_hot(cell, self.length).float()

    def reset(self, *, config=None, seed=None):
        self.apply_config(config, {})  # no config keys
        if seed is not None:
            self._generator.manual_seed(seed)
        self.cell.zero_()
        self.t.zero_()
        return self._observe(self.cell)

    def step(self, action):
        cell = (self.cell + 2 * action.reshape(-1) - 1).clamp(0, self.length - 1)
        self.t += 1
        terminated = cell == self.length - 1
        truncated = (self.t >= self.max_steps) & ~terminated
        done = terminated | truncated
        self.cell = cell.masked_fill(done, 0)
        self.t.masked_fill_(done, 0)
        return self.step_output(
            {
                "obs": self._observe(self.cell),
                "rewards": terminated.float().unsqueeze(1),
                "terminated": terminated.unsqueeze(1),
                "truncated": truncated.unsqueeze(1),
                "final_obs": self._observe(cell),
            }
        )


def env_steps_to_reach_the_end(rnd, budget):
    """Env steps until the mean return of the episodes ending in a collect reaches 0.9 (most
    episodes reach the far end), or ``None`` within ``budget``; and whether any reward was seen."""
    # Advantages are not normalised: normalised, the value's noise alone drifts PPO's policy
    # (the same way in every cell), which crosses the corridor on some seeds; here PPO without
    # an intrinsic reward has nothing to learn from until an episode reaches the end.
    algo = PPO(
        Chain,
        num_envs=64,
        horizon=32,
        sgd_minibatch_size=512,
        num_sgd_iters=4,
        lr=1e-3,
        gamma=0.99,
        normalize_advantages=False,
        model_config={"hiddens": [64, 64]},
        seed=0,
        rnd=rnd,
    )
    rewarded = False
    while algo.env_steps < budget:
        returns = algo.collect()["episodes/return_mean"]  # NaN when no episode ended
        rewarded = rewarded or returns > 0
        if returns >= 0.9:
            return algo.env_steps, rewarded
        algo.update()
    return None, rewarded


def test_rnd_crosses_a_sparse_corridor_that_ppo_alone_never_does():
    # seeds 0-5 with RND: 18,432-30,720 env steps (this one, seed 0: 26,624); without: no
    # reward in 300,000 env steps on seeds 0-3, nor in 100,000 on seeds 4 and 5
    rnd = {
        "weight": 1.0,
        "reward_normalization": True,
        "state_normalization": True,
        "predictor_hidden_dims": [64],
        "target_hidden_dims": [64],
        "num_outputs": 16,
    }
    steps, _ = env_steps_to_reach_the_end(rnd, budget=100_000)
    assert steps is not None and steps <= 100_000
    steps, rewarded = env_steps_to_reach_the_end(None, budget=100_000)
    assert steps is None and not rewarded
