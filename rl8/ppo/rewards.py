"""Reward normalisation: rewards scaled by the running standard deviation of the discounted
return (part of PPO: it needs the discount factor and the rollout's shape)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rl8.policies.normalization import RunningMeanStd
from rl8.ppo.buffer import discount_matrix

__all__ = ["RewardNormalizer"]


class RewardNormalizer(nn.Module):
    """Scales rewards by the running standard deviation of the discounted return.

    As in SB3's ``VecNormalize`` and the "37 implementation details": each env keeps a
    discounted return ``G <- gamma * G * (1 - done) + r``; the variance of ``G`` over all envs
    and steps seen so far scales the rewards (they are not centred).

    Args:
        num_envs: Number of envs (one running return each).
        gamma: Discount factor of the return.
        device: Device of the statistics.
        clip: Scaled rewards are clipped to ``[-clip, clip]``.
        eps: Added to the variance before the square root.
    """

    def __init__(self, num_envs: int, gamma: float, *, device: torch.device | str = "cpu", clip: float = 10.0,
                 eps: float = 1e-8) -> None:
        super().__init__()
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.eps = float(eps)
        self.stats = RunningMeanStd((), device=device)
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float32, device=device))

    @torch.no_grad()
    def update(self, rewards: torch.Tensor, dones: torch.Tensor | None,
               all_reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
        """Advance the running returns over a collect and fold them into the statistics.

        Args:
            rewards: ``[num_envs, T]`` rewards of one collect.
            dones: ``[num_envs, T]`` bool, True where an episode ended at that step (its
                running return restarts after it), or ``None`` for infinite-horizon envs.
            all_reduce: See :meth:`RunningMeanStd.update`.
        """
        self.stats.update(self.advance(rewards, dones).reshape(-1), all_reduce)

    @torch.no_grad()
    def advance(self, rewards: torch.Tensor, dones: torch.Tensor | None) -> torch.Tensor:
        """Advance the running returns over a collect WITHOUT touching the statistics.

        Returns the running return after every step, ``[num_envs, T]`` float32: the samples
        :meth:`update` folds into :attr:`stats` (PPO folds their moments in itself, with the
        rollout stats, to read everything back from the device at once).
        """
        if dones is None:
            seen = self._discounted_without_resets(rewards.float())
            g = seen[:, -1]
        else:
            g = self.returns
            seen = torch.empty_like(rewards, dtype=torch.float32)
            for t in range(rewards.shape[1]):
                g = g * self.gamma + rewards[:, t]
                seen[:, t] = g
                g = g.masked_fill(dones[:, t], 0.0)
        self.returns.copy_(g)
        return seen

    def _discounted_without_resets(self, rewards: torch.Tensor) -> torch.Tensor:
        """``G_t = gamma * G_{t-1} + r_t`` for all ``t`` at once: one ``[N, T] @ [T, T]`` matmul
        with the (transposed) discount matrix of :func:`rl8.ppo.buffer.discount_matrix`, instead of
        ``T`` sequential steps of small ops."""
        discount = discount_matrix(rewards.shape[1], self.gamma, rewards.dtype, rewards.device)
        # G_t = gamma^(t+1) G_-1 + sum_{k<=t} gamma^(t-k) r_k; column 0 of the matrix is gamma^t
        carry = torch.outer(self.returns, discount[:, 0])
        return torch.addmm(carry, rewards, discount.T, beta=self.gamma)

    def returns_moments(self, seen: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The moments of running returns ``seen`` (from :meth:`advance`) to fold into the
        statistics, and the statistics as they are now, as 0-d tensors to read back with
        other stats (:func:`rl8.ppo.stats.reduce_stats`: the first dict as ``sums``, the second as
        ``local``); :meth:`merge_returns_moments` then folds them in."""
        f64 = torch.float64
        sums = {"reward_normalizer/sum": seen.sum(dtype=f64),
                "reward_normalizer/sum_sq": torch.linalg.vector_norm(seen, dtype=f64).square()}
        stats = self.stats
        return sums, {"reward_normalizer/mean": stats.mean, "reward_normalizer/var": stats.var,
                      "reward_normalizer/count": stats.count}

    def merge_returns_moments(self, values: dict[str, float], count: float) -> None:
        """Fold :meth:`returns_moments`, read back (and summed over ranks) as ``values``, into
        the statistics; ``count``: the number of running returns they cover (all ranks)."""
        current = tuple(values[f"reward_normalizer/{key}"] for key in ("mean", "var", "count"))
        self.stats.merge_moments_(current, count, values["reward_normalizer/sum"], values["reward_normalizer/sum_sq"])

    def reset(self) -> None:
        """Restart every env's running return (when PPO resets all envs)."""
        self.returns.zero_()

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        """Scale ``rewards`` by the running std of the return."""
        scale = self.stats.var.add(self.eps).rsqrt().to(rewards.dtype)
        return (rewards * scale).clamp(-self.clip, self.clip)
