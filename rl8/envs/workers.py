"""What the worker processes of the gymnasium adapters (async
:class:`~rl8.envs.gymnasium.GymnasiumEnv`, :class:`~rl8.envs.pool.PoolEnv`) share."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from rl8.envs.atari import is_atari_id, make_atari

__all__ = [
    "CLOSE_TIMEOUT_S",
    "EPISODE_RECORDS_KEY",
    "EnvStepTimeout",
    "EnvWorkerDied",
    "ReportEpisodeRecords",
    "check_step_timeout",
    "exit_description",
    "make_single_env",
    "stop_processes",
    "with_episode_records",
]

#: Seconds a closing env waits for its workers to exit before terminating (then killing) them.
CLOSE_TIMEOUT_S = 2.0


class EnvWorkerDied(RuntimeError):
    """A worker process of an async :class:`~rl8.envs.gymnasium.GymnasiumEnv` or a
    :class:`rl8.envs.PoolEnv` ended unasked (killed, crashed); the env has been closed."""


class EnvStepTimeout(TimeoutError):
    """A sub-env's step took longer than the env's ``step_timeout_s``; the env has been closed."""


def exit_description(code: int | None) -> str:
    """``exit code 1``, ``exit code -9 (killed by signal SIGKILL)``, for messages."""
    how = f"exit code {code}"
    if code is not None and code < 0:
        try:
            how += f" (killed by signal {signal.Signals(-code).name})"
        except ValueError:
            pass
    return how


def check_step_timeout(owner: str, value: Any) -> float | None:
    """``step_timeout_s`` as a float or ``None``; else a ``ValueError`` naming ``owner``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not value > 0
    ):
        raise ValueError(
            f"{owner}: step_timeout_s must be a number of seconds > 0 or None, got {value!r}"
        )
    return float(value)


def stop_processes(processes: Sequence[Any], pipes: Sequence[Any]) -> None:
    """Ask worker ``processes`` to exit (``("close", None)`` on their ``pipes``); after
    ``CLOSE_TIMEOUT_S`` seconds terminate, then kill, those still running; close the pipes."""
    for pipe in pipes:
        try:
            pipe.send(("close", None))
        except (OSError, ValueError):
            pass  # its worker is gone

    def join_all(among: Sequence[Any]) -> None:
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for process in among:
            process.join(max(0.0, deadline - time.monotonic()))

    try:
        join_all(processes)
    finally:
        for stop in ("terminate", "kill"):
            alive = [p for p in processes if p.is_alive()]
            for process in alive:
                getattr(process, stop)()
            join_all(alive)
        for pipe in pipes:
            pipe.close()


#: The info key of the new records that :class:`ReportEpisodeRecords` reports.
EPISODE_RECORDS_KEY = "rl8_episode_records"


class ReportEpisodeRecords(gymnasium.Wrapper):
    """Adds ``info["rl8_episode_records"]``, float64 ``[return_sum, length_sum, count]``, after
    each ``step`` and ``reset`` that completed episodes in ``record``. It reads ``record``'s
    counters, not its ``info["episode"]``, to also count the games that end inside an outer
    wrapper's ``reset`` (the Atari preset's no-op or FIRE step), whose info no one returns.

    Args:
        env: The sub-env, with ``record`` somewhere in its wrapper chain.
        record: The ``RecordEpisodeStatistics`` wrapper whose episodes are reported.
    """

    #: Marks the wrapper, for ``has_wrapper_attr`` across processes.
    reports_episode_records = True

    def __init__(self, env: gymnasium.Env, record: gymnasium.wrappers.RecordEpisodeStatistics) -> None:
        super().__init__(env)
        self.record = record
        self._reported = record.episode_count

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._with_new_records(info)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, self._with_new_records(info)

    def _with_new_records(self, info: dict[str, Any]) -> dict[str, Any]:
        new = self.record.episode_count - self._reported
        if new == 0:
            return info
        self._reported = self.record.episode_count
        new = min(new, len(self.record.return_queue))  # (more than its buffer_length at once: lost)
        returns = list(self.record.return_queue)[-new:]
        lengths = list(self.record.length_queue)[-new:]
        return {
            **info,
            EPISODE_RECORDS_KEY: np.array([sum(returns), sum(lengths), new], dtype=np.float64),
        }


def with_episode_records(env: gymnasium.Env) -> gymnasium.Env:
    """``env`` in a :class:`ReportEpisodeRecords` of the innermost ``RecordEpisodeStatistics``
    of its wrapper chain (the closest to the game's rewards), or ``env`` when it has none."""
    record = None
    inner = env
    while isinstance(inner, gymnasium.Wrapper):
        if isinstance(inner, gymnasium.wrappers.RecordEpisodeStatistics):
            record = inner
        inner = inner.env
    return env if record is None else ReportEpisodeRecords(env, record)


def make_single_env(
    env: str | Callable[..., gymnasium.Env],
    kwargs: dict[str, Any],
    wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Env]],
) -> gymnasium.Env:
    """One sub-env ``env`` (an id or a callable) of ``kwargs`` with the ``wrappers`` applied in
    order (ALE ids get the Atari preset), in :func:`with_episode_records`."""
    if is_atari_id(env):
        single = make_atari(env, **kwargs)
    else:
        single = gymnasium.make(env, **kwargs) if isinstance(env, str) else env(**kwargs)
    for wrapper in wrappers:
        single = wrapper(single)
    return with_episode_records(single)
