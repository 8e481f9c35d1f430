"""The shared frame of the built-in simulated envs (:class:`~rl8.envs.CartPole`,
:class:`~rl8.envs.Pendulum`)."""

from __future__ import annotations

import numbers
from typing import Any, ClassVar

import torch

from rl8.envs.base import Env
from rl8.fields import check_int


class PhysicsEnv(Env):
    """A batch of simulations of one physical system, built as :class:`~rl8.envs.base.Env`
    (``horizon`` unused): numeric parameters set with ``reset(config=...)``, a seeded generator,
    a state and a step counter per sub-env. Subclasses set :attr:`default_params` and implement
    :meth:`_initial_state`, :meth:`_observe` and :meth:`_use_params`.

    Attributes:
        params: The parameters in use (floats, ``max_episode_steps`` an int).
        state: ``[num_envs, ...]`` float32 tensor of the systems' states.
        steps: ``[num_envs, 1]`` int64 tensor, steps taken in each sub-env's current episode.
    """

    default_params: ClassVar[dict[str, float | int]]

    def __init__(
        self, num_envs: int, /, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__(num_envs, horizon, device=device)
        self._generator = self.make_generator()
        self._set_params(dict(self.default_params))
        self.state = self._initial_state()
        self.steps = torch.zeros(num_envs, 1, dtype=torch.int64, device=self.device)

    def _set_params(self, params: dict[str, Any]) -> None:
        name = type(self).__name__
        for key, value in params.items():
            if key != "max_episode_steps" and (
                not isinstance(value, numbers.Real) or isinstance(value, bool)
            ):
                raise TypeError(f"{name}: config {key!r} must be a number, got {value!r}")
        p: dict[str, Any] = {k: float(v) for k, v in params.items() if k != "max_episode_steps"}
        steps = params["max_episode_steps"]
        p["max_episode_steps"] = check_int(f"{name}: config 'max_episode_steps'", steps, 1)
        self.params = p
        self._use_params(p)

    def _use_params(self, params: dict[str, Any]) -> None:
        """Derive what the simulation needs from newly set (validated) parameters."""

    def _initial_state(self) -> torch.Tensor:
        """``[num_envs, ...]`` states of fresh episodes, drawn from ``self._generator``."""
        raise NotImplementedError

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reset(self, *, config: dict[str, Any] | None = None, seed: int | None = None) -> torch.Tensor:
        """Reset every sub-env (``config``: the physical parameters, see the class)."""
        self._apply_reset_args(config, seed)
        self.state = self._initial_state()
        self.steps.zero_()
        return self._observe(self.state)
