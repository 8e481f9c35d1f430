"""The envs that a Trainer evaluates and records videos in, apart from training: each built
once (without moving torch's RNG) and put back in its first state before every use."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl8.policies.policy import check_memory
from rl8.ppo.algorithm import make_env
from rl8.ppo.rollout import second_instance_problem
from rl8.training.video import (
    check_can_render,
    episode_limit,
    fork_rng,
    import_imageio,
    make_recording_env,
    record_video,
)

if TYPE_CHECKING:
    from rl8.ppo.algorithm import PPO

__all__ = ["EvalEnvs"]

#: Most envs of the eval env built on demand (without ``eval_num_envs``).
_ON_DEMAND_EVAL_ENVS = 16


class _FirstState:
    """An env built once by ``build()``, put back in its first state at every :meth:`get`."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.env: Any = None
        self._state: Any = None

    def get(self, build: Any) -> Any:
        if self.env is None:
            with fork_rng(self.device):  # building it must not move the training RNG
                self.env = build()
            self._state = self.env.state_dict()
        elif self._state is not None:
            self.env.load_state_dict(self._state)
        return self.env

    def close(self) -> None:
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.env.close()
            self.env = None


class EvalEnvs:
    """Where :meth:`rl8.Trainer.eval` and :meth:`rl8.Trainer.record` run, for ``algo`` (its env
    spec, ``env_kwargs``, ``env_config`` and device): a dedicated eval env of ``num_envs`` envs
    (``eval_num_envs``), or with ``None`` the training envs at env-reset boundaries (at any time
    for an env rl8 cannot build twice), else an env of ``min(num_envs, 16)`` built on demand;
    ``num_steps``: steps per env of one evaluation (``eval_num_steps``; ``None``: see
    ``docs/trainer.md#evaluation-eval``)."""

    def __init__(self, algo: PPO, num_envs: int | None, num_steps: int | None) -> None:
        if num_envs is not None:  # one step of every env at least, before anything is built
            check_memory(
                f"eval_num_envs={num_envs}",
                int(num_envs * algo.buffer.bytes_per_transition),
                algo.device,
                "Use fewer eval envs",
            )
        self.algo = algo
        self.num_envs = num_envs
        self.num_steps = num_steps
        self._eval = _FirstState(algo.device)
        self._record = _FirstState(algo.device)

    @property
    def eval_env(self) -> Any:
        """The dedicated eval env, or ``None`` until an evaluation needed one."""
        return self._eval.env

    @property
    def record_env(self) -> Any:
        """The one-env copy of the training env that videos are recorded in, or ``None``."""
        return self._record.env

    def _second_instance(self, what: str) -> None:
        problem = second_instance_problem(self.algo.env, self.algo.env_spec)
        if problem is not None:
            raise RuntimeError(
                f"{what} needs a second instance of the env, but {problem} (docs/simulators.md)"
            )

    def _build_eval_env(self) -> Any:
        self._second_instance(f"Trainer(eval_num_envs={self.num_envs})")
        algo, hp = self.algo, self.algo.hparams
        size = self.num_envs if self.num_envs is not None else min(hp.num_envs, _ON_DEMAND_EVAL_ENVS)
        return make_env(algo.env_spec, size, hp.horizon, device=algo.device, env_kwargs=hp.env_kwargs)

    def _build_record_env(self) -> Any:
        self._second_instance("recording a video")
        algo, hp = self.algo, self.algo.hparams
        env = make_recording_env(
            algo.env_spec, env_kwargs=hp.env_kwargs, horizon=hp.horizon, device=algo.device
        )
        try:
            check_can_render(env)
        except BaseException:
            env.close()
            raise
        return env

    def evaluate(self, env_config: dict[str, Any] | None, deterministic: bool) -> dict[str, float]:
        """The rollout stats of one evaluation (:meth:`rl8.PPO.evaluate` with ``env_config`` over
        ``hparams.env_config``, ``deterministic``: the distributions' modes), torch's RNG kept, on
        the training envs (state restored afterwards) or the dedicated eval env, as
        ``docs/trainer.md#evaluation-eval`` says."""
        algo, hp = self.algo, self.algo.hparams
        default_steps = hp.horizon * max(1, hp.horizons_per_env_reset)
        config = {**hp.env_config, **(env_config or {})}
        single = second_instance_problem(algo.env, algo.env_spec) is not None
        with fork_rng(algo.device):
            if self.num_envs is None and (algo.next_collect_resets or single):  # the training envs
                env, saved = None, algo.env.state_dict()
                # an env that cannot be built twice: whole episodes, up to its limit (from a reset)
                limit = episode_limit(algo.env, config) if single else None
            else:
                env, saved = self._eval.get(self._build_eval_env), None
                limit = episode_limit(env, config) if env.episodic else None
            try:
                return algo.evaluate(
                    env,
                    env_config=env_config,
                    deterministic=deterministic,
                    num_steps=self.num_steps or limit or default_steps,
                )
            finally:
                # the next collect's reset is then the one it would have been without the eval
                if saved is not None:
                    algo.env.load_state_dict(saved)

    def check_can_record(self) -> None:
        """Raise now what recording would raise later (no imageio, an env that cannot render)."""
        import_imageio()
        self._record.get(self._build_record_env)

    def record(
        self,
        path: str | os.PathLike[str],
        *,
        deterministic: bool,
        max_steps: int | None,
        env_config: dict[str, Any] | None,
        fps: float | None,
    ) -> Path:
        """Record one episode of the policy to ``path`` (see :meth:`rl8.Trainer.record` for the
        arguments), torch's RNG kept; returns the path written."""
        algo = self.algo
        config = {**algo.hparams.env_config, **(env_config or {})}
        with fork_rng(algo.device):
            return record_video(
                algo.policy,
                self._record.get(self._build_record_env),
                path,
                deterministic=deterministic,
                max_steps=max_steps,
                fps=fps,
                env_config=config or None,
                seed=algo.seed,
            )

    def close(self) -> None:
        """Close the envs built here (the training envs stay open)."""
        self._eval.close()
        self._record.close()
