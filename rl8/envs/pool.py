"""A pool of worker processes stepping gymnasium envs, with batched inference over ready envs:
:class:`PoolEnv` (``docs/collection.md``)."""

from __future__ import annotations

import collections
import functools
import multiprocessing as mp
import os
import pickle
import selectors
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector.utils import CloudpickleWrapper
from tensordict import TensorDictBase

from rl8.envs.base import ReadyEnvs
from rl8.envs.converter import rows, set_rows
from rl8.envs.gymnasium_base import GymnasiumEnvBase
from rl8.envs.pool_worker import (
    GUARD_ADVICE,
    WORKER_NAME,
    Shared,
    check_main_module,
    split,
    worker,
)
from rl8.envs.workers import (
    CLOSE_TIMEOUT_S,
    EnvWorkerDied,
    ReportEpisodeRecords,
    check_step_timeout,
    exit_description,
    make_single_env,
    stop_processes,
)

__all__ = ["PoolEnv", "PoolWorkerDied"]


class PoolWorkerDied(EnvWorkerDied):
    """A worker process of a :class:`PoolEnv` ended without being asked to (killed, crashed)."""


def _int_or(name: str, value: Any, default: int) -> int:
    """``value`` as an int >= 1, or ``default`` for ``None``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"PoolEnv: {name} must be an int >= 1 or None, got {value!r}")
    return int(value)


def _stop_workers(
    selector: selectors.BaseSelector, processes: list[Any], pipes: list[Connection]
) -> None:
    selector.close()
    stop_processes(processes, pipes)


class PoolEnv(GymnasiumEnvBase, ReadyEnvs):
    """``num_envs`` gymnasium envs stepped by ``num_workers`` worker processes, each owning a
    block of sub-envs, that PPO collects from as they get ready; a script must build it under an
    ``if __name__ == "__main__":`` guard (``docs/collection.md``).

    ``num_envs``, ``horizon``, ``device``, ``env``, ``env_kwargs``, ``wrappers`` and
    ``render_mode`` are :class:`~rl8.envs.gymnasium.GymnasiumEnv`'s (``env`` and ``wrappers``
    picklable); ``vectorization_mode`` is ``"pool"``, the value that selects this class.

    Args:
        num_workers: Worker processes, >= 1, at most ``num_envs``; ``None``:
            ``min(num_envs, os.cpu_count())``.
        min_batch_size: The fewest ready envs the rollout acts on at once, >= 1, at most
            ``num_envs`` (every env: the sync mode's transitions); ``None``: ``num_envs // 2``.
        max_batch_size: The most envs one forward pass acts on, >= ``min_batch_size``, at
            most ``num_envs``; ``None``: ``num_envs``.
        max_wait_s: The longest wait in seconds for ``min_batch_size`` ready envs before
            acting on the ready ones, >= 0; ``None`` (default): no limit.
        step_timeout_s: The longest time in seconds one sub-env's step may take from when its
            worker could start it, > 0, else :class:`~rl8.envs.workers.EnvStepTimeout` (the
            pool closed); ``None`` (default): no limit.

    Attributes:
        num_workers: The number of worker processes started.
        env_blocks: ``env_blocks[w]``: the sub-envs worker ``w`` owns (a ``range``).
    """

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        env: str | Callable[..., gymnasium.Env],
        vectorization_mode: str = "pool",
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Env]] | None = None,
        render_mode: str | None = None,
        num_workers: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        max_wait_s: float | None = None,
        step_timeout_s: float | None = None,
    ) -> None:
        self._closed = True  # until the workers run: close() has nothing to do
        super().__init__(num_envs, horizon, device=device)
        if getattr(vectorization_mode, "value", vectorization_mode) != "pool":
            raise ValueError(f"PoolEnv: vectorization_mode must be 'pool', got {vectorization_mode!r}")
        self._set_env("PoolEnv", env, env_kwargs, wrappers, render_mode)
        num_workers = _int_or("num_workers", num_workers, min(num_envs, os.cpu_count() or 1))
        self.num_workers = min(num_workers, num_envs)
        min_batch_size = _int_or("min_batch_size", min_batch_size, max(1, num_envs // 2))
        self.min_batch_size = min(min_batch_size, num_envs)
        given_max = _int_or("max_batch_size", max_batch_size, num_envs)
        if given_max < min_batch_size:
            raise ValueError(
                f"PoolEnv: max_batch_size must be >= min_batch_size={min_batch_size}, got {given_max}"
            )
        self.max_batch_size = min(given_max, num_envs)
        if max_wait_s is not None and (
            isinstance(max_wait_s, bool)
            or not isinstance(max_wait_s, (int, float))
            or not max_wait_s >= 0
        ):
            raise ValueError(
                f"PoolEnv: max_wait_s must be a number of seconds >= 0 or None, got {max_wait_s!r}"
            )
        self.max_wait_s = None if max_wait_s is None else float(max_wait_s)
        self.step_timeout_s = check_step_timeout("PoolEnv", step_timeout_s)
        self.vectorization_mode = "pool"
        check_main_module(self.name)
        make_env = functools.partial(make_single_env, self.env, self._single_kwargs(), self.wrappers)
        try:
            make_env_pickle = pickle.dumps(CloudpickleWrapper(make_env))
        except Exception as err:
            raise TypeError(
                f"PoolEnv: the env {self.env!r}, its env_kwargs and wrappers must pickle (with "
                f"cloudpickle) to reach the worker processes: {type(err).__name__}: {err}"
            ) from err
        probe = make_env()  # made here for its spaces and metadata
        try:
            obs_space, action_space = probe.observation_space, probe.action_space
            self._set_spaces(
                obs_space, action_space, probe.metadata, isinstance(probe, ReportEpisodeRecords)
            )
        finally:
            probe.close()
        try:
            self._start_workers(obs_space, action_space, make_env_pickle)
        except BaseException:
            self.close()
            raise

    def _start_workers(
        self, obs_space: gymnasium.Space, action_space: gymnasium.Space, make_env_pickle: bytes
    ) -> None:
        """Start one worker process per block of sub-envs, sharing memory, and wait until each is ready."""
        ctx = mp.get_context("forkserver")  # docs/collection.md says why
        ctx.set_forkserver_preload([__name__])  # the fork server imports rl8 once
        num_envs = self.num_envs
        shared = Shared(obs_space, action_space, num_envs, ctx)
        self._views = shared.views()
        self.env_blocks = split(num_envs, self.num_workers)
        self._owner = np.concatenate([np.full(len(b), w) for w, b in enumerate(self.env_blocks)])
        self._pipes: list[Connection] = []
        self._processes: list[Any] = []
        # every pipe and process sentinel (readable once the process has ended), registered
        # once rather than at each of the thousands of waits of a collect
        self._selector = selectors.DefaultSelector()
        self._finalizer = weakref.finalize(
            self, _stop_workers, self._selector, self._processes, self._pipes
        )
        self._closed = False
        self._stepping = np.zeros(num_envs, dtype=bool)  # sent an action, not yet received
        self._ready: list[int] = []  # done stepping, not yet returned by recv, oldest first
        # per worker: the sub-envs sent to it and not yet reported, in the order it steps them,
        # and when it last made progress (reported a step, or was sent one while idle)
        self._queued = [collections.deque() for _ in range(self.num_workers)]
        self._progress_at = np.zeros(self.num_workers)
        self._started = False  # every worker has reported "ready"
        self._replies: dict[int, tuple[str, Any]] = {}  # a worker's answer to reset/render
        for w, block in enumerate(self.env_blocks):
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=worker,
                args=(w, block, make_env_pickle, shared, child),
                name=f"{WORKER_NAME}{w}",
                daemon=True,
            )
            process.start()
            child.close()
            self._pipes.append(parent)
            self._processes.append(process)
            self._selector.register(parent, selectors.EVENT_READ, ("message", w))
            self._selector.register(process.sentinel, selectors.EVENT_READ, ("ended", w))
        self._await_replies(range(self.num_workers), "ready")
        self._started = True

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the workers, worker 0 first (still listed after :meth:`close`)."""
        return tuple(process.pid for process in self._processes)

    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every sub-env (those still stepping finish first), as
        :meth:`GymnasiumEnv.reset <rl8.envs.gymnasium.GymnasiumEnv.reset>`."""
        seed = self._reset_seed(config, seed)
        while self._stepping.any():  # sub-envs still stepping: wait, and forget their outputs
            self._wait_for_steps(None)
        self._ready = []
        for w, block in enumerate(self.env_blocks):
            self._send(w, "reset", [(i, None if seed is None else seed + i) for i in block])
        self._await_replies(range(self.num_workers), "reset")
        self._needs_reset = False
        self._forget_episode_records()
        return self.converter.from_reset(self._views["obs"])

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Step every sub-env once with ``action`` (send all, receive all)."""
        if self._stepping.any() or self._ready:
            raise RuntimeError(
                f"{self.name}.step: sub-envs are stepping (send/recv in use); receive them all first"
            )
        n = self.num_envs
        self.send(torch.arange(n), action)
        return self.recv(n, n, None)[1]

    def send(self, env_ids: torch.Tensor, actions: torch.Tensor | TensorDictBase) -> None:
        """Start the steps of the sub-envs ``env_ids`` (:meth:`rl8.envs.base.ReadyEnvs.send`)."""
        self._check_ready("send")
        ids = np.asarray(env_ids.cpu() if isinstance(env_ids, torch.Tensor) else env_ids, dtype=np.int64)
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= self.num_envs)):
            raise ValueError(
                f"{self.name}.send: env_ids must be a 1-d tensor of indices in "
                f"[0, {self.num_envs}), got {ids.tolist()}"
            )
        busy = sorted(set(ids[self._stepping[ids]].tolist()) | (set(ids.tolist()) & set(self._ready)))
        if busy:
            raise RuntimeError(
                f"{self.name}.send: sub-envs {busy} have not been received (recv) since "
                "their last action"
            )
        set_rows(self._views["actions"], ids, self.converter.to_actions(actions))
        self._stepping[ids] = True
        owners = self._owner[ids]
        now = time.monotonic()
        for w in np.unique(owners).tolist():
            block = ids[owners == w].tolist()
            if not self._queued[w]:
                self._progress_at[w] = now
            self._queued[w].extend(block)
            self._send(w, "step", block)

    def recv(
        self, min_batch_size: int, max_batch_size: int, max_wait_s: float | None
    ) -> tuple[torch.Tensor, TensorDictBase]:
        """The step outputs of sub-envs whose step is done (:meth:`rl8.envs.base.ReadyEnvs.recv`)."""
        self._check_open()
        pending = int(self._stepping.sum()) + len(self._ready)
        if pending == 0:
            raise RuntimeError(f"{self.name}.recv: no sub-env is stepping; send actions first")
        need = min(min_batch_size, pending)
        deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
        self._poll(0.0)
        while len(self._ready) < need:
            if deadline is not None and self._ready and time.monotonic() >= deadline:
                break
            left = None if deadline is None or not self._ready else max(0.0, deadline - time.monotonic())
            self._wait_for_steps(left)
        taken, self._ready = self._ready[:max_batch_size], self._ready[max_batch_size:]
        ids = np.sort(np.asarray(taken, dtype=np.int64))
        views = self._views
        if self._episode_records is not None:
            self._episode_records += views["episode_records"][ids].sum(0)
        ended = views["terminated"][ids] | views["truncated"][ids]
        obs = rows(views["obs"], ids)
        final = rows(views["obs"], ids)
        if ended.any():
            set_rows(final, np.flatnonzero(ended), rows(views["final_obs"], ids[ended]))
        out = self.converter.from_rows(
            obs, final, views["rewards"][ids], views["terminated"][ids], views["truncated"][ids]
        )
        return torch.from_numpy(ids), out

    def render(self, index: int = 0) -> np.ndarray:
        """An RGB frame of sub-env ``index``, drawn by its worker (needs ``render_mode="rgb_array"``)."""
        self._check_render(index)
        w = int(self._owner[index])
        self._send(w, "render", index)
        return self._checked_frame(self._await_replies([w], "frame")[w])

    def __repr__(self) -> str:
        return (
            f"PoolEnv({self.env!r}, num_envs={self.num_envs}, num_workers={self.num_workers}, "
            f"min_batch_size={self.min_batch_size}, max_batch_size={self.max_batch_size}, "
            f"max_wait_s={self.max_wait_s}, step_timeout_s={self.step_timeout_s}, device={self.device})"
        )

    def _send(self, worker: int, command: str, arg: Any) -> None:
        try:
            self._pipes[worker].send((command, arg))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._worker_died(worker)

    def _poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (``None``: no limit) for messages or a worker's exit; handle them."""
        died = []
        for key, _ in self._selector.select(timeout):
            kind, w = key.data
            if kind == "ended":
                died.append(w)
                continue
            try:
                # one message; the next select sees the rest
                self._handle(w, *key.fileobj.recv())
            except (EOFError, ConnectionResetError):
                died.append(w)
        for w in died:
            self._worker_died(w)

    def _handle(self, worker: int, kind: str, payload: Any) -> None:
        if kind == "stepped":
            self._stepping[payload] = False
            self._ready.append(payload)
            self._queued[worker].remove(payload)  # (the first, as a rule: O(1))
            self._progress_at[worker] = time.monotonic()
        elif kind == "error":
            index, exc, trace = payload
            self._raise_worker_error(exc, trace, f"sub-env {index} by pool worker {worker}", "the pool")
        else:
            self._replies[worker] = (kind, payload)

    def _await_replies(self, workers: Sequence[int], kind: str) -> dict[int, Any]:
        answers = {}
        for w in workers:
            while w not in self._replies:
                self._poll(None)
            got, answers[w] = self._replies.pop(w)
            if got != kind:
                raise RuntimeError(f"{self.name}: worker {w} answered {got!r}, expected {kind!r}")
        return answers

    def _wait_for_steps(self, timeout: float | None) -> None:
        """:meth:`_poll` until ``timeout`` or the first step deadline; ``EnvStepTimeout`` past it."""
        if self.step_timeout_s is None:
            self._poll(timeout)
            return
        busy = [w for w in range(self.num_workers) if self._queued[w]]
        if busy:
            left = max(0.0, min(self._progress_at[busy]) + self.step_timeout_s - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        self._poll(timeout)
        now = time.monotonic()
        for w in busy:
            if (
                self._queued[w]
                and now - self._progress_at[w] >= self.step_timeout_s
                and not self._pipes[w].poll()
            ):
                self._raise_step_timeout(f"sub-env {self._queued[w][0]} (pool worker {w})", "the pool")

    def _worker_died(self, worker: int) -> None:
        pipe = self._pipes[worker]
        try:  # what it sent before it ended (an error names its cause better than its exit)
            while pipe.poll():
                self._handle(worker, *pipe.recv())
        except (EOFError, OSError):
            pass
        process = self._processes[worker]
        process.join(CLOSE_TIMEOUT_S)
        block = self.env_blocks[worker]
        how = exit_description(process.exitcode)
        if not self._started:
            how += (
                " while starting, before it could report an error (its own error is printed above by the "
                "worker process; one that dies on start is often a main script that the worker runs "
                f"again: {GUARD_ADVICE})"
            )
        self.close()
        raise PoolWorkerDied(
            f"{self.name}: pool worker {worker} (pid {process.pid}, sub-envs "
            f"{block.start}..{block.stop - 1}) ended unexpectedly with {how}; the pool and all its "
            "workers have been closed."
        )
