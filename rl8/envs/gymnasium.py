"""Any gymnasium environment as an rl8 :class:`~rl8.envs.base.Env`, through a gymnasium vector
env (``docs/gymnasium.md``)."""

from __future__ import annotations

import difflib
import functools
import multiprocessing
import multiprocessing.connection
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDictBase

from rl8.envs.atari import is_atari_id
from rl8.envs.gymnasium_base import GymnasiumEnvBase, GymnasiumEnvFactory
from rl8.envs.pool import PoolEnv
from rl8.envs.spaces import check_space
from rl8.envs.workers import (
    CLOSE_TIMEOUT_S,
    EnvWorkerDied,
    check_step_timeout,
    exit_description,
    make_single_env,
    stop_processes,
    with_episode_records,
)
from rl8.fields import did_you_mean

__all__ = ["GymnasiumEnv", "GymnasiumEnvFactory"]


def _close_async(vector_env: AsyncVectorEnv) -> None:
    """Close an ``AsyncVectorEnv`` within a bounded time (gymnasium's ``close`` first waits,
    without a limit, for the call in flight)."""
    pipes = [pipe for pipe in vector_env.parent_pipes if pipe is not None and not pipe.closed]
    try:
        stop_processes(vector_env.processes, pipes)
    finally:
        vector_env.closed = True  # gymnasium's close and __del__ have nothing left to do


class _WorkerErrors:
    """An AsyncVectorEnv's ``error_queue`` that keeps the worker errors, to raise the original
    exception with its traceback (gymnasium raises ``type(exc)(exc)`` and only logs it)."""

    def __init__(self, vector_env: AsyncVectorEnv) -> None:
        self._queue = vector_env.error_queue
        vector_env.error_queue = self
        self.items: list[tuple[int, type, BaseException, str]] = []

    def get(self, *args: Any, **kwargs: Any) -> Any:
        item = self._queue.get(*args, **kwargs)
        self.items.append(item)
        return item


class GymnasiumEnv(GymnasiumEnvBase):
    """``num_envs`` copies of a gymnasium env, batched through a gymnasium vector env.

    Finished sub-envs are reset inside :meth:`step` (``SAME_STEP``). Float Boxes give float32
    tensors and a top-level ``action_mask`` a bool one; :attr:`observation_space` describes
    these tensors (``docs/gymnasium.md``).

    Args:
        num_envs: Number of gymnasium envs stepped together (the batch size), >= 1.
        horizon: Steps PPO collects per env between updates; unused by the adapter.
        device: Torch device of the returned tensors.
        env: A registered gymnasium id (``"CartPole-v1"``, ``"module:Env-v0"``), or a callable
            (a function or a ``gymnasium.Env`` subclass) that returns one env.
        vectorization_mode: ``"sync"`` (every env in this process), ``"async"`` (one
            subprocess per env) or ``"pool"``: a :class:`rl8.envs.PoolEnv` instead.
        env_kwargs: Keyword arguments for ``gymnasium.make`` (for an id) or the callable; ALE
            ids get the Atari preset, configured by ``"atari_preset"`` (``docs/pixels.md``).
        wrappers: Gymnasium wrappers (callables ``env -> env``) applied, in order, to each env.
        render_mode: Gymnasium render mode of each env; ``"rgb_array"`` enables :meth:`render`.
        step_timeout_s: ``"async"`` and ``"pool"``: the longest time in seconds one sub-env's
            step (with its auto-reset) may take, > 0, else
            :class:`~rl8.envs.workers.EnvStepTimeout` (the env closed); ``None``: no limit.

    Attributes:
        vector_env: The underlying gymnasium vector env.
        converter: The :class:`~rl8.envs.converter.GymnasiumConverter` of its observations,
            outputs and actions.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> GymnasiumEnv:
        """``GymnasiumEnv(..., vectorization_mode="pool")`` builds a :class:`rl8.envs.PoolEnv`
        (registered as a virtual subclass: ``isinstance(env, GymnasiumEnv)`` holds for it)."""
        mode = kwargs.get("vectorization_mode")
        if cls is GymnasiumEnv and getattr(mode, "value", mode) == "pool":
            return PoolEnv(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        num_envs: int,
        /,
        horizon: int | None = None,
        *,
        device: torch.device | str = "cpu",
        env: str | Callable[..., gymnasium.Env],
        vectorization_mode: str = "sync",
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Env]] | None = None,
        render_mode: str | None = None,
        step_timeout_s: float | None = None,
    ) -> None:
        super().__init__(num_envs, horizon, device=device)
        mode = getattr(vectorization_mode, "value", vectorization_mode)
        if mode == "pool":
            raise ValueError(
                f"{type(self).__name__}: vectorization_mode='pool' builds rl8.envs.PoolEnv, which a "
                "subclass of GymnasiumEnv cannot be; use 'sync' or 'async', or PoolEnv itself"
            )
        if mode not in ("sync", "async"):
            raise ValueError(
                f"GymnasiumEnv: vectorization_mode must be one of ['sync', 'async', 'pool'], "
                f"got {vectorization_mode!r}"
            )
        self._set_env("GymnasiumEnv", env, env_kwargs, wrappers, render_mode)
        self.step_timeout_s = check_step_timeout("GymnasiumEnv", step_timeout_s)
        if self.step_timeout_s is not None and mode == "sync":
            raise ValueError(
                f"GymnasiumEnv: step_timeout_s needs vectorization_mode 'async' or 'pool' (a step in "
                f"this process cannot be interrupted), got step_timeout_s={step_timeout_s!r} with "
                f"vectorization_mode={mode!r}"
            )
        self.vectorization_mode = mode
        self.vector_env = self._make_vector_env()
        self._closed = False
        is_async = isinstance(self.vector_env, AsyncVectorEnv)
        self._errors = _WorkerErrors(self.vector_env) if is_async else None
        # ends the async workers in time, also when the env is collected or the interpreter exits
        self._finalizer = weakref.finalize(
            self, _close_async if is_async else type(self.vector_env).close, self.vector_env
        )
        try:
            vector_env = self.vector_env
            reports = self._call(vector_env.call, "has_wrapper_attr", "reports_episode_records")
            self._set_spaces(
                vector_env.single_observation_space,
                vector_env.single_action_space,
                vector_env.metadata,
                any(reports),
            )
        except BaseException:
            self.close()
            raise

    def _make_vector_env(self) -> VectorEnv:
        """The vector env of ``num_envs`` copies (``SAME_STEP`` autoreset, outputs not copied; shared
        memory in async mode)."""
        env, mode, kwargs = self.env, self.vectorization_mode, self._single_kwargs()
        vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False}
        make_single = functools.partial(make_single_env, env, kwargs, self.wrappers)
        try:
            if isinstance(env, str) and not is_atari_id(env):
                return gymnasium.make_vec(
                    env,
                    self.num_envs,
                    vectorization_mode=mode,
                    vector_kwargs=vector_kwargs,
                    wrappers=[*self.wrappers, with_episode_records],
                    **kwargs,
                )
            fns = [make_single] * self.num_envs
            return (AsyncVectorEnv if mode == "async" else SyncVectorEnv)(fns, **vector_kwargs)
        except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as err:
            if not isinstance(env, str):
                raise
            ids = {i.lower(): i for i in gymnasium.registry}
            close = [ids[i] for i in difflib.get_close_matches(env.lower(), list(ids))]
            hint = (
                did_you_mean(env, close=close)
                or "; see gymnasium.pprint_registry() for the registered ids"
            )
            raise type(err)(f"GymnasiumEnv: unknown gymnasium env id {env!r}{hint} ({err})") from err
        except (EOFError, BrokenPipeError, ConnectionResetError):
            if mode != "async":
                raise
            raise EnvWorkerDied(
                f"{self.name}: an async worker process ended while building its env, before it "
                "could report an error (the worker printed its own error above)"
            ) from None
        except (TypeError, ValueError):
            # AsyncVectorEnv fails on spaces it cannot put in shared memory before rl8 sees
            # them: name the unsupported space the way the sync path does.
            if mode == "async":
                single = make_single()
                try:
                    check_space(single.observation_space, field=f"{self.name} observation_space")
                    check_space(single.action_space, field=f"{self.name} action_space")
                finally:
                    single.close()
            raise

    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every gymnasium env; sub-env ``i`` gets ``seed + i`` (``None``: each continues its
        stream, the first reset's seed drawn from torch's global generator). ``config``: only ``{}``."""
        seed = self._reset_seed(config, seed)
        obs, _ = self._call(self.vector_env.reset, seed=seed)
        self._needs_reset = False
        self._forget_episode_records()
        return self.converter.from_reset(obs)

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Step every gymnasium env once (finished envs auto-reset) with ``action``, on any device,
        cast to the space's dtype (not clipped); ``final_obs`` is a tensor of its own."""
        self._check_ready("step")
        obs, rewards, terminated, truncated, infos = self._call(
            self._step_vector_env, self.converter.to_actions(action)
        )
        if self._episode_records is not None:
            self._add_episode_records(infos)
        return self.converter.from_step(obs, rewards, terminated, truncated, infos)

    def _step_vector_env(self, actions: Any) -> tuple[Any, ...]:
        if self.step_timeout_s is None or not isinstance(self.vector_env, AsyncVectorEnv):
            return self.vector_env.step(actions)
        self.vector_env.step_async(actions)
        try:
            return self.vector_env.step_wait(timeout=self.step_timeout_s)
        except multiprocessing.TimeoutError:
            late = [
                i
                for i, pipe in enumerate(self.vector_env.parent_pipes)
                if pipe is not None and not pipe.poll()
            ]
            where = f"sub-env {late[0]}" if len(late) == 1 else f"sub-envs {late}"
            self._raise_step_timeout(where, "the vector env")

    def render(self, index: int = 0) -> np.ndarray:
        """An RGB frame of sub-env ``index`` (needs ``render_mode="rgb_array"``; in async mode
        every sub-env renders)."""
        self._check_render(index)
        if isinstance(self.vector_env, SyncVectorEnv):
            return self._checked_frame(self.vector_env.envs[index].render())
        return self._checked_frame(self._call(self.vector_env.call, "render")[index])

    def __repr__(self) -> str:
        return (
            f"GymnasiumEnv({self.env!r}, num_envs={self.num_envs}, "
            f"vectorization_mode={self.vectorization_mode!r}, device={self.device})"
        )

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call into the vector env; on a worker error, close it and raise the worker's error
        (:class:`EnvWorkerDied` for a worker that ended)."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if self._errors is None:
                raise
            if self._errors.items:
                index, _, remote, trace = self._errors.items[-1]
                exc = remote if isinstance(remote, BaseException) else err
                self._raise_worker_error(
                    exc, trace, f"sub-env {index}'s worker process", "the vector env"
                )
            if isinstance(err, (EOFError, BrokenPipeError, ConnectionResetError)):
                # gymnasium reads a dead worker's pipe and gets a bare EOFError: say who died
                raise self._worker_died() from None
            raise

    def _worker_died(self) -> EnvWorkerDied:
        processes = self.vector_env.processes
        ended = multiprocessing.connection.wait([p.sentinel for p in processes], timeout=CLOSE_TIMEOUT_S)
        dead = []
        for i, process in enumerate(processes):
            if process.sentinel in ended:
                process.join(CLOSE_TIMEOUT_S)
                dead.append(
                    f"sub-env {i} (pid {process.pid}) ended unexpectedly with "
                    f"{exit_description(process.exitcode)}"
                )
        self.close()
        which = "; ".join(dead) or "a worker ended unexpectedly"
        return EnvWorkerDied(
            f"{self.name}: the async worker process of {which}; the vector env and all its "
            "workers have been closed."
        )


# a PoolEnv is a GymnasiumEnv of vectorization_mode="pool" (isinstance and issubclass hold)
GymnasiumEnv.register(PoolEnv)
