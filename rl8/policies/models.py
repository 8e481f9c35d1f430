"""Models: networks that map observations to distribution parameters and a value (the
:class:`Model` contract and the default :class:`MLPModel`; ``docs/models.md``)."""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from gymnasium import spaces
from tensordict import TensorDictBase
from torch import nn

from rl8.fields import did_you_mean
from rl8.policies.distributions import Normal
from rl8.policies.groups import group_space, resolve_obs_groups

__all__ = [
    "Model",
    "MLPModel",
    "flatten_observation",
    "flat_observation_size",
    "check_model_config",
    "ACTIVATIONS",
    "INPLACE_ACTIVATIONS",
]

#: Activation names accepted by model_config's "activation", mapped to their torch.nn classes.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
    "selu": nn.SELU,
    "mish": nn.Mish,
    "softplus": nn.Softplus,
    "sigmoid": nn.Sigmoid,
}

#: Activations that :func:`make_mlp` runs in place on their Linear layer's output: their
#: backward reads their own output, so in place they allocate none (same values and gradients).
INPLACE_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ELU, nn.ReLU, nn.LeakyReLU)


def flat_observation_size(space: spaces.Space) -> int:
    """Number of features :func:`flatten_observation` produces for one observation of ``space``."""
    if isinstance(space, spaces.Dict):
        return sum(flat_observation_size(s) for k, s in space.spaces.items() if k != "action_mask")
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return int(math.prod(space.shape))
    raise TypeError(f"flat_observation_size: unsupported observation space {space}")


def flatten_observation(obs: torch.Tensor | TensorDictBase, space: spaces.Space) -> torch.Tensor:
    """Observations ``obs`` ``[B, ...]`` of ``space`` (a TensorDict for ``Dict`` spaces) as float
    features ``[B, flat_observation_size(space)]``: Box and MultiBinary flattened, Discrete and
    MultiDiscrete one-hot, ``Dict`` entries concatenated in key order (without ``action_mask``)."""
    if isinstance(space, spaces.Dict):
        parts = [flatten_observation(obs[k], s) for k, s in space.spaces.items() if k != "action_mask"]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    if isinstance(space, spaces.Discrete):
        return F.one_hot(obs.long() - int(space.start), int(space.n)).float()
    if isinstance(space, spaces.MultiDiscrete):
        flat = obs.reshape(obs.shape[0], -1).long()
        nvec = space.nvec.reshape(-1).tolist()
        return torch.cat([F.one_hot(flat[:, i], n) for i, n in enumerate(nvec)], dim=-1).float()
    return obs.reshape(obs.shape[0], -1).float()


class Model(nn.Module):
    """Base class of models: observations in, distribution parameters and value out.
    Subclasses implement :meth:`forward`, and :meth:`value` when it is cheaper.

    Args:
        observation_space: Space of one observation.
        action_space: Space of one action.
        distribution_cls: The action distribution class; the parameters' width is
            ``distribution_cls.param_size(action_space)``.
        **config: Model-specific options (``model_config`` in PPO's hyper-parameters).
    """

    recurrent: ClassVar[bool] = False

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        distribution_cls: type,
        /,
        **config: Any,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.distribution_cls = distribution_cls
        self.config = dict(config)

    def forward(self, obs: torch.Tensor | TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters ``[B, P]`` and values ``[B]`` of observations ``[B, ...]``."""
        raise NotImplementedError

    def value(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """Values ``[B]`` of observations ``obs`` ``[B, ...]``."""
        return self(obs)[1]

    #: The keys of a ``Dict`` observation that the actor reads (``None``: all of them); an
    #: exported actor takes only these (asymmetric actor-critic, docs/models.md).
    actor_groups: tuple[str, ...] | None = None

    def actor_params(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """Distribution parameters ``[B, P]`` of observations ``[B, ...]`` from the actor alone
        (no value): what an exported policy runs."""
        return self(obs)[0]

    def rollout(self) -> contextlib.AbstractContextManager:
        """A context in which the parameters stay constant (PPO's collect and evaluate), where a
        model may precompute something, leaving its outputs unchanged; the default does nothing."""
        return contextlib.nullcontext()

    learned_log_std: bool = False
    noise_std_type: str = "log"

    def init_policy_head(
        self, state_dependent_std: bool, init_log_std: float, noise_std_type: str = "log"
    ) -> int:
        """Set up the std of Gaussian distributions; return the policy head's width (the means
        only when a state-independent std is learned, see :meth:`distribution_params`).

        Args:
            state_dependent_std: The head outputs the log-std too (else a learned parameter).
            init_log_std: Initial value of the learned log-std.
            noise_std_type: The parameter learned: ``"log"`` the log-std (``model.log_std``),
                ``"scalar"`` the std itself (``model.std``, rsl_rl's default).
        """
        if noise_std_type not in ("log", "scalar"):
            raise ValueError(
                f"model_config noise_std_type: expected 'log' or 'scalar', got {noise_std_type!r}"
            )
        dist = self.distribution_cls
        param_size = dist.param_size(self.action_space)
        gaussian = issubclass(dist, Normal) or bool(getattr(dist, "gaussian", False))
        self.learned_log_std = gaussian and not state_dependent_std
        if not self.learned_log_std:
            return param_size
        self.noise_std_type = noise_std_type
        if noise_std_type == "scalar":
            self.std = nn.Parameter(torch.full((param_size // 2,), math.exp(init_log_std)))
        else:
            self.log_std = nn.Parameter(torch.full((param_size // 2,), float(init_log_std)))
        return param_size // 2

    def distribution_params(self, head: torch.Tensor) -> torch.Tensor:
        """The distribution params from the policy head's output (:meth:`init_policy_head`)."""
        if not self.learned_log_std:
            return head
        log_std = self.log_std if self.noise_std_type == "log" else self.std.clamp(min=1e-6).log()
        return torch.cat([head, log_std.to(head.dtype).expand_as(head)], dim=-1)


def initial_log_std(init_log_std: float | None, init_noise_std: float | None) -> float:
    """The initial log-std of model_config's ``init_log_std`` or ``init_noise_std`` (the std,
    rsl_rl's name; > 0), at most one of them given; neither: 0 (std 1)."""
    if init_noise_std is None:
        return 0.0 if init_log_std is None else float(init_log_std)
    if init_log_std is not None:
        raise ValueError(
            f"model_config: init_log_std={init_log_std!r} and init_noise_std={init_noise_std!r} "
            "set the same thing (log-std and std); give one"
        )
    if (
        isinstance(init_noise_std, bool)
        or not isinstance(init_noise_std, numbers.Real)
        or not init_noise_std > 0
    ):
        raise ValueError(
            f"model_config init_noise_std: expected a number > 0 (the initial std), got {init_noise_std!r}"
        )
    return math.log(init_noise_std)


def check_model_config(model_cls: type, model_config: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` naming any key of ``model_config`` (PPO's hyper-parameter: keyword
    arguments of the :class:`Model` subclass ``model_cls``) that ``model_cls`` does not take, its
    close matches and the valid names, before the model is built."""
    parameters = list(inspect.signature(model_cls.__init__).parameters.values())[1:]  # without self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return  # it takes any name (**config)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    valid = [p.name for p in parameters[3:] if p.kind in keyword]  # after the three positional ones
    for key in model_config:
        if key not in valid:
            raise ValueError(
                f"model_config.{key}: {model_cls.__name__} has no option {key!r}{did_you_mean(key, valid)} "
                f"(valid: {', '.join(valid) or 'none'})"
            )


def lookup(field: str, table: Mapping[str, Any], value: Any) -> Any:
    """``table[value]`` for a name (anything else, a class, is returned as is), else a
    ``ValueError`` naming ``model_config``'s ``field`` and the names of ``table``."""
    if not isinstance(value, str):
        return value
    if value not in table:
        raise ValueError(f"model_config {field}: expected one of {sorted(table)}, got {value!r}")
    return table[value]


def check_widths(name: str, value: Any, *, non_empty: bool = False) -> tuple[int, ...]:
    """Layer widths given as the config entry ``name`` (``"model_config hiddens"``) as a tuple of
    ints >= 1 (at least one with ``non_empty``), else a ``ValueError``."""
    ints = (
        not isinstance(value, (str, bytes))
        and isinstance(value, Sequence)
        and all(not isinstance(h, bool) and isinstance(h, numbers.Integral) and h >= 1 for h in value)
    )
    if not ints or (non_empty and not value):
        size = "non-empty " if non_empty else ""
        raise ValueError(f"{name}: expected a {size}sequence of ints >= 1, got {value!r}")
    return tuple(int(h) for h in value)


def make_linear(in_features: int, out_features: int, gain: float, ortho_init: bool) -> nn.Linear:
    """A Linear layer; with ``ortho_init``, orthogonal weights of ``gain`` and zero biases."""
    linear = nn.Linear(in_features, out_features)
    if ortho_init:
        nn.init.orthogonal_(linear.weight, gain)
        nn.init.zeros_(linear.bias)
    return linear


def make_mlp(sizes: Sequence[int], activation: type[nn.Module], ortho_init: bool) -> list[nn.Module]:
    """The layers of an MLP through ``sizes``: Linear layers (orthogonal, gain sqrt(2), with
    ``ortho_init``), each followed by an ``activation`` (in place for those of
    :data:`INPLACE_ACTIVATIONS`)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        act = activation(inplace=True) if activation in INPLACE_ACTIVATIONS else activation()
        layers += [make_linear(sizes[i], sizes[i + 1], math.sqrt(2), ortho_init), act]
    return layers


class MLPModel(Model):
    """The default model: two plain ``nn.Sequential`` MLPs, :attr:`pi` and :attr:`vf`, on the
    flattened observation, or (``shared=True``) a :attr:`trunk` with two ``nn.Linear`` heads.
    With observation groups (``obs_groups``) the actor reads its groups and the critic its own.
    ``observation_space`` (flattened by :func:`flatten_observation`), ``action_space``,
    ``distribution_cls``: as for :class:`Model`.

    Args:
        hiddens: Widths of the hidden layers, e.g. ``(64, 64)``.
        critic_hiddens: Widths of the value network's hidden layers; ``None``: ``hiddens``.
        activation: A name of :data:`ACTIVATIONS` or an ``nn.Module`` class.
        shared: One trunk with two heads (else separate networks, the default).
        state_dependent_std: Gaussian policies: the network outputs the log-std (else a
            learned, state-independent std, the default).
        init_log_std: Initial value of the state-independent log-std; ``None``: 0.
        init_noise_std: Or the initial std itself (> 0; rsl_rl's ``init_noise_std``).
        noise_std_type: ``"log"``: the log-std is learned; ``"scalar"``: the std (rsl_rl's default).
        ortho_init: Orthogonal initialisation (gain sqrt(2) for hidden layers, 0.01 for the
            policy head, 1 for the value head) with zero biases; else torch's default init.
        obs_groups: ``{"actor": [group, ...], "critic": [group, ...]}``: the keys of a ``Dict``
            observation each network reads, flattened in this order; ``None`` or a missing set:
            rsl_rl 5's fallbacks (:func:`~rl8.policies.groups.resolve_obs_groups`).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        distribution_cls: type,
        /,
        *,
        hiddens: Sequence[int] = (64, 64),
        critic_hiddens: Sequence[int] | None = None,
        activation: str | type[nn.Module] = "tanh",
        shared: bool = False,
        state_dependent_std: bool = False,
        init_log_std: float | None = None,
        init_noise_std: float | None = None,
        noise_std_type: str = "log",
        ortho_init: bool = True,
        obs_groups: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        hiddens = check_widths("model_config hiddens", hiddens)
        critic_hiddens = (
            hiddens
            if critic_hiddens is None
            else check_widths("model_config critic_hiddens", critic_hiddens)
        )
        super().__init__(
            observation_space,
            action_space,
            distribution_cls,
            hiddens=hiddens,
            critic_hiddens=critic_hiddens,
            activation=activation,
            shared=shared,
            state_dependent_std=state_dependent_std,
            init_log_std=init_log_std,
            init_noise_std=init_noise_std,
            noise_std_type=noise_std_type,
            ortho_init=ortho_init,
            obs_groups=obs_groups,
        )
        act = lookup("activation", ACTIVATIONS, activation)
        groups = resolve_obs_groups(observation_space, obs_groups)
        self.actor_groups, self.critic_groups = groups["actor"], groups["critic"]
        self.actor_space = group_space(observation_space, self.actor_groups)
        # one space object when both read the same: the forward pass flattens once
        same = self.critic_groups == self.actor_groups
        self.critic_space = (
            self.actor_space if same else group_space(observation_space, self.critic_groups)
        )
        log_std = initial_log_std(init_log_std, init_noise_std)
        head_size = self.init_policy_head(state_dependent_std, log_std, noise_std_type)
        self.shared = bool(shared)
        if self.shared and (not same or critic_hiddens != hiddens):
            raise ValueError(
                f"model_config shared: one trunk reads one observation with one set of widths, but the actor reads "
                f"{self.actor_groups} with hiddens={hiddens} and the critic {self.critic_groups} with "
                f"critic_hiddens={critic_hiddens}; set shared=False"
            )
        sizes = [flat_observation_size(self.actor_space), *hiddens]
        critic_sizes = [flat_observation_size(self.critic_space), *critic_hiddens]
        if self.shared:
            self.trunk = nn.Sequential(*make_mlp(sizes, act, ortho_init))
            self.pi = make_linear(sizes[-1], head_size, 0.01, ortho_init)
            self.vf = make_linear(sizes[-1], 1, 1.0, ortho_init)
        else:
            self.pi = nn.Sequential(
                *make_mlp(sizes, act, ortho_init), make_linear(sizes[-1], head_size, 0.01, ortho_init)
            )
            self.vf = nn.Sequential(
                *make_mlp(critic_sizes, act, ortho_init),
                make_linear(critic_sizes[-1], 1, 1.0, ortho_init),
            )

    def forward(self, obs: torch.Tensor | TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        x = flatten_observation(obs, self.actor_space)
        y = x if self.critic_space is self.actor_space else flatten_observation(obs, self.critic_space)
        if self.shared:
            x = y = self.trunk(x)
        return self.distribution_params(self.pi(x)), self.vf(y)[:, 0]

    def actor_params(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        x = flatten_observation(obs, self.actor_space)
        return self.distribution_params(self.pi(self.trunk(x) if self.shared else x))

    def value(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        y = flatten_observation(obs, self.critic_space)
        return self.vf(self.trunk(y) if self.shared else y)[:, 0]
