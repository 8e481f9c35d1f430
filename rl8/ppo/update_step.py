"""PPO's update step: what one minibatch does to the policy's weights. :class:`rl8.PPO` chooses
one at construction and :meth:`rl8.PPO.update` calls it once per minibatch: :class:`EagerStep`
here (the loss, backward, gradient all-reduce, clip and optimizer step in plain autograd), or
``compile=True``'s steps of :mod:`rl8.ppo.compiled` (the same with a compiled loss, or the whole
step as one compiled function)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
from tensordict import TensorDict, TensorDictBase

from rl8.ppo.losses import PPOLoss, adaptive_lr

__all__ = ["EagerStep", "UpdateExtension", "UpdateStep", "optimizer_step", "set_lr"]


class UpdateStep(Protocol):
    """One minibatch's step of :meth:`rl8.PPO.update`."""

    def __call__(
        self,
        minibatch: TensorDict,
        entropy_coeff: float,
        extra_loss: torch.Tensor | None,
        index: int,
    ) -> tuple[PPOLoss, torch.Tensor | None]:
        """Train on ``minibatch``, the ``index``-th of the update (counting over its passes).

        Args:
            minibatch: Its samples (observations, actions, old log-probabilities and values,
                advantages, returns).
            entropy_coeff: The entropy bonus's weight in the loss, this update's.
            extra_loss: The extensions' terms to add to PPO's loss (a 0-d tensor), or ``None``.
            index: The minibatch's position in the update, from 0.

        Returns:
            The minibatch's :class:`~rl8.ppo.losses.PPOLoss` and the gradient norm before
            clipping of the optimizer step it took, or ``None`` when it took none (it
            accumulated its gradients for a later one).
        """
        ...

    def stats(self) -> dict[str, float]:
        """What the step reports once in the update's stats (``profiling/compile_ms``), else ``{}``."""
        ...


class UpdateExtension(Protocol):
    """An extension of :meth:`rl8.PPO.update` (rsl_rl's symmetry and RND:
    :class:`~rl8.ppo.symmetry.Symmetry`, :class:`~rl8.ppo.rnd.RandomNetworkDistillation`), called
    at two named points: each minibatch before PPO's step, and after the update.

    Attributes:
        loss_name: Its loss is reported as ``losses/<loss_name>``.
        loss_coeff: The weight of that loss in ``losses/total`` (0: not part of PPO's loss).
    """

    loss_name: str
    loss_coeff: float

    def minibatch_step(
        self, minibatch: TensorDict
    ) -> tuple[TensorDict, torch.Tensor, torch.Tensor | None]:
        """Before PPO's step on ``minibatch``: returns the minibatch PPO trains on (it, or an
        augmented copy), the extension's loss (a detached 0-d tensor, for the stats) and the
        term it adds to PPO's loss (a 0-d tensor with its gradient), or ``None``."""
        ...

    def after_update(self, obs: torch.Tensor | TensorDictBase) -> None:
        """After the update's last minibatch, with the rollout's observations ``[N, T, ...]``."""
        ...


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate to ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    max_grad_norm: float | None,
    *,
    average_gradients: Callable[[list[torch.Tensor]], None],
    grad_scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """Average the gradients of ``params`` over ranks (``average_gradients``), unscale them
    (``grad_scaler``), clip their global norm to ``max_grad_norm`` (``None``: only measure it) and
    step ``optimizer``; returns the norm before clipping, a detached float32 0-d tensor."""
    average_gradients(params)  # data-parallel: one all-reduce per optimizer step
    if grad_scaler is not None:
        grad_scaler.unscale_(optimizer)
    # max_grad_norm None: the norm is only measured (an infinite bound never scales)
    max_norm = math.inf if max_grad_norm is None else max_grad_norm
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    return grad_norm.detach().float()


class EagerStep:
    """The plain update step: the minibatch's loss, ``desired_kl``'s lr, backward, then every
    ``minibatches_per_step`` minibatches the optimizer step (:func:`optimizer_step`).

    Args:
        minibatch_loss: ``(minibatch, entropy_coeff) -> PPOLoss``, the PPO loss of the current
            policy (``PPO._minibatch_loss``, or its compiled version).
        policy: The module whose trainable parameters ``optimizer`` steps.
        optimizer: The policy's optimizer.
        max_grad_norm: Clip the global gradient norm to this; ``None``: only measure it.
        minibatches_per_step: Minibatches whose mean loss one optimizer step takes: 1, or with
            ``accumulate_grads`` a pass's minibatches.
        desired_kl: rsl_rl's adaptive lr: each minibatch's approximate KL (the mean over ranks,
            ``mean_over_ranks``) sets the lr of its step; ``None``: the lr is left alone.
        mean_over_ranks: A 0-d tensor's mean over the ranks, as a float.
        average_gradients: Averages a list of gradients over the ranks in place.
        grad_scaler: float16 autocast's loss scaler, or ``None``.
    """

    def __init__(
        self,
        minibatch_loss: Callable[[TensorDict, float], PPOLoss],
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float | None,
        *,
        minibatches_per_step: int = 1,
        desired_kl: float | None = None,
        mean_over_ranks: Callable[[torch.Tensor], float],
        average_gradients: Callable[[list[torch.Tensor]], None],
        grad_scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.minibatch_loss = minibatch_loss
        self.policy, self.optimizer, self.max_grad_norm = policy, optimizer, max_grad_norm
        self.minibatches_per_step = minibatches_per_step
        self.desired_kl = desired_kl
        self.mean_over_ranks, self.average_gradients = mean_over_ranks, average_gradients
        self.grad_scaler = grad_scaler

    def __call__(
        self,
        minibatch: TensorDict,
        entropy_coeff: float,
        extra_loss: torch.Tensor | None,
        index: int,
    ) -> tuple[PPOLoss, torch.Tensor | None]:
        """:meth:`UpdateStep.__call__`."""
        loss = self.minibatch_loss(minibatch, entropy_coeff)
        if self.desired_kl is not None:  # this minibatch's KL sets the lr of its step, as in rsl_rl
            self.adapt_lr(loss.approx_kl)
        if index % self.minibatches_per_step == 0:
            # after the forward pass, as rsl_rl and CleanRL do: the old gradients' memory
            # stays allocated for this pass's activations instead of being freed and refetched
            self.optimizer.zero_grad()
        total = loss.total if extra_loss is None else loss.total + extra_loss
        total = total / self.minibatches_per_step
        (total if self.grad_scaler is None else self.grad_scaler.scale(total)).backward()
        if (index + 1) % self.minibatches_per_step != 0:
            return loss, None
        return loss, self.optimizer_step()

    def optimizer_step(self) -> torch.Tensor:
        """:func:`optimizer_step` of the policy's trainable parameters; the norm before clipping."""
        return optimizer_step(
            self.optimizer,
            [p for p in self.policy.parameters() if p.requires_grad],
            self.max_grad_norm,
            average_gradients=self.average_gradients,
            grad_scaler=self.grad_scaler,
        )

    def adapt_lr(self, approx_kl: torch.Tensor) -> None:
        """hparam desired_kl: the lr from a minibatch's approximate KL (all ranks' mean)."""
        kl = torch.tensor(self.mean_over_ranks(approx_kl), dtype=torch.float64)
        lr = torch.tensor(self.optimizer.param_groups[0]["lr"], dtype=torch.float64)
        set_lr(self.optimizer, adaptive_lr(lr, kl, self.desired_kl).item())

    def stats(self) -> dict[str, float]:
        """:meth:`UpdateStep.stats`: none."""
        return {}
