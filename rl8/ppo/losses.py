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

import functools
from typing import Any

import torch
from torch import Tensor

__all__ = ["ppo_loss", "reference_ppo_loss"]


@functools.lru_cache(maxsize=64)
def _monitor_map(vf_coeff: float, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(W, b)`` with ``W @ means + b`` = policy loss, vf loss, KL, clip fraction and total
    from the means of (surrogate, squared error, ratio, log-ratio, clipped)."""
    weights = torch.tensor(
        [
            [-1.0, 0.0, 0.0, 0.0, 0.0],  # policy_loss = -mean(surrogate)
            [0.0, 0.5, 0.0, 0.0, 0.0],  # vf_loss = mean(error^2) / 2
            [0.0, 0.0, 1.0, -1.0, 0.0],  # kl = mean(ratio) - mean(log_ratio) - 1
            [0.0, 0.0, 0.0, 0.0, 1.0],  # clip_fraction
            [-1.0, 0.5 * vf_coeff, 0.0, 0.0, 0.0],  # total = policy_loss + vf_coeff * vf_loss
        ],
        dtype=dtype, device=device,
    )
    offsets = torch.tensor([0.0, 0.0, -1.0, 0.0, 0.0], dtype=dtype, device=device)
    return weights, offsets


class _PPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logp: Tensor, values: Tensor, old_logp: Tensor, advantages: Tensor, old_values: Tensor,
        returns: Tensor, clip_param: float, dual_clip_param: float | None, vf_clip_param: float | None, vf_coeff: float,
    ) -> tuple[Tensor, Tensor]:
        n = logp.numel()
        # Rows whose means are the monitors: surrogate, squared value error, ratio, log-ratio,
        # and whether the ratio was clipped. One reduction and one small matmul then give all
        # the scalars (fewer ops than one mean per stat: these tensors are small).
        rows = torch.empty((5, n), dtype=logp.dtype, device=logp.device)
        log_ratio = torch.sub(logp, old_logp, out=rows[3])
        ratio = torch.exp(log_ratio, out=rows[2])
        clamped = ratio.clamp(1.0 - clip_param, 1.0 + clip_param)
        torch.ne(clamped, ratio, out=rows[4])  # clipped (|ratio - 1| > clip_param)
        unclipped = advantages * ratio
        clipped = clamped.mul_(advantages)
        # the gradient flows through the unclipped term wherever it is the minimum
        active = unclipped <= clipped
        if dual_clip_param is None:
            torch.minimum(unclipped, clipped, out=rows[0])
        else:
            surrogate = torch.minimum(unclipped, clipped)
            floor = advantages * dual_clip_param
            capped = (advantages < 0) & (surrogate < floor)
            torch.where(capped, floor, surrogate, out=rows[0])
            active &= ~capped
        # d(policy_loss)/d(logp) = -advantages * ratio / n where active (d ratio = ratio d logp)
        grad_logp = unclipped.mul_(active).mul_(-1.0 / n)

        error = values - returns
        if vf_clip_param is None:
            torch.square(error, out=rows[1])
        else:
            square = error.square()
            change = values - old_values
            clipped_error = change.clamp(-vf_clip_param, vf_clip_param).add_(old_values).sub_(returns)
            clipped_square = clipped_error.square()
            # max(square, clipped_square); the clipped branch passes a gradient only where its
            # clamp is inactive (there the two differ by rounding alone)
            use_clipped = clipped_square > square
            torch.where(use_clipped, clipped_square, square, out=rows[1])
            error = torch.where(use_clipped, clipped_error.mul_(change.abs_() <= vf_clip_param), error)
        # d(vf_coeff * vf_loss)/d(values) = vf_coeff * error / n
        grad_values = error.mul_(vf_coeff / n)

        weights, offsets = _monitor_map(vf_coeff, rows.dtype, rows.device)
        # [policy_loss, vf_loss, kl, clip_fraction, total]
        out = torch.addmv(offsets, weights, rows.mean(1))
        monitors, total = out[:4], out[4].clone()
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


def ppo_loss(logp: Tensor, values: Tensor, old_logp: Tensor, advantages: Tensor, old_values: Tensor, returns: Tensor,
             *, clip_param: float, dual_clip_param: float | None = None, vf_clip_param: float | None = None,
             vf_coeff: float = 1.0) -> tuple[Tensor, Tensor]:
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
    logp: Tensor, values: Tensor, old_logp: Tensor, advantages: Tensor, old_values: Tensor, returns: Tensor, *,
    clip_param: float, dual_clip_param: float | None = None, vf_clip_param: float | None = None, vf_coeff: float = 1.0,
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
