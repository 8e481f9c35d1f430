"""ManiSkill3's tasks as rl8 envs, ``PPO("maniskill:PushCube-v1")`` (``docs/simulators.md``):
ManiSkill's ``ManiSkillVectorEnv`` behind :class:`~rl8.envs.torch_vector.TorchVectorEnv`.
ManiSkill, an extra, is imported only when a task is built."""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import torch

from rl8.envs.torch_vector import TorchVectorEnv

__all__ = ["CPU_SIM_BACKENDS", "make_maniskill_env"]

#: ManiSkill's names of its CPU physics (PhysX on the CPU: one env per process); the others
#: (``"physx_cuda"``, ``"gpu"``...) simulate on CUDA.
CPU_SIM_BACKENDS = ("cpu", "physx_cpu")


def _check_task(task: str) -> None:
    import mani_skill.envs  # noqa: F401  (optional extra: importing it registers ManiSkill's tasks)
    from mani_skill.utils.registration import REGISTERED_ENVS

    if task not in REGISTERED_ENVS:
        close = difflib.get_close_matches(task, list(REGISTERED_ENVS), n=5)
        raise ValueError(
            f"ManiSkill task {task!r} is not in ManiSkill's registry ({len(REGISTERED_ENVS)} tasks); "
            f"close names: {close or 'none'}"
        )


def _sim_backend(sim_backend: str | None, device: torch.device, num_envs: int) -> str:
    """The ManiSkill sim backend for ``device``, checked against it and ``num_envs``."""
    if sim_backend is None:
        sim_backend = "physx_cpu" if device.type == "cpu" else f"physx_cuda:{device.index or 0}"
    on_cpu = sim_backend.partition(":")[0] in CPU_SIM_BACKENDS
    if on_cpu != (device.type == "cpu"):
        raise ValueError(
            f"make_maniskill_env: sim_backend {sim_backend!r} gives tensors on "
            f"{'the CPU' if on_cpu else 'CUDA'}, but device is {str(device)!r}; leave sim_backend "
            "out to get the backend of the device"
        )
    if on_cpu and num_envs != 1:
        raise ValueError(
            f"make_maniskill_env: ManiSkill's CPU physics ({sim_backend!r}) simulates one env per "
            f"process, so num_envs must be 1 on the CPU, got {num_envs}; many envs in one "
            "process need its GPU physics (device='cuda', sim_backend 'physx_cuda')"
        )
    return sim_backend


def make_maniskill_env(
    task: str,
    num_envs: int,
    horizon: int | None = None,
    *,
    device: torch.device | str,
    sim_backend: str | None = None,
    obs_mode: str = "state",
    control_mode: str | None = None,
    reward_mode: str | None = None,
    max_episode_steps: int | None = None,
    ignore_terminations: bool = False,
    seed: int | None = None,
) -> TorchVectorEnv:
    """ManiSkill3's task ``task`` on ``num_envs`` envs, as an rl8 env (``PPO("maniskill:<task>")``).

    The env is ``gym.make(task, num_envs=..., obs_mode=..., sim_backend=...)`` behind
    ``ManiSkillVectorEnv`` (same-step auto-reset, the final observations in
    ``info["final_observation"]``, episode metrics recorded), wrapped as a
    :class:`~rl8.envs.torch_vector.TorchVectorEnv`; ``env.pop_log()`` gives the success rate of
    the episodes that ended. ManiSkill renders with Vulkan even for state observations: on a
    machine without a GPU, a software Vulkan device (Mesa's lavapipe, 24.3 or newer) is needed.

    Args:
        task: A ManiSkill task id, e.g. ``"PushCube-v1"``.
        num_envs: Envs simulated together; 1 on the CPU (ManiSkill's CPU physics runs one env
            per process).
        horizon: PPO's horizon; unused (the episode length is the task's, or ``max_episode_steps``).
        device: Torch device of the env's tensors: ``"cpu"``, or a CUDA device for ManiSkill's
            GPU physics.
        sim_backend: ManiSkill's ``sim_backend``; ``None``: ``"physx_cpu"`` on the CPU,
            ``"physx_cuda:<index>"`` on CUDA.
        obs_mode: ManiSkill's ``obs_mode``: ``"state"`` (a flat tensor), ``"state_dict"`` (a
            nested dict, a ``Dict`` space)...
        control_mode: ManiSkill's ``control_mode``; ``None``: the task's default.
        reward_mode: ManiSkill's ``reward_mode`` (``"normalized_dense"``, ``"dense"``,
            ``"sparse"``); ``None``: the task's default.
        max_episode_steps: Steps before a time-out (truncated); ``None``: the task's.
        ignore_terminations: Episodes end only at time-outs (ManiSkill's
            ``ignore_terminations``): a success or failure does not end them.
        seed: Unused: PPO's first ``reset(seed=env_seed)`` seeds ManiSkill's envs (the rank's
            seed under torchrun).

    Raises:
        ValueError: The task is not in ManiSkill's registry, ``sim_backend`` does not match
            ``device``, or ``num_envs`` > 1 on the CPU.
        ImportError: ManiSkill is not installed.
    """
    device = torch.device(device)
    sim_backend = _sim_backend(sim_backend, device, num_envs)
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv  # optional extra

    _check_task(task)
    kwargs: dict[str, Any] = {"control_mode": control_mode, "reward_mode": reward_mode}
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    if device.type == "cpu":
        kwargs["render_backend"] = "cpu"  # ManiSkill's default asks for CUDA, then falls back
    env = gym.make(task, num_envs=num_envs, obs_mode=obs_mode, sim_backend=sim_backend, **kwargs)
    vector_env = ManiSkillVectorEnv(
        env, auto_reset=True, ignore_terminations=ignore_terminations, record_metrics=True
    )
    return TorchVectorEnv(vector_env, device=device)
