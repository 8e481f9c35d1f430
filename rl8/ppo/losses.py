"""PPO's loss in plain autograd, each term and monitor by name, and the optimizer that minimises it."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl8.ppo.resolve import OPTIMIZER, qualified_name, resolve

__all__ = [
    "ADAPTIVE_LR_BOUNDS",
    "ADAPTIVE_LR_FACTOR",
    "MONITORS",
    "PPOLoss",
    "adaptive_lr",
    "make_optimizer",
    "ppo_loss",
]

#: The factor by which rsl_rl's adaptive learning rate (hparam ``desired_kl``) moves.
ADAPTIVE_LR_FACTOR = 1.5
#: The bounds of rsl_rl's adaptive learning rate.
ADAPTIVE_LR_BOUNDS = (1e-5, 1e-2)


@dataclass(frozen=True)
class PPOLoss:
    """PPO's loss on one minibatch, by term (scalars, float32).

    Attributes:
        total: The differentiable loss minimised:
            ``policy_loss + vf_coeff * value_loss - entropy_coeff * entropy``.
        policy_loss: Minus the mean clipped surrogate (detached).
        value_loss: Half the mean squared value error, clipped if asked (detached).
        entropy: Mean entropy of the action distributions (detached).
        approx_kl: Approximate KL divergence from the collecting policy,
            ``mean((ratio - 1) - log ratio)`` (detached).
        clip_fraction: Fraction of samples whose ratio was clipped, ``|ratio - 1| > clip_param``.
    """

    total: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor


#: The fields of :class:`PPOLoss` besides ``total``: detached monitors.
MONITORS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


def ppo_loss(
    logp: Tensor,
    values: Tensor,
    entropy: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    old_values: Tensor,
    returns: Tensor,
    *,
    clip_param: float,
    dual_clip_param: float | None = None,
    vf_clip_param: float | None = None,
    vf_coeff: float = 1.0,
    entropy_coeff: float = 0.0,
    collected: Tensor | None = None,
) -> PPOLoss:
    """PPO's clipped surrogate, plus the weighted (optionally clipped) value loss, minus the
    weighted entropy bonus, over float32 ``[B]`` tensors.

    Args:
        logp: Log-probabilities of the taken actions under the current policy.
        values: Value predictions of the current policy.
        entropy: Entropies of the current policy's action distributions (detached: reported only).
        old_logp: Log-probabilities of the same actions when they were collected.
        advantages: Advantage estimates (normalised if wanted).
        old_values: Value predictions when the actions were collected.
        returns: Value targets (advantages + old values, before normalisation).
        clip_param: Epsilon of the ratio clip ``[1 - eps, 1 + eps]`` (> 0).
        dual_clip_param: Dual-clip constant ``c > 1`` (Ye et al., 2020) bounding the surrogate
            of negative advantages by ``c * advantage``; ``None`` = off.
        vf_clip_param: Clip of the value change ``|values - old_values|`` (the rewards' unit);
            ``None`` = plain squared error.
        vf_coeff: Weight of the value loss in the total.
        entropy_coeff: Weight of the entropy bonus in the total.
        collected: ``[B]`` bool, True for the samples that were collected, False for augmented
            copies (hparam ``symmetry``): the entropy, ``approx_kl`` and ``clip_fraction`` are
            means over the collected ones, as rsl_rl measures them; ``None``: all are collected.
    """
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    surrogate = torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_param, 1 + clip_param))
    if dual_clip_param is not None:
        surrogate = torch.where(
            advantages < 0, torch.max(surrogate, dual_clip_param * advantages), surrogate
        )
    policy_loss = -surrogate.mean()

    value_error = (values - returns).square()
    if vf_clip_param is not None:
        clipped_values = old_values + (values - old_values).clamp(-vf_clip_param, vf_clip_param)
        value_error = torch.max(value_error, (clipped_values - returns).square())
    value_loss = 0.5 * value_error.mean()

    mean_entropy = _mean(entropy, collected)
    total = policy_loss + vf_coeff * value_loss - entropy_coeff * mean_entropy
    with torch.no_grad():
        approx_kl = _mean((ratio - 1) - log_ratio, collected)
        clip_fraction = _mean(((ratio - 1).abs() > clip_param).float(), collected)
    return PPOLoss(
        total=total,
        policy_loss=policy_loss.detach(),
        value_loss=value_loss.detach(),
        entropy=mean_entropy.detach(),
        approx_kl=approx_kl,
        clip_fraction=clip_fraction,
    )


def _mean(x: Tensor, rows: Tensor | None) -> Tensor:
    """The mean of ``x`` over the ``rows`` where the bool mask is True (all for ``None``)."""
    return x.mean() if rows is None else torch.where(rows, x, 0.0).sum() / rows.sum()


def adaptive_lr(lr: Tensor, kl: Tensor, desired_kl: float) -> Tensor:
    """rsl_rl's adaptive learning rate from the one now, ``lr``, and the KL divergence ``kl`` of
    the collecting policy from the current one on a minibatch (0-d tensors: compiled code runs it
    without a host sync), aiming at ``desired_kl``: ``lr / 1.5`` (not below 1e-5) when
    ``kl > 2 * desired_kl``, ``lr * 1.5`` (not above 1e-2) when ``0 < kl < desired_kl / 2``, else ``lr``."""
    low, high = ADAPTIVE_LR_BOUNDS
    down = (lr / ADAPTIVE_LR_FACTOR).clamp(min=low)
    up = (lr * ADAPTIVE_LR_FACTOR).clamp(max=high)
    return torch.where(kl > 2 * desired_kl, down, torch.where((kl < desired_kl / 2) & (kl > 0), up, lr))


def make_optimizer(
    optimizer_cls: type[torch.optim.Optimizer] | str,
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    optimizer_kwargs: dict[str, Any],
    device: torch.device,
) -> torch.optim.Optimizer:
    """An ``optimizer_cls`` (a ``torch.optim.Optimizer`` class or its dotted path) over ``params``
    on ``device``, with learning rate ``lr`` and ``optimizer_kwargs`` (Adam(W) fused unless they
    choose otherwise).

    Raises:
        ValueError: ``optimizer_cls`` refused ``optimizer_kwargs`` (naming the ones it takes).
    """
    cls = resolve(optimizer_cls, OPTIMIZER, field="hparam optimizer_cls")
    kwargs = dict(optimizer_kwargs)
    if cls in (torch.optim.Adam, torch.optim.AdamW) and not {"fused", "foreach"} & set(kwargs):
        kwargs["fused"] = device.type in ("cpu", "cuda")
    try:
        return cls(params, lr=lr, **kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"hparam optimizer_kwargs: {qualified_name(cls)} refused {optimizer_kwargs!r} "
            f"({err}); expected its keyword arguments: {_keyword_defaults(cls)}"
        ) from err


def _keyword_defaults(cls: type) -> str:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return "see its documentation"
    return ", ".join(
        f"{p.name}={p.default!r}"
        for p in parameters
        if p.name not in ("params", "lr") and p.default is not inspect.Parameter.empty
    )
