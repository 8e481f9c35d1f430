"""Running statistics for observation and reward normalisation.

Every statistic is kept as (mean, var, count), so that statistics from several processes can
be merged exactly (see :meth:`RunningMeanStd.merge_`), which is what data-parallel training
needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from .buffer import discount_matrix

__all__ = ["RunningMeanStd", "ObservationNormalizer", "RewardNormalizer"]


class RunningMeanStd(nn.Module):
    """Mean and variance of a stream of batches, per feature, in float64.

    Args:
        shape: Shape of one sample (the feature shape); batches have extra leading dims.
        device: Device of the statistics.
    """

    def __init__(self, shape: tuple[int, ...] = (), *, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64, device=device))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64, device=device))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64, device=device))

    @torch.no_grad()
    def update(self, batch: torch.Tensor, all_reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
        """Fold a batch ``[..., *shape]`` into the statistics (no host synchronisation).

        Args:
            batch: Samples with the feature shape as trailing dims.
            all_reduce: In data-parallel training, a function that sums a tensor across
                ranks in place; the statistics then cover every rank's batch, identically on
                every rank.
        """
        x = batch.reshape(-1, *self.shape).to(torch.float64)
        n = x.shape[0]
        if all_reduce is not None:
            packed = torch.cat([x.new_full((1,), float(n)), x.sum(0).reshape(-1), x.square().sum(0).reshape(-1)])
            all_reduce(packed)
            size = (packed.numel() - 1) // 2
            count = packed[0]
            mean = (packed[1 : 1 + size] / count.clamp(min=1)).reshape(self.shape)
            var = (packed[1 + size :] / count.clamp(min=1)).reshape(self.shape) - mean.square()
            self.merge_(mean, var.clamp(min=0), count)
            return
        if n == 0:
            return
        # two reductions: torch.var_mean is slower on the CPU
        mean = x.mean(0)
        var = x.var(0, unbiased=False) if n > 1 else torch.zeros_like(mean)
        self.merge_(mean, var, torch.tensor(float(n), dtype=torch.float64, device=x.device))

    @torch.no_grad()
    def merge_(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """Merge another set of statistics (Chan et al.'s parallel algorithm), in place."""
        total = self.count + count
        w = count / total.clamp(min=1.0)  # weight of the new statistics (0 when both are empty)
        delta = mean - self.mean
        # var = (1 - w) var_a + w var_b + w (1 - w) delta^2: the pooled M2 over the total count
        self.var.lerp_(var, w).add_(delta.square().mul_(w * (1.0 - w)))
        self.mean.add_(delta.mul_(w))
        self.count.copy_(total)

    @torch.no_grad()
    def merge_moments_(self, current: tuple[float, float, float], count: float, total: float,
                       total_sq: float) -> None:
        """Merge a batch given by its moments, with the arithmetic on the host.

        For scalar statistics (``shape == ()``) whose current values the caller has already
        read back: ``current`` is ``(mean, var, count)`` as they are now; ``count``,
        ``total`` and ``total_sq`` are the batch's size, sum and sum of squares (float64
        accuracy). Three fills replace a dozen device ops.
        """
        mean_a, var_a, count_a = current
        if count <= 0:
            return
        mean_b = total / count
        var_b = max(total_sq / count - mean_b * mean_b, 0.0)
        n = count_a + count
        w = count / n
        delta = mean_b - mean_a
        self.mean.fill_(mean_a + delta * w)
        self.var.fill_((1.0 - w) * var_a + w * var_b + w * (1.0 - w) * delta * delta)
        self.count.fill_(n)

    def std(self, eps: float = 1e-8) -> torch.Tensor:
        """Standard deviation with ``eps`` added to the variance."""
        return (self.var + eps).sqrt()

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


class ObservationNormalizer(nn.Module):
    """Normalises observations with running mean and variance: ``clip((x - mean) / std)``.

    Only floating-point leaves are normalised; integer leaves (e.g. images stored as uint8,
    discrete observations) and an ``action_mask`` pass through unchanged.

    Args:
        example: One batch of observations ``[B, ...]`` (a tensor or TensorDict) that fixes the
            feature shapes.
        clip: Normalised values are clipped to ``[-clip, clip]``.
        eps: Added to the variance before the square root.
    """

    def __init__(self, example: torch.Tensor | TensorDictBase, *, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip = float(clip)
        self.eps = float(eps)
        self.stats = nn.ModuleDict()
        for key, leaf in self._leaves(example):
            self.stats[self._name(key)] = RunningMeanStd(tuple(leaf.shape[1:]), device=leaf.device)

    @staticmethod
    def _name(key: str | tuple[str, ...]) -> str:
        return "obs" if key == () else "__".join(key if isinstance(key, tuple) else (key,))

    @staticmethod
    def _leaves(obs):
        if isinstance(obs, TensorDictBase):
            for key, leaf in obs.items(include_nested=True, leaves_only=True):
                key = key if isinstance(key, tuple) else (key,)
                if key[-1] == "action_mask" or not leaf.is_floating_point():
                    continue
                yield key, leaf
        elif obs.is_floating_point():
            yield (), obs

    @torch.no_grad()
    def update(self, obs: torch.Tensor | TensorDictBase, batch_dims: int = 1,
               all_reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
        """Fold observations with ``batch_dims`` leading batch dims into the statistics
        (``all_reduce``: see :meth:`RunningMeanStd.update`)."""
        for key, leaf in self._leaves(obs):
            rms = self.stats[self._name(key)]
            rms.update(leaf.reshape(-1, *leaf.shape[batch_dims:]), all_reduce)

    def forward(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor | TensorDictBase:
        """Return normalised observations (a new tensor / TensorDict; the input is untouched)."""
        if isinstance(obs, TensorDictBase):
            out = obs.clone(recurse=False)
            for key, leaf in self._leaves(obs):
                out.set(key, self._normalize(self.stats[self._name(key)], leaf))
            return out
        if not obs.is_floating_point():
            return obs
        return self._normalize(self.stats["obs"], obs)

    def _normalize(self, rms: RunningMeanStd, x: torch.Tensor) -> torch.Tensor:
        mean = rms.mean.to(x.dtype)
        inv_std = rms.var.add(self.eps).rsqrt().to(x.dtype)
        return ((x - mean) * inv_std).clamp(-self.clip, self.clip)


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
        with the (transposed) discount matrix of :func:`rl8.buffer.discount_matrix`, instead of
        ``T`` sequential steps of small ops."""
        discount = discount_matrix(rewards.shape[1], self.gamma, rewards.dtype, rewards.device)
        # G_t = gamma^(t+1) G_-1 + sum_{k<=t} gamma^(t-k) r_k; column 0 of the matrix is gamma^t
        carry = torch.outer(self.returns, discount[:, 0])
        return torch.addmm(carry, rewards, discount.T, beta=self.gamma)

    def returns_moments(self, seen: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The moments of running returns ``seen`` (from :meth:`advance`) to fold into the
        statistics, and the statistics as they are now, as 0-d tensors to read back with
        other stats (:func:`rl8.stats.reduce_stats`: the first dict as ``sums``, the second as
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
