"""The policy: a model, an action distribution and (optionally) observation normalisation."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rl8.envs.spaces import check_space, space_dtype, space_shape, zeros_like_space
from rl8.policies.deploy import export_policy
from rl8.policies.distributions import Distribution, default_distribution_cls
from rl8.policies.encoders import default_model_cls
from rl8.policies.groups import actor_space
from rl8.policies.models import Model, check_model_config
from rl8.policies.normalization import ObservationNormalizer

__all__ = ["Policy", "check_memory", "device_memory"]


def device_memory(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes, or ``None`` where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no sysconf, or no answer
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def check_memory(what: str, need: int, device: torch.device, advice: str) -> None:
    """Refuse (``ValueError``) ``what``, which needs ``need`` bytes, when that is more than the
    whole memory of ``device``; ``advice`` says what to do instead."""
    total = device_memory(device)
    if total is not None and need > total:
        raise ValueError(
            f"{what} needs about {need} bytes ({need / 2**30:.1f} GiB); {device} has "
            f"{total} bytes ({total / 2**30:.1f} GiB) in all. {advice}"
        )


def _model_bytes(build: Any) -> int:
    """Bytes of the parameters and buffers of ``build()``'s model, built on the meta device (else 0)."""
    try:
        with torch.device("meta"):
            model = build()
    except Exception:
        return 0
    return sum(
        t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers())
    )


class Policy(nn.Module):
    """Acts on observations: the model's outputs parameterise an action distribution.
    ``policy(obs)`` gives env actions for a batch of tensors; :meth:`predict` numpy actions.

    Args:
        observation_space: Space of one observation.
        action_space: Space of one action.
        model_cls: A :class:`~rl8.policies.models.Model` subclass; ``None``: the default for the
            observation space (:func:`rl8.policies.encoders.default_model_cls`).
        model_config: Keyword arguments of ``model_cls``.
        distribution_cls: A :class:`~rl8.policies.distributions.Distribution` subclass; ``None``:
            the default for the action space.
        normalize_observations: Feed the model observations normalised by running statistics.
        device: Device of the parameters.
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
            raise TypeError(
                "action_space: Dict action spaces are not supported; use MultiDiscrete or Box"
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self.distribution_cls = distribution_cls or default_distribution_cls(action_space)
        if not self.distribution_cls.supports(action_space):
            raise TypeError(
                f"distribution_cls: {self.distribution_cls.__name__} does not support the "
                f"action space {action_space}"
            )
        self.model_config = dict(model_config or {})
        self.model_cls = model_cls or default_model_cls(observation_space, self.model_config)
        check_model_config(self.model_cls, self.model_config)

        def build() -> Model:
            return self.model_cls(
                observation_space, action_space, self.distribution_cls, **self.model_config
            )

        check_memory(
            f"model_config {self.model_config} ({self.model_cls.__name__})",
            _model_bytes(build),
            torch.device("cpu"),
            "Use a smaller model",
        )
        self.model = build()
        #: The part of the observation space the actor reads (the actor's groups, with
        #: ``action_mask``): all that acting needs (:meth:`actor_step`, :meth:`predict`, exports).
        self.actor_observation_space = actor_space(
            observation_space, self.model.actor_groups, owner=type(self.model).__name__
        )
        self.obs_normalizer = (
            ObservationNormalizer(zeros_like_space(observation_space, [1]))
            if normalize_observations
            else None
        )
        self._state: TensorDictBase | None = None
        self.to(device)

    @property
    def device(self) -> torch.device:
        """Device of the policy's parameters."""
        return next(self.parameters()).device

    @property
    def state(self) -> TensorDictBase | None:
        """The recurrent state kept between calls ``policy(obs)``, read-only (``None`` for feedforward
        models, and until the first call or after :meth:`reset_state` without a mask)."""
        return self._state

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
            return obs.get("action_mask").bool()  # the tensor itself when it is bool
        return None

    def distribution(self, obs: torch.Tensor | TensorDictBase) -> tuple[Distribution, torch.Tensor]:
        """The action distribution and the values ``[B]`` for a batch of observations."""
        params, value = self.model(self.preprocess(obs))
        return self.distribution_cls(params, self.action_space, action_mask=self.action_mask(obs)), value

    def rollout(self) -> contextlib.AbstractContextManager:
        """The model's :meth:`~rl8.policies.models.Model.rollout` context (parameters constant)."""
        return self.model.rollout()

    def initial_state(self, batch_size: int) -> TensorDictBase | None:
        """The recurrent model's initial state for ``batch_size`` envs (``None`` if feedforward)."""
        if not self.recurrent:
            return None
        return self.model.initial_state(batch_size, self.device)

    def rollout_step(
        self,
        obs: torch.Tensor | TensorDictBase,
        carry: TensorDictBase | None,
        starts: torch.Tensor | None = None,
    ) -> tuple[Distribution, torch.Tensor, TensorDictBase | None]:
        """One env step of the policy for a batch of envs: the action distribution, the values
        ``[B]`` and the carry after the step.

        Args:
            obs: Observations ``[B, ...]``.
            carry: The recurrent state before this step (:meth:`initial_state`); ``None`` for
                feedforward models.
            starts: ``[B]`` bool, True where an episode starts at ``obs`` (its carry is reset
                first); ``None``: none does.
        """
        if carry is None:
            return (*self.distribution(obs), None)
        params, values, carry = self.model(
            self.preprocess(obs)[:, None], carry, self._starts(obs, starts)[:, None]
        )
        dist = self.distribution_cls(params[:, 0], self.action_space, action_mask=self.action_mask(obs))
        return dist, values[:, 0], carry

    def rollout_value(
        self,
        obs: torch.Tensor | TensorDictBase,
        carry: TensorDictBase | None,
        starts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Values ``[B]`` of one step from ``carry`` (arguments as of :meth:`rollout_step`)."""
        if carry is None:
            return self.value(obs)
        return self.model.value(
            self.preprocess(obs)[:, None], carry, self._starts(obs, starts)[:, None]
        )[:, 0]

    def actor_step(
        self,
        obs: torch.Tensor | TensorDictBase,
        carry: TensorDictBase | None,
        starts: torch.Tensor | None = None,
    ) -> tuple[Distribution, TensorDictBase | None]:
        """The action distribution of one env step for a batch of envs, and the carry after it,
        from the actor alone: a ``Dict`` observation needs only the keys of
        :attr:`actor_observation_space` (others, such as the critic's privileged groups, are
        ignored). Arguments as of :meth:`rollout_step`."""
        if isinstance(obs, TensorDictBase) and isinstance(self.actor_observation_space, spaces.Dict):
            obs = obs.select(*self.actor_observation_space.spaces)
        if carry is not None:  # a recurrent network reads the actor's groups only
            dist, _, carry = self.rollout_step(obs, carry, starts)
            return dist, carry
        params = self.model.actor_params(self.preprocess(obs))
        return self.distribution_cls(params, self.action_space, action_mask=self.action_mask(obs)), None

    def _starts(self, obs: torch.Tensor | TensorDictBase, starts: torch.Tensor | None) -> torch.Tensor:
        """``starts``, or no episode start for any of the ``[B]`` envs."""
        return (
            torch.zeros(obs.shape[0], dtype=torch.bool, device=self.device) if starts is None else starts
        )

    def reset_state(self, mask: torch.Tensor | None = None) -> None:
        """Recurrent policies: forget the state kept between calls of the policy for the envs where
        the ``[B]`` bool ``mask`` is True (``None``: all of them)."""
        if mask is None or self._state is None:
            self._state = None
            return
        initial = self.initial_state(mask.shape[0])
        m = mask.to(self.device)
        self._state = self._state.apply(
            lambda cur, init: torch.where(m.reshape(-1, *([1] * (cur.dim() - 1))), init, cur), initial
        )

    def evaluate(
        self, minibatch: TensorDictBase, *, entropy_grad: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities, entropies and values of the raw actions of a minibatch, one
        entry per step (``[B]``, or ``[S * T]`` for sequences).

        Args:
            minibatch: ``obs`` and raw ``actions``: transitions ``[B, ...]``, or for recurrent
                models sequences ``[S, T, ...]`` with ``state`` ``[S]`` (before each sequence)
                and ``firsts`` ``[S, T]`` (episode starts).
            entropy_grad: ``False``: entropies without autograd (for a loss that only reports
                them).
        """
        obs, actions = minibatch["obs"], minibatch["actions"]
        if self.recurrent:  # replay each sequence from its stored initial state
            params, value, _ = self.model(self.preprocess(obs), minibatch["state"], minibatch["firsts"])
            mask = self.action_mask(obs)
            mask = None if mask is None else mask.flatten(0, 1)
            dist = self.distribution_cls(params.flatten(0, 1), self.action_space, action_mask=mask)
            actions, value = actions.flatten(0, 1), value.flatten()
        else:
            dist, value = self.distribution(obs)
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            entropy = dist.entropy()
        return dist.log_prob(actions), entropy, value

    def value(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """Values ``[B]`` of a batch of observations."""
        return self.model.value(self.preprocess(obs))

    def to_env_action(self, actions: torch.Tensor) -> torch.Tensor:
        """Map raw actions to the env's action space (e.g. scale to a Box's bounds)."""
        return self.distribution_cls.to_env_action(actions, self.action_space)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor | TensorDictBase, *, deterministic: bool = True) -> torch.Tensor:
        """Env actions for a batch of observations (deterministic by default); a recurrent
        policy keeps its state between calls, see :meth:`reset_state`."""
        state = self._state
        if self.recurrent and (state is None or state.batch_size[0] != obs.shape[0]):
            state = self.initial_state(obs.shape[0])
        dist, self._state = self.actor_step(obs, state)
        return self.to_env_action(dist.deterministic_sample() if deterministic else dist.sample())

    @torch.no_grad()
    def predict(
        self,
        obs: Any,
        *,
        deterministic: bool = True,
        state: TensorDictBase | None = None,
        episode_start: Any = None,
    ) -> tuple[np.ndarray, TensorDictBase | None]:
        """``(actions, state)`` for one observation or a batch (in the spirit of SB3): numpy
        actions of the action space's dtype (``Box`` ones clipped to the bounds), without a batch
        dimension for one observation, and the recurrent state for the next call (else ``None``).

        Args:
            obs: One observation or a batch: numpy, torch, Python numbers or lists (a dict of
                those for ``Dict`` spaces, with at least the keys the actor reads,
                :attr:`actor_observation_space`; the space's other keys, such as a critic's
                privileged groups, may be given and are ignored).
            deterministic: The distribution's mode (``True``) or a sample (``False``).
            state: Recurrent policies: the state of the previous call; ``None`` starts new
                episodes.
            episode_start: Recurrent policies: bool (``[B]`` for a batch), ``True`` where an
                episode starts at ``obs`` (its state is reset first).
        """
        space, needed = self.observation_space, self.actor_observation_space
        unread = [k for k in space.spaces if k not in needed.spaces] if needed is not space else []
        obs, batch = _as_batch(obs, needed, self.device, unread)
        size, starts = 1 if batch is None else batch, None
        if not self.recurrent:
            state = None
        elif state is None:
            state = self.initial_state(size)
        elif state.batch_size[0] != size:
            raise ValueError(
                f"state: expected the state of {size} env(s) (batch size [{size}]), "
                f"got batch size {list(state.batch_size)}"
            )
        if self.recurrent and episode_start is not None:
            starts = torch.as_tensor(episode_start, dtype=torch.bool, device=self.device).reshape(size)
        dist, state = self.actor_step(obs, state, starts)
        raw = dist.deterministic_sample() if deterministic else dist.sample()
        actions = self.to_env_action(raw).cpu().numpy().astype(self.action_space.dtype, copy=False)
        if isinstance(self.action_space, spaces.Box):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return (actions[0] if batch is None else actions), state

    def export(self, path: str | os.PathLike[str], format: str = "onnx") -> Path:
        """Write the actions of ``predict(obs, deterministic=True)`` to the file ``path`` (replaced
        atomically) for a robot, as ``format``: ``"onnx"`` (needs the ``onnx`` extra) or
        ``"torchscript"``; returns the path (:func:`rl8.policies.deploy.export_policy`, which says
        what the file takes and what it raises; ``docs/export.md``)."""
        return export_policy(self, path, format)


def _as_batch(
    obs: Any, space: spaces.Space, device: torch.device, unread: Sequence[str] = ()
) -> tuple[torch.Tensor | TensorDict, int | None]:
    """One observation or a batch as a batched tensor (TensorDict for ``Dict`` spaces) on
    ``device``, and the batch size (``None`` for one observation); ``unread``: keys that ``obs``
    may have besides those of the ``Dict`` ``space``, left out."""
    leaves = {name: (tensor, batch) for name, tensor, batch in _leaves(obs, space, (), device, unread)}
    batches = {batch for _, batch in leaves.values()}
    if len(batches) > 1:
        given = ", ".join(
            f"{_leaf_name(name)}: {tuple(tensor.shape)}" for name, (tensor, _) in leaves.items()
        )
        raise ValueError(
            f"obs: expected one observation or a batch of the same size in every entry, "
            f"got shapes {given}"
        )
    batch = batches.pop()
    tensors = {
        name: tensor.unsqueeze(0) if batch is None else tensor for name, (tensor, _) in leaves.items()
    }
    if not isinstance(space, spaces.Dict):
        return tensors[()], batch
    return TensorDict(tensors, batch_size=[1 if batch is None else batch], device=device), batch


def _leaf_name(name: tuple[str, ...]) -> str:
    return "obs" + "".join(f"[{key!r}]" for key in name)


def _leaves(
    obs: Any,
    space: spaces.Space,
    name: tuple[str, ...],
    device: torch.device,
    unread: Sequence[str] = (),
) -> Iterator[tuple]:
    """``(name, tensor, batch)`` per entry of ``obs``: the tensor in its space's dtype on
    ``device``, the batch size (``None`` for one observation); an error for a wrong shape or a
    missing or unknown key (keys of ``unread`` may be given and are left out)."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, (Mapping, TensorDictBase)):
            raise ValueError(
                f"{_leaf_name(name)}: expected a dict with the keys {list(space.spaces)}, "
                f"got {type(obs).__name__}"
            )
        given = list(obs.keys())
        missing = [key for key in space.spaces if key not in given]
        extra = [key for key in given if key not in space.spaces and key not in unread]
        if missing or extra:
            problems = [
                f"{what} {keys}" for what, keys in (("missing", missing), ("unexpected", extra)) if keys
            ]
            also = (
                f" (the observation's {list(unread)} may be given too; the actor does not read them)"
                if unread
                else ""
            )
            raise ValueError(
                f"{_leaf_name(name)}: expected the keys {list(space.spaces)}{also}, got {given} "
                f"({', '.join(problems)})"
            )
        for key, sub in space.spaces.items():
            yield from _leaves(obs[key], sub, (*name, key), device)
        return
    dtype = torch.bool if name == ("action_mask",) else space_dtype(space)
    tensor = (obs if torch.is_tensor(obs) else torch.as_tensor(np.asarray(obs))).to(
        device=device, dtype=dtype
    )
    expected, shape = space_shape(space), tuple(tensor.shape)
    if shape == expected:
        yield name, tensor, None
    elif len(shape) == len(expected) + 1 and shape[1:] == expected:
        yield name, tensor, shape[0]
    else:
        batched = "(B" + "".join(f", {size}" for size in expected) + ")"
        raise ValueError(
            f"{_leaf_name(name)}: expected shape {expected} (one observation) or {batched} (a batch "
            f"of B), got {shape}"
        )
