"""Running statistics: exact against batch statistics, mergeable across processes."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rl8.normalization import ObservationNormalizer, RewardNormalizer, RunningMeanStd


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
    a.update(data[:200]); b.update(data[200:]); whole.update(data)
    a.merge_(b.mean, b.var, b.count)
    torch.testing.assert_close(a.mean, whole.mean)
    torch.testing.assert_close(a.var, whole.var)


def test_observation_normalizer_skips_masks_and_integers():
    obs = TensorDict(
        {"x": torch.randn(64, 2) * 3 + 1, "action_mask": torch.ones(64, 4, dtype=torch.bool),
         "i": torch.arange(64)},
        batch_size=[64],
    )
    norm = ObservationNormalizer(obs[:1])
    norm.update(obs)
    out = norm(obs)
    assert out["action_mask"].dtype == torch.bool
    assert torch.equal(out["i"], obs["i"])
    torch.testing.assert_close(out["x"].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["x"].std(0, unbiased=False), torch.ones(2), atol=1e-4, rtol=0)


def test_reward_normalizer_tracks_discounted_return():
    norm = RewardNormalizer(num_envs=2, gamma=0.5)
    rewards = torch.ones(2, 3)
    dones = torch.tensor([[False, True, False], [False, False, False]])
    norm.update(rewards, dones)
    # env 0: 1, 1.5, (reset) 1 ; env 1: 1, 1.5, 1.75
    seen = torch.tensor([1.0, 1.5, 1.0, 1.0, 1.5, 1.75], dtype=torch.float64)
    torch.testing.assert_close(norm.stats.var, seen.var(unbiased=False))
    torch.testing.assert_close(norm.returns, torch.tensor([1.0, 1.75]))
    scaled = norm(torch.ones(2, 1))
    torch.testing.assert_close(scaled, torch.ones(2, 1) / (seen.var(unbiased=False).sqrt().float()), rtol=1e-4, atol=0)


def test_reward_normalizer_vectorised_path_matches_the_recurrence():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(7, 40, generator=g)
    fast, slow = RewardNormalizer(7, 0.97), RewardNormalizer(7, 0.97)
    for _ in range(3):  # carries the running return across collects
        fast.update(rewards, None)
        slow.update(rewards, torch.zeros(7, 40, dtype=torch.bool))
    torch.testing.assert_close(fast.returns, slow.returns, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.stats.var, slow.stats.var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.stats.mean, slow.stats.mean, rtol=1e-5, atol=1e-6)
