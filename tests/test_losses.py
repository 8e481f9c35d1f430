"""PPO's loss against its terms worked out by hand on a tiny batch."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rl8.ppo.losses import PPOLoss, ppo_loss

# Four samples: ratios 1.5 and 3.0 (above 1 + eps), 1.1 (inside) and 0.25 (below 1 - eps).
RATIOS = [1.5, 3.0, 1.1, 0.25]
ADVANTAGES = [2.0, -1.0, 3.0, -2.0]
OLD_VALUES = [0.0, 1.0, 2.0, 0.0]
VALUES = [1.0, 1.0, 3.0, -2.0]  # changes 1, 0, 1, -2 from the old values
RETURNS = [0.0, 2.0, 2.0, -3.0]
ENTROPY = [0.5, 1.0, 1.5, 1.0]


def _loss(**kwargs):
    old_logp = torch.tensor([-1.0, -2.0, -0.5, -1.5], dtype=torch.float64)
    logp = (old_logp + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_()
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    entropy = torch.tensor(ENTROPY, dtype=torch.float64, requires_grad=True)
    loss = ppo_loss(
        logp,
        values,
        entropy,
        old_logp,
        torch.tensor(ADVANTAGES, dtype=torch.float64),
        torch.tensor(OLD_VALUES, dtype=torch.float64),
        torch.tensor(RETURNS, dtype=torch.float64),
        **kwargs,
    )
    loss.total.backward()
    return loss, logp.grad, values.grad, entropy.grad


def test_terms_by_hand():
    loss, grad_logp, grad_values, grad_entropy = _loss(clip_param=0.2, vf_coeff=0.5, entropy_coeff=0.1)
    # surrogates min(r A, clip(r) A): min(3, 2.4), min(-3, -1.2), min(3.3, 3.3), min(-0.5, -1.6)
    assert loss.policy_loss.item() == pytest.approx(-(2.4 - 3.0 + 3.3 - 1.6) / 4)
    # squared errors 1, 1, 1, 1
    assert loss.value_loss.item() == pytest.approx(0.5 * 1.0)
    assert loss.entropy.item() == pytest.approx(1.0)
    kl = sum(r - 1 - math.log(r) for r in RATIOS) / 4
    assert loss.approx_kl.item() == pytest.approx(kl)
    assert loss.clip_fraction.item() == pytest.approx(3 / 4)  # all but 1.1
    assert loss.total.item() == pytest.approx(-(2.4 - 3.0 + 3.3 - 1.6) / 4 + 0.5 * 0.5 - 0.1 * 1.0)
    # d/dlogp of -mean(surrogate): -r A / 4 where the unclipped term is the minimum (samples 2
    # and 3, where it ties with the clipped one inside the range), 0 where the clipped one is
    torch.testing.assert_close(
        grad_logp, torch.tensor([0.0, 3.0 / 4, -1.1 * 3.0 / 4, 0.0], dtype=torch.float64)
    )
    # d/dV of 0.5 * 0.5 * mean((V - R)^2) = 0.5 * (V - R) / 4
    torch.testing.assert_close(
        grad_values, torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float64) * 0.5 / 4
    )
    torch.testing.assert_close(grad_entropy, torch.full((4,), -0.1 / 4, dtype=torch.float64))


def test_dual_clip_and_value_clip_by_hand():
    loss, grad_logp, grad_values, _ = _loss(clip_param=0.2, dual_clip_param=2.0, vf_clip_param=0.5)
    # negative advantages: max(surrogate, c A): max(-3, -2) = -2 (capped), max(-1.6, -4) = -1.6
    assert loss.policy_loss.item() == pytest.approx(-(2.4 - 2.0 + 3.3 - 1.6) / 4)
    assert grad_logp.tolist() == pytest.approx(
        [0.0, 0.0, -1.1 * 3.0 / 4, 0.0]
    )  # the cap passes no gradient
    # clipped values old + clip(V - old, +-0.5): 0.5, 1, 2.5, -0.5; their errors 0.5, -1, 0.5, 2.5;
    # max of the squares: max(1, 0.25), max(1, 1), max(1, 0.25), max(1, 6.25)
    assert loss.value_loss.item() == pytest.approx(0.5 * (1 + 1 + 1 + 6.25) / 4)
    # d/dV of 0.5 * mean(max(...)): (V - R) / 4 where the unclipped error wins; 0 for sample 4,
    # where the clipped one wins with its clamp active
    assert grad_values.tolist() == pytest.approx([1.0 / 4, -1.0 / 4, 1.0 / 4, 0.0])


def test_terms_are_named_detached_scalars():
    loss, *_ = _loss(clip_param=0.2)
    assert isinstance(loss, PPOLoss)
    assert [f.name for f in dataclasses.fields(loss)] == [
        "total",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
    ]
    for f in dataclasses.fields(loss)[1:]:
        value = getattr(loss, f.name)
        assert value.shape == () and not value.requires_grad, f.name
    assert loss.total.requires_grad


def test_gradcheck_in_double_precision():
    g = torch.Generator().manual_seed(2)
    old_logp, adv, old_values, returns = (
        torch.randn(64, generator=g, dtype=torch.float64) for _ in range(4)
    )
    logp = (old_logp + 0.4 * torch.randn(64, generator=g, dtype=torch.float64)).requires_grad_()
    values = (old_values + torch.randn(64, generator=g, dtype=torch.float64)).requires_grad_()
    entropy = torch.rand(64, generator=g, dtype=torch.float64).requires_grad_()

    def total(logp, values, entropy):
        return ppo_loss(
            logp,
            values,
            entropy,
            old_logp,
            adv,
            old_values,
            returns,
            clip_param=0.2,
            dual_clip_param=3.0,
            vf_clip_param=0.5,
            vf_coeff=0.7,
            entropy_coeff=0.01,
        ).total

    # away from the kinks the loss is smooth, so finite differences check the autograd gradient
    assert torch.autograd.gradcheck(total, (logp, values, entropy), eps=1e-7, atol=1e-6)


def test_frozen_values_and_entropy_get_no_gradient():
    g = torch.Generator().manual_seed(4)
    logp = torch.randn(16, generator=g).requires_grad_()
    rest = [torch.randn(16, generator=g) for _ in range(6)]
    loss = ppo_loss(logp, *rest, clip_param=0.2)
    loss.total.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
