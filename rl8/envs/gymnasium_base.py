"""What the gymnasium adapters share: :class:`GymnasiumEnvBase`, the base of
:class:`~rl8.envs.gymnasium.GymnasiumEnv` and :class:`~rl8.envs.pool.PoolEnv`, and
:class:`GymnasiumEnvFactory`, what ``PPO("CartPole-v1")`` builds its env with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import torch

from rl8.envs.base import Env
from rl8.envs.episodes import EpisodeRecords
from rl8.envs.workers import EPISODE_RECORDS_KEY

__all__ = ["GymnasiumEnvBase", "GymnasiumEnvFactory", "env_label"]


def env_label(env: str | Callable[..., gymnasium.Env]) -> str:
    """``GymnasiumEnv(<id or callable name>)``, for messages."""
    name = env if isinstance(env, str) else getattr(env, "__name__", "env")
    return f"GymnasiumEnv({name})"


class GymnasiumEnvBase(Env):
    """What the gymnasium adapters share (:class:`~rl8.envs.gymnasium.GymnasiumEnv` and
    :class:`~rl8.envs.pool.PoolEnv`): the seeds of a reset, the episode records of the
    sub-envs, a state that is not saved, closing on exit, and :meth:`make_factory`. A subclass
    sets ``env``, ``env_kwargs``, ``wrappers``, ``render_mode`` and ``converter`` in its
    ``__init__``."""

    episodic = True

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
        return env_label(self.env)

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

    def state_dict(self) -> None:
        """``None``: the simulators live in gymnasium (and maybe subprocesses) and cannot be
        saved, so PPO resets these envs when training resumes from a checkpoint."""
        return None

    def __enter__(self) -> GymnasiumEnvBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @classmethod
    def make_factory(
        cls, env: str | Callable[..., gymnasium.Env], **kwargs: Any
    ) -> GymnasiumEnvFactory:
        """A callable ``f(num_envs, horizon=None, *, device="cpu")`` that builds the env.

        ``PPO("CartPole-v1")`` calls ``GymnasiumEnv.make_factory("CartPole-v1")`` and uses the
        result as its env class.

        Args:
            env: A registered gymnasium id or a callable returning one gymnasium env.
            **kwargs: The other keyword arguments of :class:`~rl8.envs.gymnasium.GymnasiumEnv`
                (``vectorization_mode``, ``env_kwargs``, ``wrappers``, ``render_mode``,
                ``step_timeout_s``, and those of :class:`rl8.envs.PoolEnv` for ``"pool"``).
        """
        return GymnasiumEnvFactory(cls, env, kwargs)


class GymnasiumEnvFactory:
    """Builds :class:`~rl8.envs.gymnasium.GymnasiumEnv` instances: ``f(num_envs, horizon=None, *, device="cpu")``.

    A plain (picklable, for a string id) object rather than a closure, carrying the class
    attributes PPO reads from an env class (``episodic``, ``max_num_envs``, ``max_horizon``,
    ``metadata``).

    Args:
        cls: The env class to build (``GymnasiumEnv`` or a subclass).
        env: A registered gymnasium id or a callable returning one gymnasium env.
        kwargs: The other keyword arguments of the class.
    """

    def __init__(self, cls: type[GymnasiumEnvBase], env: Any, kwargs: dict[str, Any]) -> None:
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
    ) -> GymnasiumEnvBase:
        return self.cls(num_envs, horizon, device=device, env=self.env, **self.kwargs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.cls.__name__}.make_factory({self.env!r}{extra})"
