"""How :meth:`rl8.PPO.collect` fills the learner's rollout buffer, chosen once at construction
(``collect_mode``): :class:`SyncCollector` here runs the rollout in the caller's thread;
:class:`~rl8.ppo.overlap.OverlapCollector` runs the next one in a background thread while PPO
updates (``docs/collection.md``). Both run the rollout loop PPO chose for its env
(:func:`~rl8.ppo.rollout.rollout`, or :func:`~rl8.ppo.rollout.rollout_ready_envs` for an env
with the ``ReadyEnvs`` interface such as the pool)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
from tensordict import TensorDictBase

from rl8.policies.policy import Policy
from rl8.ppo.buffer import RolloutBuffer, RolloutCarry

__all__ = ["Collector", "Rollout", "SyncCollector"]


@dataclasses.dataclass
class Rollout:
    """A finished rollout.

    Attributes:
        obs: The envs' observations after its last step (the next rollout starts there).
        version: The learner's update count (``PPO.updates``) whose weights collected it.
    """

    obs: torch.Tensor | TensorDictBase
    version: int


class Collector(Protocol):
    """What :class:`rl8.PPO` asks of its collector.

    Attributes:
        carry: The carry that goes on with the training envs (a recurrent model's state).
    """

    carry: RolloutCarry

    def collect(
        self,
        policy: Policy,
        version: int,
        obs: torch.Tensor | TensorDictBase | None,
        deterministic: bool,
        *,
        reset_envs: Callable[[], torch.Tensor | TensorDictBase] | None,
        resets_next: bool,
    ) -> Rollout:
        """Fill ``buffer`` (the learner's) with a rollout and return it.

        Args:
            policy: The learner's policy, at its update count ``version``.
            obs: The envs' observations after the last rollout (``None`` before the first).
            deterministic: Take the distributions' modes instead of sampling.
            reset_envs: Resets the envs and returns their observations, when this collect
                starts with a reset (else ``None``).
            resets_next: Whether the next collect starts with a reset.
        """
        ...

    def finish(self, obs: torch.Tensor | TensorDictBase | None) -> torch.Tensor | TensorDictBase | None:
        """Wait for a rollout in flight; the envs' observations after it (``obs`` if none)."""
        ...

    def discard(self) -> None:
        """Drop a rollout in flight or waiting (the envs are about to be reset)."""
        ...

    def join(self) -> None:
        """Wait for a background thread to end, its rollout kept."""
        ...

    def update_stats(self, policy_lag: int) -> dict[str, float]:
        """What the collector adds to the update's stats (``monitors/policy_lag``), else ``{}``."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """The collector's part of a checkpoint (``PPO.state_dict``'s ``overlap``), or ``None``."""
        ...

    def load_state_dict(self, state: dict[str, Any], obs: torch.Tensor | TensorDictBase | None) -> None:
        """Restore :meth:`state_dict`; ``obs``: the envs' observations after the saved rollout."""
        ...


class SyncCollector:
    """``collect_mode="sync"``: each collect runs one rollout of the training envs into the
    learner's buffer, in the caller's thread.

    Args:
        run: ``run(policy, buffer, carry, obs, generator, deterministic) -> obs``: one rollout
            of the training envs that fills ``buffer``.
        buffer: The learner's rollout buffer.
        carry: The learner's carry.
        generator: Draws the sampled actions (PPO's own generator).
    """

    def __init__(
        self,
        run: Callable[..., Any],
        buffer: RolloutBuffer,
        carry: RolloutCarry,
        generator: torch.Generator,
    ) -> None:
        self.run, self.buffer, self.carry, self.generator = run, buffer, carry, generator

    def collect(
        self,
        policy: Policy,
        version: int,
        obs: torch.Tensor | TensorDictBase | None,
        deterministic: bool,
        *,
        reset_envs: Callable[[], torch.Tensor | TensorDictBase] | None,
        resets_next: bool,
    ) -> Rollout:
        """:meth:`Collector.collect`: a reset if due, then the rollout."""
        if reset_envs is not None:
            obs = reset_envs()
        obs = self.run(policy, self.buffer, self.carry, obs, self.generator, deterministic)
        return Rollout(obs, version)

    def finish(self, obs: torch.Tensor | TensorDictBase | None) -> torch.Tensor | TensorDictBase | None:
        """:meth:`Collector.finish`: no rollout is ever in flight."""
        return obs

    def discard(self) -> None:
        """:meth:`Collector.discard`: nothing waits."""

    def join(self) -> None:
        """:meth:`Collector.join`: no thread."""

    def update_stats(self, policy_lag: int) -> dict[str, float]:
        """:meth:`Collector.update_stats`: none (the buffer is always the current weights')."""
        return {}

    def state_dict(self) -> None:
        """:meth:`Collector.state_dict`: nothing beyond PPO's own state."""
        return None

    def load_state_dict(self, state: dict[str, Any], obs: torch.Tensor | TensorDictBase | None) -> None:
        """:meth:`Collector.load_state_dict`: nothing to restore."""
