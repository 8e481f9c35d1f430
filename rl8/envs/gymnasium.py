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
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDict, TensorDictBase

from rl8.envs.atari import is_atari_id
from rl8.envs.base import Env, new_tensordict
from rl8.envs.episodes import EpisodeRecords
from rl8.envs.spaces import check_space, space_dtype, zeros_like_space
from rl8.envs.workers import (
    CLOSE_TIMEOUT_S, EPISODE_RECORDS_KEY, EnvStepTimeout, EnvWorkerDied, RemoteTraceback,
    ReportEpisodeRecords, check_step_timeout, exit_description, make_single_env, stop_processes,
    with_episode_records,
)

__all__ = [
    "EnvStepTimeout", "EnvWorkerDied", "GymnasiumConverter", "GymnasiumEnv", "GymnasiumEnvFactory",
    "ReportEpisodeRecords",
]

_MODES = ("sync", "async", "pool")
_ACTION_MASK = "action_mask"
# A tree mirrors a (possibly nested) Dict space: a dict of trees for Dict, a leaf otherwise.
_Tree = Any

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


def _torch_dtype(np_dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros((), dtype=np_dtype)).dtype


def _map(tree: _Tree, fn: Callable[..., Any], *data: Any) -> Any:
    """Apply ``fn(leaf, *leaf_data)`` over a tree, returning a nested dict for Dict nodes."""
    if isinstance(tree, dict):
        return {key: _map(sub, fn, *(d[key] for d in data)) for key, sub in tree.items()}
    return fn(tree, *data)


def _convert_obs_space(space: spaces.Space, *, top: bool = True) -> tuple[spaces.Space, _Tree]:
    """The space of the tensors rl8 gets, and the tree of their torch dtypes.

    Float Boxes become float32 (the policy works in float32; halves a float64 buffer), a
    top-level ``action_mask`` entry of a Dict becomes a bool Box; everything else keeps its
    space and takes the dtype of :func:`rl8.envs.spaces.space_dtype`.
    """
    if isinstance(space, spaces.Dict):
        converted, tree = {}, {}
        for key, sub in space.spaces.items():
            if top and key == _ACTION_MASK:
                if not isinstance(sub, (spaces.MultiBinary, spaces.Box)):
                    raise TypeError(
                        f"observation_space[{key!r}]: an action mask must be a MultiBinary or a "
                        f"Box of 0/1, got {sub}"
                    )
                converted[key] = spaces.Box(0, 1, tuple(sub.shape), np.bool_)
                tree[key] = torch.bool
            else:
                converted[key], tree[key] = _convert_obs_space(sub, top=False)
        return spaces.Dict(converted), tree
    if (
        isinstance(space, spaces.Box)
        and np.issubdtype(space.dtype, np.floating)
        and space.dtype != np.float32
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "precision lowered by casting" is what we want
            space = spaces.Box(
                space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32
            )
    return space, space_dtype(space)


def _action_tree(space: spaces.Space) -> _Tree:
    """The torch dtypes of the numpy actions gymnasium wants (a tree for Dict spaces)."""
    if isinstance(space, spaces.Dict):
        return {key: _action_tree(sub) for key, sub in space.spaces.items()}
    return _torch_dtype(space.dtype)


def _write_row(tree: _Tree, dst: Any, index: int, value: Any) -> None:
    """Write one env's observation (numpy, or a dict of them) into row ``index`` of a batch."""
    if isinstance(tree, dict):
        for key, sub in tree.items():
            _write_row(sub, dst[key], index, value[key])
    else:
        dst[index] = value


def _close_matches(env_id: str) -> list[str]:
    ids = list(gymnasium.registry.keys())
    lower = {i.lower(): i for i in ids}
    found = difflib.get_close_matches(env_id.lower(), list(lower), n=5, cutoff=0.6)
    return [lower[f] for f in found]


def _env_label(env: str | Callable[..., gymnasium.Env]) -> str:
    """``GymnasiumEnv(<id or callable name>)``, for messages."""
    name = env if isinstance(env, str) else getattr(env, "__name__", "env")
    return f"GymnasiumEnv({name})"


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
            f"{_env_label(env)}: an async worker process ended while building its env, before it "
            "could report an error (the worker printed its own error above)"
        ) from None
    except (TypeError, ValueError):
        # AsyncVectorEnv fails on spaces it cannot put in shared memory before rl8 sees
        # them: name the unsupported space the way the sync path does.
        if mode == "async":
            single = make_single()
            try:
                check_space(single.observation_space, field=f"{_env_label(env)} observation_space")
                check_space(single.action_space, field=f"{_env_label(env)} action_space")
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


class GymnasiumConverter:
    """numpy <-> torch for a :class:`GymnasiumEnv`: its spaces, observations, step outputs and
    actions.

    Gymnasium's vector envs run with ``copy=False``, so the observation arrays they return are
    their own buffers, overwritten by the next step. Each observation leaf is copied exactly
    once, into a fresh array of the rl8 dtype (the copy also converts the dtype), and
    ``torch.from_numpy`` shares that memory. Rewards are converted to float32 (a copy anyway);
    the terminated/truncated arrays are fresh per step and shared as they are. When
    :attr:`staged`, the same copies go into staging buffers (pinned on CUDA), allocated once,
    then to the device without blocking.

    Args:
        observation_space: The gymnasium env's (single) observation space.
        action_space: Its (single) action space.
        num_envs: The batch size.
        device: Torch device of the tensors.
        label: The env's name, for messages.

    Attributes:
        observation_space: The space of the observation tensors (float Boxes as float32, a
            top-level ``action_mask`` as bool).
        staged: Whether outputs go through staging buffers (``True`` for non-CPU devices).
    """

    def __init__(
        self, observation_space: spaces.Space, action_space: spaces.Space, num_envs: int,
        device: torch.device, label: str,
    ) -> None:
        check_space(observation_space, field=f"{label} observation_space")
        check_space(action_space, field=f"{label} action_space")
        self.observation_space, obs_tree = _convert_obs_space(observation_space)
        self._np_tree = _map(obs_tree, lambda dtype: torch.empty(0, dtype=dtype).numpy().dtype)
        self._act_tree = _action_tree(action_space)
        if isinstance(observation_space, spaces.Dict) and _ACTION_MASK in observation_space.spaces:
            mask_shape = tuple(observation_space[_ACTION_MASK].shape)
            if isinstance(action_space, spaces.Discrete) and mask_shape != (int(action_space.n),):
                raise ValueError(
                    f"{label}: observation_space['action_mask'] has shape {mask_shape}, "
                    f"expected ({int(action_space.n)},) for the action space {action_space}"
                )
        self.num_envs = num_envs
        self.device = device
        self._batch_size = torch.Size([num_envs])
        self.staged = device.type != "cpu"
        self._staging: tuple[TensorDict, dict[str, Any]] | None = None
        self._staged_copy: torch.cuda.Event | None = None

    def from_reset(self, obs: Any) -> torch.Tensor | TensorDictBase:
        """The observations of a vector env's reset, as tensors on the device."""
        if not self.staged:
            return self._obs_to_torch(self._fresh_obs(obs))
        stage, views = self._stage()
        self._fill_obs(views["obs"], obs)
        return self._to_device(stage["obs"])

    def from_step(
        self, obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        infos: dict[str, Any],
    ) -> TensorDictBase:
        """A vector env's step as the step contract's TensorDict; ``final_obs`` is ``obs``
        with the rows of the envs that ended an episode replaced by their last observation."""
        if self.staged:
            return self._output_staged(obs, rewards, terminated, truncated, infos)
        n = self.num_envs
        obs = self._fresh_obs(obs)
        final = _map(self._np_tree, lambda dtype, array: array.copy(), obs)
        self._write_final(final, infos)
        return new_tensordict(
            {
                "obs": self._obs_to_torch(obs),
                "rewards": torch.from_numpy(rewards.astype(np.float32).reshape(n, 1)),
                "terminated": torch.from_numpy(terminated.reshape(n, 1)),
                "truncated": torch.from_numpy(truncated.reshape(n, 1)),
                "final_obs": self._obs_to_torch(final),
            },
            self._batch_size,
            self.device,
        )

    def from_rows(
        self, obs: Any, final_obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
    ) -> TensorDictBase:
        """The step output of ``K = len(rewards)`` sub-envs (any ``K``, not only ``num_envs``)
        from arrays of their own (fresh copies, as the worker pool gathers them): ``obs`` and
        ``final_obs`` (the observation before the auto-reset where an episode ended, else
        ``obs``), numpy arrays (dicts of them for Dict spaces) with ``K`` rows."""
        n = len(rewards)
        batch_size = torch.Size([n])
        def convert(value: Any) -> Any:
            return self._obs_to_torch(_map(self._np_tree, lambda dtype, a: a.astype(dtype, copy=False), value),
                                      batch_size)
        out = new_tensordict(
            {
                "obs": convert(obs),
                "rewards": torch.from_numpy(rewards.astype(np.float32).reshape(n, 1)),
                "terminated": torch.from_numpy(terminated.reshape(n, 1)),
                "truncated": torch.from_numpy(truncated.reshape(n, 1)),
                "final_obs": convert(final_obs),
            },
            batch_size,
            None,
        )
        return out.to(self.device, non_blocking=self.staged)

    def to_actions(self, action: torch.Tensor | TensorDictBase) -> Any:
        """Env actions as the numpy arrays (a dict of them for Dict spaces) gymnasium wants."""
        def leaf(dtype: torch.dtype, value: torch.Tensor) -> np.ndarray:
            if value.requires_grad:
                value = value.detach()
            # a copy of its own: PPO passes rows of its rollout buffer, which a gymnasium env
            # (or wrapper) that keeps its action array must not see change later
            return value.to(dtype).cpu().numpy().copy()

        return _map(self._act_tree, leaf, action)

    def _fresh_obs(self, obs: Any) -> Any:
        return _map(self._np_tree, lambda dtype, array: np.array(array, dtype=dtype), obs)

    def _write_final(self, final: Any, infos: dict[str, Any]) -> None:
        """Overwrite the rows of the envs that ended an episode with their last observation."""
        mask = infos.get("_final_obs")
        if mask is None or not mask.any():
            return
        values = infos["final_obs"]
        for i in np.flatnonzero(mask):  # a few rows per step: row writes beat np.stack
            _write_row(self._np_tree, final, i, values[i])

    def _obs_to_torch(self, obs: Any, batch_size: torch.Size | None = None) -> torch.Tensor | TensorDict:
        tensors = _map(self._np_tree, lambda dtype, array: torch.from_numpy(array), obs)
        if isinstance(tensors, dict):
            if batch_size is not None:  # CPU tensors of some of the envs (from_rows)
                return new_tensordict(tensors, batch_size, None)
            return new_tensordict(tensors, self._batch_size, self.device)
        return tensors

    def _stage(self) -> tuple[TensorDict, dict[str, Any]]:
        """Staging buffers for one step output (pinned on CUDA), allocated on first use.

        Returns the TensorDict and numpy views of its leaves (``obs``/``final_obs`` as trees).
        """
        if self._staging is None:
            n = self.num_envs
            stage = TensorDict(
                {
                    "obs": zeros_like_space(self.observation_space, [n]),
                    "rewards": torch.zeros(n, 1),
                    "terminated": torch.zeros(n, 1, dtype=torch.bool),
                    "truncated": torch.zeros(n, 1, dtype=torch.bool),
                    "final_obs": zeros_like_space(self.observation_space, [n]),
                },
                batch_size=[n],
            )
            if self.device.type == "cuda" and torch.cuda.is_available():
                stage = stage.pin_memory()
            views = {
                key: _map(self._np_tree, lambda dtype, t: t.numpy(), stage[key])
                for key in ("obs", "final_obs")
            }
            for key in ("rewards", "terminated", "truncated"):
                views[key] = stage[key].numpy()[:, 0]
            self._staging = (stage, views)
        elif self._staged_copy is not None:
            # The previous non-blocking copy must have left the buffers before we refill them.
            self._staged_copy.synchronize()
        return self._staging

    def _to_device(self, staged: torch.Tensor | TensorDictBase) -> Any:
        out = staged.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._staged_copy = torch.cuda.Event()
            self._staged_copy.record()
        return out

    def _fill_obs(self, dst: Any, obs: Any) -> None:
        _map(self._np_tree, lambda dtype, d, a: np.copyto(d, a, casting="unsafe"), dst, obs)

    def _output_staged(
        self, obs: Any, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        infos: dict[str, Any],
    ) -> TensorDictBase:
        stage, views = self._stage()
        self._fill_obs(views["obs"], obs)
        self._fill_obs(views["final_obs"], views["obs"])
        self._write_final(views["final_obs"], infos)
        np.copyto(views["rewards"], rewards, casting="unsafe")
        np.copyto(views["terminated"], terminated)
        np.copyto(views["truncated"], truncated)
        return self._to_device(stage)


class GymnasiumEnv(Env):
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

    episodic = True

    def __new__(cls, *args: Any, **kwargs: Any) -> GymnasiumEnv:
        """``GymnasiumEnv(..., vectorization_mode="pool")`` builds a :class:`rl8.envs.PoolEnv`."""
        mode = kwargs.get("vectorization_mode")
        if cls is GymnasiumEnv and getattr(mode, "value", mode) == "pool":
            from rl8.envs.pool import PoolEnv

            cls = PoolEnv
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
            self.converter = GymnasiumConverter(
                self.vector_env.single_observation_space, self.vector_env.single_action_space,
                num_envs, self.device, self._name(),
            )
            reports = self._call(self.vector_env.call, "has_wrapper_attr", "reports_episode_records")
            # [return_sum, length_sum, count] of the sub-envs' records not yet popped; None: none kept
            self._episode_records = np.zeros(3) if any(reports) else None
        except BaseException:
            self.close()
            raise
        self.observation_space = self.converter.observation_space
        self.action_space = self.vector_env.single_action_space
        self.metadata = {**type(self).metadata, **self.vector_env.metadata}
        self.metadata.setdefault("render_fps", 30)
        self._needs_reset = True
        self._seeded = False

    def _reset_seed(self, config: dict[str, Any] | None, seed: int | None) -> int | None:
        """Check :meth:`reset`'s arguments and return the seed of sub-env 0 (sub-env ``i``
        takes ``seed + i``), drawn from torch's global generator on the first reset."""
        self._check_open()
        if config:
            raise KeyError(
                f"{self._name()}.reset: config {sorted(config)} is not supported; gymnasium envs "
                "are configured once through GymnasiumEnv(..., env_kwargs={...})"
            )
        if seed is None and not self._seeded:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        if seed is not None:
            seed = int(seed)
            self._seeded = True
        return seed

    def _single_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.env_kwargs)
        if self.render_mode is not None:
            kwargs["render_mode"] = self.render_mode
        return kwargs

    def _name(self) -> str:
        return _env_label(self.env)

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

    def pop_episode_records(self) -> EpisodeRecords | None:
        """The episodes that ended since the last call (or :meth:`reset`) as the sub-envs'
        ``RecordEpisodeStatistics`` recorded them (the innermost one of each sub-env's wrapper
        chain: under the Atari preset, whole games with the game's unclipped score and their
        length in emulator frames), and forget them.

        Returns:
            Their sums and count (zeros when none ended), or ``None`` when the sub-envs have
            no ``RecordEpisodeStatistics``.
        """
        if self._episode_records is None:
            return None
        return_sum, length_sum, count = self._episode_records.tolist()
        self._forget_episode_records()
        return EpisodeRecords(return_sum, length_sum, int(count))

    def _add_episode_records(self, infos: dict[str, Any]) -> None:
        """Add what the sub-envs' :class:`ReportEpisodeRecords` put in a step's infos: the
        step's own info (under ``final_info`` for sub-envs that ended an episode and were
        reset, ``SAME_STEP``) and the info of those resets."""
        for info in (infos, infos.get("final_info")):
            if info is not None and EPISODE_RECORDS_KEY in info:
                self._episode_records += info[EPISODE_RECORDS_KEY].sum(0)

    def _forget_episode_records(self) -> None:
        if self._episode_records is not None:
            self._episode_records[:] = 0.0

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

    def state_dict(self) -> None:
        """``None``: the simulators live in gymnasium (and maybe subprocesses) and cannot be
        saved, so PPO resets these envs when training resumes from a checkpoint."""
        return None

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

    def __enter__(self) -> GymnasiumEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"GymnasiumEnv({self.env!r}, num_envs={self.num_envs}, "
            f"vectorization_mode={self.vectorization_mode!r}, device={self.device})"
        )

    @classmethod
    def make_factory(
        cls, env: str | Callable[..., gymnasium.Env], **kwargs: Any
    ) -> GymnasiumEnvFactory:
        """A callable ``f(num_envs, horizon=None, *, device="cpu")`` that builds the env.

        ``PPO("CartPole-v1")`` calls ``GymnasiumEnv.make_factory("CartPole-v1")`` and uses the
        result as its env class.

        Args:
            env: A registered gymnasium id or a callable returning one gymnasium env.
            **kwargs: The other keyword arguments of :class:`GymnasiumEnv`
                (``vectorization_mode``, ``env_kwargs``, ``wrappers``, ``render_mode``,
                ``step_timeout_s``, and those of :class:`rl8.envs.PoolEnv` for ``"pool"``).
        """
        return GymnasiumEnvFactory(cls, env, kwargs)

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


class GymnasiumEnvFactory:
    """Builds :class:`GymnasiumEnv` instances: ``f(num_envs, horizon=None, *, device="cpu")``.

    A plain (picklable, for a string id) object rather than a closure, carrying the class
    attributes PPO reads from an env class (``episodic``, ``max_num_envs``, ``max_horizon``,
    ``metadata``).

    Args:
        cls: The env class to build (``GymnasiumEnv`` or a subclass).
        env: A registered gymnasium id or a callable returning one gymnasium env.
        kwargs: The other keyword arguments of the class.
    """

    def __init__(self, cls: type[GymnasiumEnv], env: Any, kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.env = env
        self.kwargs = dict(kwargs)
        self.episodic = cls.episodic
        self.max_num_envs = cls.max_num_envs
        self.max_horizon = cls.max_horizon
        self.metadata = cls.metadata
        name = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        self.__name__ = self.__qualname__ = f"{cls.__name__}[{name}]"

    def __call__(
        self, num_envs: int, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> GymnasiumEnv:
        return self.cls(num_envs, horizon, device=device, env=self.env, **self.kwargs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.cls.__name__}.make_factory({self.env!r}{extra})"
