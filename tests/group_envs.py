"""A test env whose ``Dict`` observation has observation groups, as Isaac Lab's: ``policy``
(what the actor may see) and ``critic`` (privileged: the state and the episode's elapsed time)."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs import CartPole


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
