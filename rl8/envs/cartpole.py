"""Batched CartPole: gymnasium's ``CartPole-v1`` simulated for ``num_envs`` carts at once."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs import drawing
from rl8.envs.physics import PhysicsEnv

__all__ = ["CartPole"]

_X_THRESHOLD = 2.4  # m
_THETA_THRESHOLD = 12 * 2 * math.pi / 360  # rad, 12 degrees


class CartPole(PhysicsEnv):
    """Balance a pole on a cart by pushing the cart left or right: gymnasium's CartPole-v1
    (dynamics, spaces, reward, termination and truncation; ``docs/envs.md``).

    ``reset(config={...})`` sets ``gravity`` (m/s^2, 9.8), ``masscart`` (kg, 1.0), ``masspole``
    (kg, 0.1), ``length`` (half the pole's length, m, 0.5), ``force_mag`` (N, 10.0), ``tau``
    (s per step, 0.02) and ``max_episode_steps`` (500), the same for all sub-envs.

    Built as :class:`~rl8.envs.base.Env` (``num_envs`` carts; ``horizon`` unused).

    Attributes:
        state: ``[num_envs, 4]`` float32 ``(x, x_dot, theta, theta_dot)``; assign to set it.
        steps: ``[num_envs, 1]`` int64, steps taken in each sub-env's current episode.
    """

    episodic: ClassVar[bool] = True
    metadata: ClassVar[dict[str, Any]] = {"render_fps": 50}
    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = spaces.Discrete(2)

    default_params: ClassVar[dict[str, float | int]] = {
        "gravity": 9.8,
        "masscart": 1.0,
        "masspole": 0.1,
        "length": 0.5,
        "force_mag": 10.0,
        "tau": 0.02,
        "max_episode_steps": 500,
    }

    def _use_params(self, p: dict[str, Any]) -> None:
        # |state| above these ends the episode (only x and theta are limited)
        self._thresholds = torch.tensor(
            [_X_THRESHOLD, math.inf, _THETA_THRESHOLD, math.inf], dtype=torch.float32, device=self.device
        )
        total_mass = p["masspole"] + p["masscart"]
        self._total_mass = total_mass
        self._polemass_length = p["masspole"] * p["length"]
        # force / total_mass for action 0 (left) and 1 (right), looked up without a branch
        self._force_over_mass = torch.tensor(
            [-p["force_mag"] / total_mass, p["force_mag"] / total_mass],
            dtype=torch.float32,
            device=self.device,
        )

    def _initial_state(self) -> torch.Tensor:
        return torch.empty(self.num_envs, 4, device=self.device).uniform_(
            -0.05, 0.05, generator=self._generator
        )

    @staticmethod
    def _observe(state: torch.Tensor) -> torch.Tensor:
        return state  # the state is the observation

    @staticmethod
    def mirror(
        env: Any = None, obs: torch.Tensor | None = None, actions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """CartPole's left/right mirror for hparam ``symmetry`` (rsl_rl's ``data_augmentation_func``
        signature): the ``[B, 4]`` observations with their mirrored copies ``-obs`` after them,
        the ``[B]`` actions (0 left, 1 right) with ``1 - actions`` after them; ``None`` stays
        ``None``. The dynamics, the reward and the initial states are symmetric under it."""
        return (
            None if obs is None else torch.cat([obs, -obs]),
            None if actions is None else torch.cat([actions, 1 - actions]),
        )

    def step(self, action: torch.Tensor) -> TensorDict:
        """Push every cart (``action``: ``[num_envs]`` int64, 0 left, 1 right) and advance ``tau`` seconds."""
        p = self.params
        n = self.num_envs
        state = self.state
        _, x_dot, theta, theta_dot = state.unbind(1)
        cos = torch.cos(theta)
        sin = torch.sin(theta)
        ml = self._polemass_length
        tm = self._total_mass
        # temp = (force + ml * theta_dot^2 * sin) / total_mass
        temp = torch.addcmul(
            self._force_over_mass[action.reshape(n)], theta_dot * theta_dot, sin, value=ml / tm
        )
        # thetaacc = (g sin - cos temp) / (l (4/3 - mp cos^2 / tm))
        denom = torch.mul(cos, cos).mul_(-p["length"] * p["masspole"] / tm).add_(p["length"] * 4.0 / 3.0)
        theta_acc = torch.addcmul(sin * p["gravity"], cos, temp, value=-1.0).div_(denom)
        x_acc = torch.addcmul(temp, theta_acc, cos, value=-ml / tm)
        deriv = torch.stack((x_dot, x_acc, theta_dot, theta_acc), 1)
        final = torch.add(state, deriv, alpha=p["tau"])

        terminated = (final.abs() > self._thresholds).any(1, keepdim=True)
        self.steps.add_(1)
        truncated = self.steps >= p["max_episode_steps"]
        done = terminated | truncated
        self.state = torch.where(done, self._initial_state(), final)
        self.steps.masked_fill_(done, 0)
        return self.step_output(
            {
                "obs": self.state,
                "rewards": torch.ones(n, 1, device=self.device),
                "terminated": terminated,
                "truncated": truncated,
                "final_obs": final,
            }
        )

    def render(self, index: int = 0) -> np.ndarray:
        """Sub-env ``index`` as a ``uint8`` RGB frame ``[400, 600, 3]`` spanning ``[-2.4, 2.4]`` m."""
        x, _, theta, _ = (float(v) for v in self.state[index].cpu())
        height, width = 400, 600
        scale = width / (2 * _X_THRESHOLD)  # pixels per metre
        pole_len = scale * 2 * self.params["length"]
        cart_w, cart_h, axle = 50.0, 30.0, 7.5
        cart_x = x * scale + width / 2.0
        track_y = height - 100.0
        img = drawing.canvas(height, width)
        drawing.draw_line(img, 0, track_y, width, track_y, 1.0, (0, 0, 0))
        left, top = cart_x - cart_w / 2, track_y - cart_h / 2
        drawing.fill_rect(img, left, top, left + cart_w, top + cart_h, (0, 0, 0))
        axle_y = track_y - axle
        tip_x = cart_x + pole_len * math.sin(theta)
        tip_y = axle_y - pole_len * math.cos(theta)
        drawing.draw_line(img, cart_x, axle_y, tip_x, tip_y, 10.0, (202, 152, 101))
        drawing.fill_circle(img, cart_x, axle_y, 5.0, (129, 132, 203))
        return img
