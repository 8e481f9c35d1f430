"""Small stand-ins, in torch, for the simulators' batched interfaces: rsl_rl's ``VecEnv`` (as
Isaac Lab's and mjlab's wrappers give it) and a torch-batched gymnasium vector env (ManiSkill3).

The task: a point mass on a line, ``x' = x + dt * v``, ``v' = v + dt * a`` (``a`` clipped to
[-1, 1]); reward ``1 - |x|`` per step; an episode ends at ``|x| > 2`` (terminated) or after
``max_episode_length`` steps (a time-out). Observation groups: ``policy`` = (x, v), ``critic`` =
(x, v, steps left / limit).
"""

from __future__ import annotations

import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict


class PointMassVecEnv:
    """rsl_rl's ``VecEnv`` interface. ``auto_reset=False``: finished sub-envs stay as they are
    until ``reset(env_ids)`` (mjlab's ``cfg.auto_reset=False``); ``final_obs_key``: the true
    final observations are also put in ``extras`` under that key.

    Like the real wrappers, ``step`` returns the same ``extras`` dict every time, and its log
    (``extras[log_key]``: ``"log"`` as Isaac Lab and mjlab, ``"episode"`` as Genesis) is written
    when sub-envs reset, into the same tensors: the mean return of the ended episodes over
    ``max_episode_length`` (``Episode_Reward/return``, a per-step reward as the managers divide
    by the episode's seconds) and the counts of those that timed out or left the line
    (``Episode_Termination/time_out``, ``/out_of_bounds``, ints). ``stale_log=True``: the log
    keeps its last values on steps where no sub-env resets (as Isaac Lab and Genesis do); else
    it is empty on those steps (as mjlab's). With ``auto_reset=False`` the log comes with the
    extras of ``reset(env_ids)`` (as mjlab's). ``seed`` and ``device`` are kept as given (what
    a factory under torchrun was called with)."""

    def __init__(
        self,
        num_envs: int = 16,
        max_episode_length: int = 50,
        *,
        auto_reset: bool = True,
        final_obs_key: str | None = None,
        seed: int = 0,
        dt: float = 0.1,
        log_key: str = "log",
        stale_log: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_envs, self.num_actions, self.device = num_envs, 1, torch.device(device)
        self.seed, self.log_key, self.stale_log = seed, log_key, stale_log
        self.extras: dict = {}
        self.log_return = torch.zeros(())  # written in place at every reset, as a sim's buffers
        self.max_episode_length, self.auto_reset, self.final_obs_key, self.dt = (
            max_episode_length,
            auto_reset,
            final_obs_key,
            dt,
        )
        self.generator = torch.Generator().manual_seed(seed)
        self.state = torch.zeros(num_envs, 2)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.returns = torch.zeros(num_envs)
        self.reset_calls = 0
        self.reset()

    def start(self, env_ids: torch.Tensor) -> None:
        self.state[env_ids, 0] = torch.rand(len(env_ids), generator=self.generator) * 2 - 1
        self.state[env_ids, 1] = 0.0
        self.episode_length_buf[env_ids] = 0
        self.returns[env_ids] = 0.0

    def get_observations(self) -> TensorDict:
        left = 1 - self.episode_length_buf[:, None].float() / self.max_episode_length
        policy = self.state.clone()
        return TensorDict(
            {"policy": policy, "critic": torch.cat([policy, left], 1)}, batch_size=[self.num_envs]
        )

    def reset(self, env_ids: torch.Tensor | None = None) -> tuple[TensorDict, dict]:
        self.reset_calls += 1
        if env_ids is not None and self.log_key in self.extras:  # the log of the episodes it ends
            self.log_episodes(env_ids)
        self.start(torch.arange(self.num_envs) if env_ids is None else env_ids)
        return self.get_observations(), self.extras

    def log_episodes(self, ids: torch.Tensor) -> None:
        """Write the log of the episodes of ``ids``, which end now, into ``extras``."""
        self.log_return.copy_(self.returns[ids].mean() / self.max_episode_length)
        x = self.state[ids, 0]
        log = self.extras[self.log_key]
        log.clear()  # the dict, reused too
        log["Episode_Reward/return"] = self.log_return
        log["Episode_Termination/time_out"] = int((x.abs() <= 2).sum())
        log["Episode_Termination/out_of_bounds"] = int((x.abs() > 2).sum())

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        a = actions.reshape(self.num_envs).clamp(-1, 1)
        x, v = self.state.unbind(1)
        v = v + self.dt * a
        x = x + self.dt * v
        self.state = torch.stack([x, v], 1)
        self.episode_length_buf += 1
        rewards = 1 - x.abs()
        self.returns += rewards
        terminated = x.abs() > 2
        time_outs = (self.episode_length_buf >= self.max_episode_length) & ~terminated
        dones = terminated | time_outs
        extras = self.extras
        extras["time_outs"] = time_outs
        log = extras.setdefault(self.log_key, {})
        if not self.stale_log:
            log.clear()
        obs = self.get_observations()
        if self.final_obs_key is not None:
            extras[self.final_obs_key] = obs
        ids = dones.nonzero().view(-1)
        if len(ids) and self.auto_reset:
            self.log_episodes(ids)
            self.start(ids)
            obs = self.get_observations()
        return obs, rewards, dones.long(), extras


class PointMassVectorEnv:
    """The same task as a torch-batched gymnasium vector env with same-step auto-reset and the
    final observations in ``info["final_observation"]`` (as ManiSkill3's ``ManiSkillVectorEnv``);
    ``give_final_obs=False``: none (as Isaac Lab's direct envs)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self, num_envs: int = 16, *, give_final_obs: bool = True, max_episode_length: int = 50
    ) -> None:
        self.sim = PointMassVecEnv(num_envs, max_episode_length)
        self.num_envs, self.device, self.give_final_obs = num_envs, torch.device("cpu"), give_final_obs
        self.single_observation_space = spaces.Box(-float("inf"), float("inf"), (2,))
        self.single_action_space = spaces.Box(-1.0, 1.0, (1,))
        self.closed = False

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[torch.Tensor, dict]:
        if seed is not None:
            self.sim.generator.manual_seed(seed)
        return self.sim.reset()[0]["policy"], {}

    def step(self, actions: torch.Tensor) -> tuple:
        sim = self.sim
        sim.auto_reset = False
        obs, rewards, dones, extras = sim.step(actions)
        info = {}
        ids = dones.bool().nonzero().view(-1)
        if len(ids):
            if self.give_final_obs:
                info["final_observation"] = obs["policy"]
            sim.start(ids)
            obs = sim.get_observations()
        truncated = extras["time_outs"]
        return obs["policy"], rewards, dones.bool() & ~truncated, truncated, info

    def close(self) -> None:
        self.closed = True


def make_point_mass(
    task: str, num_envs: int, horizon: int | None, *, device: str, seed: int | None, **env_kwargs: object
):
    """A maker of named tasks (``rl8.envs.tasks``): ``"PointMass"`` as an rsl_rl env, its sim on
    ``device`` seeded with ``seed`` (0 for ``None``)."""
    from rl8.envs.rsl_rl import RslRlEnv

    if task != "PointMass":
        raise ValueError(f"unknown task {task!r}")
    return RslRlEnv(PointMassVecEnv(num_envs, seed=seed or 0, device=device, **env_kwargs))
