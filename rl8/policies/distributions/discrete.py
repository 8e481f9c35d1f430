"""Distributions of discrete actions: :class:`Categorical` (``Discrete``), :class:`MultiCategorical`
(``MultiDiscrete``) with action masks, and :class:`Bernoulli` (``MultiBinary``)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import Tensor

from rl8.policies.distributions.base import MASKED_LOGIT, Distribution, cached

__all__ = ["Bernoulli", "Categorical", "MultiCategorical"]


def _categorical_sample(
    log_probs: Tensor, generator: torch.Generator | None, guard_logits: Tensor | None
) -> Tensor:
    """Inverse-CDF sampling, one uniform per row: the index ``[...]`` of the first cumulative
    probability >= u (a left-sided binary search).

    With ``guard_logits`` (rows that may hold zero probabilities) u is drawn in ``(0, total]``,
    so a zero-probability choice would need ``c[j-1] < u <= c[j] == c[j-1]`` (or
    ``u <= c[0] == 0``), both impossible.
    """
    probs = log_probs.exp()
    cdf = probs.cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    if guard_logits is None:
        # every p > 0: the clamp only catches a total that rounding leaves a hair below 1
        return torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)
    u = torch.mul(1.0 - u, cdf[..., -1:])  # (0, total]: rand is [0, 1)
    index = torch.searchsorted(cdf, u)
    if cdf.device.type != "cpu":
        # A parallel (GPU) cumsum does not promise cdf[j] == cdf[j-1] bit for bit when p[j] == 0
        # (the CPU one accumulates each row in order): should a zero-probability choice come
        # out, take the mode, which is allowed whenever any action is.
        chosen = probs.gather(-1, index)
        index = torch.where(chosen > 0, index, guard_logits.argmax(-1, keepdim=True))
    return index.squeeze(-1)


class _CategoricalBase(Distribution):
    """What the categorical families share: float32 logits (masked), their cached log-softmax
    and the methods on them. :class:`MultiCategorical` has a components axis before the choices
    and sums over it (:meth:`_total`)."""

    supports_action_mask = True

    def __init__(
        self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None
    ) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        logits = params.float()
        if action_mask is not None:
            if action_mask.dtype != torch.bool:
                raise ValueError(
                    f"{type(self).__name__}: action_mask must be a bool tensor, got {action_mask.dtype}"
                )
            if action_mask.shape != logits.shape:
                raise ValueError(
                    f"{type(self).__name__}: action_mask must have shape {list(logits.shape)} "
                    f"(the batch shape and one entry per action), got {list(action_mask.shape)}"
                )
            logits = logits.masked_fill(~action_mask, MASKED_LOGIT)
        self.logits = logits
        self._guard = logits if action_mask is not None else None  # the guard_logits of the sampler
        self._log_probs: Tensor | None = None
        self._log_probs_mode: tuple[bool, bool] | None = None

    @property
    def log_probs(self) -> Tensor:
        """Normalised log-probabilities of every choice, cached per grad / inference mode (a
        cache made with autograd on also serves ``no_grad`` callers)."""
        # torch.compile cannot read the inference mode: only the grad mode keys the cache there
        mode = (
            torch.is_grad_enabled(),
            not torch.compiler.is_compiling() and torch.is_inference_mode_enabled(),
        )
        cached = self._log_probs_mode
        if self._log_probs is None or (cached != mode and not (cached == (True, False) and not mode[0])):
            self._log_probs = torch.log_softmax(self.logits, -1)
            self._log_probs_mode = mode
        return self._log_probs

    @property
    def probs(self) -> Tensor:
        """Probabilities of every choice (exactly 0 for masked actions)."""
        return self.log_probs.exp()

    @classmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """int64, like the env's action."""
        return torch.int64

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Identity (adds ``action_space.start`` when it is not 0)."""
        device = actions.device
        start = cached(
            action_space,
            ("start", device),
            lambda: (
                torch.as_tensor(action_space.start, dtype=torch.int64, device=device)
                if np.any(action_space.start)
                else None
            ),
        )
        return actions if start is None else actions + start

    def _total(self, x: Tensor) -> Tensor:
        return x

    def _actions(self, index: Tensor) -> Tensor:
        return index.reshape(self.batch_shape + self.raw_action_shape(self.action_space))

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """One choice per row and component (inverse-CDF sampling), int64 ``[B, *raw_action_shape]``."""
        return self._actions(_categorical_sample(self.log_probs, generator, self._guard))

    def deterministic_sample(self) -> Tensor:
        """The most likely allowed choice of every component, int64 ``[B, *raw_action_shape]``."""
        return self._actions(self.logits.argmax(-1))

    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-probability of raw actions, summed over components, ``[B]`` (masked: hugely negative)."""
        index = actions.reshape(self.logits.shape[:-1]).long().unsqueeze(-1)
        return self._total(self.log_probs.gather(-1, index).squeeze(-1))

    def entropy(self) -> Tensor:
        """``-sum(p * log p)`` over the allowed actions, summed over components, ``[B]``."""
        # masked choices have p == 0 and a finite log p, so p * log p == 0 (no 0 * -inf NaN)
        return self._total(-(self.log_probs.exp() * self.log_probs).sum(-1))


class Categorical(_CategoricalBase):
    """A categorical distribution over ``Discrete(n)`` actions.

    Params are ``n`` unnormalised logits; raw actions are int64 ``[B]``. ``action_mask`` (bool
    ``[B, n]``, ``True`` = allowed) gives masked actions probability exactly 0; every row must
    allow one action (``docs/distributions.md``).
    """

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``Discrete`` spaces."""
        return isinstance(action_space, spaces.Discrete)

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``n``: one logit per action."""
        return int(action_space.n)


class MultiCategorical(_CategoricalBase):
    """Independent categorical distributions, one per component of a ``MultiDiscrete(nvec)``.

    ``nvec`` (any shape) is flattened in C order; params are the ``sum(nvec)`` logits of the
    components one after another, and so is ``action_mask`` (each component must allow one
    choice). Raw actions are int64 ``[B, *nvec.shape]``; :meth:`log_prob` and :meth:`entropy`
    are summed over components.
    """

    def __init__(
        self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None
    ) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        num, width, pad_index = self._layout(action_space)
        logits = self.logits
        if pad_index is not None:
            # Components of different sizes: append one zero-probability logit and gather a
            # [*, num * width] layout in which short components repeat it as padding, so all
            # components share one [*, num, width] tensor (one gather, no filled tensor).
            device = logits.device
            index = cached(action_space, ("pad_index", device), lambda: pad_index.to(device))
            logits = F.pad(logits, (0, 1), value=MASKED_LOGIT).index_select(-1, index)
        self.logits = logits.reshape(self.batch_shape + (num, width))
        self._guard = self.logits if action_mask is not None or pad_index is not None else None

    @staticmethod
    def _layout(action_space: spaces.MultiDiscrete) -> tuple[int, int, Tensor | None]:
        """``(components, width of the widest, pad_index)``; ``pad_index`` is ``None`` when all
        components have one width, else the source column in the params of each padded slot,
        or the appended pad."""

        def make() -> tuple[int, int, Tensor | None]:
            nvec = np.asarray(action_space.nvec, dtype=np.int64).reshape(-1)  # supports(): not empty
            width = int(nvec.max())
            if (nvec == width).all():
                return nvec.size, width, None
            offsets, columns = np.cumsum(nvec) - nvec, np.arange(width)
            index = np.where(columns < nvec[:, None], offsets[:, None] + columns, nvec.sum())
            return nvec.size, width, torch.as_tensor(index.reshape(-1), dtype=torch.int64)

        return cached(action_space, "multicategorical", make)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``MultiDiscrete`` spaces of any shape with at least one component."""
        return isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.size > 0

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``sum(nvec)``: the logits of each component, one component after another."""
        return int(np.asarray(action_space.nvec).sum())

    def _total(self, x: Tensor) -> Tensor:
        return x.sum(-1)


class Bernoulli(Distribution):
    """Independent Bernoulli variables for a ``MultiBinary(shape)`` space.

    Params are ``prod(shape)`` logits (log-odds of a 1), kept as float32 ``logits``
    ``[B, prod(shape)]``; raw actions are int64 0/1 ``[B, *shape]``; :meth:`log_prob` and
    :meth:`entropy` are summed over the variables.
    """

    def __init__(
        self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None
    ) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        self.logits = params.float()
        self._event_shape = tuple(action_space.shape)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``MultiBinary`` spaces of any shape."""
        return isinstance(action_space, spaces.MultiBinary)

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``prod(shape)``: one logit per variable."""
        return int(np.prod(action_space.shape, dtype=np.int64))

    @classmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """int64 (0/1), like the env's action."""
        return torch.int64

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``1`` with probability ``sigmoid(logit)``, int64 ``[B, *shape]``."""
        u = torch.rand(
            self.logits.shape, generator=generator, device=self.logits.device, dtype=torch.float32
        )
        return (u < torch.sigmoid(self.logits)).long().reshape(self.batch_shape + self._event_shape)

    def deterministic_sample(self) -> Tensor:
        """``1`` where the logit is positive, int64 ``[B, *shape]``."""
        return (self.logits > 0).long().reshape(self.batch_shape + self._event_shape)

    def log_prob(self, actions: Tensor) -> Tensor:
        """Sum of ``log p`` (for 1s) and ``log(1 - p)`` (for 0s), ``[B]``."""
        target = actions.reshape(self.logits.shape).float()
        return -F.binary_cross_entropy_with_logits(self.logits, target, reduction="none").sum(-1)

    def entropy(self) -> Tensor:
        """Sum over variables of ``softplus(l) - l * sigmoid(l)``, ``[B]``."""
        return (F.softplus(self.logits) - self.logits * torch.sigmoid(self.logits)).sum(-1)
