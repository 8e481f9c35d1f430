"""The :class:`Distribution` contract every action distribution implements, and the helpers the
distributions share (space checks, cached per-space constants, action masks)."""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

__all__ = ["Distribution", "LOG_STD_MAX", "LOG_STD_MIN"]


LOG_STD_MIN = -20.0
"""Lower clamp of the log standard deviation of
:class:`~rl8.policies.distributions.continuous.Normal` and
:class:`~rl8.policies.distributions.continuous.SquashedNormal`."""
LOG_STD_MAX = 2.0
"""Upper clamp of the log standard deviation of
:class:`~rl8.policies.distributions.continuous.Normal` and
:class:`~rl8.policies.distributions.continuous.SquashedNormal`."""

# Logit given to masked-out (and padding) actions. The most negative finite float32 rather
# than -inf: its probability is exactly 0 after softmax, yet 0 * log_prob stays 0 (no NaN in the
# entropy or its gradient) and a row with every action masked degrades to a uniform
# distribution instead of NaN.
MASKED_LOGIT = torch.finfo(torch.float32).min
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)


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


def cached(space: spaces.Space, name: Any, make) -> Any:
    store = _space_cache(space)
    if name not in store:
        store[name] = make()
    return store[name]


def is_float_box(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating)


def space_name(space: spaces.Space) -> str:
    return f"{type(space).__name__} ({' '.join(str(space).split())})"


def to_out(result: tuple[Tensor, Tensor], out: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """``result`` (actions, log-probs), or copied into ``out`` and ``out`` returned."""
    if out is None:
        return result
    out[0].copy_(result[0])
    out[1].copy_(result[1])
    return out


def check_mask(mask: Tensor, expected_shape: torch.Size, cls_name: str) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"{cls_name}: action_mask must be a bool tensor, got {mask.dtype}")
    if mask.shape != expected_shape:
        raise ValueError(
            f"{cls_name}: action_mask must have shape {list(expected_shape)} "
            f"(the batch shape and one entry per action), got {list(mask.shape)}"
        )


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
        # compile=True (rl8.ppo.compiled) traces no checks: they read numpy scalars of the space
        if not torch.compiler.is_compiling():
            name = type(self).__name__
            if not self.supports(action_space):
                raise ValueError(f"{name} does not support the action space {space_name(action_space)}")
            expected = self.param_size(action_space)
            given = params.shape[-1] if params.ndim > 0 else None
            if given != expected:
                raise ValueError(
                    f"{name}: params must have {expected} entries in the last dimension for "
                    f"{space_name(action_space)}, got {given} (params shape {list(params.shape)})"
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
        return to_out((actions, self.log_prob(actions)), out)

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
