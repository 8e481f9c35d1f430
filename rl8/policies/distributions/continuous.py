"""Distributions of continuous actions (``Box``): :class:`Normal` (clipped to the bounds by
:meth:`~Normal.to_env_action`) and :class:`SquashedNormal` (tanh-squashed into the bounds)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import Tensor

from rl8.policies.distributions.base import (
    HALF_LOG_2PI,
    LOG_2,
    LOG_STD_MAX,
    LOG_STD_MIN,
    Distribution,
    cached,
    is_float_box,
)

__all__ = ["Normal", "SquashedNormal"]


class _BoxBounds:
    """Affine map from a normalised action to a Box, on one device (built once per space)."""

    __slots__ = ("center", "half_range", "low", "high", "log_half_range_sum", "affine", "clip")

    def __init__(self, space: spaces.Box, device: torch.device) -> None:
        low = np.asarray(space.low, dtype=np.float64)
        high = np.asarray(space.high, dtype=np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        low_f, high_f = np.where(finite, low, -1.0), np.where(finite, high, 1.0)
        center, half = (high_f + low_f) / 2.0, (high_f - low_f) / 2.0  # 0 and 1 if unbounded
        self.center, self.half_range, self.low, self.high = (
            torch.as_tensor(x, dtype=torch.float32, device=device) for x in (center, half, low, high)
        )
        self.affine = bool(finite.any())
        self.clip = bool(np.isfinite(low).any() or np.isfinite(high).any())
        with np.errstate(divide="ignore"):
            self.log_half_range_sum = float(np.log(half).sum())

    @staticmethod
    def get(space: spaces.Box, device: torch.device) -> _BoxBounds:
        return cached(space, ("box_bounds", device), lambda: _BoxBounds(space, device))


class Normal(Distribution):
    """A diagonal Gaussian over a float ``Box``, acting in a normalised action space.

    Params are ``[mean (d), log_std (d)]`` with ``d = prod(shape)``, kept as float32 ``[B, d]``
    attributes ``mean`` and ``log_std`` (clamped to ``[LOG_STD_MIN, LOG_STD_MAX]``). Raw actions are
    the Gaussian samples, float32 ``[B, *shape]``; :meth:`log_prob` and :meth:`entropy` are those
    of the raw Gaussian.
    """

    def __init__(
        self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None
    ) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        params = params.float()
        d = params.shape[-1] // 2
        self.mean = params[..., :d]
        self.log_std = params[..., d:].clamp(LOG_STD_MIN, LOG_STD_MAX)
        self._event_shape = tuple(action_space.shape)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``Box`` spaces with a floating dtype."""
        return is_float_box(action_space)

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``2 * prod(shape)``: the means, then the log standard deviations."""
        return 2 * int(np.prod(action_space.shape, dtype=np.int64))

    @classmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """float32."""
        return torch.float32

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """``clip(center + half_range * raw, low, high)`` where both bounds are finite (raw
        ``[-1, 1]`` covers the Box), else ``raw`` clipped to its finite bound; float32."""
        bounds = _BoxBounds.get(action_space, actions.device)
        actions = actions.float()
        if bounds.affine:
            actions = torch.addcmul(bounds.center, bounds.half_range, actions)
        if bounds.clip:
            actions = torch.clamp(actions, bounds.low, bounds.high)
        return actions

    def _rsample_flat(self, generator: torch.Generator | None = None) -> Tensor:
        noise = torch.randn(
            self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype
        )
        return torch.addcmul(self.mean, self.log_std.exp(), noise)

    def _log_prob_flat(self, x: Tensor) -> Tensor:
        z = (x - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std).sum(-1) - self.mean.shape[-1] * HALF_LOG_2PI

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``mean + std * N(0, 1)``, float32 ``[B, *shape]``."""
        return self._rsample_flat(generator).reshape(self.batch_shape + self._event_shape)

    def deterministic_sample(self) -> Tensor:
        """The mean, float32 ``[B, *shape]``."""
        return self.mean.reshape(self.batch_shape + self._event_shape)

    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-density of raw Gaussian actions ``[B, *shape]``, summed over dimensions, ``[B]``."""
        return self._log_prob_flat(actions.reshape(self.mean.shape).float())

    def entropy(self) -> Tensor:
        """Exact entropy of the Gaussian, ``sum(0.5 + 0.5 * log(2 pi) + log_std)``, ``[B]``."""
        return self.log_std.sum(-1) + self.mean.shape[-1] * (0.5 + HALF_LOG_2PI)


class SquashedNormal(Normal):
    """A Gaussian squashed by ``tanh`` onto a ``Box`` with finite bounds (as in SAC).

    Params are those of :class:`Normal`; the raw action is the pre-tanh sample ``u``, the env
    action ``center + half_range * tanh(u)``, and :meth:`log_prob` the log-density of the env
    action (``docs/distributions.md``).
    """

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """Float ``Box`` spaces whose bounds are all finite with ``low < high``."""
        return is_float_box(action_space) and cached(
            action_space,
            "squashable",
            lambda: bool(
                np.isfinite(action_space.low).all()
                and np.isfinite(action_space.high).all()
                and (action_space.low < action_space.high).all()
            ),
        )

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """``clip(center + half_range * tanh(raw), low, high)``, float32 ``[B, *shape]``."""
        bounds = _BoxBounds.get(action_space, actions.device)
        env = torch.addcmul(bounds.center, bounds.half_range, torch.tanh(actions.float()))
        return torch.clamp(env, bounds.low, bounds.high)

    def _log_prob_flat(self, u: Tensor) -> Tensor:
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|
        log_det = (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        bounds = _BoxBounds.get(self.action_space, u.device)
        return super()._log_prob_flat(u) - log_det - bounds.log_half_range_sum

    def entropy(self, generator: torch.Generator | None = None) -> Tensor:
        """A one-sample, reparameterised estimate ``-log_prob(u)``, ``u = mean + std * eps`` (no
        closed form), ``eps`` drawn from ``generator`` (``None``: torch's global RNG)."""
        return -self._log_prob_flat(self._rsample_flat(generator))
