"""What the :class:`~rl8.Trainer` reads of the algorithm it trains: the :class:`Algorithm`
protocol, which :class:`rl8.PPO` and :class:`rl8.Distillation` follow (``docs/trainer.md``)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rl8.envs.base import Env
from rl8.policies.policy import Policy
from rl8.ppo.distributed import DistContext
from rl8.ppo.hparams import HParams
from rl8.ppo.stats import Stats

__all__ = ["Algorithm"]


class Algorithm(Protocol):
    """An algorithm the Trainer can run, checkpoint and resume.

    Attributes:
        algorithm: Its name in checkpoints (``"PPO"``, ``"Distillation"``): the class that
            ``Trainer.from_checkpoint`` builds (``rl8.training.resume.ALGORITHMS``).
        hparams: Its frozen hyper-parameters (an :class:`~rl8.HParams` or a subclass): the
            Trainer reads ``batch_size`` (env steps per training step), ``horizon``,
            ``env_kwargs`` and ``env_config``, and logs ``to_plain()``.
        env: The training envs.
        env_spec: What the envs were built from (a class, an id...), for eval envs and files.
        policy: The policy that acts (logged, exported, evaluated and checkpointed).
        optimizer: Its torch optimizer (its class is logged).
        device: The device of its tensors.
        dist: The data-parallel context (:class:`~rl8.ppo.distributed.DistContext`).
        seed: The run's seed.
        amp_dtype: The autocast dtype of its forward passes (logged).
        env_steps: Env transitions collected so far (all ranks); ``env_resets``, ``collects``
            and ``updates`` (:meth:`update` calls) are the other counters the Trainer reports.
    """

    algorithm: str
    hparams: HParams
    env: Env
    env_spec: Any
    policy: Policy
    optimizer: torch.optim.Optimizer
    device: torch.device
    dist: DistContext
    seed: int
    amp_dtype: torch.dtype
    env_steps: int
    env_resets: int
    collects: int
    updates: int

    @property
    def next_collect_resets(self) -> bool:
        """Whether the next :meth:`collect` resets the envs (evaluation on them is then free)."""
        ...

    def collect(self, *, env_config: dict[str, Any] | None = None, deterministic: bool = False) -> Stats:
        """Run the policy in the envs for one rollout; returns the rollout stats."""
        ...

    def update(self) -> dict[str, float]:
        """Train on the last rollout; returns the update stats (``losses/*``, ``monitors/*``...)."""
        ...

    def evaluate(
        self,
        env: Env | None = None,
        *,
        env_config: dict[str, Any] | None = None,
        deterministic: bool = True,
        num_steps: int | None = None,
    ) -> Stats:
        """The rollout stats of the policy in ``env`` (``None``: the training envs)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly (tensors and plain values)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...

    def close(self) -> None:
        """Release what the algorithm started (threads); the envs stay open."""
        ...
