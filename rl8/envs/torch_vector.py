"""A gymnasium vector env of torch tensors (ManiSkill3, Isaac Lab) as an rl8 env (``docs/simulators.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from rl8.envs.base import Env

__all__ = ["TorchVectorEnv", "batched_obs", "float32_box", "is_torch_vector_env", "vector_env_device"]

#: The info keys under which a same-step auto-resetting vector env gives the final observations
#: (gymnasium 1.x, then gymnasium 0.29 and ManiSkill3).
FINAL_OBS_KEYS = ("final_obs", "final_observation")


def is_torch_vector_env(obj: Any) -> bool:
    """Whether ``obj`` looks like a batched gymnasium vector env."""
    return all(
        hasattr(obj, a)
        for a in ("num_envs", "single_observation_space", "single_action_space", "reset", "step")
    )


def vector_env_device(vector_env: Any) -> Any:
    """The device of a batched vector env's tensors: its ``device`` attribute or its
    ``unwrapped``'s; ``None`` when it has neither (gymnasium's numpy vector envs)."""
    return getattr(vector_env, "device", None) or getattr(
        getattr(vector_env, "unwrapped", None), "device", None
    )


def batched_obs(value: Any, num_envs: int) -> torch.Tensor | TensorDictBase:
    """Observations ``value`` (``[num_envs, ...]`` each) as rl8 takes them: a tensor, or a
    TensorDict of a (nested) dict of tensors (no copy)."""
    if isinstance(value, TensorDictBase) and value.batch_size == (num_envs,):
        return value
    if isinstance(value, Mapping):
        return TensorDict(dict(value), batch_size=[num_envs])
    if isinstance(value, torch.Tensor):
        return value
    raise TypeError(
        f"observations must be torch tensors or dicts of them, got {type(value).__name__} "
        "(a gymnasium env of numpy arrays goes through rl8.envs.GymnasiumEnv)"
    )


def float32_box(space: Any) -> spaces.Box | None:
    """A ``Box`` space as a float32 ``Box`` (rl8's action dtype), else ``None``."""
    if not isinstance(space, spaces.Box):
        return None
    return spaces.Box(space.low.astype("float32"), space.high.astype("float32"), space.shape, "float32")


class TorchVectorEnv(Env):
    """A batched gymnasium vector env whose observations, rewards and flags are torch tensors on
    its device, as an rl8 env. Its sub-envs must reset themselves inside ``step`` (gymnasium's
    same-step auto-reset); the final observation of a finished episode is read from the info's
    ``final_obs``/``final_observation`` when the env gives it, else a truncated step bootstraps
    from the observation before the step (``docs/simulators.md``). The finished episodes' values
    in ``info["final_info"]`` (ManiSkill3's ``success``, and its ``episode`` metrics) are averaged
    until :meth:`pop_log`.

    Args:
        vector_env: The env: ``num_envs``, ``single_observation_space``,
            ``single_action_space``, ``reset(seed=...) -> (obs, info)`` and
            ``step(actions) -> (obs, rewards, terminated, truncated, info)``, ``[num_envs, ...]``.
        device: Its device; ``None``: its ``device`` attribute (or its ``unwrapped``'s), which
            a given device must match.
    """

    episodic = True
    single_instance = True

    def __init__(self, vector_env: Any, *, device: torch.device | str | None = None) -> None:
        own = vector_env_device(vector_env)
        device = device or own
        if device is None:
            raise ValueError(
                f"TorchVectorEnv: {type(vector_env).__name__} has no device attribute; "
                "pass TorchVectorEnv(env, device=...)"
            )
        if own is not None and torch.device(own) != torch.device(device):
            raise ValueError(
                f"TorchVectorEnv: device is {str(device)!r}, but {type(vector_env).__name__}'s "
                f"tensors are on {str(own)!r}"
            )
        super().__init__(int(vector_env.num_envs), device=device)
        mode = getattr(vector_env, "metadata", {}).get("autoreset_mode")
        if mode is not None and getattr(mode, "value", mode) != "SameStep":
            raise ValueError(
                f"TorchVectorEnv: the env's autoreset_mode is {mode}; rl8 needs sub-envs "
                "that reset inside step: build it with autoreset_mode=AutoresetMode.SAME_STEP"
            )
        self.vector_env = vector_env
        self.observation_space = vector_env.single_observation_space
        self.action_space = float32_box(vector_env.single_action_space) or vector_env.single_action_space
        self._last_obs: torch.Tensor | TensorDictBase | None = None
        self._log_sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """``vector_env.reset(seed=seed)``; ``config`` must be empty (the env is set where it is built)."""
        self.apply_config(config, {})
        obs, _ = self.vector_env.reset(seed=seed)
        self._last_obs = batched_obs(obs, self.num_envs)
        return self._last_obs

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """One step of every sub-env; see :meth:`rl8.Env.step`."""
        obs, rewards, terminated, truncated, info = self.vector_env.step(action)
        n = self.num_envs
        obs = batched_obs(obs, n)
        final = (
            next((info[k] for k in FINAL_OBS_KEYS if k in info), None)
            if isinstance(info, Mapping)
            else None
        )
        final_obs = self._last_obs if final is None else batched_obs(final, n)
        self._last_obs = obs
        if isinstance(info, Mapping) and isinstance(info.get("final_info"), Mapping):
            self._add_final_info(info["final_info"], info.get("_final_info"))
        return self.step_output(
            {
                "obs": obs,
                "rewards": rewards.reshape(n, 1).to(torch.float32, copy=True),
                "terminated": terminated.reshape(n, 1).to(torch.bool, copy=True),
                "truncated": truncated.reshape(n, 1).to(torch.bool, copy=True),
                "final_obs": final_obs,
            }
        )

    def _add_final_info(self, final_info: Mapping[str, Any], finished: Any) -> None:
        """Add the values of the episodes that ended (the ``[N]`` bool ``finished``, ManiSkill3's
        ``info["_final_info"]``) to the sums :meth:`pop_log` averages: ``success``, ``fail`` and
        ``episode/<metric>`` (ManiSkill3's ``success_once``, ``return``, ``episode_len``...)."""
        if not isinstance(finished, torch.Tensor):
            return
        finished = finished.reshape(-1).bool()
        values = {key: final_info.get(key) for key in ("success", "fail")}
        episode = final_info.get("episode")
        if isinstance(episode, Mapping):
            values.update({f"episode/{key}": value for key, value in episode.items()})
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.shape == finished.shape:
                # kept as tensors: no device sync per step on a GPU
                total, count = self._log_sums.get(key, (0.0, 0))
                self._log_sums[key] = (total + (value.double() * finished).sum(), count + finished.sum())

    def pop_log(self) -> dict[str, torch.Tensor]:
        """The mean over the episodes that ended since the last call of each value their
        ``info["final_info"]`` gave (ManiSkill3: ``success``, ``fail``, ``episode/return``...),
        as 0-d float64 tensors on the env's device (NaN for a value given at a step where no
        episode ended), and forget them."""
        out = {key: total / count for key, (total, count) in self._log_sums.items()}
        self._log_sums = {}
        return out

    def state_dict(self) -> None:
        """``None``: the simulator's state is not saved; PPO resets the env on resume."""
        return None

    def close(self) -> None:
        """Close the wrapped env."""
        self.vector_env.close()
