"""The policy: a model, an action distribution and (optionally) observation normalisation."""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from torch import nn

from .distributions import Distribution, default_distribution_cls
from .models import MLPModel, Model
from .normalization import ObservationNormalizer
from .spaces import check_space, zeros_like_space

__all__ = ["Policy"]


class Policy(nn.Module):
    """Acts on observations: the model's outputs parameterise an action distribution.

    Args:
        observation_space: Space of one observation.
        action_space: Space of one action.
        model_cls: A :class:`~rl8.models.Model` subclass; ``None``: :class:`~rl8.models.MLPModel`.
        model_config: Keyword arguments of ``model_cls``.
        distribution_cls: A :class:`~rl8.distributions.Distribution` subclass; ``None``: the
            default for the action space.
        normalize_observations: Keep running observation statistics and feed the model
            normalised observations.
        device: Device of the parameters.

    Calling the policy (``policy(obs)``) returns env actions, ready for ``Env.step``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        model_cls: type[Model] | None = None,
        model_config: dict[str, Any] | None = None,
        distribution_cls: type[Distribution] | None = None,
        normalize_observations: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        check_space(observation_space, field="observation_space")
        check_space(action_space, field="action_space")
        if isinstance(action_space, spaces.Dict):
            raise TypeError("action_space: Dict action spaces are not supported; use MultiDiscrete or Box")
        self.observation_space = observation_space
        self.action_space = action_space
        self.distribution_cls = distribution_cls or default_distribution_cls(action_space)
        if not self.distribution_cls.supports(action_space):
            raise TypeError(
                f"distribution_cls: {self.distribution_cls.__name__} does not support the "
                f"action space {action_space}"
            )
        self.model_cls = model_cls or MLPModel
        self.model_config = dict(model_config or {})
        self.model = self.model_cls(observation_space, action_space, self.distribution_cls, **self.model_config)
        self.obs_normalizer = (
            ObservationNormalizer(zeros_like_space(observation_space, [1])) if normalize_observations else None
        )
        self.to(device)

    @property
    def device(self) -> torch.device:
        """Device of the policy's parameters."""
        return next(self.parameters()).device

    @property
    def recurrent(self) -> bool:
        """Whether the model carries a hidden state between steps."""
        return bool(getattr(self.model, "recurrent", False))

    def preprocess(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor | TensorDictBase:
        """Normalise observations when observation normalisation is on."""
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    @staticmethod
    def action_mask(obs: torch.Tensor | TensorDictBase) -> torch.Tensor | None:
        """The ``action_mask`` entry of a TensorDict observation, if any."""
        if isinstance(obs, TensorDictBase) and "action_mask" in obs.keys():
            mask = obs.get("action_mask")
            return mask if mask.dtype == torch.bool else mask.bool()
        return None

    def distribution(self, obs: torch.Tensor | TensorDictBase) -> tuple[Distribution, torch.Tensor]:
        """The action distribution and the values ``[B]`` for a batch of observations."""
        params, value = self.model(self.preprocess(obs))
        return self.distribution_cls(params, self.action_space, action_mask=self.action_mask(obs)), value

    def act(
        self, obs: torch.Tensor | TensorDictBase, *, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample raw actions with their log-probabilities ``[B]`` and values ``[B]``.

        Raw actions are what the rollout buffer stores; :meth:`to_env_action` maps them to
        the env's action space.
        """
        dist, value = self.distribution(obs)
        actions = dist.deterministic_sample() if deterministic else dist.sample()
        return actions, dist.log_prob(actions), value

    def evaluate(
        self, obs: torch.Tensor | TensorDictBase, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities, entropies and values (each ``[B]``) of given raw actions."""
        dist, value = self.distribution(obs)
        return dist.log_prob(actions), dist.entropy(), value

    def value(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """Values ``[B]`` of a batch of observations."""
        return self.model.value(self.preprocess(obs))

    def to_env_action(self, actions: torch.Tensor) -> torch.Tensor:
        """Map raw actions to the env's action space (e.g. scale to a Box's bounds)."""
        return self.distribution_cls.to_env_action(actions, self.action_space)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor | TensorDictBase, *, deterministic: bool = True) -> torch.Tensor:
        """Env actions for a batch of observations (deterministic by default)."""
        actions, _, _ = self.act(obs, deterministic=deterministic)
        return self.to_env_action(actions)
