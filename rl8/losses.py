"""The PPO surrogate and value losses as one autograd node.

Written with autograd, the clipped surrogate, the dual clip and the clipped value loss are
about twenty small element-wise operations whose backward passes (``min``/``max``/``clamp``
masks, broadcasts) add as many again. :func:`ppo_loss` computes the same losses in a forward
pass that also works out their (piecewise-linear) gradients with respect to the new
log-probabilities and values, so the backward pass is two multiplications. The KL and
clip-fraction monitors come from the same ratios, at no extra cost.

Gradients follow the usual sub-gradient choices at the kinks: where the unclipped and clipped
surrogates tie, the gradient is the unclipped one (this is what autograd yields too, since the
tie is only possible inside the clip range or where the advantage is 0); where the clipped and
unclipped value errors tie, the unclipped one. Ties of floating-point values away from those
cases have probability zero.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["ppo_loss", "reference_ppo_loss"]


class _PPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logp: Tensor,
        values: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        old_values: Tensor,
        returns: Tensor,
        clip_param: float,
        dual_clip_param: float | None,
        vf_clip_param: float | None,
        vf_coeff: float,
    ) -> tuple[Tensor, Tensor]:
        n = logp.numel()
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        unclipped = advantages * ratio
        clipped = ratio.clamp(1.0 - clip_param, 1.0 + clip_param).mul_(advantages)
        # the gradient flows through the unclipped term wherever it is the minimum
        active = unclipped <= clipped
        surrogate = torch.minimum(unclipped, clipped)
        if dual_clip_param is not None:
            floor = advantages * dual_clip_param
            capped = (advantages < 0) & (surrogate < floor)
            surrogate = torch.where(capped, floor, surrogate)
            active &= ~capped
        policy_loss = surrogate.mean().neg_()
        # d(policy_loss)/d(logp) = -advantages * ratio / n where active (d ratio = ratio d logp)
        grad_logp = unclipped.mul_(active).mul_(-1.0 / n)

        error = values - returns
        square = error.square()
        if vf_clip_param is not None:
            change = values - old_values
            clipped_error = change.clamp(-vf_clip_param, vf_clip_param).add_(old_values).sub_(returns)
            clipped_square = clipped_error.square()
            # max(square, clipped_square); the clipped branch passes a gradient only where its
            # clamp is inactive (there the two differ by rounding alone)
            use_clipped = clipped_square > square
            square = torch.where(use_clipped, clipped_square, square)
            error = torch.where(use_clipped, clipped_error.mul_(change.abs_() <= vf_clip_param), error)
        vf_loss = square.mean().mul_(0.5)
        # d(vf_coeff * vf_loss)/d(values) = vf_coeff * error / n
        grad_values = error.mul_(vf_coeff / n)

        total = policy_loss + vf_coeff * vf_loss
        kl = (ratio - 1.0).sub_(log_ratio).mean()
        clip_fraction = (ratio - 1.0).abs_().gt_(clip_param).float().mean()
        monitors = torch.stack([policy_loss, vf_loss, kl, clip_fraction])
        ctx.save_for_backward(grad_logp, grad_values)
        ctx.mark_non_differentiable(monitors)
        return total, monitors

    @staticmethod
    def backward(ctx: Any, grad_total: Tensor, grad_monitors: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grad_logp, grad_values = ctx.saved_tensors
        return (
            grad_logp * grad_total if ctx.needs_input_grad[0] else None,
            grad_values * grad_total if ctx.needs_input_grad[1] else None,
            None, None, None, None, None, None, None, None,
        )


def ppo_loss(
    logp: Tensor,
    values: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    old_values: Tensor,
    returns: Tensor,
    *,
    clip_param: float,
    dual_clip_param: float | None = None,
    vf_clip_param: float | None = None,
    vf_coeff: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate plus the weighted (optionally clipped) value loss.

    All tensors are float32 ``[B]``: ``logp`` and ``values`` from the current policy (they
    carry the gradient), the rest from the rollout (``advantages`` already normalised if
    wanted).

    Args:
        logp: Log-probabilities of the taken actions under the current policy.
        values: Value predictions of the current policy.
        old_logp: Log-probabilities of the same actions when they were collected.
        advantages: Advantage estimates.
        old_values: Value predictions when the actions were collected.
        returns: Value targets (advantages + old values, before normalisation).
        clip_param: Epsilon of the ratio clip ``[1 - eps, 1 + eps]`` (> 0).
        dual_clip_param: Dual-clip constant ``c > 1`` (Ye et al., 2020): for negative
            advantages the surrogate is bounded below by ``c * advantage``; ``None`` = off.
        vf_clip_param: Clip of the value change ``|values - old_values|`` in the clipped value
            loss (same unit as the rewards); ``None`` = plain squared error.
        vf_coeff: Weight of the value loss in the total.

    Returns:
        ``(total, monitors)``: the differentiable scalar
        ``policy_loss + vf_coeff * vf_loss``, and a detached float32 ``[4]`` tensor of
        ``policy_loss``, ``vf_loss`` (half the mean squared error), the approximate KL
        ``mean((ratio - 1) - log ratio)`` and the clip fraction ``mean(|ratio - 1| > eps)``.
    """
    return _PPOLoss.apply(
        logp, values, old_logp, advantages, old_values, returns,
        float(clip_param),
        None if dual_clip_param is None else float(dual_clip_param),
        None if vf_clip_param is None else float(vf_clip_param),
        float(vf_coeff),
    )


def reference_ppo_loss(
    logp: Tensor,
    values: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    old_values: Tensor,
    returns: Tensor,
    *,
    clip_param: float,
    dual_clip_param: float | None = None,
    vf_clip_param: float | None = None,
    vf_coeff: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """:func:`ppo_loss` written plainly with autograd (the definition the fast one is tested
    against; same arguments and results)."""
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    surrogate = torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_param, 1 + clip_param))
    if dual_clip_param is not None:
        surrogate = torch.where(advantages < 0, torch.max(surrogate, dual_clip_param * advantages), surrogate)
    policy_loss = -surrogate.mean()
    vf_error = (values - returns).square()
    if vf_clip_param is not None:
        clipped = old_values + (values - old_values).clamp(-vf_clip_param, vf_clip_param)
        vf_error = torch.max(vf_error, (clipped - returns).square())
    vf_loss = 0.5 * vf_error.mean()
    with torch.no_grad():
        kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > clip_param).float().mean()
        monitors = torch.stack([policy_loss, vf_loss, kl, clip_fraction])
    return policy_loss + vf_coeff * vf_loss, monitors
