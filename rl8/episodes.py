"""Episode bookkeeping across collects: each env's running return and length."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["EpisodeTracker"]


class EpisodeTracker:
    """The return and length so far of each env's current episode, carried from one collect
    to the next, and the sums over the episodes that end within a collect.

    Args:
        num_envs: Number of envs.
        device: Device of the running return and length.
    """

    def __init__(self, num_envs: int, device: torch.device | str) -> None:
        self.returns = torch.zeros(num_envs, device=device)
        self.lengths = torch.zeros(num_envs, device=device)

    def reset(self) -> None:
        """Every env starts a new episode (PPO reset all envs)."""
        self.returns.zero_()
        self.lengths.zero_()

    def advance(self, rewards: torch.Tensor, dones: torch.Tensor) -> dict[str, torch.Tensor]:
        """Advance over one collect and sum up the episodes that ended in it, vectorised.

        Args:
            rewards: ``[num_envs, T]`` rewards of the collect.
            dones: ``[num_envs, T]`` bool, True where an episode ended at that step.

        Returns:
            0-d float64 tensors: ``episodes/return_sum`` and ``episodes/length_sum`` (sums
            over the ended episodes, whole episodes including steps of earlier collects) and
            ``episodes/count`` (how many ended).
        """
        n, h = rewards.shape
        steps = torch.arange(h, device=rewards.device)
        cum_ret = self.returns[:, None] + rewards.float().cumsum(1)
        cum_len = self.lengths[:, None] + (steps + 1).float()
        last_done = torch.where(dones, steps, -1).cummax(1).values
        prev_done = torch.cat([torch.full((n, 1), -1, device=rewards.device), last_done[:, :-1]], 1)
        has_prev = prev_done >= 0
        idx = prev_done.clamp(min=0)
        start_ret = torch.where(has_prev, cum_ret.gather(1, idx), 0.0)
        start_len = torch.where(has_prev, cum_len.gather(1, idx), 0.0)
        done_f = dones.float()
        ret_sum = ((cum_ret - start_ret) * done_f).sum()
        len_sum = ((cum_len - start_len) * done_f).sum()
        final = last_done[:, -1:]
        ended = final >= 0
        fidx = final.clamp(min=0)
        self.returns = (cum_ret[:, -1:] - torch.where(ended, cum_ret.gather(1, fidx), 0.0))[:, 0]
        self.lengths = (cum_len[:, -1:] - torch.where(ended, cum_len.gather(1, fidx), 0.0))[:, 0]
        return {
            "episodes/return_sum": ret_sum.double(),
            "episodes/length_sum": len_sum.double(),
            "episodes/count": done_f.sum().double(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The running return and length (the keys PPO checkpoints have always used)."""
        return {"episode_return": self.returns.clone(), "episode_length": self.lengths.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        device = self.returns.device
        self.returns = state["episode_return"].to(device)
        self.lengths = state["episode_length"].to(device)
