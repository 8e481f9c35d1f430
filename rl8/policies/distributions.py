"""Action distributions: what turns a model's flat output into actions, log-probs and entropy.

A policy is a model plus a distribution class. The model outputs a flat tensor of
``param_size(action_space)`` parameters per sample; the distribution built from them samples
*raw* actions (what the rollout buffer stores and what :meth:`Distribution.log_prob` takes) and
:meth:`Distribution.to_env_action` maps raw actions to what ``Env.step`` receives (see
:mod:`rl8.envs.spaces` for the env's action conventions). Each class's docstring gives its action
space, parameter layout and raw actions (a table in ``docs/distributions.md``).

Everything is computed in float32 from raw tensor operations (no ``torch.distributions``
objects in the hot loop), and sampling draws from the global torch RNG unless a
``generator`` is given, so ``torch.manual_seed`` makes rollouts reproducible.

The parameters may carry any number of leading batch dimensions (``[B, P]``, ``[B, T, P]``);
results keep them. See ``docs/distributions.md`` for a walk-through.
"""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import Tensor

__all__ = [
    "Bernoulli", "Categorical", "Distribution", "LOG_STD_MAX", "LOG_STD_MIN", "MultiCategorical",
    "Normal", "SquashedNormal", "default_distribution_cls",
]

LOG_STD_MIN = -20.0
"""Lower clamp of the log standard deviation of :class:`Normal` and :class:`SquashedNormal`."""
LOG_STD_MAX = 2.0
"""Upper clamp of the log standard deviation of :class:`Normal` and :class:`SquashedNormal`."""

# Logit given to masked-out (and padding) actions. The most negative finite float32 rather
# than -inf: its probability is exactly 0 after softmax, yet 0 * log_prob stays 0 (no NaN in the
# entropy or its gradient) and a row with every action masked degrades to a uniform
# distribution instead of NaN.
_MASKED_LOGIT = torch.finfo(torch.float32).min
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


# --------------------------------------------------------------------------------------------
# Per-space cache: numpy work on a space (bounds, nvec) is done once, tensors once per device.
# Keyed by ``id(space)`` and guarded by a weak reference (gymnasium spaces are not hashable).
# Spaces are assumed not to be mutated after first use.

_SPACE_CACHE: dict[int, tuple[weakref.ref, dict[Any, Any]]] = {}


def _space_cache(space: spaces.Space) -> dict[Any, Any]:
    key = id(space)
    entry = _SPACE_CACHE.get(key)
    if entry is not None and entry[0]() is space:
        return entry[1]
    store: dict[Any, Any] = {}

    def _drop(ref: weakref.ref, key: int = key) -> None:
        current = _SPACE_CACHE.get(key)
        if current is not None and current[0] is ref:
            del _SPACE_CACHE[key]

    _SPACE_CACHE[key] = (weakref.ref(space, _drop), store)
    return store


def _cached(space: spaces.Space, name: Any, make) -> Any:
    store = _space_cache(space)
    if name not in store:
        store[name] = make()
    return store[name]


def _is_float_box(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating)


def _space_name(space: spaces.Space) -> str:
    return f"{type(space).__name__} ({' '.join(str(space).split())})"


# --------------------------------------------------------------------------------------------
# Categorical kernels on logits of shape [..., n] (n = number of choices, last dim).

# Short rows of a big batch are computed choice-major: torch's CPU softmax over the last dim
# vectorises along that dim, so rows shorter than a vector register leave most lanes idle; over
# dim 0 of a contiguous [n, ...] copy it vectorises along the batch. A full register of choices
# or a small batch (fixed costs dominate) is better row-major, hence the bounds.
_CHOICE_MAJOR_MAX_CHOICES = 15
_CHOICE_MAJOR_MIN_ROWS = 256


def _log_softmax(logits: Tensor) -> tuple[Tensor, Tensor | None]:
    """``log_softmax(logits, -1)`` and, when it was computed choice-major (short rows of a big
    batch), the contiguous ``[n, ...]`` tensor it is a view of (else ``None``). Either way the
    first result has the values and shape of ``log_softmax(logits, -1)``."""
    n = logits.shape[-1]
    if 1 < n <= _CHOICE_MAJOR_MAX_CHOICES and logits.numel() >= _CHOICE_MAJOR_MIN_ROWS * n:
        by_choice = torch.log_softmax(logits.T if logits.dim() == 2 else logits.movedim(-1, 0), 0)
        return (by_choice.T if logits.dim() == 2 else by_choice.movedim(0, -1)), by_choice
    return torch.log_softmax(logits, -1), None


def _categorical_sample(log_probs: Tensor, generator: torch.Generator | None, guard_logits: Tensor | None,
                        masked: bool | None = None, by_choice: Tensor | None = None) -> Tensor:
    """Sampled indices ``[...]`` (see :func:`_categorical_sample_index`)."""
    if by_choice is not None:
        return _categorical_sample_by_choice(by_choice, generator, guard_logits, masked)
    return _categorical_sample_index(log_probs, generator, guard_logits, masked).squeeze(-1)


def _categorical_sample_index(log_probs: Tensor, generator: torch.Generator | None, guard_logits: Tensor | None,
                              masked: bool | None = None) -> Tensor:
    """Inverse-CDF sampling (one uniform per row instead of one per choice as Gumbel-max or
    multinomial need, and no logs): index ``[..., 1]`` of the first cumulative probability
    >= u, u ~ U(0, total].

    ``masked`` (default: whether ``guard_logits`` is given) selects the exact path below for
    rows that may hold zero probabilities; unmasked rows take a two-op-shorter path. ``u`` is
    drawn in ``(0, total]`` so a zero-probability (masked) action can never be selected: that
    needs ``c[j-1] < u <= c[j] == c[j-1]`` (or ``u <= c[0] == 0``), both impossible.
    """
    probs = log_probs.exp()
    cdf = probs.cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    # The action is the number of cumulative probabilities below u: ``(cdf < u).sum(-1)``,
    # which for a non-decreasing cdf is exactly a left-sided binary search (one op, not two).
    if not (guard_logits is not None if masked is None else masked):
        # No mask: every action has p > 0, so u in [0, 1) needs no rescaling; the clamp only
        # catches u >= cdf[-1] when rounding leaves the total a hair below 1. Two fewer ops
        # per rollout step than the masked path.
        return torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)
    u = torch.mul(1.0 - u, cdf[..., -1:])  # (0, total]: rand is [0, 1)
    index = torch.searchsorted(cdf, u)
    if guard_logits is not None and cdf.device.type != "cpu":
        # For masked rows off the CPU: a parallel (GPU) cumsum does not promise
        # cdf[j] == cdf[j-1] bit for bit when p[j] == 0, so fall back to the mode (allowed
        # whenever any action is) should a zero-probability choice come out. The CPU cumsum
        # accumulates each row sequentially (in double), which makes the argument above exact.
        chosen = probs.gather(-1, index)
        index = torch.where(chosen > 0, index, guard_logits.argmax(-1, keepdim=True))
    return index


def _writable_rows(out: tuple[Tensor, Tensor], dtype: torch.dtype) -> bool:
    """Whether the categorical kernels can write actions and log-probs into ``out`` directly."""
    actions, logp = out
    return (
        actions.dtype == torch.int64 and logp.dtype == dtype
        and actions.is_contiguous() and logp.is_contiguous()
    )


def _to_out(result: tuple[Tensor, Tensor], out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """``result`` (actions, log-probs), or copied into ``out`` and ``out`` returned."""
    if out is None:
        return result
    out[0].copy_(result[0])
    out[1].copy_(result[1])
    return out


def _categorical_sample_by_choice(by_choice: Tensor, generator: torch.Generator | None, guard_logits: Tensor | None,
                                  masked: bool | None, out: Tensor | None = None) -> Tensor:
    """:func:`_categorical_sample_index` on choice-major log-probs ``[n, ...]``: the same
    draws (one uniform per row, in row order) and the same indices, but ``[...]``. The index
    is the number of cumulative probabilities below u, which for a non-decreasing cdf is the
    left-sided binary search of the row-major path."""
    probs = by_choice.exp()
    cdf = probs.cumsum(0)  # sequential along dim 0 on the CPU too, as the row-major cumsum
    u = torch.rand(cdf.shape[1:], generator=generator, device=cdf.device, dtype=cdf.dtype)
    if not (guard_logits is not None if masked is None else masked):
        # only the first n - 1 cumulative probabilities count: the index is at most n - 1
        # without a clamp
        return torch.sum(cdf[:-1] < u, 0, out=out)
    u = torch.mul(1.0 - u, cdf[-1])
    index = (cdf < u).sum(0)
    if guard_logits is not None and cdf.device.type != "cpu":
        chosen = probs.gather(0, index.unsqueeze(0)).squeeze(0)
        index = torch.where(chosen > 0, index, guard_logits.argmax(-1))
    return index if out is None else out.copy_(index)


def _categorical_log_prob(log_probs: Tensor, actions: Tensor) -> Tensor:
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _categorical_entropy(log_probs: Tensor) -> Tensor:
    # Masked entries have p == 0 and a finite log_prob, so p * log_p == 0 (no 0 * -inf NaN).
    return -(log_probs.exp() * log_probs).sum(-1)


def _check_mask(mask: Tensor, expected_shape: torch.Size, cls_name: str) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"{cls_name}: action_mask must be a bool tensor, got {mask.dtype}")
    if mask.shape != expected_shape:
        raise ValueError(
            f"{cls_name}: action_mask must have shape {list(expected_shape)} "
            f"(the batch shape and one entry per action), got {list(mask.shape)}"
        )


# --------------------------------------------------------------------------------------------


class Distribution(ABC):
    """A batch of action distributions whose parameters a model outputs.

    Subclasses implement the classmethods that describe an action space (:meth:`supports`,
    :meth:`param_size`, :meth:`raw_action_shape`, :meth:`raw_action_dtype`,
    :meth:`to_env_action`) and the per-batch methods (:meth:`sample`,
    :meth:`deterministic_sample`, :meth:`log_prob`, :meth:`entropy`).

    Args:
        params: The model's output, ``[B, param_size(action_space)]`` (any leading batch
            dimensions and any float dtype, e.g. bfloat16 under autocast; the distribution
            computes in float32).
        action_space: The action space of ONE env.
        action_mask: Optional bool tensor ``[B, n]``, ``True`` where an action is allowed; only
            for the discrete families (:attr:`supports_action_mask`). At least one action per
            row (per component for :class:`MultiCategorical`) must be allowed.

    Raises:
        ValueError: ``action_space`` is not supported by this class, ``params`` does not have
            ``param_size(action_space)`` entries in its last dimension, or an ``action_mask``
            is given to a class that does not support one or has the wrong shape/dtype.

    Attributes:
        params: The parameters as given.
        action_space: The action space.
        batch_shape: The leading dimensions of ``params`` (``params.shape[:-1]``).
        supports_action_mask: Class attribute; whether ``action_mask`` is accepted.
    """

    supports_action_mask: ClassVar[bool] = False

    def __init__(self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None) -> None:
        name = type(self).__name__
        if not self.supports(action_space):
            raise ValueError(f"{name} does not support the action space {_space_name(action_space)}")
        expected = self.param_size(action_space)
        given = params.shape[-1] if params.ndim > 0 else None
        if given != expected:
            raise ValueError(
                f"{name}: params must have {expected} entries in the last dimension for "
                f"{_space_name(action_space)}, got {given} (params shape {list(params.shape)})"
            )
        if action_mask is not None and not self.supports_action_mask:
            raise ValueError(
                f"{name} does not accept an action_mask (only the discrete families "
                "Categorical and MultiCategorical do)"
            )
        self.params = params
        self.action_space = action_space
        self.batch_shape = params.shape[:-1]

    # -- describing the action space ----------------------------------------------------------

    @classmethod
    @abstractmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """Whether this distribution class can drive ``action_space``."""

    @classmethod
    @abstractmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """Width of the flat parameter tensor the model must output for ``action_space``."""

    @classmethod
    @abstractmethod
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """Shape of ONE raw action (no batch dimension), as stored in the rollout buffer."""

    @classmethod
    @abstractmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """Torch dtype of raw actions."""

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Map a batch of raw actions to what ``Env.step`` receives (see :mod:`rl8.envs.spaces`).

        Args:
            actions: Raw actions ``[*batch, *raw_action_shape(action_space)]``.
            action_space: The action space of ONE env.

        The default is the identity.
        """
        return actions

    # -- per-batch methods -------------------------------------------------------------------

    @abstractmethod
    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw one raw action per sample, ``[*batch_shape, *raw_action_shape]``.

        Meant for rollouts (under ``torch.inference_mode``); no gradient flows.

        Args:
            generator: Random number generator to draw from; ``None`` uses torch's global RNG
                (seeded by ``torch.manual_seed``).
        """

    @abstractmethod
    def deterministic_sample(self) -> Tensor:
        """The mode of each distribution as a raw action (for evaluation)."""

    def sample_with_log_prob(self, generator: torch.Generator | None = None, *, deterministic: bool = False,
                             out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Draw raw actions (:meth:`sample`, or the modes when ``deterministic``) together
        with their :meth:`log_prob`, ``([*batch_shape, *raw_action_shape], [*batch_shape])``.

        What the rollout loop calls once per step; subclasses may share work between the
        two (the categorical families reuse one log-softmax) and write straight into ``out``.

        Args:
            generator: Random number generator to draw from (see :meth:`sample`).
            deterministic: Take the modes instead of sampling.
            out: Tensors of those shapes to write the actions and log-probs into (PPO passes
                its rollout buffer's rows); they are returned. ``None``: new tensors.
        """
        actions = self.deterministic_sample() if deterministic else self.sample(generator)
        return _to_out((actions, self.log_prob(actions)), out)

    @abstractmethod
    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-probability (density) of raw ``actions``, float32 ``[*batch_shape]``.

        Differentiable with respect to ``params``; multi-dimensional actions are summed over
        their components.
        """

    @abstractmethod
    def entropy(self) -> Tensor:
        """Entropy of each distribution, float32 ``[*batch_shape]``, differentiable."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_shape={list(self.batch_shape)}, "
            f"action_space={self.action_space})"
        )


# --------------------------------------------------------------------------------------------


class _CategoricalBase(Distribution):
    """Shared lazily-cached log-softmax for the categorical families."""

    supports_action_mask = True
    logits: Tensor

    def _init_logits(self, logits: Tensor, guard: bool) -> None:
        self.logits = logits
        self._guard = logits if guard else None  # the guard_logits of the samplers
        self._log_probs: Tensor | None = None
        self._by_choice: Tensor | None = None  # see _log_softmax
        self._log_probs_mode: tuple[bool, bool] | None = None

    @property
    def log_probs(self) -> Tensor:
        """Normalised log-probabilities of every choice (computed once, cached).

        The cache is keyed on the grad / inference mode, so a distribution first sampled under
        ``torch.inference_mode`` still yields differentiable log-probs outside it; a cache made
        with autograd on serves ``no_grad`` callers too (it only carries more history).
        """
        mode = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        cached = self._log_probs_mode
        if self._log_probs is None or (cached != mode and not (cached == (True, False) and not mode[0])):
            self._log_probs, self._by_choice = _log_softmax(self.logits)
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

    def _sample(self, generator: torch.Generator | None) -> Tensor:
        log_probs = self.log_probs  # sets _by_choice
        return _categorical_sample(log_probs, generator, self._guard, by_choice=self._by_choice)


class Categorical(_CategoricalBase):
    """A categorical distribution over ``Discrete(n)`` actions.

    Params are ``n`` unnormalised logits. Raw actions are int64 ``[B]`` and equal the env's
    action (plus the space's ``start`` when it is not 0).

    With ``action_mask`` (bool ``[B, n]``, ``True`` = allowed), masked-out actions get
    probability exactly 0: they are never sampled, never the deterministic choice and add
    nothing to the entropy. Every row must allow at least one action; a row with none
    becomes uniform over all actions (no NaN, but the sample is then not allowed).
    """

    def __init__(self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        logits = params.float()
        if action_mask is not None:
            _check_mask(action_mask, logits.shape, "Categorical")
            logits = logits.masked_fill(~action_mask, _MASKED_LOGIT)
        self._init_logits(logits, guard=action_mask is not None)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``Discrete`` spaces."""
        return isinstance(action_space, spaces.Discrete)

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``n``: one logit per action."""
        return int(action_space.n)

    @classmethod
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """``()``: one index per sample."""
        return ()

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Identity (adds ``action_space.start`` when it is not 0)."""
        start = int(action_space.start)
        return actions + start if start else actions

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw one action index per row (inverse-CDF sampling), int64 ``[B]``."""
        return self._sample(generator)

    def deterministic_sample(self) -> Tensor:
        """The most likely allowed action, int64 ``[B]``."""
        return self.logits.argmax(-1)

    def sample_with_log_prob(self, generator: torch.Generator | None = None, *, deterministic: bool = False,
                             out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Actions and their log-probabilities from one log-softmax and one gather, written
        straight into ``out`` when it is a pair of contiguous int64 / float32 tensors."""
        log_probs = self.log_probs
        guard, by_choice = self._guard, self._by_choice
        if deterministic:
            index = self.logits.argmax(-1, keepdim=True)
        elif by_choice is not None:
            if out is not None and _writable_rows(out, by_choice.dtype):
                actions, logp = out
                _categorical_sample_by_choice(by_choice, generator, guard, None, out=actions)
                torch.gather(by_choice, 0, actions.unsqueeze(0), out=logp.unsqueeze(0))
                return out
            index = _categorical_sample_by_choice(by_choice, generator, guard, None)
            return _to_out((index, by_choice.gather(0, index.unsqueeze(0)).squeeze_(0)), out)
        else:
            index = _categorical_sample_index(log_probs, generator, guard)
        return _to_out((index.squeeze(-1), log_probs.gather(-1, index).squeeze(-1)), out)

    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-probability of action indices ``[B]`` (masked actions: a huge negative number)."""
        return _categorical_log_prob(self.log_probs, actions)

    def entropy(self) -> Tensor:
        """``-sum(p * log p)`` over the allowed actions, ``[B]``."""
        return _categorical_entropy(self.log_probs)


class MultiCategorical(_CategoricalBase):
    """Independent categorical distributions, one per component of a ``MultiDiscrete(nvec)``.

    ``nvec`` may have any shape; it is flattened in C order. Params are the ``sum(nvec)``
    logits of the components one after another. Raw actions are int64
    ``[B, *nvec.shape]`` (plus the space's ``start`` for the env when it is not 0).
    :meth:`log_prob` and :meth:`entropy` are summed over components.

    ``action_mask`` is bool ``[B, sum(nvec)]`` laid out like the params; each component must
    allow at least one of its choices.
    """

    def __init__(self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        layout = self._layout(action_space)
        num, width, pad_index = layout["num"], layout["width"], layout["pad_index"]
        logits = params.float()
        if action_mask is not None:
            _check_mask(action_mask, logits.shape, "MultiCategorical")
            logits = logits.masked_fill(~action_mask, _MASKED_LOGIT)
        if pad_index is not None:
            # Components of different sizes: append one zero-probability logit and gather a
            # [*, num * width] layout in which short components repeat it as padding, so all
            # components share one [*, num, width] tensor (one gather, no filled tensor).
            index = pad_index.get(logits.device)
            if index is None:
                index = pad_index[logits.device] = layout["pad_index_cpu"].to(logits.device)
            logits = F.pad(logits, (0, 1), value=_MASKED_LOGIT).index_select(-1, index)
        logits = logits.reshape(self.batch_shape + (num, width))
        self._init_logits(logits, guard=action_mask is not None or pad_index is not None)

    @staticmethod
    def _layout(action_space: spaces.MultiDiscrete) -> dict[str, Any]:
        def make() -> dict[str, Any]:
            nvec = np.asarray(action_space.nvec, dtype=np.int64).reshape(-1)
            num, width = int(nvec.size), int(nvec.max()) if nvec.size else 0
            layout: dict[str, Any] = {"num": num, "width": width, "pad_index": None}
            if nvec.size and not (nvec == width).all():
                # For each padded slot: its source column in the params, or the appended pad.
                index = np.full((num, width), nvec.sum(), dtype=np.int64)
                offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
                for k, (offset, n) in enumerate(zip(offsets, nvec)):
                    index[k, :n] = offset + np.arange(n)
                index = index.reshape(-1)
                layout["pad_index"] = {}
                layout["pad_index_cpu"] = torch.as_tensor(index, dtype=torch.int64)
            start = np.asarray(action_space.start, dtype=np.int64)
            layout["start"] = start if start.any() else None
            layout["start_t"] = {}
            return layout

        return _cached(action_space, "multicategorical", make)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``MultiDiscrete`` spaces of any shape with at least one component."""
        return isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.size > 0

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``sum(nvec)``: the logits of each component, one component after another."""
        return int(np.asarray(action_space.nvec).sum())

    @classmethod
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """``nvec.shape``."""
        return tuple(action_space.nvec.shape)

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Identity (adds ``action_space.start`` when it is not 0)."""
        layout = cls._layout(action_space)
        if layout["start"] is None:
            return actions
        start = layout["start_t"].get(actions.device)
        if start is None:
            start = layout["start_t"][actions.device] = torch.as_tensor(layout["start"], device=actions.device)
        return actions + start

    def _shape_actions(self, actions: Tensor) -> Tensor:
        return actions.reshape(self.batch_shape + self.action_space.nvec.shape)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw one choice per component, int64 ``[B, *nvec.shape]``."""
        return self._shape_actions(self._sample(generator))

    def deterministic_sample(self) -> Tensor:
        """The most likely allowed choice of every component, int64 ``[B, *nvec.shape]``."""
        return self._shape_actions(self.logits.argmax(-1))

    def log_prob(self, actions: Tensor) -> Tensor:
        """Sum over components of the log-probability of their choices, ``[B]``."""
        flat = actions.reshape(self.batch_shape + (self.logits.shape[-2],))
        return _categorical_log_prob(self.log_probs, flat).sum(-1)

    def entropy(self) -> Tensor:
        """Sum over components of their entropies, ``[B]``."""
        return _categorical_entropy(self.log_probs).sum(-1)


# --------------------------------------------------------------------------------------------


class _BoxBounds:
    """Affine map from a normalised action to a Box, on one device (built once per space)."""

    __slots__ = ("center", "half_range", "low", "high", "log_half_range_sum", "affine", "clip")

    def __init__(self, space: spaces.Box, device: torch.device) -> None:
        low = np.asarray(space.low, dtype=np.float64)
        high = np.asarray(space.high, dtype=np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        low_f, high_f = np.where(finite, low, -1.0), np.where(finite, high, 1.0)
        center, half = (high_f + low_f) / 2.0, (high_f - low_f) / 2.0  # 0 and 1 if unbounded

        def t(x: np.ndarray) -> Tensor:
            return torch.as_tensor(x, dtype=torch.float32, device=device)

        self.center, self.half_range, self.low, self.high = t(center), t(half), t(low), t(high)
        self.affine = bool(finite.any())
        self.clip = bool(np.isfinite(low).any() or np.isfinite(high).any())
        with np.errstate(divide="ignore"):
            self.log_half_range_sum = float(np.log(half).sum())

    @staticmethod
    def get(space: spaces.Box, device: torch.device) -> _BoxBounds:
        return _cached(space, ("box_bounds", device), lambda: _BoxBounds(space, device))


def _box_dim(space: spaces.Box) -> int:
    return int(np.prod(space.shape, dtype=np.int64))


class Normal(Distribution):
    """A diagonal Gaussian over a float ``Box``, acting in a normalised action space.

    Params are ``[mean (d), log_std (d)]`` with ``d = prod(shape)``; ``log_std`` is clamped to
    ``[LOG_STD_MIN, LOG_STD_MAX]`` = ``[-20, 2]``. A state-independent standard deviation is
    the model's business (it concatenates a learned parameter to the mean).

    Raw actions are the Gaussian samples, float32 ``[B, *shape]``; :meth:`to_env_action`
    maps them onto the bounds (``center + half_range * raw``, clipped). :meth:`log_prob` and
    :meth:`entropy` are those of the raw Gaussian, summed over action dimensions.

    Attributes:
        mean: ``[B, d]`` float32.
        log_std: ``[B, d]`` float32, clamped.
    """

    def __init__(self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None) -> None:
        super().__init__(params, action_space, action_mask=action_mask)
        params = params.float()
        d = params.shape[-1] // 2
        self.mean = params[..., :d]
        self.log_std = params[..., d:].clamp(LOG_STD_MIN, LOG_STD_MAX)
        self._event_shape = tuple(action_space.shape)

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """``Box`` spaces with a floating dtype."""
        return _is_float_box(action_space)

    @classmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """``2 * prod(shape)``: the means, then the log standard deviations."""
        return 2 * _box_dim(action_space)

    @classmethod
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """The Box's shape."""
        return tuple(action_space.shape)

    @classmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """float32."""
        return torch.float32

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Map raw Gaussian actions onto the Box, float32 ``[B, *shape]``.

        Dimensions with both bounds finite: ``clip(center + half_range * raw, low, high)``
        with ``center = (high + low) / 2`` and ``half_range = (high - low) / 2``, so the raw
        range ``[-1, 1]`` covers the Box. Other dimensions: ``raw``, clipped to the one finite
        bound if there is one.
        """
        bounds = _BoxBounds.get(action_space, actions.device)
        actions = actions.float()
        if bounds.affine:
            actions = torch.addcmul(bounds.center, bounds.half_range, actions)
        if bounds.clip:
            actions = torch.clamp(actions, bounds.low, bounds.high)
        return actions

    def _flat(self, actions: Tensor) -> Tensor:
        return actions.reshape(self.mean.shape).float()

    def _rsample_flat(self, generator: torch.Generator | None = None) -> Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        return torch.addcmul(self.mean, self.log_std.exp(), noise)

    def _log_prob_flat(self, x: Tensor) -> Tensor:
        z = (x - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std).sum(-1) - self.mean.shape[-1] * _HALF_LOG_2PI

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``mean + std * N(0, 1)``, float32 ``[B, *shape]``."""
        return self._rsample_flat(generator).reshape(self.batch_shape + self._event_shape)

    def deterministic_sample(self) -> Tensor:
        """The mean, float32 ``[B, *shape]``."""
        return self.mean.reshape(self.batch_shape + self._event_shape)

    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-density of raw Gaussian actions ``[B, *shape]``, summed over dimensions, ``[B]``."""
        return self._log_prob_flat(self._flat(actions))

    def entropy(self) -> Tensor:
        """Exact entropy of the Gaussian, ``sum(0.5 + 0.5 * log(2 pi) + log_std)``, ``[B]``."""
        return self.log_std.sum(-1) + self.mean.shape[-1] * (0.5 + _HALF_LOG_2PI)


class SquashedNormal(Normal):
    """A Gaussian squashed by ``tanh`` onto a ``Box`` with finite bounds (as in SAC).

    Params are those of :class:`Normal`. The raw action is the pre-tanh Gaussian sample ``u``
    (storing ``u`` instead of the env action avoids ``atanh`` of values at the bounds); the env
    action is ``center + half_range * tanh(u)``.

    :meth:`log_prob` is the log-density of the ENV action:
    ``Normal.log_prob(u) - sum(log(half_range) + log(1 - tanh(u)^2))``, with
    ``log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))`` (stable for large ``|u|``).
    It has no closed-form entropy: :meth:`entropy` is a one-sample, reparameterised estimate.
    """

    @classmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """Float ``Box`` spaces whose bounds are all finite with ``low < high``."""
        if not _is_float_box(action_space):
            return False

        def make() -> bool:
            low, high = np.asarray(action_space.low), np.asarray(action_space.high)
            return bool(np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all())

        return _cached(action_space, "squashable", make)

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """``clip(center + half_range * tanh(raw), low, high)``, float32 ``[B, *shape]``."""
        bounds = _BoxBounds.get(action_space, actions.device)
        env = torch.addcmul(bounds.center, bounds.half_range, torch.tanh(actions.float()))
        return torch.clamp(env, bounds.low, bounds.high)

    def _log_prob_flat(self, u: Tensor) -> Tensor:
        log_det = (2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        bounds = _BoxBounds.get(self.action_space, u.device)
        return super()._log_prob_flat(u) - log_det - bounds.log_half_range_sum

    def entropy(self, generator: torch.Generator | None = None) -> Tensor:
        """One-sample estimate ``-log_prob(u)`` with ``u = mean + std * eps`` (reparameterised).

        Unbiased but noisy, differentiable through ``u``, and it draws from the RNG.
        """
        return -self._log_prob_flat(self._rsample_flat(generator))


# --------------------------------------------------------------------------------------------


class Bernoulli(Distribution):
    """Independent Bernoulli variables for a ``MultiBinary(shape)`` space.

    Params are ``prod(shape)`` logits (log-odds of a 1). Raw actions are int64 0/1
    ``[B, *shape]`` and equal the env's action. :meth:`log_prob` and :meth:`entropy` are
    summed over the variables.

    Attributes:
        logits: ``[B, prod(shape)]`` float32.
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
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """The MultiBinary's shape."""
        return tuple(action_space.shape)

    @classmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """int64 (0/1), like the env's action."""
        return torch.int64

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``1`` with probability ``sigmoid(logit)``, int64 ``[B, *shape]``."""
        u = torch.rand(self.logits.shape, generator=generator, device=self.logits.device, dtype=torch.float32)
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


# --------------------------------------------------------------------------------------------

_DEFAULTS: tuple[tuple[type[spaces.Space], type[Distribution]], ...] = (
    (spaces.Discrete, Categorical),
    (spaces.MultiDiscrete, MultiCategorical),
    (spaces.Box, Normal),
    (spaces.MultiBinary, Bernoulli),
)


def default_distribution_cls(action_space: spaces.Space) -> type[Distribution]:
    """The distribution class rl8 uses for ``action_space`` unless told otherwise.

    ``Discrete`` -> :class:`Categorical`, ``MultiDiscrete`` -> :class:`MultiCategorical`,
    float ``Box`` -> :class:`Normal`, ``MultiBinary`` -> :class:`Bernoulli`.

    Raises:
        TypeError: For any other space (including integer ``Box`` and ``Dict`` action spaces).
    """
    for space_cls, dist_cls in _DEFAULTS:
        if isinstance(action_space, space_cls) and dist_cls.supports(action_space):
            return dist_cls
    supported = ", ".join(f"{s.__name__} -> {d.__name__}" for s, d in _DEFAULTS)
    raise TypeError(
        f"no default action distribution for {_space_name(action_space)}; supported: "
        f"{supported} (Box must have a floating dtype). Pass distribution_cls= for others."
    )
