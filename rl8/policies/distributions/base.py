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

#: Lower clamp of the log standard deviation of the Gaussian distributions.
LOG_STD_MIN = -20.0
#: Upper clamp of the log standard deviation of the Gaussian distributions.
LOG_STD_MAX = 2.0
# Logit of masked-out (and padding) actions: the most negative finite float32 rather than -inf,
# so its probability is exactly 0 after softmax yet 0 * log_prob stays 0 (no NaN in the entropy
# or its gradient), and a row with every action masked becomes uniform instead of NaN.
MASKED_LOGIT = torch.finfo(torch.float32).min
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)

_SPACE_CACHE: dict[int, dict[Any, Any]] = {}


def cached(space: spaces.Space, name: Any, make) -> Any:
    """``make()``, computed once per ``name`` and space object (forgotten with the space)."""
    store = _SPACE_CACHE.get(id(space))
    if store is None:
        store = _SPACE_CACHE[id(space)] = {}
        weakref.finalize(space, _SPACE_CACHE.pop, id(space), None)
    if name not in store:
        store[name] = make()
    return store[name]


def is_float_box(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating)


def space_name(space: spaces.Space) -> str:
    return f"{type(space).__name__} ({' '.join(str(space).split())})"


class Distribution(ABC):
    """A batch of action distributions whose parameters a model outputs (kept as ``params``,
    ``action_space``, and ``batch_shape``: ``params.shape[:-1]``). Subclasses implement the
    classmethods that describe an action space and the per-batch methods; all compute in
    float32 (``docs/distributions.md``).

    Args:
        params: The model's output, ``[*batch, param_size(action_space)]``, any float dtype.
        action_space: The action space of ONE env.
        action_mask: Optional bool ``[*batch, n]``, ``True`` where an action is allowed; only
            for the discrete families (class attribute :attr:`supports_action_mask`).
    """

    supports_action_mask: ClassVar[bool] = False

    def __init__(
        self, params: Tensor, action_space: spaces.Space, *, action_mask: Tensor | None = None
    ) -> None:
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

    @classmethod
    @abstractmethod
    def supports(cls, action_space: spaces.Space) -> bool:
        """Whether this distribution class can drive ``action_space``."""

    @classmethod
    @abstractmethod
    def param_size(cls, action_space: spaces.Space) -> int:
        """Width of the flat parameter tensor the model must output for ``action_space``."""

    @classmethod
    def raw_action_shape(cls, action_space: spaces.Space) -> tuple[int, ...]:
        """Shape of ONE raw action (no batch dimension), as stored in the rollout buffer; the
        default is the action space's shape (that of an env action)."""
        return tuple(action_space.shape)

    @classmethod
    @abstractmethod
    def raw_action_dtype(cls, action_space: spaces.Space) -> torch.dtype:
        """Torch dtype of raw actions."""

    @classmethod
    def to_env_action(cls, actions: Tensor, action_space: spaces.Space) -> Tensor:
        """Map raw ``actions`` ``[*batch, *raw_action_shape(action_space)]`` to what ``Env.step``
        receives; ``action_space`` is ONE env's (the default is the identity)."""
        return actions

    @abstractmethod
    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw one raw action per sample, ``[*batch_shape, *raw_action_shape]``, without gradient,
        from ``generator`` (``None``: torch's global RNG)."""

    @abstractmethod
    def deterministic_sample(self) -> Tensor:
        """The mode of each distribution as a raw action (for evaluation)."""

    def sample_with_log_prob(
        self,
        generator: torch.Generator | None = None,
        *,
        deterministic: bool = False,
        out: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Raw actions (:meth:`sample`, or the modes) with their :meth:`log_prob`, at once.

        Args:
            generator: Random number generator to draw from (see :meth:`sample`).
            deterministic: Take the modes instead of sampling.
            out: Tensors of those shapes to write the pair into and return; ``None``: new ones.
        """
        actions = self.deterministic_sample() if deterministic else self.sample(generator)
        log_prob = self.log_prob(actions)
        if out is None:
            return actions, log_prob
        out[0].copy_(actions)
        out[1].copy_(log_prob)
        return out

    @abstractmethod
    def log_prob(self, actions: Tensor) -> Tensor:
        """Log-probability (density) of raw ``actions``, float32 ``[*batch_shape]``, summed over
        action components and differentiable with respect to ``params``."""

    @abstractmethod
    def entropy(self) -> Tensor:
        """Entropy of each distribution, float32 ``[*batch_shape]``, differentiable."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_shape={list(self.batch_shape)}, action_space={self.action_space})"
