"""rsl_rl checkpoints (``model_<iteration>.pt`` of ``OnPolicyRunner`` and ``DistillationRunner``)
as rl8 policy descriptions: the weights of an MLP actor mapped onto :class:`rl8.MLPModel`
(:func:`rl8.io.export.load_rsl_rl_policy` builds the policy; ``docs/rsl_rl.md``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rl8.envs.spaces import space_to_dict
from rl8.io.checkpoint import CheckpointError
from rl8.policies.models import flat_observation_size

__all__ = [
    "RSL_RL_MODELS",
    "RSL_RL_NORMALIZER_EPS",
    "is_rsl_rl_checkpoint",
    "rsl_rl_policy_description",
]

#: The entries of an rsl_rl checkpoint that hold a model's weights, by the name that
#: :func:`~rl8.io.export.load_rsl_rl_policy`'s ``model`` takes: rsl_rl 5's ``OnPolicyRunner``
#: (``actor``) and ``DistillationRunner`` (``student``, ``teacher``), and rsl_rl 2 to 4's
#: ``ActorCritic`` (``model``, its ``actor.*`` weights).
RSL_RL_MODELS = {
    "actor": "actor_state_dict",
    "student": "student_state_dict",
    "teacher": "teacher_state_dict",
    "model": "model_state_dict",
}

#: rsl_rl's ``EmpiricalNormalization`` divides by ``std + eps`` with this ``eps``.
RSL_RL_NORMALIZER_EPS = 1e-2

# the layers, std and normaliser of an actor, rsl_rl 5 (MLPModel) and rsl_rl 2 to 4 (ActorCritic)
_LAYOUTS = {
    "mlp": {
        "std": "distribution.std_param",
        "log_std": "distribution.log_std_param",
        "norm": "obs_normalizer.",
    },
    "actor": {"std": "std", "log_std": "log_std", "norm": "actor_obs_normalizer."},
}
_NORM_KEYS = ("_mean", "_var", "_std", "count")


def is_rsl_rl_checkpoint(state: Any) -> bool:
    """Whether ``state`` (a loaded torch file) has the layout of an rsl_rl runner's checkpoint:
    a dict with ``iter`` and one of :data:`RSL_RL_MODELS`' entries."""
    return (
        isinstance(state, Mapping)
        and "iter" in state
        and any(k in state for k in RSL_RL_MODELS.values())
    )


def _layers(weights: Mapping[str, torch.Tensor], prefix: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(weight, bias)`` of the Linear layers ``{prefix}.{i}``, in order, checked to chain."""
    indices = sorted(
        {int(m.group(1)) for k in weights if (m := re.fullmatch(rf"{prefix}\.(\d+)\.weight", k))}
    )
    layers = [(weights[f"{prefix}.{i}.weight"], weights.get(f"{prefix}.{i}.bias")) for i in indices]
    for i, (weight, bias) in zip(indices, layers):
        if weight.dim() != 2 or bias is None or bias.shape != weight.shape[:1]:
            raise CheckpointError(f"{prefix}.{i}: expected a Linear layer's weight and bias")
    for (a, _), (b, _) in zip(layers, layers[1:]):
        if b.shape[1] != a.shape[0]:
            raise CheckpointError(
                f"{prefix}: layer widths do not chain ({list(a.shape)} then {list(b.shape)})"
            )
    if indices != list(range(0, 2 * len(indices), 2)):  # Linear, activation, Linear...
        raise CheckpointError(f"{prefix}: expected Linear layers at 0, 2, 4..., got {indices}")
    return layers


def rsl_rl_policy_description(
    state: Mapping[str, Any],
    *,
    source: Any = "the rsl_rl checkpoint",
    model: str | None = None,
    observation_space: spaces.Space | None = None,
    obs_groups: Sequence[str] | None = None,
    activation: str = "elu",
) -> dict[str, Any]:
    """The rl8 policy description (as :func:`rl8.io.export.policy_to_dict` writes it, without its
    ``format`` and ``version``) of an MLP
    model in an rsl_rl checkpoint ``state``: an :class:`rl8.MLPModel` whose actor has the
    model's layers, its std (``std_type`` ``"scalar"`` or ``"log"``; 1 for a deterministic
    model) and its observation normaliser folded into the first layer (rsl_rl's
    ``(x - mean) / (std + 1e-2)``, unclipped, exactly). Its value head is not rsl_rl's critic:
    a zero linear layer (the policy acts; PPO would train its value from scratch).

    Args:
        state: The checkpoint's dict.
        source: Where it was read from, for messages.
        model: Which model (:data:`RSL_RL_MODELS`): ``None``: the actor of an ``OnPolicyRunner``
            checkpoint, the student of a ``DistillationRunner`` one.
        observation_space: The env's observation space; ``None``: an unbounded ``Box`` of the
            model's input width. A ``Dict`` space needs ``obs_groups``.
        obs_groups: The groups of a ``Dict`` ``observation_space`` the model reads, in rsl_rl's
            order (its ``obs_groups["actor"]``, ``["student"]`` or ``["teacher"]``).
        activation: The hidden layers' activation, which the file does not record (rsl_rl's
            default ``"elu"``).

    Raises:
        rl8.io.checkpoint.CheckpointError: A layout rl8 cannot map (naming the keys found and
            those expected), or an observation space whose width differs from the model's.
    """
    if model is None:
        model = next(name for name in ("actor", "student", "model") if RSL_RL_MODELS[name] in state)
    if model not in RSL_RL_MODELS:
        raise ValueError(f"model: expected one of {sorted(RSL_RL_MODELS)}, got {model!r}")
    entry = RSL_RL_MODELS[model]
    weights = state.get(entry)
    if not isinstance(weights, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        found = sorted(k for k in state if isinstance(k, str))
        raise CheckpointError(f"{source}: no {entry!r} entry of tensors by name (entries: {found})")
    prefix = "mlp" if any(k.startswith("mlp.") for k in weights) else "actor"
    names = _LAYOUTS[prefix]
    try:
        layers = _layers(weights, prefix)
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: entry {entry!r}: {exc}") from None
    known = {f"{prefix}.{2 * i}.{p}" for i in range(len(layers)) for p in ("weight", "bias")}
    known |= {names["std"], names["log_std"], *(names["norm"] + k for k in _NORM_KEYS)}
    if model == "model":  # ActorCritic: its critic's weights are not the actor's
        known |= {k for k in weights if k.startswith(("critic.", "critic_obs_normalizer."))}
    unknown = sorted(set(weights) - known)
    if len(layers) < 2 or unknown:
        raise CheckpointError(
            f"{source}: entry {entry!r} is not an MLP actor rl8 can map: expected the keys "
            f"{prefix}.0.weight, {prefix}.0.bias, {prefix}.2.weight ... (two Linear layers or more), "
            f"{names['std']} or {names['log_std']}, {names['norm']}{{_mean,_var,_std,count}}; "
            f"found {sorted(weights)[:12]}"
            + (f", which rl8 cannot map: {unknown[:6]}" if unknown else "")
        )
    (first_w, first_b), *rest = layers
    width, num_actions = first_w.shape[1], layers[-1][0].shape[0]
    norm = state.get("obs_norm_state_dict") if model == "model" else None  # rsl_rl 2's own entry
    mean, std = weights.get(names["norm"] + "_mean"), weights.get(names["norm"] + "_std")
    if isinstance(norm, Mapping):
        mean, std = norm.get("_mean"), norm.get("_std")
    if mean is not None and std is not None:  # x -> (x - mean) / (std + eps) before the first layer
        scale = 1.0 / (std.reshape(-1).float() + RSL_RL_NORMALIZER_EPS)
        if scale.shape != (width,) or mean.numel() != width:
            raise CheckpointError(
                f"{source}: the observation normaliser's {mean.numel()} values do not fit the first "
                f"layer's {width} inputs"
            )
        first_b = first_b - first_w @ (mean.reshape(-1).float() * scale)
        first_w = first_w * scale
    std_key = next((k for k in (names["std"], names["log_std"]) if k in weights), None)
    noise_std_type = "log" if std_key == names["log_std"] else "scalar"
    std_value = weights[std_key] if std_key is not None else torch.ones(num_actions)
    if std_value.shape != (num_actions,):
        raise CheckpointError(
            f"{source}: {std_key} has shape {list(std_value.shape)}, expected [{num_actions}] (one "
            "per action; a state-dependent std is not mapped)"
        )
    obs_space, config_groups = _observation_space(observation_space, obs_groups, width, source)
    state_dict: dict[str, torch.Tensor] = {
        "model.std" if noise_std_type == "scalar" else "model.log_std": std_value
    }
    for i, (w, b) in enumerate([(first_w, first_b), *rest]):
        state_dict[f"model.pi.{2 * i}.weight"], state_dict[f"model.pi.{2 * i}.bias"] = w, b
    state_dict["model.vf.0.weight"] = torch.zeros(1, width)
    state_dict["model.vf.0.bias"] = torch.zeros(1)
    model_config = {
        "hiddens": [w.shape[0] for w, _ in layers[:-1]],
        "critic_hiddens": [],
        "activation": {"lrelu": "leaky_relu", "swish": "silu"}.get(activation, activation),
        "noise_std_type": noise_std_type,
        "ortho_init": False,
    }
    if config_groups is not None:
        model_config["obs_groups"] = {"actor": config_groups, "critic": config_groups}
    return {
        "observation_space": space_to_dict(obs_space),
        "action_space": space_to_dict(spaces.Box(-np.inf, np.inf, (num_actions,), np.float32)),
        "model_cls": "rl8.policies.models.MLPModel",
        "model_config": model_config,
        "distribution_cls": "rl8.policies.distributions.continuous.Normal",
        "normalize_observations": False,
        "env": None,
        "state_dict": {k: v.detach().float().clone() for k, v in state_dict.items()},
    }


def _observation_space(
    space: spaces.Space | None, groups: Sequence[str] | None, width: int, source: Any
) -> tuple[spaces.Space, list[str] | None]:
    """The policy's observation space and the groups its actor reads, checked against ``width``."""
    if space is None:
        if groups is not None:
            raise ValueError("obs_groups: needs the Dict observation_space the groups are keys of")
        return spaces.Box(-np.inf, np.inf, (width,), np.float32), None
    if isinstance(space, spaces.Dict):
        if groups is None:
            raise ValueError(
                f"obs_groups: a Dict observation_space needs the groups the model reads (its keys: "
                f"{list(space.spaces)})"
            )
        missing = [g for g in groups if g not in space.spaces]
        if missing:
            raise ValueError(
                f"obs_groups: {missing} are not keys of the observation space ({list(space.spaces)})"
            )
        given = sum(flat_observation_size(space[g]) for g in groups)
    else:
        given = flat_observation_size(space)
    if given != width:
        raise CheckpointError(
            f"{source}: the model reads {width} observation values, but the observation space "
            f"{'groups ' + str(list(groups)) if groups else ''} hold {given}"
        )
    return space, None if groups is None else list(groups)
