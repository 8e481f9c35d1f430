"""A test env whose ``Dict`` observation has observation groups, as Isaac Lab's: ``policy``
(what the actor may see) and ``critic`` (privileged: the state and the episode's elapsed time)."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs import CartPole
from rl8.envs.physics import PhysicsEnv


class GroupCartPole(CartPole):
    """CartPole with the groups ``policy`` (the 4 state values) and ``critic`` (the state and
    the fraction of ``max_episode_steps`` elapsed, which only the value needs)."""

    observation_space = spaces.Dict(
        {
            "policy": spaces.Box(-np.inf, np.inf, (4,), np.float32),
            "critic": spaces.Box(-np.inf, np.inf, (5,), np.float32),
        }
    )

    def _groups(self, state: torch.Tensor, steps: torch.Tensor) -> TensorDict:
        elapsed = steps.float() / self.params["max_episode_steps"]
        return TensorDict(
            {"policy": state, "critic": torch.cat([state, elapsed], 1)},
            batch_size=[self.num_envs],
            device=self.device,
        )

    def _observe(self, state: torch.Tensor) -> TensorDict:
        return self._groups(state, self.steps)

    def step(self, action: torch.Tensor) -> TensorDict:
        before = self.steps.clone()
        out = super().step(action)
        out["final_obs"] = self._groups(out["final_obs"], before + 1)
        out["obs"] = self._groups(out["obs"], self.steps)
        return out


class RobotCartPole(CartPole):
    """GroupCartPole as a robot sees it: the ``policy`` group alone, no privileged ``critic``."""

    observation_space = spaces.Dict({"policy": GroupCartPole.observation_space["policy"]})

    def _observe(self, state: torch.Tensor) -> TensorDict:
        return TensorDict({"policy": state}, batch_size=[self.num_envs], device=self.device)

    def step(self, action: torch.Tensor) -> TensorDict:
        out = super().step(action)
        out["final_obs"] = self._observe(out["final_obs"])
        out["obs"] = self._observe(out["obs"])
        return out


class GoalPoint(PhysicsEnv):
    """Move a point ``x`` on ``[-1, 1]`` to a goal ``g`` (both drawn uniformly per episode of 32
    steps) by ``0.1 * clip(a, -1, 1)`` per step, for a reward ``1 - |g - x| / 2`` in ``[0, 1]``.
    The groups: ``teacher`` (privileged: the error ``g - x`` alone, an easy task) and ``policy``
    (what a robot sees: ``x``, ``g`` and 30 channels of sensor noise, which PPO must learn to
    ignore)."""

    episodic = True
    observation_space = spaces.Dict(
        {
            "policy": spaces.Box(-np.inf, np.inf, (32,), np.float32),
            "teacher": spaces.Box(-np.inf, np.inf, (1,), np.float32),
        }
    )
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    default_params = {"max_episode_steps": 32}

    def _initial_state(self) -> torch.Tensor:
        sample = torch.empty(self.num_envs, 2, device=self.device)
        return sample.uniform_(-1.0, 1.0, generator=self._generator)  # (x, g)

    def _observe(self, state: torch.Tensor) -> TensorDict:
        noise = torch.randn(self.num_envs, 30, device=self.device, generator=self._generator)
        error = state[:, 1:] - state[:, :1]
        return TensorDict(
            {"policy": torch.cat([state, noise], 1), "teacher": error},
            batch_size=[self.num_envs],
            device=self.device,
        )

    def step(self, action: torch.Tensor) -> TensorDict:
        x = (self.state[:, :1] + 0.1 * action.reshape(self.num_envs, 1).clamp(-1.0, 1.0)).clamp(-1, 1)
        final_state = torch.cat([x, self.state[:, 1:]], 1)
        rewards = 1 - (final_state[:, 1:] - x).abs() / 2
        self.steps.add_(1)
        truncated = self.steps >= self.params["max_episode_steps"]
        self.state = torch.where(truncated, self._initial_state(), final_state)
        self.steps.masked_fill_(truncated, 0)
        return self.step_output(
            {
                "obs": self._observe(self.state),
                "rewards": rewards,
                "terminated": torch.zeros_like(truncated),
                "truncated": truncated,
                "final_obs": self._observe(final_state),
            }
        )
