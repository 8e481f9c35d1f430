"""rsl_rl 5's random network distillation (Burda et al., "Exploration by Random Network
Distillation", 2018; Schwarke et al., CoRL 2023), hparam ``rnd``: an intrinsic reward, the
distance between a fixed random target network's embedding of a state and a trained
predictor's. :meth:`rl8.PPO.collect` adds :meth:`RandomNetworkDistillation.rewards` to the
rollout's (in its stats, ``rewards/intrinsic_*``); :meth:`rl8.PPO.update` gives the predictor
one step of its own optimizer per minibatch (:meth:`RandomNetworkDistillation.train_step`,
``losses/rnd``) (``docs/ppo.md``, Extensions)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rl8.fields import Entry, check_entries, is_int, is_number
from rl8.policies.groups import group_space
from rl8.policies.models import ACTIVATIONS, flat_observation_size, flatten_observation, make_mlp
from rl8.policies.normalization import RunningMeanStd

__all__ = ["RND_DEFAULTS", "RandomNetworkDistillation", "rnd_problem", "rnd_state_groups"]

#: The keys of hparam ``rnd`` (rsl_rl 5's ``rnd_cfg``, plus ``state_groups`` and
#: ``scale_by_step_dt``) and their defaults, rsl_rl's.
RND_DEFAULTS: dict[str, Any] = {
    "weight": 0.0,
    "weight_schedule": None,
    "reward_normalization": False,
    "state_normalization": False,
    "learning_rate": 1e-3,
    "num_outputs": 1,
    "predictor_hidden_dims": [-1],
    "target_hidden_dims": [-1],
    "activation": "elu",
    "state_groups": None,
    "scale_by_step_dt": False,
}
#: The keys of each ``weight_schedule`` mode (besides ``mode``).
SCHEDULE_KEYS = {
    "constant": (),
    "step": ("final_step", "final_value"),
    "linear": ("initial_step", "final_step", "final_value"),
}
#: The discount of the intrinsic reward's running return (its normalisation), rsl_rl's.
REWARD_NORMALIZATION_GAMMA = 0.99
#: Added to the state's std in its normalisation, rsl_rl's.
STATE_NORMALIZATION_EPS = 1e-2
_FIELD = "hparam rnd"


def _dims(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(is_int(d) and (d >= 1 or d == -1) for d in v)


_ENTRIES: dict[str, Entry] = {
    "weight": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "weight_schedule": (
        "None or a dict with 'mode' one of " + str(list(SCHEDULE_KEYS)),
        lambda v: v is None or isinstance(v, Mapping),
    ),
    "reward_normalization": ("a bool", lambda v: isinstance(v, bool)),
    "state_normalization": ("a bool", lambda v: isinstance(v, bool)),
    "learning_rate": ("a number > 0", lambda v: is_number(v) and v > 0),
    "num_outputs": ("an int >= 1", lambda v: is_int(v) and v >= 1),
    "predictor_hidden_dims": ("a list of ints >= 1 or -1 (the state's size)", _dims),
    "target_hidden_dims": ("a list of ints >= 1 or -1 (the state's size)", _dims),
    "activation": (f"one of {sorted(ACTIVATIONS)}", lambda v: isinstance(v, str) and v in ACTIVATIONS),
    "state_groups": (
        "None or a non-empty list of observation groups",
        lambda v: (
            v is None
            or (isinstance(v, (list, tuple)) and bool(v) and all(isinstance(g, str) for g in v))
        ),
    ),
    "scale_by_step_dt": ("a bool", lambda v: isinstance(v, bool)),
}


def rnd_problem(value: Any, name: str = "rnd") -> str | None:
    """HParams' check of ``rnd``: ``None``, or what a bad value should have been (a
    ``ValueError`` naming the key for a bad entry)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return "None or a dict {'weight': w, 'learning_rate': lr, ...} (rsl_rl's rnd_cfg)"
    field = f"hparam {name}"
    check_entries(value, field, _ENTRIES)
    schedule = value.get("weight_schedule")
    if schedule is not None:
        _check_schedule(schedule, f"{field}['weight_schedule']")
    return None


def _check_schedule(schedule: Any, field: str) -> None:
    mode = schedule.get("mode") if isinstance(schedule, Mapping) else None
    if mode not in SCHEDULE_KEYS:
        raise ValueError(
            f"{field}: expected None or a dict with 'mode' one of {list(SCHEDULE_KEYS)}, got {schedule!r}"
        )
    for key in SCHEDULE_KEYS[mode]:
        if key not in schedule:
            raise ValueError(
                f"{field}['{key}']: missing (mode {mode!r} takes {list(SCHEDULE_KEYS[mode])})"
            )
        kind = is_number if key == "final_value" else (lambda v: is_int(v) and v >= 0)
        if not kind(schedule[key]):
            expected = "a number" if key == "final_value" else "an int >= 0 (steps per env)"
            raise ValueError(f"{field}['{key}']: expected {expected}, got {schedule[key]!r}")
    if mode == "linear" and schedule["final_step"] <= schedule["initial_step"]:
        raise ValueError(
            f"{field}['final_step']: expected an int > initial_step={schedule['initial_step']}, "
            f"got {schedule['final_step']!r}"
        )


def rnd_state_groups(space: spaces.Space, groups: Sequence[str] | None) -> tuple[str, ...] | None:
    """The groups of the ``Dict`` observation ``space`` that RND reads: ``groups``, else (as
    rsl_rl 5 resolves its ``rnd_state`` set) a group ``rnd_state``, else ``policy``, else the
    whole observation (``None``, also for a space that is no ``Dict``).

    Raises:
        ValueError: ``groups`` for a space that is no ``Dict``, or a group it does not have.
    """
    keys = list(space.spaces) if isinstance(space, spaces.Dict) else []
    if groups is None:
        fallback = next((g for g in ("rnd_state", "policy") if g in keys), None)
        return None if fallback is None else (fallback,)
    if not keys:
        raise ValueError(f"{_FIELD}['state_groups']: needs a Dict observation space, got {space}")
    unknown = [g for g in groups if g not in keys]
    if unknown:
        raise ValueError(
            f"{_FIELD}['state_groups']: the observation has no group {unknown[0]!r} (its groups: {keys})"
        )
    return tuple(groups)


def _steps_flat(obs: torch.Tensor | TensorDictBase) -> torch.Tensor | TensorDictBase:
    """Observations ``[N, T, ...]`` as ``[N * T, ...]``."""
    if isinstance(obs, TensorDictBase):
        return obs.reshape(-1)
    return obs.reshape(-1, *obs.shape[2:])


def _mlp(
    num_states: int, num_outputs: int, hidden_dims: Sequence[int], activation: str
) -> nn.Sequential:
    """rsl_rl's MLP: Linear layers through ``hidden_dims`` (``-1``: ``num_states``) with the
    activation between them, torch's default initialisation, a linear output."""
    sizes = [num_states, *(num_states if d == -1 else d for d in hidden_dims)]
    return nn.Sequential(
        *make_mlp(sizes, ACTIVATIONS[activation], False), nn.Linear(sizes[-1], num_outputs)
    )


class RandomNetworkDistillation(nn.Module):
    """RND's networks, normalisers, weight schedule and optimizer, from hparam ``rnd``.

    Args:
        config: The ``rnd`` hparam (:data:`RND_DEFAULTS` for the keys it leaves out).
        observation_space: The env's observation space (RND reads the float features of
            :func:`rnd_state_groups`).
        step_dt: Seconds per env step, by which ``weight`` is multiplied when the config's
            ``scale_by_step_dt`` (rsl_rl's scaling; its schedule's ``final_value`` is not
            scaled, as in rsl_rl); ``None`` when the env does not say.
        device: Where the networks live.
        average_gradients: Averages the predictor's gradients over the ranks in place
            (data-parallel training; default: a single process's, left alone).
        all_reduce: Sums a tensor over the ranks in place, for the state's running moments
            (``None``: a single process).

    Attributes:
        loss_name: ``"rnd"``: :meth:`minibatch_step`'s loss is the update's ``losses/rnd``.
        loss_coeff: 0: the predictor's loss is its own optimizer's, not part of PPO's.
        weight: The intrinsic reward's weight before any schedule (scaled by ``step_dt``).
        predictor: The trained network.
        target: The fixed random network (no gradient).
        state_normalizer: Running moments of the state (``state_normalization``), else ``None``.
        reward_normalizer: Running moments of the intrinsic reward's discounted sum
            (``reward_normalization``), else ``None``.
        optimizer: Adam over the predictor, ``learning_rate``.

    Raises:
        ValueError: ``scale_by_step_dt`` without ``step_dt``, or a state group that is not
            there (naming the field).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        observation_space: spaces.Space,
        *,
        step_dt: float | None,
        device: torch.device,
        average_gradients: Callable[[list[torch.Tensor]], None] = lambda grads: None,
        all_reduce: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        super().__init__()
        config = {**RND_DEFAULTS, **config}
        self.average_gradients, self.all_reduce = average_gradients, all_reduce
        self.loss_name, self.loss_coeff = "rnd", 0.0
        groups = rnd_state_groups(observation_space, config["state_groups"])
        self.groups = groups
        self.state_space = group_space(observation_space, groups)
        num_states = flat_observation_size(self.state_space)
        if config["scale_by_step_dt"] and step_dt is None:
            raise ValueError(
                f"{_FIELD}['scale_by_step_dt']: True, but the env has no step_dt (seconds per env "
                "step, as rsl_rl reads env.unwrapped.step_dt); set scale_by_step_dt=False and give the "
                "weight per env step"
            )
        scale = step_dt if config["scale_by_step_dt"] else 1.0
        self.weight = float(config["weight"]) * scale
        self.schedule = config["weight_schedule"]
        self.predictor = _mlp(
            num_states, config["num_outputs"], config["predictor_hidden_dims"], config["activation"]
        )
        self.target = _mlp(
            num_states, config["num_outputs"], config["target_hidden_dims"], config["activation"]
        )
        self.target.requires_grad_(False)
        self.state_normalizer = RunningMeanStd((num_states,)) if config["state_normalization"] else None
        self.reward_normalizer = RunningMeanStd(()) if config["reward_normalization"] else None
        # the running discounted sum of each env's intrinsic rewards (never reset, as rsl_rl's)
        self.register_buffer("discounted_sum", torch.zeros(0))
        self.to(device)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=float(config["learning_rate"]))

    def state(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """The RND state ``[B, num_states]`` of observations ``obs`` ``[B, ...]``, normalised
        when ``state_normalization`` (with the moments as they are)."""
        if self.groups is not None:
            obs = obs.select(*self.groups)
        x = flatten_observation(obs, self.state_space)
        if self.state_normalizer is None:
            return x
        mean, std = self.state_normalizer.mean.float(), self.state_normalizer.var.sqrt().float()
        return (x - mean) / (std + STATE_NORMALIZATION_EPS)

    def weight_at(self, step: int) -> float:
        """The weight at ``step`` env steps per env (rsl_rl's counter: 1 at the first step):
        ``weight``, or its ``weight_schedule`` (``step``: ``final_value`` from ``final_step``;
        ``linear``: from ``weight`` at ``initial_step`` to ``final_value`` at ``final_step``)."""
        s = self.schedule
        if s is None or s["mode"] == "constant":
            return self.weight
        if s["mode"] == "step":
            return self.weight if step < s["final_step"] else float(s["final_value"])
        if step < s["initial_step"]:
            return self.weight
        if step > s["final_step"]:
            return float(s["final_value"])
        progress = (step - s["initial_step"]) / (s["final_step"] - s["initial_step"])
        return self.weight + (float(s["final_value"]) - self.weight) * progress

    @torch.no_grad()
    def rewards(
        self,
        next_obs: torch.Tensor | TensorDictBase,
        first_step: int,
        all_reduce: Callable[[torch.Tensor], Any] | None = None,
    ) -> torch.Tensor:
        """The weighted intrinsic rewards ``[N, T]`` of a rollout whose observations after each
        step are ``next_obs`` ``[N, T, ...]`` (as rsl_rl: the next episode's first one where an
        episode ended): ``|target(s) - predictor(s)|``, divided by the running std of its
        discounted sum (``reward_normalization``, updated step by step), times the weight at each
        step (steps per env ``first_step + 1``, ...). In data-parallel training ``all_reduce``
        sums a tensor over ranks in place, so that the normaliser's moments cover every rank's."""
        n, t = next_obs.shape[:2]
        states = self.state(_steps_flat(next_obs))
        distance = torch.linalg.vector_norm(self.target(states) - self.predictor(states), dim=-1)
        rewards = distance.reshape(n, t)
        if self.reward_normalizer is not None:
            rewards = self._normalized(rewards, all_reduce)
        weights = torch.tensor(
            [self.weight_at(first_step + k + 1) for k in range(t)], device=rewards.device
        )
        return rewards * weights

    def _normalized(
        self, rewards: torch.Tensor, all_reduce: Callable[[torch.Tensor], Any] | None
    ) -> torch.Tensor:
        """Each step's rewards ``[N]`` over the std of the discounted sums so far (rsl_rl's
        EmpiricalDiscountedVariationNormalization)."""
        if self.discounted_sum.shape != rewards.shape[:1]:
            self.discounted_sum = torch.zeros_like(rewards[:, 0])
        out = torch.empty_like(rewards)
        for k in range(rewards.shape[1]):
            self.discounted_sum.mul_(REWARD_NORMALIZATION_GAMMA).add_(rewards[:, k])
            self.reward_normalizer.update(self.discounted_sum, all_reduce)
            std = self.reward_normalizer.var.sqrt().float()
            out[:, k] = torch.where(std > 0, rewards[:, k] / std, rewards[:, k])
        return out

    def loss(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        """The predictor's loss on observations ``obs`` ``[B, ...]``: the mean squared error
        between its embedding and the target's."""
        states = self.state(obs)
        return F.mse_loss(self.predictor(states), self.target(states))

    def train_step(
        self, obs: torch.Tensor | TensorDictBase, average_gradients: Callable[[list[torch.Tensor]], None]
    ) -> torch.Tensor:
        """One step of the predictor's optimizer on :meth:`loss` of ``obs`` (a minibatch's
        collected observations); ``average_gradients`` averages the gradients over ranks
        (data-parallel training). Returns the loss, detached."""
        loss = self.loss(obs)
        self.optimizer.zero_grad()
        loss.backward()
        average_gradients(list(self.predictor.parameters()))
        self.optimizer.step()
        return loss.detach()

    def minibatch_step(self, minibatch: TensorDict) -> tuple[TensorDict, torch.Tensor, None]:
        """PPO's update extension at each minibatch (:class:`~rl8.ppo.update_step.UpdateExtension`):
        one :meth:`train_step` of the predictor on the minibatch's observations; returns the
        minibatch unchanged, the predictor's loss and no term of PPO's loss."""
        return minibatch, self.train_step(minibatch["obs"], self.average_gradients), None

    def after_update(self, obs: torch.Tensor | TensorDictBase) -> None:
        """PPO's update extension after the update: :meth:`update_normalization` on the
        rollout's observations ``obs`` ``[N, T, ...]``."""
        self.update_normalization(obs, self.all_reduce)

    @torch.no_grad()
    def update_normalization(
        self, obs: torch.Tensor | TensorDictBase, all_reduce: Callable[[torch.Tensor], Any] | None
    ) -> None:
        """Fold the states of ``obs`` ``[N, T, ...]`` (a rollout's) into the state's moments
        (``state_normalization``), after the update as rsl_rl does."""
        if self.state_normalizer is None:
            return
        obs = _steps_flat(obs)
        if self.groups is not None:
            obs = obs.select(*self.groups)
        self.state_normalizer.update(flatten_observation(obs, self.state_space), all_reduce)

    def checkpoint(self) -> dict[str, Any]:
        """The networks, normalisers and optimizer as tensors and plain values (PPO.state_dict)."""
        return {"modules": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`checkpoint`."""
        self.discounted_sum = torch.zeros_like(state["modules"]["discounted_sum"])
        self.load_state_dict(state["modules"])
        self.optimizer.load_state_dict(state["optimizer"])
