"""Small stand-ins, in torch, for the simulators' batched interfaces: rsl_rl's ``VecEnv`` (as
Isaac Lab's and mjlab's wrappers give it) and a torch-batched gymnasium vector env (ManiSkill3's
``ManiSkillVectorEnv``; what each line imitates is noted beside it).

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
    """rsl_rl's ``VecEnv`` interface as Isaac Lab 3.0's ``RslRlVecEnvWrapper`` and mjlab's give it
    (each line that imitates the real wrapper says so). ``auto_reset=False``: finished sub-envs
    stay as they are until ``reset(env_ids)`` (mjlab's ``cfg.auto_reset=False``);
    ``final_obs_key``: the true final observations are also put in ``extras`` under that key on
    the steps where some sub-env finishes (Isaac Lab's ``cfg.compute_final_obs``, key
    ``"final_obs"``); ``finite_horizon``: no ``extras["time_outs"]`` (Isaac Lab's
    ``cfg.is_finite_horizon``). ``genesis_flags``: ``dones`` as bools, ``extras["time_outs"]``
    as floats and ``episode_length_buf`` as int32, as Genesis' locomotion example gives them
    (Isaac Lab's and mjlab's wrappers: ``dones`` as int64, bool time-outs).

    Like the real wrappers, ``step`` returns the same ``extras`` dict every time, and its log
    (``extras[log_key]``: ``"log"`` as Isaac Lab and mjlab, ``"episode"`` as Genesis) is written
    when sub-envs reset, into the same tensors: the mean return of the ended episodes over
    ``max_episode_length`` (``Episode_Reward/return``, a per-step reward as the managers divide
    by the episode's seconds) and the counts of those that timed out or left the line
    (``Episode_Termination/time_out``, ``/out_of_bounds``, ints). ``stale_log=True``: the log
    keeps its last values on steps where no sub-env resets (as Isaac Lab and Genesis do); else
    it is empty on those steps (as mjlab's). With ``auto_reset=False`` the log comes with the
    extras of ``reset(env_ids)`` (as mjlab's). ``direct_log=True``: the log of Isaac Lab 3.0's
    direct cartpole instead (``Isaac-Cartpole-Direct``, checked step by step): every reset,
    ``reset()`` included, puts a new 0-d tensor, the fraction of the reset sub-envs that timed
    out, under ``Metrics/success_rate`` in the one log dict, which is never cleared, so that the
    value stays, stale, on the steps where none resets. ``seed`` and ``device`` are kept as given
    (what a factory under torchrun was called with)."""

    def __init__(
        self,
        num_envs: int = 16,
        max_episode_length: int = 50,
        *,
        auto_reset: bool = True,
        final_obs_key: str | None = None,
        finite_horizon: bool = False,
        seed: int = 0,
        dt: float = 0.1,
        log_key: str = "log",
        stale_log: bool = False,
        direct_log: bool = False,
        device: torch.device | str = "cpu",
        genesis_flags: bool = False,
    ) -> None:
        self.num_envs, self.num_actions, self.device = num_envs, 1, torch.device(device)
        self.seed, self.log_key, self.stale_log = seed, log_key, stale_log or direct_log
        self.direct_log = direct_log
        self.extras: dict = {}
        self.log_return = torch.zeros(())  # written in place at every reset, as a sim's buffers
        self.genesis_flags = genesis_flags
        self.max_episode_length, self.auto_reset, self.final_obs_key, self.dt = (
            max_episode_length,
            auto_reset,
            final_obs_key,
            dt,
        )
        self.finite_horizon = finite_horizon
        self.generator = torch.Generator().manual_seed(seed)
        self.state = torch.zeros(num_envs, 2)
        length_dtype = torch.int32 if genesis_flags else torch.long
        self.episode_length_buf = torch.zeros(num_envs, dtype=length_dtype)
        self.returns = torch.zeros(num_envs)
        # the env's buffers, rewritten in place at every step (Isaac Lab's manager-based envs:
        # the reward manager's buffer; the direct envs' reset_terminated, reset_time_outs)
        self.reward_buf = torch.zeros(num_envs)
        self.reset_terminated = torch.zeros(num_envs, dtype=torch.bool)
        self.reset_time_outs = torch.zeros(num_envs, dtype=torch.bool)
        self.reset_calls = 0
        self.reset()  # the wrapper resets the env when it is built

    def start(self, env_ids: torch.Tensor) -> None:
        self.state[env_ids, 0] = torch.rand(len(env_ids), generator=self.generator) * 2 - 1
        self.state[env_ids, 1] = 0.0
        self.episode_length_buf[env_ids] = 0
        self.returns[env_ids] = 0.0

    def get_observations(self) -> TensorDict:
        # a TensorDict of the groups, new tensors at every step (Isaac Lab's obs_buf)
        left = 1 - self.episode_length_buf[:, None].float() / self.max_episode_length
        policy = self.state.clone()
        return TensorDict(
            {"policy": policy, "critic": torch.cat([policy, left], 1)}, batch_size=[self.num_envs]
        )

    def reset(self, env_ids: torch.Tensor | None = None) -> tuple[TensorDict, dict]:
        # Isaac Lab 3.0: reset() -> (TensorDict of the groups, extras)
        self.reset_calls += 1
        ids = torch.arange(self.num_envs) if env_ids is None else env_ids
        if self.direct_log:  # Isaac Lab's direct cartpole logs every reset, the first one too
            self.log_episodes(ids)
        elif env_ids is not None and self.log_key in self.extras:  # the log of the episodes it ends
            self.log_episodes(env_ids)
        self.start(ids)
        return self.get_observations(), self.extras

    def log_episodes(self, ids: torch.Tensor) -> None:
        """Write the log of the episodes of ``ids``, which end now, into ``extras``."""
        if self.direct_log:  # a new tensor into the same dict, as the direct cartpole's _reset_idx
            survived = self.reset_time_outs[ids].float().mean()
            self.extras.setdefault(self.log_key, {})["Metrics/success_rate"] = survived
            return
        self.log_return.copy_(self.returns[ids].mean() / self.max_episode_length)
        x = self.state[ids, 0]
        log = self.extras[self.log_key]
        log.clear()  # the dict, reused too
        log["Episode_Reward/return"] = self.log_return
        log["Episode_Termination/time_out"] = int((x.abs() <= 2).sum())
        log["Episode_Termination/out_of_bounds"] = int((x.abs() > 2).sum())

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        a = actions.to(self.device).reshape(self.num_envs).clamp(-1, 1)  # the env moves actions
        x, v = self.state.unbind(1)
        v = v + self.dt * a
        x = x + self.dt * v
        self.state = torch.stack([x, v], 1)
        self.episode_length_buf += 1
        self.reward_buf[:] = 1 - x.abs()
        self.returns += self.reward_buf
        self.reset_terminated[:] = x.abs() > 2
        self.reset_time_outs[:] = (
            self.episode_length_buf >= self.max_episode_length
        ) & ~self.reset_terminated
        time_outs = self.reset_time_outs
        dones = self.reset_terminated | time_outs
        extras = self.extras
        # the wrapper gives time_outs only for infinite-horizon tasks (not cfg.is_finite_horizon)
        if not self.finite_horizon:
            extras["time_outs"] = time_outs
        log = extras.setdefault(self.log_key, {})
        if not self.stale_log:
            log.clear()
        obs = self.get_observations()
        ids = dones.nonzero().view(-1)
        if self.final_obs_key is not None and len(ids):  # computed only when some env resets,
            extras[self.final_obs_key] = obs  # and left, stale, in the extras on later steps
        if len(ids) and self.auto_reset:
            self.log_episodes(ids)
            self.start(ids)
            obs = self.get_observations()
        if self.genesis_flags:  # Genesis' example: bool dones, float time-outs
            extras["time_outs"] = time_outs.float()
            return obs, self.reward_buf, dones, extras
        # dones as int64 (the wrapper's terminated | truncated); the reward buffer itself
        return obs, self.reward_buf, dones.long(), extras


class PointMassVectorEnv:
    """The same task as a torch-batched gymnasium vector env that behaves as ManiSkill3's
    ``ManiSkillVectorEnv(env, auto_reset=True, record_metrics=True)`` does (3.0.1, read in its
    source and checked on PushCube-v1); ``give_final_obs=False``: no final observations nor
    final infos (as Isaac Lab's direct envs). A success is ``|x| < 0.1``."""

    # ManiSkillVectorEnv sets this in its metadata
    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self, num_envs: int = 16, *, give_final_obs: bool = True, max_episode_length: int = 50
    ) -> None:
        self.sim = PointMassVecEnv(num_envs, max_episode_length)
        self.num_envs, self.device, self.give_final_obs = num_envs, torch.device("cpu"), give_final_obs
        self.single_observation_space = spaces.Box(-float("inf"), float("inf"), (2,))
        self.single_action_space = spaces.Box(-1.0, 1.0, (1,))
        self.success_once = torch.zeros(num_envs, dtype=torch.bool)
        self.closed = False

    def _info(self) -> dict:
        # ManiSkill's info of every step and reset: the steps so far and the success, [N] each
        success = self.sim.state[:, 0].abs() < 0.1
        return {"elapsed_steps": self.sim.episode_length_buf.int(), "success": success}

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[torch.Tensor, dict]:
        if seed is not None:
            self.sim.generator.manual_seed(seed)
        self.success_once[:] = False
        return self.sim.reset()[0]["policy"], self._info()

    def step(self, actions: torch.Tensor) -> tuple:
        sim = self.sim
        sim.auto_reset = False
        obs, rewards, dones, extras = sim.step(actions)
        dones = dones.bool()
        info = self._info()
        self.success_once |= info["success"]
        # record_metrics: the episode so far of every env, [N] each
        info["episode"] = {
            "success_once": self.success_once.clone(),
            "return": sim.returns.clone(),
            "episode_len": sim.episode_length_buf.int(),
        }
        # a time-out truncates, a fall terminates (ManiSkill: success | fail terminates)
        truncated = extras["time_outs"].clone()  # the sim's buffers change at its next step
        terminated = dones & ~truncated
        if dones.any():
            final_obs, final_info = (
                obs["policy"].clone(),
                info,
            )  # clones of every env's, not only the done
            ids = dones.nonzero().view(-1)
            sim.start(ids)
            self.success_once[ids] = False
            obs = sim.get_observations()
            info = self._info()  # after an auto-reset the info is the reset's
            if self.give_final_obs:
                info["final_observation"], info["final_info"] = final_obs, final_info
                info["_final_observation"] = info["_final_info"] = dones
        return obs["policy"], rewards.clone(), terminated, truncated, info

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


def point_mass_runner_cfg(task: str) -> dict:
    """A runner-config function of named tasks (``rl8.envs.tasks.TASK_RUNNER_CONFIGS``): an rsl_rl
    runner config for ``"PointMass"``."""
    if task != "PointMass":
        raise ValueError(f"unknown task {task!r}")
    return {
        "num_steps_per_env": 8,
        "actor": {"class_name": "MLPModel", "hidden_dims": [16, 16], "activation": "elu"},
        "critic": {"class_name": "MLPModel", "hidden_dims": [16, 16], "activation": "elu"},
        "algorithm": {"class_name": "PPO", "learning_rate": 3e-3},
    }
