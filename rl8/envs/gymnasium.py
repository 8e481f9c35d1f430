"""Any gymnasium environment as an rl8 :class:`~rl8.envs.base.Env`.

:class:`GymnasiumEnv` runs ``num_envs`` copies of a gymnasium env in a gymnasium vector env
(:class:`~gymnasium.vector.SyncVectorEnv` in this process, or
:class:`~gymnasium.vector.AsyncVectorEnv` with one subprocess per copy) in the ``SAME_STEP``
autoreset mode, and turns its numpy outputs into the TensorDict of the step contract.
``PPO("CartPole-v1")`` builds one through :meth:`GymnasiumEnv.make_factory`.

See ``docs/gymnasium.md`` for a walk-through.
"""

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
from rl8.envs.converter import GymnasiumConverter
from rl8.envs.gymnasium_base import GymnasiumEnvBase, GymnasiumEnvFactory, env_label
from rl8.envs.pool import PoolEnv
from rl8.envs.spaces import check_space
from rl8.envs.workers import (
    CLOSE_TIMEOUT_S, EnvStepTimeout, EnvWorkerDied, RemoteTraceback, check_step_timeout, exit_description,
    make_single_env, stop_processes, with_episode_records,
)

__all__ = ["GymnasiumEnv", "GymnasiumEnvFactory"]


_MODES = ("sync", "async", "pool")


def _close_async(vector_env: AsyncVectorEnv) -> None:
    """Close an ``AsyncVectorEnv`` without waiting forever: ask every worker to exit (a worker
    stuck in a step never reads it), then ``stop_processes``. Gymnasium's own ``close``
    first waits, without a limit, for the call in flight. Holds no reference to the
    :class:`GymnasiumEnv`, so that :func:`weakref.finalize` can run it when the env is
    collected or at interpreter exit."""
    pipes = [pipe for pipe in vector_env.parent_pipes if pipe is not None and not pipe.closed]
    for pipe in pipes:
        try:
            pipe.send(("close", None))
        except (OSError, ValueError):
            pass  # its worker is gone
    try:
        stop_processes(vector_env.processes)
    finally:
        for pipe in pipes:
            pipe.close()
        vector_env.closed = True  # gymnasium's close and __del__ have nothing left to do


def _close_matches(env_id: str) -> list[str]:
    ids = list(gymnasium.registry.keys())
    lower = {i.lower(): i for i in ids}
    found = difflib.get_close_matches(env_id.lower(), list(lower), n=5, cutoff=0.6)
    return [lower[f] for f in found]


def _make_vector_env(
    env: str | Callable[..., gymnasium.Env],
    num_envs: int,
    mode: str,
    kwargs: dict[str, Any],
    wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Env]],
) -> VectorEnv:
    """The gymnasium vector env of ``num_envs`` copies (``SAME_STEP`` autoreset, no copies of
    the outputs); an unknown id names the closest registered ones."""
    vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False}
    if mode == "async":
        vector_kwargs["shared_memory"] = True
    make_single = functools.partial(make_single_env, env, kwargs, wrappers)
    try:
        if isinstance(env, str) and not is_atari_id(env):
            return gymnasium.make_vec(env, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                                      wrappers=[*wrappers, with_episode_records], **kwargs)
        fns = [make_single] * num_envs
        return (AsyncVectorEnv if mode == "async" else SyncVectorEnv)(fns, **vector_kwargs)
    except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as err:
        if not isinstance(env, str):
            raise
        matches = _close_matches(env)
        hint = (
            f"closest registered ids: {', '.join(matches)}"
            if matches
            else "see gymnasium.pprint_registry() for the registered ids"
        )
        message = f"GymnasiumEnv: unknown gymnasium env id {env!r}; {hint} ({err})"
        try:
            new = type(err)(message)
        except Exception:
            new = ValueError(message)
        raise new from err
    except (EOFError, BrokenPipeError, ConnectionResetError):
        if mode != "async":
            raise
        raise EnvWorkerDied(
            f"{env_label(env)}: an async worker process ended while building its env, before it "
            "could report an error (the worker printed its own error above)"
        ) from None
    except (TypeError, ValueError):
        # AsyncVectorEnv fails on spaces it cannot put in shared memory before rl8 sees
        # them: name the unsupported space the way the sync path does.
        if mode == "async":
            single = make_single()
            try:
                check_space(single.observation_space, field=f"{env_label(env)} observation_space")
                check_space(single.action_space, field=f"{env_label(env)} action_space")
            finally:
                single.close()
        raise


class _WorkerErrors:
    """Takes the place of an AsyncVectorEnv's ``error_queue`` to remember the worker errors
    it hands out.

    Gymnasium re-raises a worker's exception in the main process as ``type(exc)(exc)`` and
    only logs the worker's traceback as a warning; the recorded queue items let :meth:`call`
    raise the original exception with the worker's traceback chained to it.
    """

    def __init__(self, vector_env: AsyncVectorEnv, label: str) -> None:
        self._queue = vector_env.error_queue
        vector_env.error_queue = self
        self.items: list[tuple[int, type, BaseException, str]] = []
        self.label = label

    def get(self, *args: Any, **kwargs: Any) -> Any:
        item = self._queue.get(*args, **kwargs)
        self.items.append(item)
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def call(self, close: Callable[[], None], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; on a worker error, ``close()`` the env and raise that error."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            items, self.items = list(self.items), []
            if not items:
                raise
            close()
            index, _, remote, trace = items[-1]
            exc = remote if isinstance(remote, BaseException) else err
            exc.add_note(
                f"{self.label}: raised in sub-env {index}'s worker process (the worker "
                "traceback is above); the vector env and all its workers have been closed."
            )
            raise exc.with_traceback(None) from RemoteTraceback(trace)


class GymnasiumEnv(GymnasiumEnvBase):
    """``num_envs`` copies of a gymnasium env, batched through a gymnasium vector env.

    Sub-envs that end an episode are reset inside :meth:`step` (gymnasium's ``SAME_STEP``
    autoreset mode): ``obs`` is then the first observation of the next episode and
    ``final_obs`` the last one of the finished episode. Observations and actions map to
    tensors as described in :mod:`rl8.envs.spaces`, with two conversions: float Boxes give float32
    tensors, and a top-level ``action_mask`` entry of a Dict observation gives a bool tensor;
    :attr:`observation_space` describes these tensors (the vector env's own spaces stay on
    :attr:`vector_env`).

    Args:
        num_envs: Number of gymnasium envs stepped together (the batch size), >= 1.
        horizon: Number of steps PPO collects per env between updates; unused by the adapter.
        device: Torch device of the returned tensors. On CUDA the numpy outputs go through
            pinned staging buffers (allocated once) and are copied without blocking.
        env: A registered gymnasium id (e.g. ``"CartPole-v1"`` or ``"module:Env-v0"``), or a
            callable (a function or a ``gymnasium.Env`` subclass) that returns one env.
        vectorization_mode: ``"sync"`` steps every env in this process, one after the other;
            ``"async"`` runs each env in its own subprocess (with shared-memory observations).
            Async pays off when one env step is slow (physics, rendering, > ~0.1 ms); for cheap
            envs like CartPole sync is faster. ``"pool"`` builds a :class:`rl8.envs.PoolEnv`
            instead (a few worker processes, each stepping several envs, and a rollout that
            acts on whichever envs are ready; its keyword arguments ``num_workers``,
            ``min_batch_size``, ``max_batch_size`` and ``max_wait_s`` are described there and
            in ``docs/collection.md``).
        env_kwargs: Keyword arguments for the env: passed to ``gymnasium.make`` for an id (so
            ``max_episode_steps=...`` sets the time limit), or to the callable. ALE ids
            (``"ALE/Pong-v5"``) are built with the Atari preset (:func:`rl8.envs.atari.make_atari`),
            which ``{"atari_preset": False}`` turns off and ``{"atari_preset": {...}}``
            configures (``docs/pixels.md``).
        wrappers: Gymnasium wrappers (callables ``env -> env``) applied, in order, to each env.
        render_mode: Gymnasium render mode given to each env; ``"rgb_array"`` enables
            :meth:`render`. Passed as ``render_mode=`` to ``gymnasium.make`` or the callable.
        step_timeout_s: The longest time in seconds one sub-env's step (with its auto-reset)
            may take in ``"async"`` and ``"pool"`` modes, > 0; a step that takes longer raises
            :class:`EnvStepTimeout` naming the sub-env, after closing the env and its workers.
            ``None`` (default): no limit. A step in this process (``"sync"``) cannot be
            interrupted, so ``"sync"`` refuses a limit.

    Attributes:
        vector_env: The underlying gymnasium vector env.
        converter: The :class:`GymnasiumConverter` of its observations, outputs and actions.
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
        mode = self._check_mode(vectorization_mode, env, step_timeout_s)
        self.env = env
        self.vectorization_mode = mode
        self.env_kwargs = dict(env_kwargs or {})
        self.wrappers = list(wrappers or [])
        self.render_mode = render_mode
        self.vector_env = _make_vector_env(env, num_envs, mode, self._single_kwargs(), self.wrappers)
        self._closed = False
        self._errors: _WorkerErrors | None = None
        self._finalizer: weakref.finalize | None = None
        if isinstance(self.vector_env, AsyncVectorEnv):
            # closes the workers when the env is collected or the interpreter exits, in time
            self._finalizer = weakref.finalize(self, _close_async, self.vector_env)
            self._errors = _WorkerErrors(self.vector_env, self._name())
        try:
            self._read_vector_env()
        except BaseException:
            self.close()
            raise
        self.observation_space = self.converter.observation_space
        self.action_space = self.vector_env.single_action_space
        self.metadata = {**type(self).metadata, **self.vector_env.metadata}
        self.metadata.setdefault("render_fps", 30)
        self._needs_reset = True
        self._seeded = False

    def _check_mode(self, vectorization_mode: str, env: Any, step_timeout_s: float | None) -> str:
        """Check ``vectorization_mode``, ``env`` and ``step_timeout_s`` (see the class); set
        :attr:`step_timeout_s` and return the mode as a string."""
        mode = getattr(vectorization_mode, "value", vectorization_mode)
        if mode not in _MODES:
            raise ValueError(
                f"GymnasiumEnv: vectorization_mode must be one of {list(_MODES)}, "
                f"got {vectorization_mode!r}"
            )
        if mode == "pool":
            raise ValueError(
                f"{type(self).__name__}: vectorization_mode='pool' builds rl8.envs.PoolEnv, which a "
                "subclass of GymnasiumEnv cannot be; use 'sync' or 'async', or PoolEnv itself"
            )
        if not isinstance(env, str) and not callable(env):
            raise TypeError(
                f"GymnasiumEnv: env must be a registered gymnasium id or a callable returning a "
                f"gymnasium.Env, got {type(env).__name__}"
            )
        self.step_timeout_s = check_step_timeout("GymnasiumEnv", step_timeout_s)
        if self.step_timeout_s is not None and mode == "sync":
            raise ValueError(
                f"GymnasiumEnv: step_timeout_s needs vectorization_mode 'async' or 'pool' (a step in "
                f"this process cannot be interrupted), got step_timeout_s={step_timeout_s!r} with "
                f"vectorization_mode={mode!r}"
            )
        return mode

    def _read_vector_env(self) -> None:
        """Make the converter from the vector env's spaces, and learn whether the sub-envs
        report episode records."""
        self.converter = GymnasiumConverter(
            self.vector_env.single_observation_space, self.vector_env.single_action_space,
            self.num_envs, self.device, self._name(),
        )
        reports = self._call(self.vector_env.call, "has_wrapper_attr", "reports_episode_records")
        # [return_sum, length_sum, count] of the sub-envs' records not yet popped; None: none kept
        self._episode_records = np.zeros(3) if any(reports) else None

    # --- public API -------------------------------------------------------------------------

    def reset(
        self, *, config: dict[str, Any] | None = None, seed: int | None = None
    ) -> torch.Tensor | TensorDictBase:
        """Reset every gymnasium env and return the first observations.

        Args:
            config: Only ``None`` or ``{}``: gymnasium envs take their parameters once, through
                ``env_kwargs``. Anything else raises ``KeyError``.
            seed: Sub-env ``i`` is reset with seed ``seed + i`` (distinct per env). ``None``
                continues each env's stream, except on the first reset where a seed is drawn
                from torch's global generator, so ``torch.manual_seed`` makes runs repeat.

        Returns:
            Observations ``[num_envs, *obs_shape]`` (a TensorDict for Dict spaces), on
            :attr:`device`.
        """
        seed = self._reset_seed(config, seed)
        obs, _ = self._call(self.vector_env.reset, seed=seed)
        self._needs_reset = False
        self._forget_episode_records()
        return self.converter.from_reset(obs)

    def step(self, action: torch.Tensor | TensorDictBase) -> TensorDictBase:
        """Step every gymnasium env once; finished envs are reset within the step.

        Args:
            action: A batch of env actions (see :mod:`rl8.envs.spaces`), on any device: ``[N]``
                int64 for Discrete (the space's values, ``start`` included, as the
                distributions' ``to_env_action`` gives them), ``[N, *shape]`` float for Box
                (cast to the space's dtype, not clipped), int64 0/1 for MultiBinary (sent as
                int8). A TensorDict for Dict action spaces.

        Returns:
            A TensorDict with batch size ``[num_envs]`` on :attr:`device`: ``obs``,
            ``rewards`` ``[N, 1]`` float32, ``terminated``/``truncated`` ``[N, 1]`` bool and
            ``final_obs`` (the observation before the auto-reset for envs that finished,
            equal to ``obs`` for the others; a tensor of its own, not a view of ``obs``).
        """
        self._check_open()
        if self._needs_reset:
            raise RuntimeError(f"{self._name()}.step called before reset()")
        obs, rewards, terminated, truncated, infos = self._call(
            self._step_vector_env, self.converter.to_actions(action)
        )
        if self._episode_records is not None:
            self._add_episode_records(infos)
        return self.converter.from_step(obs, rewards, terminated, truncated, infos)

    def _step_vector_env(self, actions: Any) -> tuple[Any, ...]:
        """One step of the vector env; in async mode, waiting at most :attr:`step_timeout_s`."""
        if self.step_timeout_s is None or not isinstance(self.vector_env, AsyncVectorEnv):
            return self.vector_env.step(actions)
        self.vector_env.step_async(actions)
        try:
            return self.vector_env.step_wait(timeout=self.step_timeout_s)
        except multiprocessing.TimeoutError:
            late = [
                i for i, pipe in enumerate(self.vector_env.parent_pipes) if pipe is not None and not pipe.poll()
            ]
            where = f"sub-env {late[0]}" if len(late) == 1 else f"sub-envs {late}"
            raise EnvStepTimeout(
                f"{self._name()}: {where} did not finish a step within step_timeout_s="
                f"{self.step_timeout_s:g} s (stuck, or slower than the limit); the vector env and "
                "all its workers have been closed. Raise step_timeout_s (PPO: env_kwargs="
                "{'step_timeout_s': ...}) if its steps are this slow, or set None for no limit."
            ) from None

    def render(self, index: int = 0) -> np.ndarray:
        """Return an RGB frame (``uint8``, ``[height, width, 3]``) of sub-env ``index``.

        Needs ``render_mode="rgb_array"``. In async mode every sub-env renders (gymnasium has
        no per-worker call) and the frame of ``index`` is kept.

        Args:
            index: Which sub-env to draw, ``0 <= index < num_envs``.
        """
        self._check_open()
        if self.render_mode != "rgb_array":
            raise RuntimeError(
                f"{self._name()}.render needs render_mode='rgb_array', got "
                f"render_mode={self.render_mode!r}; pass GymnasiumEnv(..., render_mode='rgb_array')"
            )
        if not 0 <= index < self.num_envs:
            raise IndexError(f"{self._name()}.render: index {index} not in [0, {self.num_envs})")
        if self._needs_reset:
            raise RuntimeError(f"{self._name()}.render called before reset()")
        if isinstance(self.vector_env, SyncVectorEnv):
            frame = self.vector_env.envs[index].render()
        else:
            frame = self._call(self.vector_env.call, "render")[index]
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ValueError(
                f"{self._name()}.render: the env returned an array of shape {frame.shape} and "
                f"dtype {frame.dtype}, expected uint8 [height, width, 3]"
            )
        return frame

    def close(self) -> None:
        """Close every gymnasium env and, in async mode, end and reap the worker processes:
        those that do not exit within 2 s (a worker stuck in a step) are terminated, then
        killed. Also run when the env is garbage collected and at interpreter exit. Safe to
        call more than once.
        """
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()  # _close_async: workers that do not exit in time are terminated
        else:
            self.vector_env.close()

    def __repr__(self) -> str:
        return (
            f"GymnasiumEnv({self.env!r}, num_envs={self.num_envs}, "
            f"vectorization_mode={self.vectorization_mode!r}, device={self.device})"
        )

    # --- errors -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                f"{self._name()} is closed (by close(), or after an error in a worker process)"
            )

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call into the vector env; on a worker error, close it and raise the worker's error
        (:class:`EnvWorkerDied` for a worker that ended, :class:`EnvStepTimeout` for a step
        past :attr:`step_timeout_s`)."""
        if self._errors is None:
            return fn(*args, **kwargs)
        try:
            return self._errors.call(self.close, fn, *args, **kwargs)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            # gymnasium reads a dead worker's pipe and gets a bare EOFError: say who died
            raise self._worker_died() from None
        except EnvStepTimeout:
            self.close()
            raise

    def _worker_died(self) -> EnvWorkerDied:
        """Close the env and return the error naming the async workers that ended."""
        processes = self.vector_env.processes
        ended = multiprocessing.connection.wait([p.sentinel for p in processes], timeout=CLOSE_TIMEOUT_S)
        dead = []
        for i, process in enumerate(processes):
            if process.sentinel in ended:
                process.join(CLOSE_TIMEOUT_S)
                dead.append(f"sub-env {i} (pid {process.pid}) ended unexpectedly with "
                            f"{exit_description(process.exitcode)}")
        self.close()
        which = "; ".join(dead) or "a worker ended unexpectedly"
        return EnvWorkerDied(
            f"{self._name()}: the async worker process of {which}; the vector env and all its "
            "workers have been closed."
        )


# a PoolEnv is a GymnasiumEnv of vectorization_mode="pool" (isinstance and issubclass hold)
GymnasiumEnv.register(PoolEnv)
