"""Two trivial 1-D infinite-horizon envs for tests and throughput benchmarks: a point ``x`` on
``[-bounds, bounds]`` moves by ``step_size`` times the action, for a reward ``-|x|``."""

from __future__ import annotations

import numbers
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs.base import Env

__all__ = ["DiscreteDummyEnv", "ContinuousDummyEnv"]


class _DummyEnv(Env):
    """Shared state, reset, step and config (``bounds``, 1.0, and ``step_size``, 0.1) of the dummy
    envs; a subclass gives the move of an action, in steps (:meth:`_moves`).

    Attributes:
        x: ``[num_envs, 1]`` float32 positions, replaced (never modified in place) by each step.
    """

    episodic: ClassVar[bool] = False
    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def __init__(
        self, num_envs: int, /, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__(num_envs, horizon, device=device)
        self._generator = self.make_generator()
        self._set_params({"bounds": 1.0, "step_size": 0.1})
        self.x = self._initial_state()

    def _set_params(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"{type(self).__name__}: config {key!r} must be a positive number, got {value!r}"
                )
        self.params: dict[str, float] = {k: float(v) for k, v in params.items()}

    def _initial_state(self) -> torch.Tensor:
        b = self.params["bounds"]
        return torch.empty(self.num_envs, 1, device=self.device).uniform_(
            -b, b, generator=self._generator
        )

    def reset(self, *, config: dict[str, Any] | None = None, seed: int | None = None) -> torch.Tensor:
        """Draw every ``x`` uniformly in ``[-bounds, bounds]`` (``config``: ``bounds``, ``step_size``)."""
        self._apply_reset_args(config, seed)
        self.x = self._initial_state()
        return self.x

    def _moves(self, action: torch.Tensor) -> torch.Tensor:
        """``[num_envs, 1]`` float moves, in ``step_size`` units, of the actions."""
        raise NotImplementedError

    def step(self, action: torch.Tensor) -> TensorDict:
        """Move every point by ``step_size`` times the move of its ``action``."""
        b = self.params["bounds"]
        self.x = torch.add(self.x, self._moves(action), alpha=self.params["step_size"]).clamp_(-b, b)
        return self.step_output({"obs": self.x, "rewards": torch.abs(self.x).neg_()})


class DiscreteDummyEnv(_DummyEnv):
    """Walk left, stay or walk right (``Discrete(3)``) on a segment; reward ``-|x|``.
    Built as :class:`~rl8.envs.base.Env` (``num_envs`` points; ``horizon`` unused)."""

    action_space = spaces.Discrete(3)

    def _moves(self, action: torch.Tensor) -> torch.Tensor:
        return action.reshape(self.num_envs, 1).sub(1).float()


class ContinuousDummyEnv(_DummyEnv):
    """Move by ``step_size * clip(a, -1, 1)`` (``Box(-1, 1, (1,))``) on a segment; reward ``-|x|``.
    Built as :class:`~rl8.envs.base.Env` (``num_envs`` points; ``horizon`` unused)."""

    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _moves(self, action: torch.Tensor) -> torch.Tensor:
        return action.reshape(self.num_envs, 1).clamp(-1.0, 1.0)
