"""The one-node PPO loss against its plain autograd definition."""

from __future__ import annotations

import pytest
import torch

from rl8.ppo.losses import ppo_loss, reference_ppo_loss


def _inputs(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old_logp = torch.randn(n, generator=g) * 0.5 - 1.0
    # ratios spread well beyond the clip range on both sides, advantages of both signs
    logp = old_logp + torch.randn(n, generator=g) * 0.4
    old_values = torch.randn(n, generator=g)
    values = old_values + torch.randn(n, generator=g) * 2.0
    return {
        "logp": logp, "values": values, "old_logp": old_logp,
        "advantages": torch.randn(n, generator=g) * 2.0, "old_values": old_values,
        "returns": old_values + torch.randn(n, generator=g) * 3.0,
    }


@pytest.mark.parametrize("dual_clip_param", [None, 3.0])
@pytest.mark.parametrize("vf_clip_param", [None, 0.5])
@pytest.mark.parametrize("vf_coeff", [0.5, 2.0])
def test_matches_reference_values_and_gradients(dual_clip_param, vf_clip_param, vf_coeff):
    data = _inputs(4096, seed=1)
    kwargs = dict(clip_param=0.2, dual_clip_param=dual_clip_param, vf_clip_param=vf_clip_param, vf_coeff=vf_coeff)
    results = []
    for fn in (ppo_loss, reference_ppo_loss):
        logp = data["logp"].clone().requires_grad_()
        values = data["values"].clone().requires_grad_()
        total, monitors = fn(logp, values, data["old_logp"], data["advantages"], data["old_values"], data["returns"], **kwargs)
        (3.0 * total).backward()  # a non-unit upstream gradient
        results.append((total.detach(), monitors, logp.grad, values.grad))
    (total, monitors, g_logp, g_values), (ref_total, ref_monitors, ref_g_logp, ref_g_values) = results
    torch.testing.assert_close(total, ref_total, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(monitors, ref_monitors, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_logp, ref_g_logp, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(g_values, ref_g_values, rtol=1e-5, atol=1e-9)
    # the data exercised every branch: clipped ratios, clipped values, active dual clip
    ratio = (data["logp"] - data["old_logp"]).exp()
    assert 0.1 < monitors[3].item() < 0.9
    assert ((ratio - 1).abs() > 0.2).any() and ((ratio - 1).abs() < 0.2).any()
    if vf_clip_param is not None:
        assert (ref_g_values == 0).any() and (ref_g_values != 0).any()
    if dual_clip_param is not None:
        adv = data["advantages"]
        assert ((adv < 0) & (adv * ratio < dual_clip_param * adv)).any()


def test_gradcheck_in_double_precision():
    data = {k: v[:64].double() for k, v in _inputs(64, seed=2).items()}
    logp = data.pop("logp").requires_grad_()
    values = data.pop("values").requires_grad_()

    def total(logp, values):
        return ppo_loss(
            logp, values, data["old_logp"], data["advantages"], data["old_values"], data["returns"],
            clip_param=0.2, dual_clip_param=3.0, vf_clip_param=0.5, vf_coeff=0.7,
        )[0]

    # away from the kinks the loss is smooth, so finite differences check the analytic gradient
    assert torch.autograd.gradcheck(total, (logp, values), eps=1e-7, atol=1e-6)


def test_monitors_are_detached_and_named_in_order():
    data = _inputs(256, seed=3)
    logp = data["logp"].clone().requires_grad_()
    values = data["values"].clone().requires_grad_()
    total, monitors = ppo_loss(
        logp, values, data["old_logp"], data["advantages"], data["old_values"], data["returns"],
        clip_param=0.1, vf_coeff=0.5,
    )
    assert total.requires_grad and not monitors.requires_grad
    policy_loss, vf_loss, kl, clip_fraction = monitors.tolist()
    assert total.item() == pytest.approx(policy_loss + 0.5 * vf_loss, rel=1e-6)
    assert vf_loss == pytest.approx(0.5 * (data["values"] - data["returns"]).square().mean().item(), rel=1e-6)
    assert kl >= 0 and 0 <= clip_fraction <= 1


def test_frozen_values_get_no_gradient():
    data = _inputs(128, seed=4)
    logp = data["logp"].clone().requires_grad_()
    total, _ = ppo_loss(
        logp, data["values"], data["old_logp"], data["advantages"], data["old_values"], data["returns"],
        clip_param=0.2,
    )
    total.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
