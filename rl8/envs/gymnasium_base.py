"""What the gymnasium adapters (:class:`~rl8.envs.gymnasium.GymnasiumEnv`,
:class:`~rl8.envs.pool.PoolEnv`) share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing.pool import RemoteTraceback
from typing import Any, NoReturn

import gymnasium
import numpy as np
import torch

from rl8.envs.base import Env
from rl8.envs.converter import GymnasiumConverter
from rl8.envs.episodes import EpisodeRecords
from rl8.envs.workers import EPISODE_RECORDS_KEY, EnvStepTimeout

__all__ = ["GymnasiumEnvBase", "GymnasiumEnvFactory"]


class GymnasiumEnvBase(Env):
    """The base of the gymnasium adapters."""

    episodic = True

    def _set_env(
        self,
        label: str,
        env: Any,
        env_kwargs: dict[str, Any] | None,
        wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Env]] | None,
        render_mode: str | None,
    ) -> None:
        if not isinstance(env, str) and not callable(env):
            raise TypeError(
                f"{label}: env must be a registered gymnasium id or a callable returning a "
                f"gymnasium.Env, got {type(env).__name__}"
            )
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.wrappers = list(wrappers or [])
        self.render_mode = render_mode
        self._needs_reset = True
        self._seeded = False

    def _set_spaces(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        metadata: dict[str, Any],
        records: bool,
    ) -> None:
        """The converter, spaces and metadata of sub-envs of these spaces; ``records``: they report
        episode records (:class:`~rl8.envs.workers.ReportEpisodeRecords`)."""
        self.converter = GymnasiumConverter(
            observation_space, action_space, self.num_envs, self.device, self.name
        )
        self.observation_space = self.converter.observation_space
        self.action_space = action_space
        # [return_sum, length_sum, count] of the sub-envs' records not yet popped; None: none kept
        self._episode_records = np.zeros(3) if records else None
        self.metadata = {**type(self).metadata, **metadata}
        self.metadata.setdefault("render_fps", 30)

    def _reset_seed(self, config: dict[str, Any] | None, seed: int | None) -> int | None:
        """The seed of sub-env 0 (sub-env ``i`` takes ``seed + i``), from torch's generator at first."""
        self._check_open()
        if config:
            raise KeyError(
                f"{self.name}.reset: config {sorted(config)} is not supported; gymnasium envs "
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

    @property
    def name(self) -> str:
        """``GymnasiumEnv(<id or callable name>)``, for messages."""
        env = self.env
        return f"GymnasiumEnv({env if isinstance(env, str) else getattr(env, '__name__', 'env')})"

    def close(self) -> None:
        """Close every gymnasium env and end the worker processes (terminated, then killed, after
        2 s); also run on garbage collection and at exit."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._finalizer()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                f"{self.name} is closed (by close(), or after an error in a worker process)"
            )

    def _check_ready(self, method: str) -> None:
        self._check_open()
        if self._needs_reset:
            raise RuntimeError(f"{self.name}.{method} called before reset()")

    def _check_render(self, index: int) -> None:
        self._check_open()
        if self.render_mode != "rgb_array":
            raise RuntimeError(
                f"{self.name}.render needs render_mode='rgb_array', got "
                f"render_mode={self.render_mode!r}; pass GymnasiumEnv(..., render_mode='rgb_array')"
            )
        if not 0 <= index < self.num_envs:
            raise IndexError(f"{self.name}.render: index {index} not in [0, {self.num_envs})")
        self._check_ready("render")

    def _checked_frame(self, frame: Any) -> np.ndarray:
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ValueError(
                f"{self.name}.render: the env returned an array of shape {frame.shape} and "
                f"dtype {frame.dtype}, expected uint8 [height, width, 3]"
            )
        return frame

    def _raise_worker_error(self, exc: BaseException, trace: str, where: str, closed: str) -> NoReturn:
        self.close()
        exc.add_note(
            f"{self.name}: raised in {where} (the worker traceback is above); {closed} and all "
            "its workers have been closed."
        )
        raise exc.with_traceback(None) from RemoteTraceback(trace)

    def _raise_step_timeout(self, where: str, closed: str) -> NoReturn:
        self.close()
        raise EnvStepTimeout(
            f"{self.name}: {where} did not finish a step within step_timeout_s="
            f"{self.step_timeout_s:g} s (stuck, or slower than the limit); {closed} and all its "
            "workers have been closed. Raise step_timeout_s (PPO: env_kwargs="
            "{'step_timeout_s': ...}) if its steps are this slow, or set None for no limit."
        ) from None

    def pop_episode_records(self) -> EpisodeRecords | None:
        """The episodes that ended since the last call (or :meth:`reset`), forgotten, as each
        sub-env's innermost ``RecordEpisodeStatistics`` recorded them; ``None``: none has one."""
        if self._episode_records is None:
            return None
        return_sum, length_sum, count = self._episode_records.tolist()
        self._forget_episode_records()
        return EpisodeRecords(return_sum, length_sum, int(count))

    def _add_episode_records(self, infos: dict[str, Any]) -> None:
        """Add the records of a step's infos (and of its auto-resets', under ``final_info``)."""
        for info in (infos, infos.get("final_info")):
            if info is not None and EPISODE_RECORDS_KEY in info:
                self._episode_records += info[EPISODE_RECORDS_KEY].sum(0)

    def _forget_episode_records(self) -> None:
        if self._episode_records is not None:
            self._episode_records[:] = 0.0

    def state_dict(self) -> None:
        """``None``: gymnasium simulators cannot be saved; PPO resets these envs on resume."""
        return None

    def __enter__(self) -> GymnasiumEnvBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def make_factory(cls, env: str | Callable[..., gymnasium.Env], **kwargs: Any) -> GymnasiumEnvFactory:
        """A :class:`GymnasiumEnvFactory` of this class, ``env`` and the other keyword arguments
        ``kwargs`` (what ``PPO("CartPole-v1")`` builds with)."""
        return GymnasiumEnvFactory(cls, env, kwargs)


class GymnasiumEnvFactory:
    """``f(num_envs, horizon=None, *, device="cpu")`` builds an env: a picklable object with
    the class attributes PPO reads from an env class.

    Args:
        cls: The env class to build (``GymnasiumEnv`` or a subclass).
        env: A registered gymnasium id or a callable returning one gymnasium env.
        kwargs: The other keyword arguments of the class.
    """

    def __init__(self, cls: type[GymnasiumEnvBase], env: Any, kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.env = env
        self.kwargs = dict(kwargs)
        for attribute in ("episodic", "max_num_envs", "max_horizon", "metadata"):
            setattr(self, attribute, getattr(cls, attribute))
        name = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        self.__name__ = self.__qualname__ = f"{cls.__name__}[{name}]"

    def __call__(
        self, num_envs: int, horizon: int | None = None, *, device: torch.device | str = "cpu"
    ) -> GymnasiumEnvBase:
        return self.cls(num_envs, horizon, device=device, env=self.env, **self.kwargs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.cls.__name__}.make_factory({self.env!r}{extra})"
