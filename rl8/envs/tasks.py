"""Named tasks of simulators' own registries (``"mjlab:<task id>"``): a spec string (yours, or
read from a checkpoint) is looked up in :data:`TASK_PREFIXES`, never imported by a name it
holds (``docs/security.md``, ``docs/simulators.md``)."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rl8.envs.base import Env

__all__ = ["TASK_PREFIXES", "is_task_spec", "make_task_env"]

#: Prefix -> the rl8 function ``make(task, num_envs, horizon, *, device, **env_kwargs) -> Env``.
TASK_PREFIXES = {
    "mjlab": "rl8.envs.mjlab.make_mjlab_env",
    "playground": "rl8.envs.jax.make_playground_env",
    "gymnax": "rl8.envs.jax.make_gymnax_env",
    "maniskill": "rl8.envs.maniskill.make_maniskill_env",
}


def is_task_spec(spec: Any) -> bool:
    """Whether ``spec`` is a string ``"<prefix>:<task>"`` of a prefix of :data:`TASK_PREFIXES`."""
    return isinstance(spec, str) and spec.partition(":")[0] in TASK_PREFIXES and ":" in spec


def make_task_env(
    spec: str, num_envs: int, horizon: int | None, *, device: torch.device | str, **env_kwargs: Any
) -> Env:
    """Build the named task ``spec`` (``"mjlab:Mjlab-Cartpole"``) with its prefix's maker.

    Args:
        spec: ``"<prefix>:<task>"``, the prefix one of :data:`TASK_PREFIXES`.
        num_envs: Number of parallel envs.
        horizon: PPO's horizon, handed to the maker.
        device: Device of the env's tensors.
        **env_kwargs: More arguments of the maker (PPO's ``env_kwargs``).

    Raises:
        ValueError: ``spec`` has no known prefix, or no task after it.
        ImportError: The maker's module or its simulator (an extra) is not installed.
    """
    prefix, _, task = spec.partition(":")
    if prefix not in TASK_PREFIXES or not task:
        raise ValueError(
            f"env {spec!r}: expected '<prefix>:<task>' with a prefix of "
            f"{sorted(TASK_PREFIXES)} and a task name after it"
        )
    module_name, _, function = TASK_PREFIXES[prefix].rpartition(".")
    try:
        make = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"env {spec!r}: the prefix {prefix!r} needs {TASK_PREFIXES[prefix]}, which could not be "
            f"loaded ({type(exc).__name__}: {exc}); install rl8 with the {prefix!r} extra and the "
            "simulator (docs/simulators.md)"
        ) from exc
    try:
        return make(task, num_envs, horizon, device=device, **env_kwargs)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] == "rl8":
            raise
        raise ImportError(
            f"env {spec!r}: the simulator's package {exc.name!r} is not installed; install rl8 "
            f"with the {prefix!r} extra and the simulator (docs/simulators.md)"
        ) from exc
