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
results keep them. The classes live in :mod:`~rl8.policies.distributions.base` (the contract),
:mod:`~rl8.policies.distributions.discrete` and :mod:`~rl8.policies.distributions.continuous`;
this package exports them. See ``docs/distributions.md`` for a walk-through.
"""

from __future__ import annotations

from gymnasium import spaces

from rl8.policies.distributions.base import LOG_STD_MAX, LOG_STD_MIN, Distribution, space_name
from rl8.policies.distributions.continuous import Normal, SquashedNormal
from rl8.policies.distributions.discrete import Bernoulli, Categorical, MultiCategorical

__all__ = [
    "LOG_STD_MAX", "LOG_STD_MIN", "Bernoulli", "Categorical", "Distribution", "MultiCategorical", "Normal",
    "SquashedNormal", "default_distribution_cls",
]


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
        f"no default action distribution for {space_name(action_space)}; supported: "
        f"{supported} (Box must have a floating dtype). Pass distribution_cls= for others."
    )
