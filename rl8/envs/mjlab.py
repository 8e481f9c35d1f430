"""mjlab's tasks (Isaac Lab's manager API on MuJoCo Warp) as rl8 envs, ``PPO("mjlab:<task id>")``
(``docs/simulators_mjlab.md``); mjlab, an extra, is imported only when a task is built."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from tensordict import TensorDict

from rl8.envs.rsl_rl import RslRlEnv
from rl8.verbosity import is_verbose

__all__ = ["RESET_MODES", "make_mjlab_env", "mjlab_runner_cfg", "quiet_warp"]

#: How finished episodes restart: ``"auto"``: mjlab resets them inside ``step`` and a time-out
#: bootstraps from the observation before the step (rsl_rl's way); ``"partial"``: mjlab steps
#: with ``auto_reset=False``, the adapter bootstraps from the true final observation and resets
#: the finished envs with ``reset(env_ids)``.
RESET_MODES = ("auto", "partial")


def _load_task(task: str) -> None:
    import mjlab.tasks  # noqa: F401  (optional extra: importing it registers mjlab's tasks)
    from mjlab.tasks.registry import list_tasks

    if task not in list_tasks():
        raise ValueError(f"mjlab task {task!r} is not in mjlab's registry; its tasks: {list_tasks()}")


def quiet_warp() -> None:
    """Silence warp's line for each kernel module it loads (``Module ... (cached)``, dozens per
    mjlab task) unless verbose (``rl8 ... -v``, ``RL8_VERBOSE=1``: :mod:`rl8.verbosity`); warp's
    warnings and errors still show. warp with logging levels gets ``warp.config.log_level``
    raised to ``warp.LOG_WARNING`` (its ``warp.config.quiet`` is deprecated there), an older warp
    ``warp.config.quiet = True``. Nothing without warp."""
    if is_verbose():
        return
    try:
        import warp
    except ImportError:
        return
    if hasattr(warp, "LOG_WARNING") and hasattr(warp.config, "log_level"):
        warp.config.log_level = max(warp.config.log_level, warp.LOG_WARNING)
    else:
        warp.config.quiet = True


def mjlab_runner_cfg(task: str) -> dict[str, Any]:
    """The rsl_rl runner config mjlab registers for the task id ``task`` (its tuned hyper-parameters),
    as the dict mjlab's ``train.py`` hands rsl_rl; ``rl8.presets.from_rsl_rl`` turns it into rl8's."""
    from mjlab.tasks.registry import load_rl_cfg

    _load_task(task)
    return asdict(load_rl_cfg(task))


def make_mjlab_env(
    task: str,
    num_envs: int,
    horizon: int | None = None,
    *,
    device: torch.device | str,
    reset_mode: str = "auto",
    seed: int | None = None,
    play: bool = False,
    init_at_random_ep_len: bool = True,
    clip_actions: float | None = None,
    env_cfg: Any = None,
) -> RslRlEnv:
    """mjlab's task ``task`` on ``num_envs`` envs, as an rl8 env (``PPO("mjlab:<task>")``).

    The env is mjlab's ``ManagerBasedRlEnv`` behind its ``RslRlVecEnvWrapper``, its observation
    groups (``actor``, ``critic``) a ``Dict`` space. Warp simulates on ``device``: CUDA, or the
    CPU (hide CUDA with ``CUDA_VISIBLE_DEVICES=""`` before mjlab is imported). warp's line for
    each kernel module it loads is left out unless verbose (:func:`quiet_warp`).

    Args:
        task: An mjlab task id, e.g. ``"Mjlab-Cartpole-Balance"``.
        num_envs: Envs simulated together (the env config's ``scene.num_envs``).
        horizon: PPO's horizon; unused (the episode length is the task's ``episode_length_s``).
        device: Torch and warp device of the simulation.
        reset_mode: One of :data:`RESET_MODES`.
        seed: mjlab's seed (its config's ``seed``: python, numpy, torch and warp);
            ``PPO("mjlab:...")`` gives its ``env_seed``, the rank's under torchrun (an
            ``env_kwargs`` seed becomes the rank's too); ``None``: the config's (the
            registry's: none, so the torch generator as PPO seeded it).
        play: The task's play config (no observation noise, endless episodes) instead of the
            training one.
        init_at_random_ep_len: On every reset, start the envs at random points of their time
            limit (rsl_rl's ``init_at_random_ep_len``, what mjlab's ``train.py`` passes).
        clip_actions: Actions clipped to ``[-clip_actions, clip_actions]`` by mjlab's wrapper
            (the runner config's ``clip_actions``); ``None``: not clipped.
        env_cfg: An mjlab ``ManagerBasedRlEnvCfg`` to use instead of the registry's (e.g. one
            changed by hand: shorter episodes, other terms); its ``scene.num_envs``,
            ``auto_reset`` and ``seed`` are set from the arguments here. ``task`` then only names it.

    Raises:
        ValueError: ``reset_mode`` is not one of :data:`RESET_MODES`, or the task is unknown.
        ImportError: mjlab is not installed.
    """
    if reset_mode not in RESET_MODES:
        raise ValueError(f"make_mjlab_env: reset_mode must be one of {RESET_MODES}, got {reset_mode!r}")
    quiet_warp()  # before mjlab builds the env, whose kernels warp loads
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg

    if env_cfg is None:
        _load_task(task)
    cfg = load_env_cfg(task, play=play) if env_cfg is None else env_cfg
    cfg.scene.num_envs = num_envs
    cfg.auto_reset = reset_mode == "auto"
    if seed is not None:
        cfg.seed = seed
    env = RslRlVecEnvWrapper(
        ManagerBasedRlEnv(cfg=cfg, device=str(torch.device(device))), clip_actions=clip_actions
    )

    def reset_envs(env_ids: torch.Tensor) -> tuple[TensorDict, dict[str, Any]]:
        obs, extras = env.unwrapped.reset(env_ids=env_ids)  # extras["log"]: the ended episodes'
        return TensorDict(obs, batch_size=[num_envs]), extras

    return RslRlEnv(
        env,
        reset_envs=None if cfg.auto_reset else reset_envs,
        init_at_random_ep_len=init_at_random_ep_len,
    )
