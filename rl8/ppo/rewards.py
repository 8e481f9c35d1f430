"""Reward normalisation by the running standard deviation of the discounted return."""

from __future__ import annotations

import torch
from torch import nn

from rl8.policies.normalization import RunningMeanStd
from rl8.ppo.buffer import discount_matrix

__all__ = ["RewardNormalizer"]

_CLIP = 10.0  # scaled rewards are clipped to [-10, 10]
_EPS = 1e-8  # added to the variance before the square root


class RewardNormalizer(nn.Module):
    """Scales rewards (not centred) by the running std of each env's discounted return
    ``G <- gamma * G * (1 - done) + r``, as SB3's ``VecNormalize``.

    Args:
        num_envs: Number of envs (one running return each).
        gamma: Discount factor of the return.
        device: Device of the statistics.
    """

    def __init__(self, num_envs: int, gamma: float, *, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.gamma = float(gamma)
        self.stats = RunningMeanStd((), device=device)
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float32, device=device))

    @torch.no_grad()
    def advance(self, rewards: torch.Tensor, dones: torch.Tensor | None) -> torch.Tensor:
        """Advance the running returns over a collect's ``[num_envs, T]`` ``rewards`` WITHOUT
        touching the statistics (:meth:`returns_moments` and :meth:`merge_returns_moments` fold
        them in); ``dones``: ``[num_envs, T]`` bool, where an episode ended, or ``None`` (no
        episodes). Returns the running return after every step, ``[num_envs, T]``."""
        if dones is None:  # in one matmul: G_t = gamma^(t+1) G_-1 + sum_{k<=t} gamma^(t-k) r_k
            discount = discount_matrix(rewards.shape[1], self.gamma, torch.float32, rewards.device)
            carry = torch.outer(self.returns, discount[:, 0])  # column 0 of the matrix is gamma^t
            seen = torch.addmm(carry, rewards.float(), discount.T, beta=self.gamma)
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

    def returns_moments(
        self, seen: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The moments of running returns ``seen`` (from :meth:`advance`) and the statistics as
        they are now, as 0-d tensors to read back with the rollout stats (``sums``, ``local``)."""
        f64 = torch.float64
        sums = {
            "reward_normalizer/sum": seen.sum(dtype=f64),
            "reward_normalizer/sum_sq": torch.linalg.vector_norm(seen, dtype=f64).square(),
        }
        stats = self.stats
        return sums, {
            "reward_normalizer/mean": stats.mean,
            "reward_normalizer/var": stats.var,
            "reward_normalizer/count": stats.count,
        }

    def merge_returns_moments(self, values: dict[str, float], count: float) -> None:
        """Fold :meth:`returns_moments`, read back as ``values``, into the statistics; ``count``:
        the number of running returns they cover (all ranks)."""
        current = tuple(values[f"reward_normalizer/{key}"] for key in ("mean", "var", "count"))
        self.stats.merge_moments_(
            current, count, values["reward_normalizer/sum"], values["reward_normalizer/sum_sq"]
        )

    def reset(self) -> None:
        """Restart every env's running return (when PPO resets all envs)."""
        self.returns.zero_()

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        """Scale ``rewards`` by the running std of the return, clipped to [-10, 10]."""
        scale = self.stats.var.add(_EPS).rsqrt().to(rewards.dtype)
        return (rewards * scale).clamp(-_CLIP, _CLIP)
