"""rsl_rl's adaptive learning rate (hparam ``desired_kl``): the rule, its application per
minibatch with that minibatch's KL (the mean over ranks), checkpoints, the compiled fused step,
errors, and a short learning check."""

from __future__ import annotations

import copy

import pytest
import torch

from rl8 import PPO
from rl8.envs import CartPole, Pendulum
from rl8.ppo.losses import adaptive_lr

TINY = dict(num_envs=16, horizon=32, num_sgd_iters=2, num_minibatches=4, seed=0, device="cpu")


@pytest.mark.parametrize(
    "lr, kl, expected",
    [
        (1e-3, 0.05, 1e-3 / 1.5),  # above 2 * desired_kl: down
        (1e-3, 0.001, 1.5e-3),  # below desired_kl / 2: up
        (1e-3, 0.0, 1e-3),  # no KL measured (the policy unchanged): kept, as rsl_rl does
        (1e-3, 0.02, 1e-3),
        (1e-3, 0.005, 1e-3),
        (1e-3, 0.01, 1e-3),  # within [d/2, 2d]: kept
        (1.2e-5, 1.0, 1e-5),
        (9e-3, 1e-6, 1e-2),  # clamped to [1e-5, 1e-2]
        (5e-2, 0.01, 5e-2),  # a start above the bound stays until the KL moves it
    ],
)
def test_the_rule(lr, kl, expected):
    new = adaptive_lr(torch.tensor(lr, dtype=torch.float64), torch.tensor(kl, dtype=torch.float64), 0.01)
    assert new.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("desired_kl, direction", [(1e-6, "down"), (1.0, "up")])
def test_applied_per_minibatch_with_its_kl(desired_kl, direction):
    """Each optimizer step runs at the lr that the rule gives from the previous lr and the KL of
    that step's own minibatch, averaged over ranks (here the update step's ``mean_over_ranks``
    is watched)."""
    algo = PPO(Pendulum, **TINY, lr=1e-3, desired_kl=desired_kl)
    kls, step_lrs = [], []
    mean_over_ranks = algo.update_step.mean_over_ranks
    algo.update_step.mean_over_ranks = lambda value: kls.append(mean_over_ranks(value)) or kls[-1]
    step = algo.optimizer.step
    algo.optimizer.step = lambda *a, **k: (
        step_lrs.append(algo.optimizer.param_groups[0]["lr"]) or step(*a, **k)
    )
    algo.collect()
    stats = algo.update()
    assert len(kls) == len(step_lrs) == 8  # 2 passes of 4 minibatches
    lr = torch.tensor(1e-3, dtype=torch.float64)
    for kl, used in zip(kls, step_lrs):
        lr = adaptive_lr(lr, torch.tensor(kl, dtype=torch.float64), desired_kl)
        assert used == lr.item()
    assert (step_lrs[-1] < 1e-3) if direction == "down" else (step_lrs[-1] > 1e-3)
    assert stats["coefficients/lr"] == step_lrs[-1]  # the lr the next update starts from


def test_the_adapted_lr_is_kept_in_checkpoints():
    algo = PPO(Pendulum, **TINY, lr=1e-3, desired_kl=1e-6)
    for _ in range(2):
        algo.collect()
        algo.update()
    lr = algo.optimizer.param_groups[0]["lr"]
    assert lr < 1e-3
    state = copy.deepcopy(algo.state_dict())
    restored = PPO(Pendulum, **state["hparams"])
    restored.load_state_dict(state)
    assert restored.optimizer.param_groups[0]["lr"] == lr
    algo.collect()
    restored.collect()
    restored_stats, stats = restored.update(), algo.update()
    assert restored_stats["coefficients/lr"] == stats["coefficients/lr"]
    assert restored_stats["losses/total"] == stats["losses/total"]


@pytest.mark.parametrize(
    "hparams, message",
    [
        (dict(desired_kl=0), "hparam desired_kl: expected a finite number > 0 or None, got 0"),
        (dict(desired_kl=-0.01), "hparam desired_kl: expected a finite number > 0 or None, got -0.01"),
        (
            dict(desired_kl=0.01, lr_schedule=[(0, 1e-3), (1000, 1e-4)]),
            "hparam desired_kl: the adaptive learning rate (desired_kl=0.01) and lr_schedule both set the learning rate",
        ),
    ],
)
def test_errors(hparams, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PPO(Pendulum, **TINY, **hparams)


@pytest.mark.slow
def test_the_fused_compiled_step_adapts_as_the_plain_one():
    kwargs = dict(TINY, lr=1e-3, desired_kl=0.002)
    plain, compiled = PPO(Pendulum, **kwargs), PPO(Pendulum, **kwargs, compile=True)
    assert compiled.compiled.train_step_kind == "fused"
    for _ in range(2):
        for algo in (plain, compiled):
            algo.collect()
        plain_stats, compiled_stats = plain.update(), compiled.update()
        assert compiled_stats["coefficients/lr"] == pytest.approx(
            plain_stats["coefficients/lr"], rel=1e-5
        )
    assert plain_stats["coefficients/lr"] != 1e-3


@pytest.mark.slow
def test_cartpole_learns_with_the_adaptive_lr():
    """rsl_rl's tuned settings (desired_kl=0.01, lr 1e-3 to start): balancing for all 200 steps of a
    deterministic evaluation within 100k env steps."""
    algo = PPO(CartPole, num_envs=32, horizon=64, seed=0, device="cpu", desired_kl=0.01, num_sgd_iters=5)
    eval_env, best = CartPole(16), 0.0
    while algo.env_steps < 100_000 and best < 199:
        algo.collect()
        algo.update()
        if algo.steps % 4 == 0:
            best = max(best, algo.evaluate(eval_env, num_steps=200)["rollout/reward_sum_mean"])
    assert best >= 199, (best, algo.env_steps)
    assert algo.optimizer.param_groups[0]["lr"] != 1e-3  # it adapted
