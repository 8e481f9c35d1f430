"""Named tasks of simulators' own registries (``"mjlab:<task id>"``): a spec string (yours, or
read from a checkpoint) is looked up in :data:`TASK_PREFIXES`, never imported by a name it
holds (``docs/security.md``, ``docs/simulators.md``)."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rl8.envs.base import Env

__all__ = ["TASK_PREFIXES", "TASK_RUNNER_CONFIGS", "is_task_spec", "make_task_env", "task_runner_cfg"]

#: Prefix -> the rl8 function ``make(task, num_envs, horizon, *, device, seed, **env_kwargs) -> Env``
#: (``seed``: the simulation's, PPO's ``env_seed``: the rank's under torchrun; or ``None``).
TASK_PREFIXES = {
    "isaaclab": "rl8.envs.isaaclab.make_isaaclab_env",
    "mjlab": "rl8.envs.mjlab.make_mjlab_env",
    "playground": "rl8.envs.jax.make_playground_env",
    "gymnax": "rl8.envs.jax.make_gymnax_env",
    "maniskill": "rl8.envs.maniskill.make_maniskill_env",
}

#: Prefix -> the rl8 function ``runner_cfg(task) -> dict``: the rsl_rl runner config the
#: simulator registers for its task (``rl8 train --task-hparams``: ``docs/cli.md``).
TASK_RUNNER_CONFIGS = {
    "isaaclab": "rl8.envs.isaaclab.isaaclab_runner_cfg",
    "mjlab": "rl8.envs.mjlab.mjlab_runner_cfg",
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
    prefix, task, make = _task_function(spec, TASK_PREFIXES)
    try:
        return make(task, num_envs, horizon, device=device, **env_kwargs)
    except ModuleNotFoundError as exc:
        error = _missing_simulator(spec, prefix, exc)
        if error is None:
            raise
        raise error from exc


def task_runner_cfg(spec: str) -> dict[str, Any]:
    """The rsl_rl runner config that the simulator of the named task ``spec``
    (``"mjlab:Mjlab-Cartpole-Balance"``) registers for it, as a dict (for
    ``rl8.presets.from_rsl_rl``).

    Raises:
        ValueError: ``spec``'s prefix has no runner configs (:data:`TASK_RUNNER_CONFIGS`), or
            the task is unknown.
        ImportError: The simulator is not installed.
    """
    prefix, task, runner_cfg = _task_function(spec, TASK_RUNNER_CONFIGS)
    try:
        return runner_cfg(task)
    except ModuleNotFoundError as exc:
        error = _missing_simulator(spec, prefix, exc)
        if error is None:
            raise
        raise error from exc


def _task_function(spec: str, table: dict[str, str]) -> tuple[str, str, Any]:
    """``(prefix, task, function)`` of ``spec``'s prefix in ``table``, the function imported."""
    prefix, _, task = spec.partition(":")
    if prefix not in table or not task:
        raise ValueError(
            f"env {spec!r}: expected '<prefix>:<task>' with a prefix of "
            f"{sorted(table)} and a task name after it"
        )
    module_name, _, function = table[prefix].rpartition(".")
    try:
        return prefix, task, getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"env {spec!r}: the prefix {prefix!r} needs {table[prefix]}, which could not be "
            f"loaded ({type(exc).__name__}: {exc}); install rl8 with the {prefix!r} extra and the "
            "simulator (docs/simulators.md)"
        ) from exc


def _missing_simulator(spec: str, prefix: str, exc: ModuleNotFoundError) -> ImportError | None:
    """The error for ``exc`` raised by a task function: an ``ImportError`` naming the simulator's
    missing package, or ``None`` when rl8's own module is missing (``exc`` stands)."""
    if exc.name is None or exc.name.partition(".")[0] == "rl8":
        return None
    return ImportError(
        f"env {spec!r}: the simulator's package {exc.name!r} is not installed; install rl8 "
        f"with the {prefix!r} extra and the simulator (docs/simulators.md)"
    )
