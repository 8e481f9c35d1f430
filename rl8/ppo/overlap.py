"""Overlapped collection (``collect_mode="overlap"``, ``docs/collection.md``): the next rollout
runs in a background thread, with a copy of the policy one update old, while PPO updates."""

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
from rl8.ppo.collectors import Rollout

__all__ = ["OverlapCollector", "Rollout"]

#: How long the interpreter waits at exit for a rollout still in flight (seconds).
EXIT_JOIN_TIMEOUT_S = 30.0
_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # every collector's rollout thread
_STORAGE = ("data", "states", "post_states")  # the tensordicts of a RolloutBuffer


@atexit.register
def _join_at_exit() -> None:
    """Let a rollout in flight at exit finish: a daemon thread stopped inside a torch op aborts."""
    for thread in list(_THREADS):
        thread.join(EXIT_JOIN_TIMEOUT_S)


class OverlapCollector:
    """The actor side of overlapped collection, a :class:`~rl8.ppo.collectors.Collector`: one
    rollout at a time, in the background; idle, :attr:`in_flight` or :attr:`ready` (a finished
    rollout waits in :attr:`buffer`).

    Args:
        policy: The learner's policy; the actor acts with a copy of it (see :meth:`start`).
        buffer: The actor's rollout buffer (the same layout as the learner's).
        generator: Draws the actor's sampled actions.
        run: ``run(policy, buffer, carry, obs, generator, deterministic) -> obs``: one rollout of
            the training envs that fills ``buffer`` (what :meth:`rl8.PPO.collect` runs in sync
            mode), run on the actor's objects.
        make_carry: ``make_carry(policy, buffer)``: the carry of the actor's policy copy.
        learner_buffer: The learner's buffer, which :meth:`collect` hands each rollout over to.

    Attributes:
        policy: The actor's copy of the policy (no gradients).
        carry: The actor's carry, which goes on with the training envs.
        version: The learner's update count of the weights last copied into :attr:`policy`.
        deterministic: Whether the rollout in flight (or ready) takes the distributions' modes.
    """

    def __init__(
        self,
        policy: Policy,
        buffer: RolloutBuffer,
        generator: torch.Generator,
        *,
        run: Callable[..., Any],
        make_carry: Callable[[Policy, RolloutBuffer], RolloutCarry],
        learner_buffer: RolloutBuffer,
    ) -> None:
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        self.learner_buffer = learner_buffer
        self.buffer, self.generator = buffer, generator
        self.carry = make_carry(self.policy, buffer)
        self.version = 0
        self.deterministic = False
        self._run = run
        # On CUDA the thread uses the default stream, like the learner (what overlaps is the host
        # side): a stream of its own would let the allocator hand the learner memory it still reads.
        self._thread: threading.Thread | None = None
        self._outcome: Rollout | BaseException | None = None  # the finished rollout, or its error

    @property
    def in_flight(self) -> bool:
        """Whether a rollout was started and not yet waited for (:meth:`wait`)."""
        return self._thread is not None

    @property
    def ready(self) -> bool:
        """Whether a finished rollout (or its error) waits to be handed over."""
        return not self.in_flight and self._outcome is not None

    @property
    def idle(self) -> bool:
        """Neither in flight nor ready: a collect has to run a rollout now."""
        return not self.in_flight and self._outcome is None

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
        """:meth:`rl8.ppo.collectors.Collector.collect`: hand the background rollout over to the
        learner's buffer (or run one now, after a reset if due), then start the next one unless
        the next collect resets the envs.

        Raises:
            ValueError: ``deterministic`` differs from the rollout's that the previous collect started.
        """
        if not self.idle and self.deterministic != deterministic:
            raise ValueError(
                f"PPO.collect: deterministic={deterministic}, but in collect_mode='overlap' the "
                f"rollout for this collect was started by the previous one with "
                f"deterministic={self.deterministic}; pass the same value to consecutive collects"
            )
        if self.idle:
            if reset_envs is not None:
                obs = reset_envs()
            self.start(policy, version, obs, deterministic, background=False)
        done = self.hand_over(self.learner_buffer)
        if not resets_next:
            self.start(policy, version, done.obs, deterministic)
        return done

    def finish(self, obs: torch.Tensor | TensorDictBase | None) -> torch.Tensor | TensorDictBase | None:
        """:meth:`rl8.ppo.collectors.Collector.finish`: the observations after the rollout in
        flight (waited for, and kept for the next collect), else ``obs``."""
        return self.wait().obs if self.in_flight else obs

    def update_stats(self, policy_lag: int) -> dict[str, float]:
        """``monitors/policy_lag``: the updates between the buffer's weights and the learner's."""
        return {"monitors/policy_lag": float(policy_lag)}

    def start(
        self,
        policy: Policy,
        version: int,
        obs: torch.Tensor | TensorDictBase,
        deterministic: bool,
        *,
        background: bool = True,
    ) -> None:
        """Copy the weights and buffers of the learner's ``policy`` (at its update count ``version``,
        ``PPO.updates``) into the actor's, then run a rollout from the envs' observations ``obs`` with
        the actor's objects, in the background thread (else in the caller's); ``deterministic``:
        take the distributions' modes instead of sampling."""
        if not self.idle:
            raise RuntimeError("OverlapCollector.start: the previous rollout was not handed over")
        self.policy.load_state_dict(policy.state_dict())
        self.version, self.deterministic = version, deterministic
        if not background:
            self._rollout(obs)
            return
        self._thread = threading.Thread(
            target=self._rollout, args=(obs,), name="rl8-overlap-collector", daemon=True
        )
        _THREADS.add(self._thread)
        self._thread.start()

    def _rollout(self, obs: torch.Tensor | TensorDictBase) -> None:
        try:
            obs = self._run(
                self.policy, self.buffer, self.carry, obs, self.generator, self.deterministic
            )
            self._outcome = Rollout(obs, self.version)
        except BaseException as exc:  # raised by the next wait(), in the caller's thread
            self._outcome = exc

    def wait(self) -> Rollout:
        """Wait for the rollout in flight (if any) and return the finished one, or raise what
        it raised (the collector is then idle)."""
        self.join()
        outcome = self._outcome
        if outcome is None:
            raise RuntimeError("OverlapCollector.wait: no rollout was started")
        if isinstance(outcome, BaseException):
            self._outcome = None
            raise outcome
        return outcome

    def join(self) -> None:
        """Wait for the background thread to end; its outcome is kept for :meth:`wait`."""
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def hand_over(self, buffer: RolloutBuffer) -> Rollout:
        """Copy the finished rollout into the learner's ``buffer`` and return it (idle after)."""
        done = self.wait()
        buffer.env_episodes, buffer.env_log = self.buffer.env_episodes, self.buffer.env_log
        for name in _STORAGE:
            source = getattr(self.buffer, name)
            if source is not None:
                getattr(buffer, name).update_(source)
        self._outcome = None
        return done

    def discard(self) -> None:
        """Wait for the rollout in flight and drop it (or its error)."""
        self.join()
        self._outcome = None

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
                "deterministic": self.deterministic,
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
        self.deterministic = bool(rollout["deterministic"])
        self._outcome = Rollout(obs, int(rollout["version"]))
