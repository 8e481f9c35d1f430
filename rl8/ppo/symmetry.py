"""rsl_rl 5's symmetry extension (Mittal et al., "Symmetry Considerations for Learning Task
Symmetric Robot Policies", ICRA 2024), hparam ``symmetry``: a user function mirrors
observations and actions; :meth:`Symmetry.augment` appends the mirrored copies of a minibatch
to it (data augmentation) and :meth:`Symmetry.mirror_loss` measures how far the actor is from
acting mirrored on mirrored observations. :meth:`rl8.PPO.update` calls both at one point of its
minibatch loop (``docs/ppo.md``, Extensions)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase

from rl8 import registry
from rl8.fields import Entry, check_entries, is_number
from rl8.policies.policy import Policy
from rl8.registry import qualified_name

__all__ = ["SYMMETRY_DEFAULTS", "Symmetry", "augmentation_function", "symmetry_problem"]

#: The keys of hparam ``symmetry`` (rsl_rl 5's ``symmetry_cfg``) and their defaults;
#: ``data_augmentation_func`` has none.
SYMMETRY_DEFAULTS: dict[str, Any] = {
    "use_data_augmentation": False,
    "use_mirror_loss": False,
    "mirror_loss_coeff": 0.0,
}
_FIELD = "hparam symmetry"


def augmentation_function(value: Any, field: str = f"{_FIELD}['data_augmentation_func']") -> Callable:
    """The augmentation function ``value`` names: the function itself, or the name it was
    registered under with :func:`rl8.register` (a config names it; nothing is imported).

    Raises:
        ValueError: A name that is not registered, or an object that is not a function (naming
            ``field``, what it expects and the value).
    """
    obj = registry.lookup(value) if isinstance(value, str) else value
    if obj is None:
        raise ValueError(
            f"{field}: {value!r} is not registered in this process; define the function and "
            f"register it under that name, rl8.register(my_function, name={value!r}) (a config "
            "names the function, rl8 never imports it)"
        )
    if isinstance(obj, type) or not callable(obj):
        raise ValueError(
            f"{field}: expected a function (env=, obs=, actions=) -> (obs, actions) or the name "
            f"it is registered under, got {value!r}"
        )
    return obj


_ENTRIES: dict[str, Entry] = {
    "data_augmentation_func": (
        "a function (env=, obs=, actions=) -> (obs, actions) or the name it is registered under",
        lambda v: isinstance(v, str) or (callable(v) and not isinstance(v, type)),
    ),
    "use_data_augmentation": ("a bool", lambda v: isinstance(v, bool)),
    "use_mirror_loss": ("a bool", lambda v: isinstance(v, bool)),
    "mirror_loss_coeff": ("a number >= 0", lambda v: is_number(v) and v >= 0),
}


def symmetry_problem(value: Any, name: str = "symmetry") -> str | None:
    """HParams' check of ``symmetry``: ``None``, or what a bad value should have been (a
    ``ValueError`` naming the key for a bad entry, a name that is not registered)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return "None or a dict {'data_augmentation_func': f, 'use_data_augmentation': bool, ...}"
    field = f"hparam {name}"
    check_entries(value, field, _ENTRIES, required=["data_augmentation_func"])
    augmentation_function(value["data_augmentation_func"], f"{field}['data_augmentation_func']")
    return None


def plain_symmetry(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``symmetry`` as checkpoints and MLflow store it: the function by its qualified name."""
    if value is None:
        return None
    func = value["data_augmentation_func"]
    return {**value, "data_augmentation_func": func if isinstance(func, str) else qualified_name(func)}


class Symmetry:
    """The mirrored copies of minibatches and the mirror loss, from hparam ``symmetry``.

    The function is rsl_rl's ``data_augmentation_func(env=env, obs=obs, actions=actions)``: it
    returns ``(obs, actions)`` with the ``B`` given rows first and their mirrored copies after
    them (``k * B`` rows, ``k >= 2``); either argument may be ``None``, and so is then its output.
    ``obs`` is a minibatch's observations as the env returns them (a TensorDict of groups for a
    ``Dict`` space, else a tensor), ``actions`` its raw actions (the distribution's samples, before
    ``to_env_action``).

    Args:
        config: The ``symmetry`` hparam (:data:`SYMMETRY_DEFAULTS` for the keys it leaves out).
        env: What the function gets as ``env``: the VecEnv itself for an rsl_rl env, else PPO's env.
        policy: The PPO's policy (a recurrent one is refused); the mirror loss is its actor's.
        autocast: Makes the context of the policy's forward passes (PPO's autocast; default none).

    Attributes:
        loss_name: ``"symmetry"``: the mirror loss is the update's ``losses/symmetry``.
        loss_coeff: Its weight in PPO's loss: ``mirror_loss_coeff`` with ``use_mirror_loss``, else 0.
        use_data_augmentation: Train PPO's loss on the mirrored copies too.
        use_mirror_loss: Add ``mirror_loss_coeff`` times the mirror loss to PPO's loss (else it
            is only reported, ``losses/symmetry``).
        mirror_loss_coeff: Weight of the mirror loss.

    Raises:
        ValueError: A recurrent policy, or ``use_mirror_loss`` for a distribution whose raw
            actions are not floats (its mode has no gradient).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        env: Any,
        policy: Policy,
        *,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        config = {**SYMMETRY_DEFAULTS, **config}
        self.policy, self.autocast = policy, autocast
        self.func = augmentation_function(config["data_augmentation_func"])
        self.name = qualified_name(self.func)
        self.env = env
        self.use_data_augmentation = bool(config["use_data_augmentation"])
        self.use_mirror_loss = bool(config["use_mirror_loss"])
        self.mirror_loss_coeff = float(config["mirror_loss_coeff"])
        self.loss_name = "symmetry"
        self.loss_coeff = self.mirror_loss_coeff if self.use_mirror_loss else 0.0
        if policy.recurrent:
            raise ValueError(
                f"{_FIELD}: not supported with a recurrent model ({policy.model_cls.__name__}): its "
                "minibatches are sequences replayed from stored hidden states, which have no mirrored "
                "copies (rsl_rl refuses it too); use a feedforward model or symmetry=None"
            )
        self.float_actions = policy.distribution_cls.raw_action_dtype(
            policy.action_space
        ).is_floating_point
        if self.use_mirror_loss and not self.float_actions:
            raise ValueError(
                f"{_FIELD}['use_mirror_loss']: needs float raw actions (the mirror loss compares the "
                f"actor's mean actions), but {policy.distribution_cls.__name__} samples "
                f"{policy.distribution_cls.raw_action_dtype(policy.action_space)}; use "
                "use_data_augmentation alone"
            )

    def mirrored(
        self, obs: torch.Tensor | TensorDictBase | None, actions: torch.Tensor | None
    ) -> tuple[torch.Tensor | TensorDictBase | None, torch.Tensor | None]:
        """The function's ``(obs, actions)`` of the ``B`` given rows, checked: ``k * B`` rows
        (``k >= 2``), the originals first, of the groups, shapes and dtypes given.

        Raises:
            ValueError: A result of another batch size, type, group, shape or dtype (naming the function).
        """
        out_obs, out_actions = self.func(env=self.env, obs=obs, actions=actions)
        rows = None
        for what, given, out in (("obs", obs, out_obs), ("actions", actions, out_actions)):
            if given is None:
                continue
            self._check_like(what, given, out)
            if rows is not None and out.shape[0] != rows:
                raise ValueError(
                    f"{_FIELD}: {self.name} returned {rows} observations but {out.shape[0]} actions "
                    f"for a minibatch of {given.shape[0]}; expected as many of each"
                )
            rows = out.shape[0]
        return out_obs, out_actions

    def _check_like(self, what: str, given: Any, out: Any) -> None:
        n = given.shape[0]
        if isinstance(given, TensorDictBase):
            if not isinstance(out, TensorDictBase) or set(out.keys()) != set(given.keys()):
                got = sorted(out.keys()) if isinstance(out, TensorDictBase) else type(out).__name__
                raise ValueError(
                    f"{_FIELD}: {self.name} returned {what} {got} for a minibatch whose {what} have "
                    f"the groups {sorted(given.keys())}; expected the same groups"
                )
            pairs = [(f"{what}[{k!r}]", given[k], out[k]) for k in given.keys()]
        elif not isinstance(out, torch.Tensor):
            raise ValueError(
                f"{_FIELD}: {self.name} returned {what} of type {type(out).__name__}; expected a "
                f"tensor like the {type(given).__name__} it was given"
            )
        else:
            pairs = [(what, given, out)]
        for label, a, b in pairs:
            if b.shape[0] < 2 * n or b.shape[0] % n or b.shape[1:] != a.shape[1:] or b.dtype != a.dtype:
                raise ValueError(
                    f"{_FIELD}: {self.name} returned {label} of shape {list(b.shape)} ({b.dtype}) for "
                    f"{list(a.shape)} ({a.dtype}); expected the {n} originals followed by their mirrored "
                    f"copies: [{', '.join([f'k * {n}', *map(str, a.shape[1:])])}] with k >= 2, of {a.dtype}"
                )

    def augment(self, minibatch: TensorDict) -> TensorDict:
        """``minibatch`` with its mirrored copies after it (``use_data_augmentation``; else the
        minibatch itself): mirrored observations and actions, the other keys (old log-probabilities,
        values, advantages, returns) repeated, as rsl_rl does; a ``collected`` column says which
        rows were collected, the rows over which PPO measures entropy, KL and clipping."""
        if not self.use_data_augmentation:
            return minibatch
        n = minibatch.batch_size[0]
        obs, actions = self.mirrored(minibatch["obs"], minibatch["actions"])
        copies = obs.shape[0] // n
        rest = minibatch.exclude("obs", "actions")
        augmented = torch.cat([rest] * copies)
        augmented["obs"], augmented["actions"] = obs, actions
        augmented["collected"] = torch.arange(copies * n, device=minibatch.device) < n
        return augmented

    def minibatch_step(
        self, minibatch: TensorDict
    ) -> tuple[TensorDict, torch.Tensor, torch.Tensor | None]:
        """PPO's update extension at each minibatch (:class:`~rl8.ppo.update_step.UpdateExtension`):
        the minibatch with its mirrored copies (:meth:`augment`), the mirror loss (detached, for
        ``losses/symmetry``), and with ``use_mirror_loss`` its weighted term of PPO's loss."""
        collected = minibatch.batch_size[0]
        minibatch = self.augment(minibatch)
        with self.autocast():
            mirror_loss = self.mirror_loss(self.policy, minibatch["obs"], collected)
        term = self.mirror_loss_coeff * mirror_loss if self.use_mirror_loss else None
        return minibatch, mirror_loss.detach(), term

    def after_update(self, obs: torch.Tensor | TensorDictBase) -> None:
        """PPO's update extension after the update: nothing to do."""

    def mirror_loss(
        self, policy: Policy, obs: torch.Tensor | TensorDictBase, collected: int
    ) -> torch.Tensor:
        """rsl_rl's mirror loss: the mean squared difference between the actor's mean actions on
        the mirrored observations and the mirrored mean actions of the ``collected`` first rows of
        ``obs`` (mirrored here when ``obs`` has only those), a float32 scalar; differentiable with
        ``use_mirror_loss``, else detached (only reported). For discrete actions, the modes'."""
        with torch.enable_grad() if self.use_mirror_loss else torch.no_grad():
            if obs.shape[0] == collected:
                obs, _ = self.mirrored(obs, None)
            dist, _ = policy.actor_step(obs, None)
            means = dist.deterministic_sample()
            _, target = self.mirrored(None, means[:collected].detach())
            return F.mse_loss(means[collected:].float(), target[collected:].float())


def augmentation_env(env: Any) -> Any:
    """What the augmentation function gets as ``env``: an rsl_rl env's VecEnv (as rsl_rl passes
    it), else ``env``."""
    return getattr(env, "vec_env", env)
