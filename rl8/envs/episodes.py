"""Episode bookkeeping across collects."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["EpisodeRecords", "EpisodeTracker"]


@dataclasses.dataclass(frozen=True)
class EpisodeRecords:
    """Sums over episodes as an env records them itself (:meth:`rl8.Env.pop_episode_records`;
    the Atari preset's whole games and unclipped score, unlike what PPO sees).

    Attributes:
        return_sum: The sum of the episodes' returns, in the env's own reward.
        length_sum: The sum of their lengths, in the env's own steps (Atari: emulator frames).
        count: How many episodes.
    """

    return_sum: float = 0.0
    length_sum: float = 0.0
    count: int = 0

    def stat_sums(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """``env_episodes/{return_sum,length_sum,count}`` as 0-d float64 tensors on ``device``."""
        values = torch.tensor([self.return_sum, self.length_sum, self.count], dtype=torch.float64).to(
            device
        )
        return dict(
            zip(
                ("env_episodes/return_sum", "env_episodes/length_sum", "env_episodes/count"),
                values.unbind(),
            )
        )


class EpisodeTracker:
    """The return and length so far of each of ``num_envs`` envs' current episode (on ``device``)."""

    def __init__(self, num_envs: int, device: torch.device | str) -> None:
        self.returns = torch.zeros(num_envs, device=device)
        self.lengths = torch.zeros(num_envs, device=device)

    def reset(self) -> None:
        """Every env starts a new episode (PPO reset all envs)."""
        self.returns.zero_()
        self.lengths.zero_()

    def advance(self, rewards: torch.Tensor, dones: torch.Tensor) -> dict[str, torch.Tensor]:
        """Advance over one collect; the 0-d float64 ``episodes/{return_sum,length_sum,count}``
        of the episodes that ended in it.

        Args:
            rewards: ``[num_envs, T]`` rewards of the collect.
            dones: ``[num_envs, T]`` bool, True where an episode ended at that step.
        """
        n, h = rewards.shape
        steps = torch.arange(h, device=rewards.device)
        cum_ret = self.returns[:, None] + rewards.float().cumsum(1)
        cum_len = self.lengths[:, None] + (steps + 1).float()
        last_done = torch.where(dones, steps, -1).cummax(1).values
        # [n, h + 1]: the last step that ended an episode before each step, and after the collect
        prev_done = torch.cat([torch.full((n, 1), -1, device=rewards.device), last_done], 1)
        has_prev = prev_done >= 0
        idx = prev_done.clamp(min=0)
        start_ret = torch.where(has_prev, cum_ret.gather(1, idx), 0.0)
        start_len = torch.where(has_prev, cum_len.gather(1, idx), 0.0)
        done_f = dones.float()
        ret_sum = ((cum_ret - start_ret[:, :-1]) * done_f).sum()
        len_sum = ((cum_len - start_len[:, :-1]) * done_f).sum()
        self.returns = cum_ret[:, -1] - start_ret[:, -1]
        self.lengths = cum_len[:, -1] - start_len[:, -1]
        return {
            "episodes/return_sum": ret_sum.double(),
            "episodes/length_sum": len_sum.double(),
            "episodes/count": done_f.sum().double(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The running return and length (the keys PPO checkpoints have always used)."""
        return {"episode_return": self.returns.clone(), "episode_length": self.lengths.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (``state``)."""
        device = self.returns.device
        self.returns = state["episode_return"].to(device)
        self.lengths = state["episode_length"].to(device)
