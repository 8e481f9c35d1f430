"""Action distributions: what turns a model's flat output into actions, log-probs and entropy
(the contract: :mod:`~rl8.policies.distributions.base`; each class: ``docs/distributions.md``)."""

from __future__ import annotations

from gymnasium import spaces

from rl8.policies.distributions.base import LOG_STD_MAX, LOG_STD_MIN, Distribution, space_name
from rl8.policies.distributions.continuous import Normal, SquashedNormal
from rl8.policies.distributions.discrete import Bernoulli, Categorical, MultiCategorical

__all__ = [
    "LOG_STD_MAX",
    "LOG_STD_MIN",
    "Bernoulli",
    "Categorical",
    "Distribution",
    "MultiCategorical",
    "Normal",
    "SquashedNormal",
    "default_distribution_cls",
]

_DEFAULTS: dict[type[spaces.Space], type[Distribution]] = {
    spaces.Discrete: Categorical,
    spaces.MultiDiscrete: MultiCategorical,
    spaces.Box: Normal,
    spaces.MultiBinary: Bernoulli,
}


def default_distribution_cls(action_space: spaces.Space) -> type[Distribution]:
    """The distribution class for one env's ``action_space``: ``Discrete`` -> :class:`Categorical`,
    ``MultiDiscrete`` -> :class:`MultiCategorical`, float ``Box`` -> :class:`Normal`,
    ``MultiBinary`` -> :class:`Bernoulli`; ``TypeError`` for any other space."""
    for space_cls, dist_cls in _DEFAULTS.items():
        if isinstance(action_space, space_cls) and dist_cls.supports(action_space):
            return dist_cls
    supported = ", ".join(f"{s.__name__} -> {d.__name__}" for s, d in _DEFAULTS.items())
    raise TypeError(
        f"no default action distribution for {space_name(action_space)}; supported: "
        f"{supported} (Box must have a floating dtype). Pass distribution_cls= for others."
    )
