"""Running statistics, kept as (mean, var, count) so that several processes' merge exactly, and
observation normalisation (the reward normaliser is PPO's: :mod:`rl8.ppo.rewards`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

__all__ = ["RunningMeanStd", "ObservationNormalizer"]


class RunningMeanStd(nn.Module):
    """Mean and variance of a stream of batches, per feature, in float64 on ``device``; ``shape``
    is that of one sample (the feature shape; batches have extra leading dims)."""

    def __init__(self, shape: tuple[int, ...] = (), *, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64, device=device))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64, device=device))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64, device=device))

    @torch.no_grad()
    def update(
        self, batch: torch.Tensor, all_reduce: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """Fold ``batch``, samples ``[..., *shape]``, into the statistics (no host synchronisation);
        in data-parallel training, ``all_reduce`` sums a tensor across ranks in place, so that
        the statistics cover every rank's batch."""
        x = batch.reshape(-1, *self.shape).to(torch.float64)
        n = x.shape[0]
        if all_reduce is not None:
            packed = torch.cat(
                [x.new_full((1,), float(n)), x.sum(0).reshape(-1), x.square().sum(0).reshape(-1)]
            )
            all_reduce(packed)
            count = packed[0]
            mean, mean_sq = (packed[1:] / count.clamp(min=1)).reshape(2, *self.shape)
            self.merge_(mean, (mean_sq - mean.square()).clamp(min=0), count)
            return
        if n == 0:
            return
        # two reductions: torch.var_mean is slower on the CPU (the variance of one sample is 0)
        self.merge_(x.mean(0), x.var(0, unbiased=False), x.new_tensor(float(n)))

    @torch.no_grad()
    def merge_(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """Merge the statistics ``mean``, ``var``, ``count`` (0-d) of other samples, in place
        (Chan et al.'s parallel algorithm)."""
        total = self.count + count
        w = count / total.clamp(min=1.0)  # weight of the new statistics (0 when both are empty)
        delta = mean - self.mean
        # var = (1 - w) var_a + w var_b + w (1 - w) delta^2: the pooled M2 over the total count
        self.var.lerp_(var, w).add_(delta.square().mul_(w * (1.0 - w)))
        self.mean.add_(delta.mul_(w))
        self.count.copy_(total)

    @torch.no_grad()
    def merge_moments_(
        self, current: tuple[float, float, float], count: float, total: float, total_sq: float
    ) -> None:
        """Merge a batch of ``count`` samples whose sum is ``total`` and sum of squares
        ``total_sq``, with the arithmetic on the host: ``current`` is ``(mean, var, count)`` as
        they are now, read back by the caller (scalar statistics: three fills, not a dozen device ops)."""
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

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


class ObservationNormalizer(nn.Module):
    """Normalises observations with running mean and variance into ``[-clip, clip]``,
    ``clip((x - mean) / sqrt(var + eps))``; integer leaves (uint8 images, discrete observations)
    and ``action_mask`` pass through. ``example``: one batch of observations ``[B, ...]`` (a
    tensor or TensorDict) that fixes the feature shapes."""

    def __init__(
        self, example: torch.Tensor | TensorDictBase, *, clip: float = 10.0, eps: float = 1e-8
    ) -> None:
        super().__init__()
        self.clip = float(clip)
        self.eps = float(eps)
        self.stats = nn.ModuleDict()
        for name, _, leaf in self._leaves(example):
            self.stats[name] = RunningMeanStd(tuple(leaf.shape[1:]), device=leaf.device)

    @staticmethod
    def _leaves(
        obs: torch.Tensor | TensorDictBase,
    ) -> Iterator[tuple[str, tuple[str, ...], torch.Tensor]]:
        """``(name of the statistics, key, leaf)`` of each float leaf but ``action_mask``."""
        if not isinstance(obs, TensorDictBase):
            if obs.is_floating_point():
                yield "obs", (), obs
            return
        for key, leaf in obs.items(include_nested=True, leaves_only=True):
            key = key if isinstance(key, tuple) else (key,)
            if key[-1] != "action_mask" and leaf.is_floating_point():
                yield "__".join(key), key, leaf

    @torch.no_grad()
    def update(
        self,
        obs: torch.Tensor | TensorDictBase,
        batch_dims: int = 1,
        all_reduce: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        """Fold observations ``obs`` with ``batch_dims`` leading batch dims into the statistics
        (``all_reduce``: see :meth:`RunningMeanStd.update`)."""
        for name, _, leaf in self._leaves(obs):
            self.stats[name].update(leaf.reshape(-1, *leaf.shape[batch_dims:]), all_reduce)

    def forward(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor | TensorDictBase:
        """Normalised observations (a new tensor or TensorDict; the input is untouched)."""
        if not isinstance(obs, TensorDictBase):
            return self._normalize(self.stats["obs"], obs) if obs.is_floating_point() else obs
        out = obs.clone(recurse=False)
        for name, key, leaf in self._leaves(obs):
            out.set(key, self._normalize(self.stats[name], leaf))
        return out

    def _normalize(self, rms: RunningMeanStd, x: torch.Tensor) -> torch.Tensor:
        mean = rms.mean.to(x.dtype)
        inv_std = rms.var.add(self.eps).rsqrt().to(x.dtype)
        return ((x - mean) * inv_std).clamp(-self.clip, self.clip)
