"""rsl_rl's ``VecEnv`` interface (Isaac Lab, mjlab, Genesis, MuJoCo Playground's torch wrapper)
as an rl8 :class:`~rl8.envs.base.Env`, duck-typed: rsl_rl is not imported (``docs/simulators.md``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from rl8.envs.base import Env
from rl8.envs.episodes import EpisodeLog
from rl8.envs.torch_vector import batched_obs, float32_box

__all__ = ["RslRlEnv", "is_rsl_rl_env", "space_of"]

Observations = torch.Tensor | TensorDictBase


def is_rsl_rl_env(obj: Any) -> bool:
    """Whether ``obj`` looks like rsl_rl's ``VecEnv`` (``get_observations``, ``step``,
    ``num_envs``, ``num_actions``, ``device``)."""
    return all(
        hasattr(obj, a) for a in ("get_observations", "step", "num_envs", "num_actions", "device")
    )


def space_of(obs: Observations) -> spaces.Space:
    """The space of one env's observation in the batch ``obs`` (unbounded ``Box``es)."""
    if isinstance(obs, TensorDictBase):
        return spaces.Dict({key: space_of(obs[key]) for key in obs.keys()})
    dtype = torch.empty(0, dtype=obs.dtype).numpy().dtype
    low, high = (
        (-np.inf, np.inf) if obs.is_floating_point() else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    )
    return spaces.Box(low, high, tuple(obs.shape[1:]), dtype)


class RslRlEnv(Env):
    """An env of rsl_rl's ``VecEnv`` interface as an rl8 env. Observation groups (``{"policy": ...,
    "critic": ...}``) make a ``Dict`` space. ``dones`` are split with ``extras["time_outs"]``:
    ``truncated = done & time_out``, ``terminated = done & ~time_out``. Without ``reset_envs``
    or ``final_obs_key``, a truncated step bootstraps from the observation before the step, as
    rsl_rl does (``docs/simulators.md``).

    Args:
        vec_env: The env: ``num_envs``, ``num_actions``, ``device``, ``get_observations()``,
            ``step(actions) -> (obs, rewards, dones, extras)``; ``reset()``, ``max_episode_length``
            and ``episode_length_buf`` are used where it has them.
        reset_envs: For an env built NOT to reset finished sub-envs inside ``step`` (mjlab's
            ``cfg.auto_reset=False``): ``reset_envs(env_ids)`` resets the sub-envs ``env_ids``
            (``[K]`` int64) and returns the observations of every sub-env afterwards, or
            ``(observations, extras)`` whose ``extras["log"]`` holds the values of the episodes
            it ended (mjlab logs them at the reset); the step's observations are then the true
            final ones. ``None``: the env resets them itself.
        final_obs_key: The ``extras`` key under which the env gives the true final observations
            of every sub-env (like the observations) on a step where some sub-env finished
            (Isaac Lab's ``"final_obs"``), or ``None``.
        init_at_random_ep_len: After each reset, draw the env's ``episode_length_buf`` below
            ``max_episode_length`` (rsl_rl's option), spreading the sub-envs' time-outs.

    Attributes:
        episode_log: The per-episode means of the values the env logs for the episodes that
            end (``extras["log"]``, Isaac Lab's and mjlab's reward and termination terms, or
            ``extras["episode"]``), until :meth:`pop_log`.
    """

    episodic = True
    single_instance = True

    def __init__(
        self,
        vec_env: Any,
        *,
        reset_envs: Callable[[torch.Tensor], Any] | None = None,
        final_obs_key: str | None = None,
        init_at_random_ep_len: bool = False,
    ) -> None:
        super().__init__(int(vec_env.num_envs), device=vec_env.device)
        if reset_envs is not None and final_obs_key is not None:
            raise ValueError("RslRlEnv: give reset_envs or final_obs_key, not both")
        self.vec_env, self.reset_envs, self.final_obs_key = vec_env, reset_envs, final_obs_key
        self.init_at_random_ep_len = init_at_random_ep_len
        self._last_obs = self._observations(vec_env.get_observations())
        self.observation_space = space_of(self._last_obs)
        self.action_space = _action_space(vec_env)
        limit = getattr(vec_env, "max_episode_length", None)
        if isinstance(limit, int):  # the episode limit of evaluations on these envs
            self.params = {"max_episode_steps": limit}
        self.episode_log = EpisodeLog(self.device)

    def _observations(self, raw: Any, extras: Any = None) -> Observations:
        if isinstance(raw, tuple):  # (obs, extras) of reset(), and of get_observations() in rsl_rl 2
            raw, extras = raw[0], raw[1]
        groups = extras.get("observations") if isinstance(extras, Mapping) else None
        if isinstance(raw, torch.Tensor) and groups:  # rsl_rl 2: the other groups in extras
            raw = {"policy": raw, **groups}
        return batched_obs(raw, self.num_envs)

    def reset(self, *, config: dict[str, Any] | None = None, seed: int | None = None) -> Observations:
        """Reset every sub-env with the env's ``reset()``, where it has one (rsl_rl's envs reset
        when built). ``config`` must be empty and ``seed`` is unused: the env's own config sets both."""
        self.apply_config(config, {})
        reset = getattr(self.vec_env, "reset", None)
        raw = reset() if callable(reset) else self.vec_env.get_observations()
        if self.init_at_random_ep_len:
            lengths = self.vec_env.episode_length_buf
            self.vec_env.episode_length_buf = torch.randint_like(
                lengths, high=int(self.vec_env.max_episode_length)
            )
        self._last_obs = self._observations(raw)
        return self._last_obs

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """One step of every sub-env (:meth:`rl8.Env.step`)."""
        raw, rewards, dones, extras = self.vec_env.step(action)
        n = self.num_envs
        obs = self._observations(raw, extras)
        done = dones.reshape(n, 1).bool()
        time_outs = extras.get("time_outs")
        truncated = (
            done & time_outs.reshape(n, 1).bool() if time_outs is not None else torch.zeros_like(done)
        )
        self._add_log(extras, done)
        if self.final_obs_key is not None:
            final_obs = self._final_obs(extras, obs)
        elif self.reset_envs is not None:
            final_obs, env_ids = obs, done.view(-1).nonzero().view(-1)
            if env_ids.numel():
                raw = self.reset_envs(env_ids)
                obs = self._observations(raw)
                if isinstance(raw, tuple):  # (obs, extras): the log of the envs it reset (mjlab's)
                    self._add_log(raw[1], done)
        else:
            final_obs = self._last_obs
        self._last_obs = obs
        return self.step_output(
            {
                "obs": obs,
                "rewards": rewards.reshape(n, 1).to(torch.float32, copy=True),
                "terminated": done & ~truncated,
                "truncated": truncated,
                "final_obs": final_obs,
            }
        )

    def _add_log(self, extras: Any, done: torch.Tensor) -> None:
        """Add ``extras["log"]`` (Isaac Lab, mjlab) or ``extras["episode"]`` (Genesis), the values
        of the episodes that ended at a step (``done``, ``[N, 1]``), to :attr:`episode_log`."""
        log = extras.get("log", extras.get("episode")) if isinstance(extras, Mapping) else None
        if isinstance(log, Mapping) and log:
            self.episode_log.add(log, done.sum())

    def _final_obs(self, extras: Mapping[str, Any], obs: Observations) -> Observations:
        """The true final observations from ``extras[final_obs_key]``; ``obs`` on a step without
        them. Isaac Lab 3.0 (``cfg.compute_final_obs``) writes them only on a step where some
        sub-env resets, and keeps the key, stale, on later steps: only the truncated rows of
        ``final_obs`` are read, and those are fresh."""
        raw = extras.get(self.final_obs_key)
        return obs if raw is None else self._observations(raw)

    def pop_log(self) -> dict[str, torch.Tensor]:
        """The per-episode mean of each value of ``extras["log"]`` (or ``["episode"]``) of the
        steps since the last call (:class:`~rl8.envs.episodes.EpisodeLog`), forgotten; PPO's
        collect reports them as ``env/`` stats."""
        return self.episode_log.pop()

    def state_dict(self) -> None:
        """``None``: the simulator's state is not saved; PPO resets the env on resume."""
        return None

    @property
    def step_dt(self) -> float | None:
        """Seconds of simulated time per env step, the VecEnv's ``unwrapped.step_dt`` (Isaac
        Lab's and mjlab's envs have it; hparam ``rnd`` scales its weight by it as rsl_rl does),
        or ``None`` when it has none."""
        unwrapped = getattr(self.vec_env, "unwrapped", self.vec_env)
        step_dt = getattr(unwrapped, "step_dt", None)
        return None if step_dt is None else float(step_dt)

    def close(self) -> None:
        """Close the wrapped env, where it has ``close()``."""
        close = getattr(self.vec_env, "close", None)
        if callable(close):
            close()


def _action_space(vec_env: Any) -> spaces.Space:
    """The env's (or its ``unwrapped``'s) action space of ``num_actions`` values as float32, else
    an unbounded ``Box``."""
    num_actions = int(vec_env.num_actions)
    for owner in (vec_env, getattr(vec_env, "unwrapped", None)):
        for name in ("single_action_space", "action_space"):
            box = float32_box(getattr(owner, name, None))
            if box is not None and box.shape == (num_actions,):
                return box
    return spaces.Box(-np.inf, np.inf, (num_actions,), np.float32)
