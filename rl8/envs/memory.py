"""A memory task: recall a cue shown at the start of the episode. Needs a recurrent policy."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8.envs.base import Env
from rl8.fields import check_int

__all__ = ["Memory"]


class Memory(Env):
    """Remember which of ``num_cues`` cues was shown and name it ``delay`` steps later: the first
    observation shows the cue (one-hot); the last entry is 1.0 on the final step, when the action
    must name the cue for a reward of 1.0 (``docs/envs.md``). ``reset(config={"delay": ...})``
    sets the delay.

    Built as :class:`~rl8.envs.base.Env` (``num_envs`` episodes; ``horizon`` unused), and:

    Args:
        delay: Steps between the cue and the answer (the episode lasts ``delay + 1`` steps).
        num_cues: Number of distinct cues (and of actions), >= 2.
    """

    episodic: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        delay: int = 4,
        num_cues: int = 2,
    ) -> None:
        super().__init__(num_envs, horizon, device=device)
        self.num_cues = check_int("Memory: num_cues", num_cues, 2)
        self.observation_space = spaces.Box(0.0, 1.0, (self.num_cues + 1,), np.float32)
        self.action_space = spaces.Discrete(self.num_cues)
        self._generator = self.make_generator()
        self.params: dict[str, int] = {}
        self._set_params({"delay": delay})
        self._cue = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _set_params(self, params: dict[str, Any]) -> None:
        d = check_int("Memory: delay", params["delay"], 0)
        self.params = {"delay": d}
        k = self.num_cues
        # _table[cue, t] is the observation at step t of an episode with that cue; row
        # t = delay + 1 (past the answer) is all zeros and serves as the terminal observation.
        table = torch.zeros(k, d + 2, k + 1, dtype=torch.float32)
        table[:, 0, :k] = torch.eye(k)
        table[:, d, k] = 1.0
        self._table = table.to(self.device)

    def _new_cues(self) -> torch.Tensor:
        return torch.randint(
            self.num_cues, (self.num_envs,), generator=self._generator, device=self.device
        )

    def reset(self, *, config: dict[str, Any] | None = None, seed: int | None = None) -> torch.Tensor:
        """Start a new episode with a new cue in every sub-env (``config``: ``{"delay": int}``)."""
        self._apply_reset_args(config, seed)
        self._cue = self._new_cues()
        self._t = torch.zeros_like(self._t)
        return self._table[self._cue, self._t]

    def step(self, action: torch.Tensor) -> TensorDict:
        """Advance every episode by one step; score the answer (``action``: cue indices) on the last."""
        n = self.num_envs
        answer = self._t == self.params["delay"]
        correct = answer & (action.reshape(n) == self._cue)
        t_next = self._t + 1
        final = self._table[self._cue, t_next]
        self._cue = torch.where(answer, self._new_cues(), self._cue)
        self._t = t_next.masked_fill_(answer, 0)
        terminated = answer.unsqueeze(1)
        return self.step_output(
            {
                "obs": self._table[self._cue, self._t],
                "rewards": correct.unsqueeze(1).to(torch.float32),
                "terminated": terminated,
                "truncated": torch.zeros_like(terminated),
                "final_obs": final,
            }
        )
