"""Catch: a ball falls down a small grid and a paddle must catch it, seen as ``uint8`` images."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs.base import Env
from rl8.fields import check_int

__all__ = ["Catch"]


class Catch(Env):
    """Catch a falling ball with a paddle, seen as ``uint8`` images (bsuite's "catch" as pixels,
    ``docs/envs.md``). A ball falls one row per step from a random column; the paddle moves along
    the bottom row (0: left, 1: stay, 2: right). When the ball lands, the episode ends with +1 if
    caught, else -1. Observations are ``[1, rows * scale, cols * scale]``: 255 for the ball and
    the paddle, 0 elsewhere.

    Built as :class:`~rl8.envs.base.Env` (``num_envs`` games; ``horizon`` unused), and:

    Args:
        rows: Rows of the grid (>= 2); an episode lasts ``rows - 1`` steps.
        cols: Columns of the grid (>= 2).
        scale: Pixels per cell side (>= 1).
    """

    episodic: ClassVar[bool] = True
    metadata: ClassVar[dict[str, Any]] = {"render_fps": 8}
    action_space = spaces.Discrete(3)

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        rows: int = 8,
        cols: int = 8,
        scale: int = 2,
    ) -> None:
        super().__init__(num_envs, horizon, device=device)
        self.rows = check_int("Catch: rows", rows, 2)
        self.cols = check_int("Catch: cols", cols, 2)
        self.scale = check_int("Catch: scale", scale, 1)
        self.observation_space = spaces.Box(
            0, 255, (1, self.rows * self.scale, self.cols * self.scale), np.uint8
        )
        self._generator = self.make_generator()
        self._envs = torch.arange(num_envs, device=self.device)
        self.ball_row = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.ball_col = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.paddle = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _new_balls(self) -> torch.Tensor:
        return torch.randint(self.cols, (self.num_envs,), generator=self._generator, device=self.device)

    def _frames(
        self, ball_row: torch.Tensor, ball_col: torch.Tensor, paddle: torch.Tensor
    ) -> torch.Tensor:
        grid = torch.zeros(self.num_envs, self.rows, self.cols, dtype=torch.uint8, device=self.device)
        grid[self._envs, ball_row, ball_col] = 255
        grid[self._envs, self.rows - 1, paddle] = 255
        if self.scale > 1:
            grid = grid.repeat_interleave(self.scale, 1).repeat_interleave(self.scale, 2)
        return grid.unsqueeze(1)

    def reset(self, *, config: dict[str, Any] | None = None, seed: int | None = None) -> torch.Tensor:
        """Start a new game in every sub-env and return the first images (``config``: none)."""
        self.apply_config(config, {})
        if seed is not None:
            self._generator.manual_seed(seed)
        self.ball_row = torch.zeros_like(self.ball_row)
        self.ball_col = self._new_balls()
        self.paddle = torch.full_like(self.paddle, self.cols // 2)
        return self._frames(self.ball_row, self.ball_col, self.paddle)

    def step(self, action: torch.Tensor) -> TensorDict:
        """Move every paddle (``action``: ``[num_envs]`` int64, 0 left, 1 stay, 2 right), drop
        every ball one row; score the games whose ball lands."""
        paddle = (self.paddle + action.reshape(self.num_envs) - 1).clamp_(0, self.cols - 1)
        ball_row = self.ball_row + 1
        landed = ball_row == self.rows - 1
        caught = landed & (paddle == self.ball_col)
        rewards = torch.where(landed, caught.float() * 2 - 1, 0.0).unsqueeze(1)
        final = self._frames(ball_row, self.ball_col, paddle)
        self.ball_row = ball_row.masked_fill(landed, 0)
        self.ball_col = torch.where(landed, self._new_balls(), self.ball_col)
        self.paddle = torch.where(landed, self.cols // 2, paddle)
        terminated = landed.unsqueeze(1)
        return self.step_output(
            {
                "obs": self._frames(self.ball_row, self.ball_col, self.paddle),
                "rewards": rewards,
                "terminated": terminated,
                "truncated": torch.zeros_like(terminated),
                "final_obs": final,
            }
        )

    def render(self, index: int = 0) -> np.ndarray:
        """Sub-env ``index``'s observation as a ``uint8`` RGB frame, each pixel an 8x8 block."""
        frame = self._frames(self.ball_row, self.ball_col, self.paddle)[index, 0].cpu().numpy()
        frame = np.kron(frame, np.ones((8, 8), dtype=np.uint8))
        return np.repeat(frame[:, :, None], 3, axis=2)
