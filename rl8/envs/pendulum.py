"""Batched Pendulum: gymnasium's ``Pendulum-v1`` simulated for ``num_envs`` pendulums at once."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs import drawing
from rl8.envs.physics import PhysicsEnv

__all__ = ["Pendulum"]


class Pendulum(PhysicsEnv):
    """Swing a pendulum up and keep it upright with a limited torque: gymnasium's Pendulum-v1
    (dynamics, spaces and reward; ``docs/envs.md``). It never terminates, only truncates.

    ``reset(config={...})`` sets ``g`` (m/s^2, 10.0), ``m`` (kg, 1.0), ``l`` (m, 1.0), ``dt``
    (s per step, 0.05), ``max_speed`` (rad/s, 8.0), ``max_torque`` (N m, 2.0) and
    ``max_episode_steps`` (200), the same for all sub-envs.

    Built as :class:`~rl8.envs.base.Env` (``num_envs`` pendulums; ``horizon`` unused).

    Attributes:
        state: ``[num_envs, 2]`` float32 ``(theta, theta_dot)``, ``theta`` not wrapped; assign
            to set it.
        steps: ``[num_envs, 1]`` int64, steps taken in each sub-env's current episode.
    """

    episodic: ClassVar[bool] = True
    metadata: ClassVar[dict[str, Any]] = {"render_fps": 30}
    observation_space = spaces.Box(
        np.array([-1.0, -1.0, -8.0], dtype=np.float32),
        np.array([1.0, 1.0, 8.0], dtype=np.float32),
        dtype=np.float32,
    )
    action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)

    default_params: ClassVar[dict[str, float | int]] = {
        "g": 10.0,
        "m": 1.0,
        "l": 1.0,
        "dt": 0.05,
        "max_speed": 8.0,
        "max_torque": 2.0,
        "max_episode_steps": 200,
    }

    def _use_params(self, p: dict[str, Any]) -> None:
        # uniform [-1, 1] samples times this give (theta, theta_dot) of a fresh episode
        self._init_scale = torch.tensor([math.pi, 1.0], dtype=torch.float32, device=self.device)

    def _initial_state(self) -> torch.Tensor:
        sample = torch.empty(self.num_envs, 2, device=self.device)
        return sample.uniform_(-1.0, 1.0, generator=self._generator).mul_(self._init_scale)

    @staticmethod
    def _observe(state: torch.Tensor) -> torch.Tensor:
        theta, theta_dot = state.unbind(1)
        return torch.stack((torch.cos(theta), torch.sin(theta), theta_dot), 1)

    @staticmethod
    def mirror(
        env: Any = None, obs: torch.Tensor | None = None, actions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Pendulum's mirror ``theta -> -theta`` for hparam ``symmetry`` (rsl_rl's
        ``data_augmentation_func`` signature): the ``[B, 3]`` observations ``(cos, sin,
        theta_dot)`` with ``(cos, -sin, -theta_dot)`` after them, the ``[B, 1]`` raw actions with
        their negatives after them (the torque bounds are symmetric); ``None`` stays ``None``."""
        return (
            None if obs is None else torch.cat([obs, obs * obs.new_tensor([1.0, -1.0, -1.0])]),
            None if actions is None else torch.cat([actions, -actions]),
        )

    def step(self, action: torch.Tensor) -> TensorDict:
        """Apply the torques ``action`` (``[num_envs, 1]``, N m, clipped to ``max_torque``) and
        advance the simulation by ``dt`` seconds."""
        p = self.params
        n = self.num_envs
        theta, theta_dot = self.state.unbind(1)
        u = action.reshape(n).clamp(-p["max_torque"], p["max_torque"])
        # reward of the state before the step: -(angle^2 + 0.1 theta_dot^2 + 0.001 u^2)
        angle = torch.remainder(theta + math.pi, 2 * math.pi).sub_(math.pi)
        rewards = torch.mul(angle, angle).neg_()
        rewards.addcmul_(theta_dot, theta_dot, value=-0.1).addcmul_(u, u, value=-0.001)
        dt = p["dt"]
        new_theta_dot = torch.add(
            theta_dot, torch.sin(theta), alpha=3 * p["g"] / (2 * p["l"]) * dt
        ).add_(u, alpha=3.0 / (p["m"] * p["l"] ** 2) * dt)
        new_theta_dot.clamp_(-p["max_speed"], p["max_speed"])
        new_theta = torch.add(theta, new_theta_dot, alpha=dt)
        final_state = torch.stack((new_theta, new_theta_dot), 1)

        self.steps.add_(1)
        truncated = self.steps >= p["max_episode_steps"]
        self.state = torch.where(truncated, self._initial_state(), final_state)
        self.steps.masked_fill_(truncated, 0)
        return self.step_output(
            {
                "obs": self._observe(self.state),
                "rewards": rewards.unsqueeze(1),
                "terminated": torch.zeros(n, 1, dtype=torch.bool, device=self.device),
                "truncated": truncated,
                "final_obs": self._observe(final_state),
            }
        )

    def render(self, index: int = 0) -> np.ndarray:
        """Sub-env ``index`` as a ``uint8`` RGB frame ``[500, 500, 3]``, ``[-2.2, 2.2]`` m around the pivot."""
        theta = float(self.state[index, 0].cpu())
        size = 500
        scale = size / (2 * 2.2)  # pixels per metre
        rod = scale * self.params["l"]
        c = size / 2.0
        tip_x = c - rod * math.sin(theta)
        tip_y = c - rod * math.cos(theta)
        img = drawing.canvas(size, size)
        drawing.draw_line(img, c, c, tip_x, tip_y, 0.2 * scale, (204, 77, 77))
        drawing.fill_circle(img, c, c, 0.05 * scale, (0, 0, 0))
        return img
