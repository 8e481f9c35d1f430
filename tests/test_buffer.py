"""GAE against a plain per-env Python reference, and the buffer layout."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.ppo.buffer import RolloutBuffer, compute_gae, minibatches, normalized_advantages
from rl8.ppo.distributed import DistContext


def reference_gae(rewards, values, terminated, truncated, final_values, gamma, lam):
    """Textbook GAE, one env and one step at a time, with Python floats."""
    n, t_len = rewards.shape
    adv = torch.zeros(n, t_len, dtype=torch.float64)
    for i in range(n):
        running = 0.0
        for t in reversed(range(t_len)):
            if terminated[i, t]:
                next_value, cont = 0.0, 0.0
            elif truncated[i, t]:
                next_value, cont = float(final_values[i, t]), 0.0
            else:
                next_value, cont = float(values[i, t + 1]), 1.0
            delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
            running = delta + gamma * lam * cont * running
            adv[i, t] = running
    return adv, adv + values[:, :-1].double()


def test_gae_matches_reference_with_terminations_and_truncations():
    g = torch.Generator().manual_seed(0)
    n, t_len = 16, 40
    rewards = torch.randn(n, t_len, generator=g)
    values = torch.randn(n, t_len + 1, generator=g)
    final_values = torch.randn(n, t_len, generator=g)
    u = torch.rand(n, t_len, generator=g)
    terminated = u < 0.08
    truncated = u > 0.92
    assert terminated.any() and truncated.any()
    adv, ret = compute_gae(
        rewards,
        values,
        gamma=0.97,
        gae_lambda=0.9,
        terminated=terminated,
        truncated=truncated,
        final_values=final_values,
    )
    ref_adv, ref_ret = reference_gae(rewards, values, terminated, truncated, final_values, 0.97, 0.9)
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)


def test_gae_infinite_horizon_bootstraps_from_last_value():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(4, 10, generator=g)
    values = torch.randn(4, 11, generator=g)
    none = torch.zeros(4, 10, dtype=torch.bool)
    adv, _ = compute_gae(rewards, values, gamma=0.99, gae_lambda=0.95)
    ref, _ = reference_gae(rewards, values, none, none, None, 0.99, 0.95)
    torch.testing.assert_close(adv.double(), ref, atol=1e-5, rtol=1e-5)


def test_gae_lambda_one_gives_discounted_returns():
    rewards = torch.ones(1, 3)
    values = torch.zeros(1, 4)
    adv, ret = compute_gae(rewards, values, gamma=0.5, gae_lambda=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.75, 1.5, 1.0]]))


def test_truncation_bootstraps_final_value_not_reset_obs_value():
    rewards = torch.zeros(1, 2)
    values = torch.tensor([[0.0, 100.0, 0.0]])  # value of the reset obs after step 0
    truncated = torch.tensor([[True, False]])
    terminated = torch.zeros(1, 2, dtype=torch.bool)
    final_values = torch.tensor([[7.0, 0.0]])
    adv, _ = compute_gae(
        rewards,
        values,
        gamma=1.0,
        gae_lambda=1.0,
        terminated=terminated,
        truncated=truncated,
        final_values=final_values,
    )
    assert adv[0, 0].item() == 7.0


def test_buffer_layout():
    buf = RolloutBuffer(
        spaces.Dict({"x": spaces.Box(-1, 1, (3,)), "action_mask": spaces.MultiBinary(2)}),
        (),
        torch.int64,
        num_envs=5,
        horizon=7,
        episodic=True,
    )
    assert tuple(buf.data.batch_size) == (5, 8)
    assert buf["obs"]["x"].shape == (5, 8, 3)
    assert buf["final_obs"]["x"].shape == (5, 8, 3)
    assert buf["actions"].dtype == torch.int64
    assert buf["terminated"].dtype == torch.bool
    assert set(buf.data.keys()) == {
        "obs",
        "actions",
        "logp",
        "values",
        "rewards",
        "terminated",
        "truncated",
        "final_obs",
    }
    plain = RolloutBuffer(spaces.Box(-1, 1, (2,)), (1,), torch.float32, num_envs=3, horizon=4)
    assert "terminated" not in plain.data.keys()


def test_buffer_columns_are_contiguous_rows_of_the_env_major_view():
    """Tensor columns are stored step by step: each per-step view the rollout loop writes is
    contiguous, and writing it fills column t of the [num_envs, horizon + 1] data."""
    n, h = 4, 3
    buf = RolloutBuffer(spaces.Box(-1, 1, (2,)), (), torch.int64, num_envs=n, horizon=h, episodic=True)
    for key in ("obs", "actions", "logp", "values", "rewards", "terminated", "truncated", "final_obs"):
        data = buf[key]
        assert data.shape[:2] == (n, h + 1)
        for t, view in enumerate(buf.columns[key]):
            assert view.is_contiguous(), (key, t)
            assert view.data_ptr() == data[:, t].data_ptr()
    for t in range(h + 1):
        buf.columns["values"][t].copy_(torch.arange(n) + 10.0 * t)
        buf.columns["obs"][t].copy_(torch.full((n, 2), float(t)))
        buf.columns["rewards"][t].copy_(torch.arange(n, dtype=torch.float32)[:, None])
    expected = torch.arange(n)[:, None] + 10.0 * torch.arange(h + 1)[None, :]
    assert torch.equal(buf["values"], expected)
    assert torch.equal(buf["obs"][:, :, 0], torch.arange(h + 1.0).expand(n, h + 1))
    assert torch.equal(buf["rewards"], torch.arange(n, dtype=torch.float32)[:, None].expand(n, h + 1))
    # flattening for minibatches keeps the env-major sample order
    assert torch.equal(buf["values"][:, :h].reshape(-1), expected[:, :h].reshape(-1))


def test_gae_with_only_terminations_or_only_truncations():
    g = torch.Generator().manual_seed(2)
    n, t_len = 8, 24
    rewards = torch.randn(n, t_len, generator=g)
    values = torch.randn(n, t_len + 1, generator=g)
    final_values = torch.randn(n, t_len, generator=g)
    flags = torch.rand(n, t_len, generator=g) < 0.1
    none = torch.zeros(n, t_len, dtype=torch.bool)
    adv, _ = compute_gae(rewards, values, gamma=0.9, gae_lambda=0.8, terminated=flags)
    ref, _ = reference_gae(rewards, values, flags, none, None, 0.9, 0.8)
    torch.testing.assert_close(adv.double(), ref, atol=1e-5, rtol=1e-5)
    adv, _ = compute_gae(
        rewards, values, gamma=0.9, gae_lambda=0.8, truncated=flags, final_values=final_values
    )
    ref, _ = reference_gae(rewards, values, none, flags, final_values, 0.9, 0.8)
    torch.testing.assert_close(adv.double(), ref, atol=1e-5, rtol=1e-5)


def reference_minibatches(samples, num_minibatches, num_passes, shuffle, generator):
    """The plain reference: each pass permutes the whole batch, normalises its advantages per
    minibatch, weights them, then splits it."""
    for _ in range(num_passes):
        n = samples.batch_size[0]
        batch = samples[torch.randperm(n, generator=generator)] if shuffle else samples.clone()
        batch["advantages"] = normalized_advantages(batch["advantages"], num_minibatches, DistContext())
        batch["advantages"] = batch["advantages"] * batch["advantage_weights"]
        yield from batch.split(n // num_minibatches)


@pytest.mark.parametrize("shuffle", [True, False])
def test_minibatches_gathered_one_by_one_agree_with_splitting_the_shuffled_batch(shuffle):
    n = 24
    samples = TensorDict(
        {
            "obs": torch.randn(n, 3),
            "actions": torch.randn(n, 1),
            "advantages": torch.randn(n),
            "advantage_weights": torch.rand(n),
        },
        batch_size=[n],
    )
    before = samples.clone()
    got = minibatches(
        samples,
        4,
        num_passes=3,
        seq_len=1,
        shuffle=shuffle,
        normalize_advantages="minibatch",
        dist=DistContext(),
        generator=torch.Generator().manual_seed(3),
    )
    expected = reference_minibatches(samples, 4, 3, shuffle, torch.Generator().manual_seed(3))
    pairs = list(zip(got, expected, strict=True))
    assert len(pairs) == 12
    for mb, ref in pairs:
        assert mb.batch_size == ref.batch_size == torch.Size([6])
        for key in ("obs", "actions", "advantages"):
            torch.testing.assert_close(mb[key], ref[key], rtol=0, atol=0)
    # the samples themselves are left as they were (the advantages are replaced per minibatch)
    assert (samples == before).all()
