"""Observation groups: which keys of a ``Dict`` observation the actor and the critic read
(asymmetric actor-critic, ``docs/models.md``), resolved as rsl_rl 5 resolves its ``obs_groups``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium import spaces

__all__ = ["OBS_SETS", "actor_space", "group_space", "obs_groups_problem", "resolve_obs_groups"]

#: The observation sets of an actor-critic model, each read from a list of groups.
OBS_SETS = ("actor", "critic")


def obs_groups_problem(obs_groups: Any) -> str | None:
    """What ``obs_groups`` should have been (the expected shape), or ``None`` when it is
    ``None`` or a dict ``{"actor": [group, ...], "critic": [group, ...]}`` (either set optional)."""
    if obs_groups is None:
        return None
    ok = (
        isinstance(obs_groups, Mapping)
        and set(obs_groups) <= set(OBS_SETS)
        and all(
            isinstance(g, Sequence)
            and not isinstance(g, str)
            and g
            and all(isinstance(k, str) for k in g)
            for g in obs_groups.values()
        )
    )
    return (
        None
        if ok
        else "None or a dict {'actor': [group, ...], 'critic': [group, ...]} of non-empty lists of str"
    )


def resolve_obs_groups(
    space: spaces.Space,
    obs_groups: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, tuple[str, ...] | None]:
    """The groups (keys of the ``Dict`` ``space``) that each of :data:`OBS_SETS` reads, ``None``
    meaning the whole observation. A set not in ``obs_groups`` falls back, as in rsl_rl 5, to the
    group of its own name, then to a ``policy`` group, then (neither present) to ``None``.

    Args:
        space: The observation space; only a ``Dict`` has groups.
        obs_groups: ``{"actor": [...], "critic": [...]}`` (PPO's ``obs_groups`` hparam), or ``None``.

    Raises:
        ValueError: A badly shaped ``obs_groups``, one given for a space that is not a ``Dict``,
            or a group the space does not have (naming the groups it has).
    """
    problem = obs_groups_problem(obs_groups)
    if problem is not None:
        raise ValueError(f"obs_groups: expected {problem}, got {obs_groups!r}")
    keys = list(space.spaces) if isinstance(space, spaces.Dict) else []
    if obs_groups is not None and not keys:
        raise ValueError(
            f"obs_groups: needs a Dict observation space whose keys are groups, got {space}"
        )
    resolved: dict[str, tuple[str, ...] | None] = {}
    for name in OBS_SETS:
        groups = (obs_groups or {}).get(name)
        if groups is None:
            fallback = name if name in keys else "policy" if "policy" in keys else None
            groups = None if fallback is None else [fallback]
        unknown = [g for g in groups or () if g not in keys]
        if unknown:
            raise ValueError(
                f"obs_groups['{name}']: the observation has no group {unknown[0]!r} (its groups: {keys})"
            )
        resolved[name] = None if groups is None else tuple(groups)
    return resolved


def group_space(space: spaces.Space, groups: Sequence[str] | None) -> spaces.Space:
    """The ``Dict`` space of ``groups`` in the order given (``space`` itself for ``None``)."""
    return space if groups is None else spaces.Dict([(g, space[g]) for g in groups])


def actor_space(
    space: spaces.Space, actor_groups: Sequence[str] | None, *, owner: str = "model"
) -> spaces.Space:
    """The part of the observation ``space`` that the actor reads, all that acting needs: for a
    ``Dict`` space the ``Dict`` of ``actor_groups`` in their order, with ``action_mask`` (which
    masks the actions) when the space has one; ``space`` itself when ``actor_groups`` is ``None``
    or the space is no ``Dict``.

    Args:
        space: The observation space.
        actor_groups: The keys the actor reads (:attr:`rl8.policies.models.Model.actor_groups`).
        owner: Who declares ``actor_groups``, for the message (e.g. the model's class name).

    Raises:
        ValueError: ``actor_groups`` names keys the space does not have (naming the keys it has).
    """
    if actor_groups is None or not isinstance(space, spaces.Dict):
        return space
    unknown = [k for k in actor_groups if k not in space.spaces]
    if unknown:
        raise ValueError(
            f"{owner}.actor_groups: {unknown} are not keys of the observation space "
            f"(keys: {list(space.spaces)})"
        )
    keys = list(actor_groups)
    if "action_mask" in space.spaces and "action_mask" not in keys:
        keys.append("action_mask")
    return group_space(space, keys)
