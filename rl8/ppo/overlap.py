"""Overlapped collection (``collect_mode="overlap"``, ``docs/collection.md``): the next rollout
runs in a background thread, with a copy of the policy one update old, while PPO updates.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rl8.envs.episodes import EpisodeRecords
from rl8.policies.policy import Policy
from rl8.ppo.buffer import RolloutBuffer, RolloutCarry

__all__ = ["OverlapCollector", "Rollout", "RolloutFn"]

#: How long the interpreter waits at exit for a rollout still in flight (seconds).
EXIT_JOIN_TIMEOUT_S = 30.0
_COLLECTORS: weakref.WeakSet[OverlapCollector] = weakref.WeakSet()
_STORAGE = ("data", "states", "post_states")  # the tensordicts of a RolloutBuffer


@atexit.register
def _join_at_exit() -> None:
    """Let a rollout still in flight at exit finish: a daemon thread stopped inside a torch op
    aborts the process."""
    for collector in list(_COLLECTORS):
        thread = collector._thread
        if thread is not None:
            thread.join(EXIT_JOIN_TIMEOUT_S)


#: ``run(policy, buffer, carry, obs, generator, deterministic) -> obs``: one rollout of the
#: training envs that fills ``buffer`` (what :meth:`rl8.PPO.collect` runs in sync mode).
RolloutFn = Callable[
    [Policy, RolloutBuffer, RolloutCarry, "torch.Tensor | TensorDictBase", torch.Generator, bool],
    "torch.Tensor | TensorDictBase",
]


@dataclasses.dataclass
class Rollout:
    """A finished rollout in the actor's buffer, not yet handed over.

    Attributes:
        obs: The envs' observations after its last step (the next rollout starts there).
        version: The learner's update count (``PPO.steps``) whose weights collected it.
        deterministic: Whether it took the distributions' modes.
    """

    obs: torch.Tensor | TensorDictBase
    version: int
    deterministic: bool


class OverlapCollector:
    """The actor side of overlapped collection: one rollout at a time, in the background;
    idle, :attr:`in_flight` or :attr:`ready` (a finished rollout waits in :attr:`buffer`).

    Args:
        policy: The learner's policy; the actor acts with a copy of it (see :meth:`sync`).
        buffer: The actor's rollout buffer (the same layout as the learner's).
        generator: Draws the actor's sampled actions.
        run: The rollout function (see :data:`RolloutFn`), run on the actor's objects.
        make_carry: ``make_carry(policy, buffer)``: the carry of the actor's policy copy.

    Attributes:
        policy: The actor's copy of the policy (no gradients).
        carry: The actor's carry, which goes on with the training envs.
        version: The learner's update count of the weights last synced into :attr:`policy`.
    """

    def __init__(
        self, policy: Policy, buffer: RolloutBuffer, generator: torch.Generator, *, run: RolloutFn,
        make_carry: Callable[[Policy, RolloutBuffer], RolloutCarry],
    ) -> None:
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        self.buffer, self.generator = buffer, generator
        self.carry = make_carry(self.policy, buffer)
        self.version = 0
        self._run = run
        # On CUDA the thread uses the default stream, like the learner (what overlaps is the host
        # side): a stream of its own would let the allocator hand the learner memory it still reads.
        self._thread: threading.Thread | None = None
        self._deterministic = False  # of the rollout in flight
        _COLLECTORS.add(self)
        self._done: Rollout | None = None
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a rollout was started and not yet waited for (:meth:`wait`)."""
        return self._thread is not None

    @property
    def ready(self) -> bool:
        """Whether a finished rollout (or its error) waits to be handed over."""
        return not self.in_flight and (self._done is not None or self._error is not None)

    @property
    def idle(self) -> bool:
        """Neither in flight nor ready: a collect has to run a rollout now."""
        return not self.in_flight and not self.ready

    def sync(self, policy: Policy, version: int) -> None:
        """Copy the learner ``policy``'s weights and buffers into the actor's copy (none in
        flight); ``version`` is the learner's update count."""
        if self.in_flight:
            raise RuntimeError("OverlapCollector.sync: a rollout is in flight; wait() for it first")
        self.policy.load_state_dict(policy.state_dict())
        self.version = version

    def start(self, obs: torch.Tensor | TensorDictBase, deterministic: bool, *, background: bool = True) -> None:
        """Run a rollout from ``obs`` with the actor's objects.

        Args:
            obs: The envs' current observations.
            deterministic: Take the distributions' modes instead of sampling.
            background: Run it in the background thread (else in the caller's).
        """
        if not self.idle:
            raise RuntimeError("OverlapCollector.start: the previous rollout was not handed over")
        self._deterministic = deterministic
        if not background:
            self._run_rollout(obs, deterministic)
            return
        self._thread = threading.Thread(
            target=self._background, args=(obs, deterministic), name="rl8-overlap-collector", daemon=True
        )
        self._thread.start()

    def _run_rollout(self, obs: torch.Tensor | TensorDictBase, deterministic: bool) -> None:
        obs = self._run(self.policy, self.buffer, self.carry, obs, self.generator, deterministic)
        self._done = Rollout(obs, self.version, deterministic)

    def _background(self, obs: torch.Tensor | TensorDictBase, deterministic: bool) -> None:
        try:
            self._run_rollout(obs, deterministic)
        except BaseException as exc:  # raised by the next wait(), in the caller's thread
            self._error = exc

    @property
    def deterministic(self) -> bool:
        """Whether the rollout in flight (or ready) takes the distributions' modes."""
        return self._deterministic

    def wait(self) -> Rollout:
        """Wait for the rollout in flight (if any) and return the finished one, or raise what
        it raised (the collector is then idle)."""
        self.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._done is None:
            raise RuntimeError("OverlapCollector.wait: no rollout was started")
        return self._done

    def join(self) -> None:
        """Wait for the background thread to end; its outcome is kept for :meth:`wait`."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None

    def hand_over(self, buffer: RolloutBuffer) -> Rollout:
        """Copy the finished rollout into the learner's ``buffer`` and return it (idle after)."""
        done = self.wait()
        buffer.env_episodes = self.buffer.env_episodes
        for name in _STORAGE:
            source = getattr(self.buffer, name)
            if source is not None:
                getattr(buffer, name).update_(source)
        self._done = None
        return done

    def discard(self) -> None:
        """Wait for the rollout in flight and drop it (or its error)."""
        self.join()
        self._done = self._error = None

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The actor's generator and the finished rollout not yet handed over (waited for)."""
        rollout = None
        if not self.idle:
            done = self.wait()
            done_records = self.buffer.env_episodes  # the env's own records of that rollout
            storage = {name: getattr(self.buffer, name) for name in _STORAGE}
            rollout = {
                **{name: None if td is None else td.clone().to_dict() for name, td in storage.items()},
                "env_episodes": None if done_records is None else dataclasses.asdict(done_records),
                "version": done.version,
                "deterministic": done.deterministic,
            }
        return {"generator": self.generator.get_state(), "rollout": rollout}

    def load_state_dict(self, state: dict[str, Any], obs: torch.Tensor | TensorDictBase | None) -> None:
        """Restore :meth:`state_dict`; ``obs``: the envs' observations after the saved rollout
        (``None``: the envs reset, the rollout is dropped)."""
        self.discard()
        self.generator.set_state(state["generator"])
        rollout = state["rollout"]
        if rollout is None or obs is None:
            return
        device = self.buffer.data.device
        for name in _STORAGE:
            if rollout[name] is not None:
                target = getattr(self.buffer, name)
                target.update_(TensorDict(rollout[name], batch_size=target.batch_size).to(device))
        env_episodes = rollout.get("env_episodes")  # (absent from checkpoints before rl8 kept them)
        self.buffer.env_episodes = None if env_episodes is None else EpisodeRecords(**env_episodes)
        self._deterministic = bool(rollout["deterministic"])
        self._done = Rollout(obs, int(rollout["version"]), self._deterministic)
