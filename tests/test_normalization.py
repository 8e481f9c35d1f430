"""Running statistics: exact against batch statistics, mergeable across processes."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rl8.policies.normalization import ObservationNormalizer, RunningMeanStd
from rl8.ppo.rewards import RewardNormalizer


def test_running_mean_std_equals_batch_statistics():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(1000, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2.0
    rms = RunningMeanStd((3,))
    for chunk in data.split(137):
        rms.update(chunk)
    torch.testing.assert_close(rms.mean, data.double().mean(0))
    torch.testing.assert_close(rms.var, data.double().var(0, unbiased=False))
    assert rms.count.item() == 1000


def test_merge_of_two_halves_equals_whole():
    data = torch.randn(500, 2, dtype=torch.float64)
    a, b, whole = RunningMeanStd((2,)), RunningMeanStd((2,)), RunningMeanStd((2,))
    a.update(data[:200])
    b.update(data[200:])
    whole.update(data)
    a.merge_(b.mean, b.var, b.count)
    torch.testing.assert_close(a.mean, whole.mean)
    torch.testing.assert_close(a.var, whole.var)


def test_observation_normalizer_skips_masks_and_integers():
    obs = TensorDict(
        {
            "x": torch.randn(64, 2) * 3 + 1,
            "action_mask": torch.ones(64, 4, dtype=torch.bool),
            "i": torch.arange(64),
        },
        batch_size=[64],
    )
    norm = ObservationNormalizer(obs[:1])
    norm.update(obs)
    out = norm(obs)
    assert out["action_mask"].dtype == torch.bool
    assert torch.equal(out["i"], obs["i"])
    torch.testing.assert_close(out["x"].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["x"].std(0, unbiased=False), torch.ones(2), atol=1e-4, rtol=0)


def fold_returns(norm: RewardNormalizer, rewards: torch.Tensor, dones: torch.Tensor | None) -> None:
    """The plain reference of what a collect does to the reward normaliser: advance the running
    returns over ``rewards`` ``[num_envs, T]`` and fold every one into the statistics."""
    norm.stats.update(norm.advance(rewards, dones).reshape(-1))


def test_reward_normalizer_tracks_discounted_return():
    norm = RewardNormalizer(num_envs=2, gamma=0.5)
    rewards = torch.ones(2, 3)
    dones = torch.tensor([[False, True, False], [False, False, False]])
    fold_returns(norm, rewards, dones)
    # env 0: 1, 1.5, (reset) 1 ; env 1: 1, 1.5, 1.75
    seen = torch.tensor([1.0, 1.5, 1.0, 1.0, 1.5, 1.75], dtype=torch.float64)
    torch.testing.assert_close(norm.stats.var, seen.var(unbiased=False))
    torch.testing.assert_close(norm.returns, torch.tensor([1.0, 1.75]))
    scaled = norm(torch.ones(2, 1))
    torch.testing.assert_close(
        scaled, torch.ones(2, 1) / (seen.var(unbiased=False).sqrt().float()), rtol=1e-4, atol=0
    )


def test_reward_normalizer_vectorised_path_matches_the_recurrence():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(7, 40, generator=g)
    fast, slow = RewardNormalizer(7, 0.97), RewardNormalizer(7, 0.97)
    for _ in range(3):  # carries the running return across collects
        fold_returns(fast, rewards, None)
        fold_returns(slow, rewards, torch.zeros(7, 40, dtype=torch.bool))
    torch.testing.assert_close(fast.returns, slow.returns, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.stats.var, slow.stats.var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.stats.mean, slow.stats.mean, rtol=1e-5, atol=1e-6)


def test_host_merge_of_moments_matches_the_device_merge():
    """PPO folds the reward normaliser's batch moments in on the host (merge_moments_); the
    result equals RunningMeanStd.update over the same samples, and the plain statistics."""
    g = torch.Generator().manual_seed(5)
    batches = [
        torch.randn(300, generator=g, dtype=torch.float64) * s + m
        for s, m in ((1.0, 5.0), (3.0, -2.0), (0.1, 40.0))
    ]
    device_side, host_side = RunningMeanStd(), RunningMeanStd()
    for x in batches:
        device_side.update(x)
        current = (host_side.mean.item(), host_side.var.item(), host_side.count.item())
        host_side.merge_moments_(current, float(x.numel()), x.sum().item(), x.square().sum().item())
    everything = torch.cat(batches)
    for stats in (device_side, host_side):
        torch.testing.assert_close(stats.mean, everything.mean(), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(stats.var, everything.var(unbiased=False), rtol=1e-9, atol=1e-9)
        assert stats.count.item() == everything.numel()


def test_ppo_reward_statistics_cover_every_running_return():
    """After several collects the reward normaliser's statistics are those of every running
    return PPO has seen (episodic env: returns restart after each episode end)."""
    from rl8 import PPO
    from rl8.envs import CartPole

    algo = PPO(
        CartPole, num_envs=8, horizon=16, sgd_minibatch_size=32, seed=0, horizons_per_env_reset=-1
    )
    reference = RewardNormalizer(8, algo.hparams.gamma)
    for _ in range(3):
        algo.collect()
        data = algo.buffer.data
        dones = data["terminated"][:, :16] | data["truncated"][:, :16]
        fold_returns(reference, data["rewards"][:, :16], dones)
    stats = algo.reward_normalizer.stats
    torch.testing.assert_close(stats.mean, reference.stats.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(stats.var, reference.stats.var, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(algo.reward_normalizer.returns, reference.returns)


def test_reward_normalizer_merges_returns_moments_read_back():
    """returns_moments + merge_returns_moments fold a collect's running returns into the
    statistics exactly like fold_returns (the plain reference) does."""
    from rl8.ppo.distributed import DistContext
    from rl8.ppo.stats import reduce_stats

    torch.manual_seed(0)
    rewards = torch.randn(4, 6)
    a, b = RewardNormalizer(4, 0.9), RewardNormalizer(4, 0.9)
    fold_returns(a, rewards, None)
    seen = b.advance(rewards, None)
    sums, local = b.returns_moments(seen)
    b.merge_returns_moments(reduce_stats(DistContext(), sums=sums, local=local), float(seen.numel()))
    torch.testing.assert_close(b.stats.mean, a.stats.mean)
    torch.testing.assert_close(b.stats.var, a.stats.var)
    assert b.stats.count.item() == a.stats.count.item() == 24
