"""Episode bookkeeping across collects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["COUNT_PREFIXES", "EpisodeLog", "EpisodeRecords", "EpisodeTracker"]


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


#: Key prefixes of values that COUNT the ended episodes a term ended (Isaac Lab's and mjlab's
#: termination manager: ``Episode_Termination/<term>``); their per-episode mean is a fraction.
COUNT_PREFIXES = ("Episode_Termination/",)

_FOLD_EVERY = 256  # steps kept before their values are summed (bounds the memory held)


class EpisodeLog:
    """Per-episode means of the values a simulator logs for the episodes that end at a step
    (Isaac Lab's and mjlab's ``extras["log"]``, Genesis' ``extras["episode"]``), summed on the
    simulator's device until :meth:`pop` (``docs/simulators.md``).

    A step's value is the mean over the sub-envs whose episode ended at that step (what the
    managers of Isaac Lab and mjlab and Genesis' examples log), so it is weighted by how many
    ended: a step where none ended adds nothing (Isaac Lab and Genesis leave the last values in
    ``extras`` until the next reset). A tensor of several values holds one value per ended
    episode (each weighs 1, as rsl_rl's logger counts them), on a step where some ended (on
    others it is stale, and adds nothing either). A value under
    :data:`COUNT_PREFIXES` counts the ended episodes a term ended: its mean is the fraction of
    the ended episodes. Values are copied when added, so a simulator may reuse its dict and
    tensors in place.

    Args:
        device: The simulator's device (where the sums are kept).
        field: What the values are, for error messages (``'extras["log"]'``).
    """

    def __init__(self, device: torch.device | str, field: str = 'extras["log"]') -> None:
        self.device, self.field = torch.device(device), field
        self._values: dict[str, list[Any]] = {}  # per key: each step's value (float or 0-d tensor)
        self._weights: dict[str, list[torch.Tensor]] = {}  # and its weight (0-d, on the device)
        self._steps = 0
        self._sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # folded: (numerator, weight)

    def add(self, log: Mapping[str, Any], ended: torch.Tensor) -> None:
        """Record one step's values.

        Args:
            log: The step's ``{name: value}``; a value is a number or a tensor (0-d, or one
                value per ended episode).
            ended: How many sub-envs' episodes ended at the step: a 0-d int tensor on the device.

        Raises:
            ValueError: A name is not a string, or a value is not a number or a tensor.
        """
        for key, value in log.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"{self.field}: expected string names, got {key!r} ({type(key).__name__})"
                )
            if isinstance(value, torch.Tensor) and value.numel() == 1:  # a copy, as it may change
                value, weight = (
                    value.detach().reshape(()).to(self.device, torch.float64, copy=True),
                    ended,
                )
            elif isinstance(value, torch.Tensor) and value.numel() > 1:  # one value per episode
                # none ended: the values are those of earlier episodes, left in a stale log
                weight = (ended > 0).to(self.device) * value.numel()
                value = value.detach().to(self.device, torch.float64).mean()  # a new tensor: a copy
            elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
                value, weight = float(value), ended
            else:
                raise ValueError(
                    f"{self.field}[{key!r}]: expected a number or a non-empty tensor, "
                    f"got {value!r} ({type(value).__name__})"
                )
            self._values.setdefault(key, []).append(value)
            self._weights.setdefault(key, []).append(weight)
        self._steps += 1
        if self._steps >= _FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        f64 = torch.float64
        for key, values in self._values.items():
            if all(isinstance(v, float) for v in values):
                stacked = torch.tensor(values, dtype=f64, device=self.device)
            else:
                stacked = torch.stack(
                    [torch.as_tensor(v, dtype=f64, device=self.device) for v in values]
                )
            weights = torch.stack(self._weights[key]).to(f64)
            # a mean over the ended episodes weighs as many as ended; a count is already a sum
            weighted = stacked if key.startswith(COUNT_PREFIXES) else stacked * weights
            numerator = torch.where(weights > 0, weighted, 0.0).sum()
            old = self._sums.get(key)
            total = (
                (numerator, weights.sum())
                if old is None
                else (old[0] + numerator, old[1] + weights.sum())
            )
            self._sums[key] = total
        self._values, self._weights, self._steps = {}, {}, 0

    def pop(self) -> dict[str, torch.Tensor]:
        """The per-episode mean of each value since the last call, as 0-d float64 tensors on
        the device by name (NaN where no episode ended), and forget them."""
        self._fold()
        out = {key: numerator / weight for key, (numerator, weight) in self._sums.items()}
        self._sums = {}
        return out
