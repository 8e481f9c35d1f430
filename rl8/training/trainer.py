"""The :class:`Trainer`: PPO for hours, with stop conditions, evaluations, MLflow tracking,
checkpoints, resuming and signals (see ``docs/trainer.md``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rl8.io.checkpoint_dir import CheckpointDirLock, check_writable_folder, read_checkpoint
from rl8.io.export import policy_to_dict
from rl8.mlflow_store import StoreSchemaError
from rl8.ppo.algorithm import check_env_configs
from rl8.ppo.distributed import DistContext, current_roles
from rl8.ppo.resolve import env_spec_string, is_dotted_path, qualified_name
from rl8.ppo.stats import Stats
from rl8.tracking.common import TrackingError, TrackingWarning
from rl8.tracking.tracker import TERMINAL_STATUSES, Tracker
from rl8.training.actors import Learner, check_actor_config, run_actor
from rl8.training.algorithm import Algorithm
from rl8.training.callbacks import CallbackLike, as_callbacks, callback_name, run_callbacks
from rl8.training.conditions import Condition
from rl8.training.config import TrainerConfig, run_params
from rl8.training.eval_envs import EvalEnvs
from rl8.training.progress import Progress, is_nan
from rl8.training.resume import (
    BEST_POLICY_ARTIFACT,
    RESUMING,
    LoggedModels,
    RunRecord,
    absolute_tracking_uri,
    algo_from_checkpoint,
    check_finite_policy,
    log_policy_artifacts,
    model_name,
    write_checkpoint,
)
from rl8.training.run_args import (
    TRAINING_RETURN,
    as_conditions,
    check_eval_plan,
    check_run_names,
    check_run_plan,
    checkpoint_every,
    learn_env_steps,
    register_metric,
)
from rl8.training.run_args import run_params as run_arg_params
from rl8.training.signals import StopSignals, signal_exit
from rl8.version import __version__

__all__ = ["TrainStats", "Trainer"]

#: Seconds a SIGINT/SIGTERM exit may spend on ending the MLflow run (delivering what is queued,
#: setting the status), whatever the tracking server does.
SIGNAL_CLOSE_TIMEOUT_S = 6.0


class TrainStats(Stats):
    """All stats of one training step, a ``dict[str, float]`` (a :class:`rl8.ppo.stats.Stats`):
    counters, the collect's and update's stats, ``profiling/*`` (ms), ``throughput/*``,
    ``memory/*`` (MiB) and on evaluation steps ``eval/*`` (see ``docs/trainer.md#metrics``)."""


def _env_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec.rsplit(".", 1)[-1] if is_dotted_path(spec) else spec
    return getattr(spec, "__name__", None) or type(spec).__name__


def _memory_stats(device: torch.device) -> dict[str, float]:
    """Resident memory of this process (MiB) and, on CUDA, the device memory of torch."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
        out["memory/rss_mb"] = resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    with contextlib.suppress(ImportError, OSError):  # no resource module: Windows
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["memory/max_rss_mb"] = maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    if device.type == "cuda":
        out["memory/cuda_allocated_mb"] = torch.cuda.memory_allocated(device) / 2**20
        out["memory/cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


class Trainer:
    """Train an algorithm (:class:`~rl8.PPO`, :class:`~rl8.Distillation`: the
    :class:`~rl8.training.algorithm.Algorithm` protocol) with stop conditions, MLflow tracking and checkpoints
    (see ``docs/checkpoints.md``). Its MLflow run starts at the first call that needs it (a
    step, :meth:`run` or :meth:`learn` once their arguments are checked, :attr:`run_id`; see
    ``docs/trainer.md``) and stays open until :meth:`close` (or a ``with`` block's end).

    Args:
        algo: The algorithm; the Trainer reads its counters and never copies it.
        config: The options (a :class:`~rl8.training.config.TrainerConfig`); ``None``: defaults.
        **options: Options by name, over ``config`` (``experiment="cartpole"``): the fields of
            :class:`~rl8.training.config.TrainerConfig`.

    Attributes:
        experiment: The MLflow experiment name (``config.experiment`` or the env's name).
        metadata: ``config.metadata`` as a dict (stored in every checkpoint).
        tracker: The :class:`~rl8.tracking.Tracker` of the MLflow run.
        eval_envs: The :class:`~rl8.training.eval_envs.EvalEnvs` that :meth:`eval` and
            :meth:`record` run in.
        last_checkpoint: Path of the latest checkpoint written or loaded, or ``None``.
        stopped_by: The stop condition that ended the latest :meth:`run`, or ``None``.
    """

    def __init__(self, algo: Algorithm, config: TrainerConfig | None = None, **options: Any) -> None:
        if config is not None and not isinstance(config, TrainerConfig):
            raise TypeError(
                f"Trainer: config must be a rl8.training.config.TrainerConfig or None, got {config!r}"
            )
        self.config = config = (config or TrainerConfig()).replace(**options)
        self.algo = algo
        self.env_spec = env_spec_string(algo.env_spec)
        self.experiment = config.experiment or _env_name(algo.env_spec)
        self.eval_envs = EvalEnvs(algo, config.eval_num_envs, config.eval_num_steps)
        self.stopped_by: Condition | None = None
        self.metadata = dict(config.metadata or {})
        self.closed = False
        self._run_args: dict[str, Any] | None = None
        self._conditions: list[Condition] = []
        self._conditions_met = False  # whether the stop conditions held at the latest step
        # set by from_checkpoint: the checkpoint resumed from and what it records of the run
        self._resumed_file, self._resumed = RESUMING.get() or (None, None)
        self.last_checkpoint: Path | None = self._resumed_file
        self._last_checkpoint_step: int | None = (
            None if self._resumed_file is None else int(algo.env_steps)
        )
        self._models = LoggedModels(
            config.log_models,
            config.register_metric,
            config.register_mode,
            best=None if self._resumed is None else self._resumed.best_checkpoint,
        )
        self._logged: tuple[int, dict[str, float]] = (-1, {})  # the latest step's logged stats
        self._ignore_stop_signals = False  # while a signal exit ends the run (bounded)
        self._run_start_wait_s: float | None = None  # 0: a signal's checkpoint waits for no run start
        # data-parallel training: only rank 0 talks to MLflow and writes checkpoints
        self._dist: DistContext = algo.dist
        roles = current_roles()  # with actors: they only collect, in run(); learners receive
        check_actor_config(config, algo, roles)
        self.is_actor = roles is not None and roles.is_actor
        self._learner = Learner(algo, config) if roles is not None and not self.is_actor else None
        self.tracker = Tracker(
            experiment=self.experiment,
            run_name=config.run_name,
            tracking_uri=config.tracking_uri,
            run_id=config.run_id,
            enabled=config.tracking and self._dist.is_main,
            asynchronous=config.async_logging,
            end_at_exit=True,
            system_metrics=config.system_metrics,
            tags={"mlflow.parentRunId": config.parent_run_id} if config.parent_run_id else None,
            log_every=config.log_every,
        )
        # the checkpoint folder belongs to this run alone (rank 0 holds the claim): claimed
        # now, so that an unusable folder is an error before any MLflow run exists
        self._dir_lock: CheckpointDirLock | None = None
        given = config.checkpoint_dir  # None: checkpoints/<run id> once the run id is known
        self._checkpoint_dir: Path | None = None if given is None else Path(given).absolute()
        self._checkpoints_root = Path("checkpoints").absolute()
        self._run_id: str | None = None
        self._dist.on_main(self._claim_folder)
        # the MLflow run starts at the first call that needs it (see _open_run), so that a call
        # whose arguments fail their checks leaves no run behind; the ranks of data-parallel
        # training start it now, while they are all here to agree on its id
        self._run_opened = False
        if self._dist.enabled:
            self._open_run()

    def _claim_folder(self) -> None:
        """Rank 0: claim an explicit checkpoint folder, or check that the default's root can be
        written (actors write no checkpoints: they claim nothing)."""
        if not self.is_actor and self._checkpoint_dir is not None:
            self._dir_lock = CheckpointDirLock(
                self._checkpoint_dir, run_id=self.config.run_id, resumed_from=self._resumed_file
            )
        elif not self.is_actor:
            check_writable_folder(self._checkpoints_root)

    def _open_run(self) -> None:
        """Start the MLflow run, once, and log the configuration to it: at the first step,
        evaluation, recording, checkpoint or read of :attr:`run_id` (:meth:`run` and
        :meth:`learn` after checking their arguments). A new run in a local store (SQLite, a
        folder) starts in the logging thread, while the first collect runs: importing MLflow and
        migrating a new store take seconds."""
        if self._run_opened or self.closed:  # closed before any call needed it: it has none
            return
        config = self.config
        background = (
            config.async_logging
            and self.tracker.enabled
            and self.tracker.is_local
            and config.run_id is None
            and not self._dist.enabled
        )
        self._run_id, self._checkpoint_dir = self._dist.on_main(lambda: self._start_run(background))
        if background:
            self.tracker.start_in_background()
        self._run_opened = True
        # queued until a run starting in the background exists
        self.tracker.log_params(run_params(self.algo, config, self.env_spec, self._dist))

    def _start_run(self, background: bool) -> tuple[str | None, Path | None]:
        """Rank 0: start the run now (unless in the ``background``); the run id and the
        checkpoint folder (``None``: named once a run starting in the background has an id)."""
        if background:
            return None, self._checkpoint_dir
        try:
            self._run_id = self.tracker.start()
        except BaseException:
            self._release_folder()
            raise
        if self._dir_lock is not None:
            self._dir_lock.set_run_id(self._run_id)
        return self._run_id, self._checkpoint_dir or self._claim_default_folder()

    def _claim_default_folder(self) -> Path:
        """``checkpoints/<run id>`` (without tracking ``checkpoints/<time stamp>-<random>``),
        claimed unless by an actor."""
        name = self._run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        folder = self._checkpoints_root / name
        if not self.is_actor:
            self._dir_lock = CheckpointDirLock(
                folder, run_id=self._run_id, resumed_from=self._resumed_file
            )
        return folder

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (``None`` without tracking); starts the run when no call has yet,
        and waits for a run still starting (a :class:`~rl8.tracking.TrackingError` when it could
        not be started in the background)."""
        self._open_run()
        self._check_run_start(wait=True)
        return self._run_id

    @property
    def checkpoint_dir(self) -> Path:
        """The checkpoint folder (absolute): ``config.checkpoint_dir``, else ``checkpoints/<run id>``
        (without tracking ``checkpoints/<time stamp>-<random>``, unique to this Trainer), claimed
        (unless by an actor) when first named; the default starts the run like :attr:`run_id`
        and waits for a run still starting (a :class:`~rl8.tracking.TrackingError` when it could
        not be started in the background)."""
        if self._checkpoint_dir is None:
            self._open_run()  # names it, unless the run starts in the background
        if self._checkpoint_dir is None:
            self._check_run_start(wait=True)  # for the run still starting
            self._checkpoint_dir = self._claim_default_folder()
        return self._checkpoint_dir

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this Trainer is closed (its MLflow run has ended)")

    def _release_folder(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()

    def _check_run_start(self, *, wait: bool = False, unless_reported: bool = False) -> None:
        """Raise the error of a background run start that failed; ``wait``: for one in
        progress; ``unless_reported``: unless raised before."""
        if wait:
            self.tracker.wait_started(self._run_start_wait_s)
        self.tracker.check_start(once=unless_reported)
        self._run_id = self.tracker.run_id or self._run_id

    def _counters(self) -> dict[str, float]:
        algo = self.algo
        return {
            "env/steps": algo.env_steps,
            "env/resets": algo.env_resets,
            "algorithm/collects": algo.collects,
            "algorithm/steps": algo.updates,
        }

    def _train_step(self, env_config: dict[str, Any] | None) -> TrainStats:
        algo, learner = self.algo, self._learner
        if self.is_actor:
            raise RuntimeError(
                f"Trainer.step on actor rank {self._dist.global_rank}: an actor only collects, in "
                "Trainer.run (call run() on every rank)"
            )
        t0 = time.perf_counter()
        collect = (
            learner.collect(env_config) if learner is not None else algo.collect(env_config=env_config)
        )
        t1 = time.perf_counter()
        update = algo.update()
        if learner is not None:
            learner.after_update()
        t2 = time.perf_counter()
        stats = TrainStats({**collect, **update, **self._counters()})
        stats["profiling/collect_ms"] = 1000.0 * (t1 - t0)
        stats["profiling/step_ms"] = 1000.0 * (t2 - t1)
        # every rank's envs (timings are this rank's: rank 0's in MLflow); with actors: the
        # transitions the learners used
        steps = algo.hparams.batch_size * self._dist.world_size
        stats["throughput/env_steps_per_s"] = steps / max(t2 - t0, 1e-9)
        stats.update(_memory_stats(algo.device))
        return stats

    def _stop_actors(self) -> None:
        if self._learner is not None:
            self._learner.stop()

    def _log(self, stats: Mapping[str, float], *, evaluated: bool = False) -> None:
        """All stats in one request, at step ``env/steps``; NaN values are left out. An
        evaluation's stats are logged whatever the cadence (``log_every``) says."""
        self._check_open()
        self._check_run_start()
        metrics = {k: float(v) for k, v in stats.items() if not is_nan(v)}
        self._logged = (int(self.algo.env_steps), metrics)
        self.tracker.log_metrics(metrics, step=self._logged[0], always=evaluated)

    def flush(self) -> None:
        """Wait until the metrics of every step so far are sent (or queued after a failure)."""
        self.tracker.flush()
        self._check_run_start()

    def step(self, *, env_config: dict[str, Any] | None = None) -> TrainStats:
        """One training step: one collect and one update, logged to MLflow; returns its
        :class:`TrainStats` (NaN values included; they are not logged).

        Args:
            env_config: Env parameters applied when the envs are reset before this collect
                (merged over ``hparams.env_config``; see :meth:`rl8.PPO.collect`).
        """
        self._open_run()  # before the collect, which a run starting in the background overlaps
        stats = self._train_step(env_config)
        self._log(stats)
        return stats

    def _eval(self, env_config: dict[str, Any] | None, deterministic: bool) -> TrainStats:
        t0 = time.perf_counter()
        raw = self.eval_envs.evaluate(env_config, deterministic)
        stats = TrainStats({f"eval/{k}": v for k, v in raw.items()})
        stats["profiling/eval_ms"] = 1000.0 * (time.perf_counter() - t0)
        return stats

    def eval(
        self, *, env_config: dict[str, Any] | None = None, deterministic: bool = True
    ) -> TrainStats:
        """Evaluate the policy without touching training state (torch's RNG included); returns and
        logs at the current ``env/steps`` its ``eval/<rollout stat>`` and ``profiling/eval_ms``
        (see :class:`~rl8.training.eval_envs.EvalEnvs`, ``docs/trainer.md``).

        Args:
            env_config: Env parameters for the evaluation (over ``hparams.env_config``).
            deterministic: Act with the distributions' modes (``False``: sample).
        """
        self._open_run()
        stats = self._eval(env_config, deterministic)
        self._log(stats, evaluated=True)
        return stats

    def record(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        deterministic: bool = True,
        max_steps: int | None = None,
        env_config: dict[str, Any] | None = None,
        fps: float | None = None,
    ) -> Path:
        """Record a video of one episode of the current policy in a one-env copy of the training
        env (training is not disturbed) and log it as the artifact ``videos/<file name>``;
        returns the path written. Needs the ``video`` extra (see ``docs/videos.md``).

        Args:
            path: The MP4 file to write; ``None``: ``checkpoint_dir/videos/video-<env steps>.mp4``.
            deterministic: Act with the distributions' modes (``False``: sample).
            max_steps: Env steps at most; ``None``: one episode, bounded by the env's episode
                limit or 1000 steps.
            env_config: Env parameters for the recording (over ``hparams.env_config``).
            fps: Frame rate in frames per second; ``None``: the env's ``metadata["render_fps"]``.
        """
        self._check_open()
        self._open_run()
        if path is None:
            path = self.checkpoint_dir / "videos" / f"video-{int(self.algo.env_steps)}.mp4"
        written = self.eval_envs.record(
            path, deterministic=deterministic, max_steps=max_steps, env_config=env_config, fps=fps
        )
        if self.tracker.enabled and self._dist.is_main:
            self.tracker.log_artifact(written, "videos")  # queued with async_logging
        return written

    def run(
        self,
        *,
        env_config: dict[str, Any] | None = None,
        eval_env_config: dict[str, Any] | None = None,
        steps_per_eval: int | None = None,
        stop_conditions: Condition | Sequence[Condition] | None = None,
        max_env_steps: int | None = None,
        max_seconds: float | None = None,
        callbacks: CallbackLike | Sequence[CallbackLike] | None = None,
        **unknown: Any,
    ) -> TrainStats:
        """Train until a stop condition holds or a callback asks to stop: steps, evaluations every
        ``steps_per_eval`` steps, callbacks, logging, checkpoints every ``checkpoint_every`` steps
        and at the end, signals (see ``docs/trainer.md#training-run``); returns the stats of the
        last step (only the counters when no step ran). An exception ends the MLflow run as
        ``FAILED``, SIGINT/SIGTERM as ``KILLED``.

        Args:
            env_config: Env parameters for training resets (see :meth:`step`).
            eval_env_config: Env parameters for evaluations; default ``env_config``.
            steps_per_eval: Evaluate every this many steps; ``None``: never.
            stop_conditions: A :class:`~rl8.training.conditions.Condition` or a list of them;
                the run stops when any holds (it becomes :attr:`stopped_by`).
            max_env_steps: Stop once ``env/steps`` (a resumed run's included) reaches this, an
                int >= 1 (adds ``HitsUpperBound("env/steps", max_env_steps)``).
            max_seconds: Stop after this many seconds of training, a number > 0 (adds
                ``TimeLimit(max_seconds)``).
            callbacks: Called after every step (see :mod:`rl8.training.callbacks`): a callable
                ``callback(trainer, stats)`` or a :class:`~rl8.training.callbacks.Callback`, or a
                list of them; one that returns :data:`rl8.STOP` stops the run.
            **unknown: No other argument: one is a ``TypeError`` saying what it may mean
                (Stable-Baselines3's ``total_timesteps``: ``max_env_steps``).

        Raises:
            ValueError, TypeError: Before training and before the MLflow run starts, a bad
                argument (the message names it).
            rl8.training.conditions.MissingStatError: A condition on a stat that the run never
                reports (an ``eval/`` stat without ``steps_per_eval``, a typo).
        """
        self._check_open()
        check_run_names(unknown, self.run)
        if self.is_actor:  # collect until the learners stop the job
            return TrainStats(run_actor(self.algo, self.config, env_config=env_config))
        check_eval_plan(steps_per_eval, eval_env_config)
        conditions = as_conditions(stop_conditions, max_env_steps=max_env_steps, max_seconds=max_seconds)
        check_run_plan(self.config, conditions, steps_per_eval)
        if self.config.record_every is not None and self._dist.is_main:
            self.eval_envs.check_can_record()
        callbacks = as_callbacks(callbacks)
        if eval_env_config is None:
            eval_env_config = env_config
        check_env_configs(
            self.algo,
            {"Trainer.run: env_config": env_config, "Trainer.run: eval_env_config": eval_env_config},
        )
        self._run_args = {
            "env_config": dict(env_config) if env_config else None,
            "eval_env_config": dict(eval_env_config) if eval_env_config else None,
            "steps_per_eval": steps_per_eval,
        }
        finished = self._resumed is not None and self._resumed.restore(conditions)  # held: no step
        self._conditions = conditions
        self._conditions_met = finished
        self._open_run()  # the arguments are checked: the run starts, overlapping the first collect
        with warnings.catch_warnings():
            # a resumed run records a changed value once as "resumed/run/..."; later ones are expected
            warnings.filterwarnings("ignore", message="MLflow param 'run/", category=TrackingWarning)
            self.tracker.log_params(run_arg_params(self._run_args, conditions))
        if not conditions and not callbacks:
            warnings.warn(
                "Trainer.run: no stop_conditions, so training runs until interrupted (Ctrl-C "
                "writes a checkpoint and stops); e.g. max_env_steps=1_000_000 or "
                "stop_conditions=HitsUpperBound('episodes/return_mean', 475)",
                stacklevel=2,
            )
        stats = self._train_until(
            conditions,
            callbacks,
            finished=finished,
            env_config=env_config,
            eval_env_config=eval_env_config,
            steps_per_eval=steps_per_eval,
            checkpoint_every=checkpoint_every(self.config, steps_per_eval),
        )
        if self.config.register_as is not None and self.tracker.enabled:
            self.register_best()
        return stats

    def _train_until(
        self,
        conditions: list[Condition],
        callbacks: Sequence[CallbackLike],
        *,
        finished: bool,
        env_config: dict[str, Any] | None,
        eval_env_config: dict[str, Any] | None,
        steps_per_eval: int | None,
        checkpoint_every: int | None,
    ) -> TrainStats:
        """:meth:`run`'s loop: train, evaluate when due, call back, log, check the stop conditions,
        checkpoint every ``checkpoint_every`` steps, act on signals; then the last checkpoint. No
        step when ``finished`` (the conditions held at the checkpoint resumed from)."""
        algo, config = self.algo, self.config
        progress = Progress(
            config.progress if self._dist.is_main else False,
            interval_s=config.progress_every_s,
            run=self,
        )
        signals = StopSignals(self._dist, lambda: self._ignore_stop_signals)
        stats = TrainStats(self._counters())
        held = [False] * len(conditions)  # which conditions held at the latest step
        stopped_by_callback: CallbackLike | None = None
        with signals.installed():
            try:
                progress.announce()  # where the results go, once the run has an id
                for condition in conditions:
                    condition.start()
                while not finished:
                    stats = self._train_step(env_config)
                    evaluated = steps_per_eval is not None and algo.updates % steps_per_eval == 0
                    if evaluated:
                        stats.update(self._eval(eval_env_config, deterministic=True))
                        if (
                            config.record_every
                            and (algo.updates // steps_per_eval) % config.record_every == 0
                        ):
                            stats.update(self._record_eval(eval_env_config))
                    stopped_by_callback = run_callbacks(callbacks, self, stats, evaluated)
                    self._log(stats, evaluated=evaluated)
                    held = [bool(condition(stats)) for condition in conditions]
                    self._conditions_met = any(held)
                    progress.update(stats, conditions, held=held)
                    if checkpoint_every and algo.updates % checkpoint_every == 0:
                        self.save_checkpoint()
                    stop = signals.agree(any(held) or stopped_by_callback is not None)
                    self._handle_signals(signals, progress)
                    if stop:
                        break
                # the last lines come after those saying where the run goes, which need its id
                self._check_run_start(wait=True)
                progress.update(stats, conditions, force=True, held=held)
                self.stopped_by = next((c for c, fired in zip(conditions, held) if fired), None)
                if finished and len(conditions) == 1:  # then it is the one that held
                    self.stopped_by = conditions[0]
                progress.summary(
                    stats,
                    self.stopped_by,
                    held_at_checkpoint=finished,
                    callback=None if stopped_by_callback is None else callback_name(stopped_by_callback),
                )
                if self._last_checkpoint_step != algo.env_steps:
                    self.save_checkpoint()
                signals.agree(False)
                self._handle_signals(signals, progress)  # one that arrived during the last checkpoint
                self._stop_actors()
                progress.results(self)
            except (KeyboardInterrupt, SystemExit):
                progress.close()
                with contextlib.suppress(Exception):  # a signal's exit: the actors exit with it
                    self._stop_actors()
                self._close_killed()
                raise
            except BaseException as exc:
                progress.close()
                if signals.stop_signal is None:
                    self._close_while_raising("FAILED")
                    raise
                # stopping on a signal failed (e.g. its checkpoint): still the signal's exit
                self._close_killed()
                if self._dist.is_main:
                    print(
                        f"rl8: {signal.Signals(signals.stop_signal).name}: {type(exc).__name__}: {exc} while "
                        f"stopping; latest checkpoint: {self.last_checkpoint}"
                        f"{self.tracker.end_report('KILLED')}",
                        file=sys.stderr,
                        flush=True,
                    )
                raise signal_exit(signals.stop_signal) from exc
        return stats

    def _record_eval(self, env_config: dict[str, Any] | None) -> TrainStats:
        """The video of an evaluation step (``record_every``), on rank 0; its duration in ms."""
        if not self._dist.is_main:
            return TrainStats()
        t0 = time.perf_counter()
        self.record(
            self.checkpoint_dir / "videos" / f"eval-{int(self.algo.env_steps)}.mp4",
            env_config=env_config,
        )
        return TrainStats({"profiling/record_ms": 1000.0 * (time.perf_counter() - t0)})

    def _handle_signals(self, signals: StopSignals, progress: Progress) -> None:
        """Act on the signals received: a checkpoint for SIGUSR1; for SIGINT/SIGTERM a checkpoint,
        the run ended as ``KILLED``, and the signal's exception."""
        checkpoint, signum = signals.take()
        if checkpoint:
            path = self.save_checkpoint()
            progress.close()
            if self._dist.is_main:
                print(f"rl8: SIGUSR1: checkpoint written to {path}", file=sys.stderr, flush=True)
        if signum is None:
            return
        progress.close()
        if self._last_checkpoint_step != self.algo.env_steps:
            self.save_checkpoint(wait_for_run=False)
        self._close_killed()
        if self._dist.is_main:
            print(
                f"rl8: {signal.Signals(signum).name}: checkpoint written to {self.last_checkpoint}"
                f"{self.tracker.end_report('KILLED')}",
                file=sys.stderr,
                flush=True,
            )
        progress.results(self)
        raise signal_exit(signum)

    def resolved_config(self) -> TrainerConfig:
        """:attr:`config` with what this Trainer resolved (its MLflow run, absolute tracking URI,
        checkpoint folder): what a checkpoint stores. Waits for a run still starting."""
        return self.config.replace(
            run_id=self.run_id,
            experiment=self.experiment,
            run_name=self.tracker.run_name,
            tracking_uri=absolute_tracking_uri(self.tracker.tracking_uri),
            tracking=self.tracker.enabled,
            checkpoint_dir=str(self.checkpoint_dir),
            metadata=self.metadata,
        )

    def _env_info(self) -> dict[str, Any]:  # as a policy file records it
        hp = self.algo.hparams
        return {
            "spec": self.env_spec,
            "env_kwargs": dict(hp.env_kwargs),
            "env_config": dict(hp.env_config),
        }

    def _run_record(self) -> RunRecord:
        """The record of the latest :meth:`run`, completed by that of the checkpoint this Trainer
        resumed from."""
        conditions = self._conditions
        record = RunRecord(
            self._run_args,
            [c.state_dict() for c in conditions],
            [c.to_config() for c in conditions],
            self._conditions_met,
        )
        saved = self._resumed
        if saved is not None and not self._conditions and saved.stop_conditions:
            record = dataclasses.replace(saved, run=record.run)
        if saved is not None and record.run is None:
            record.run = saved.run
        record.best_checkpoint = self._models.best
        return record

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's content: only tensors and plain Python values (see docs/trainer.md)."""
        algo = self.algo
        return {
            "algo": algo.state_dict(),
            "env": {"spec": self.env_spec, "class": qualified_name(type(algo.env))},
            "trainer": {
                **self.resolved_config().stored(),
                **dataclasses.asdict(self._run_record()),
                "policy": policy_to_dict(algo.policy, include_state=False, env=self._env_info()),
                **self._teacher_entry(),
            },
            "versions": {"rl8": __version__, "torch": str(torch.__version__)},
        }

    def _teacher_entry(self) -> dict[str, Any]:
        """A distillation's teacher as a checkpoint describes it (its weights are the algo's)."""
        teacher = getattr(self.algo, "teacher", None)
        if teacher is None:
            return {}
        return {"teacher": policy_to_dict(teacher, include_state=False)}

    def save_checkpoint(
        self, path: str | os.PathLike[str] | None = None, *, wait_for_run: bool = True
    ) -> Path:
        """Write a checkpoint (:meth:`state_dict`) atomically, log the policy and the
        ``rl8/checkpoint.json`` pointer to the MLflow run (see ``docs/checkpoints.md``), and
        return the path written. In data-parallel training every rank calls it at the same step
        (rank 0 writes).

        Args:
            path: Destination file; ``None``: ``checkpoint_dir/checkpoint-<env steps>.pt``,
                keeping the last ``keep_checkpoints`` there.
            wait_for_run: ``False`` (a signal's checkpoint): an MLflow run still starting is not
                waited for; the checkpoint then records no run id, in ``checkpoints/<time
                stamp>-<random>`` unless ``checkpoint_dir`` was given.

        Raises:
            rl8.ppo.algorithm.NonFiniteError: The policy holds NaN or inf (nothing is written).
        """
        if not wait_for_run:
            self._run_start_wait_s = 0.0
            try:
                return self.save_checkpoint(path)
            finally:
                self._run_start_wait_s = None
        step = int(self.algo.env_steps)
        check_finite_policy(self.algo.policy, step, self.last_checkpoint)
        folder = self.checkpoint_dir if path is None else None
        if folder is not None and self._dir_lock is not None:  # rank 0: the folder's lock names the run
            self._dir_lock.set_run_id(self.run_id)
        actors = self._learner.actor_states() if self._learner is not None else None
        logged_step, logged = self._logged  # the ranking stat is the one logged at this step
        metric = self._ranking_metric()
        self._models.rank_by(metric)
        value = logged.get(metric) if logged_step == step else None
        models = self._models.checkpoint(step, value, self._last_checkpoint_step)
        written = write_checkpoint(
            self.state_dict(), path, folder, self.config.keep_checkpoints, step, self._dist, actors
        )
        self.last_checkpoint = written
        self._last_checkpoint_step = step
        if self.tracker.enabled and not self.closed:
            log_policy_artifacts(self.tracker, self.algo.policy, self._env_info(), written, step, models)
        return written

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        env: Any = None,
        hparams: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
        trust_code: bool = False,
        **kwargs: Any,
    ) -> Trainer:
        """Rebuild a Trainer (and its PPO, state loaded) from a checkpoint and continue its
        MLflow run (see ``docs/checkpoints.md``).

        Args:
            path: A checkpoint file, a folder of checkpoints (its latest), or an MLflow run id.
            env: The env to use instead of the stored one (one the checkpoint could not record,
                or a class this process has not registered).
            hparams: Hyper-parameters to change, e.g. ``{"device": "cuda"}``.
            tracking_uri: Tracking URI of the run (default: the one stored in the checkpoint).
            trust_code: Trust the file: import the modules of names the registry
                (:mod:`rl8.registry`) does not hold, and let its env spec name a plain function
                (see ``docs/security.md``).
            **kwargs: Other :class:`Trainer` options to change (the others are those stored).

        Raises:
            FileNotFoundError: No checkpoint at ``path``.
            rl8.io.checkpoint.CheckpointError: A corrupt, foreign or unsafe file.
            ValueError: The env's observation or action space differs from the checkpoint's.
            rl8.tracking.TrackingError: The stored MLflow run cannot be resumed (raised by the
                first call that starts the run: ``run()``, ``step()``, ``run_id``...).
        """
        file, state = read_checkpoint(path, tracking_uri=tracking_uri)
        algo = algo_from_checkpoint(file, state, env=env, hparams=hparams, trust_code=trust_code)
        saved = state["trainer"]
        config = TrainerConfig.from_stored(saved)
        tracking = kwargs.pop("tracking", config.tracking)
        config = config.replace(
            tracking=tracking,
            run_id=config.run_id if tracking else None,
            tracking_uri=tracking_uri or config.tracking_uri,
        )
        token = RESUMING.set((file.absolute(), RunRecord.from_checkpoint(saved)))
        try:
            return cls(algo, config, **kwargs)
        finally:
            RESUMING.reset(token)

    def register_best(
        self, name: str | None = None, *, metric: str | None = None, mode: str | None = None
    ) -> str | None:
        """Register the run's best checkpoint (its logged model with the best ``metric``; with
        ``log_models="none"`` its run artifacts ``best_policy/``) in MLflow's Model Registry as
        a new version of ``name`` with the alias ``best`` (``load_policy("models:/NAME@best")``)
        and return the new version, or ``None`` when the store could not be reached (a
        :class:`~rl8.tracking.TrackingWarning` says why); :meth:`run` calls it when
        ``register_as`` is set. A line on stderr (unless ``progress=False``) names the version,
        the checkpoint's step and the stat that ranked it.

        Args:
            name: The registered model; ``None``: ``register_as``.
            metric: The stat that ranks the checkpoints; ``None``: ``register_metric``, else
                ``eval/episodes/return_mean`` when the latest :meth:`run` evaluated
                (``steps_per_eval``) and the training return ``episodes/return_mean`` when it
                did not.
            mode: ``"max"`` or ``"min"``; ``None``: ``register_mode``.

        Raises:
            ValueError: No checkpoint of the run has ``metric``, or no name is given, or with
                ``log_models="none"`` a ``metric`` or ``mode`` other than the config's.
        """
        self._check_open()
        name = name or self.config.register_as
        if not name or not self.tracker.enabled:
            raise ValueError(
                f"Trainer.register_best: needs a name (register_as) and tracking, got name={name!r}"
            )
        self._open_run()
        steps_per_eval = self._run_args["steps_per_eval"] if self._run_args else None
        metric = metric or self._ranking_metric()
        mode = mode or self.config.register_mode
        try:
            if self.config.log_models == "none":
                version, value, step = self._register_best_policy(name, metric, mode)
            else:
                version, value, step = self.tracker.register_best(name, metric, mode=mode)
        except TrackingError as exc:
            warnings.warn(str(exc), TrackingWarning, stacklevel=2)
            return None
        checkpoint = "the final checkpoint" if step == self._last_checkpoint_step else "the checkpoint"
        ranked_by = (
            "no eval plan: ranked by the training return"
            if metric == TRAINING_RETURN and steps_per_eval is None
            else "ranked by"
        )
        if self.config.progress is not False:
            print(
                f"rl8: registered {name!r} version {version} (models:/{name}@best): {checkpoint} "
                f"at step {step} ({ranked_by} {metric} = {value:g})",
                file=sys.stderr,
                flush=True,
            )
        return version

    def _ranking_metric(self) -> str:
        """The stat that ranks the checkpoints (``register_metric``, or its default for the
        eval plan of the latest :meth:`run`), for ``register_as`` and ``log_models`` alike."""
        if self._run_args is None and self._models.metric is not None:
            return self._models.metric  # a resumed run before its run(): the ranking it had
        steps_per_eval = self._run_args["steps_per_eval"] if self._run_args else None
        return register_metric(self.config, steps_per_eval)

    def _register_best_policy(self, name: str, metric: str, mode: str) -> tuple[str, float, int]:
        """:meth:`register_best` of a run without logged models: its ``best_policy/`` artifacts,
        the best checkpoint by the config's ranking (the only one such a run keeps)."""
        ranking, ranked_by = self._models, self._ranking_metric()
        if (metric, mode) != (ranked_by, ranking.mode):
            raise ValueError(
                f"Trainer.register_best: with log_models='none' the run keeps only the best checkpoint "
                f"by register_metric={ranked_by!r} (register_mode={ranking.mode!r}), got "
                f"metric={metric!r}, mode={mode!r}; set log_models='best_and_last' or 'all' to rank "
                "the checkpoints by another stat"
            )
        best = ranking.best
        if best is None:
            raise ValueError(
                f"no checkpoint of MLflow run {self.run_id} has the stat {metric!r}, so none can be "
                f"registered as {name!r} (an eval/ stat is known at the checkpoints written at "
                "evaluation steps)"
            )
        description = (
            f"{model_name(best['step'])} of run {self.run_id} ({BEST_POLICY_ARTIFACT}/): "
            f"{metric} = {best['value']:g} ({mode})"
        )
        version = self.tracker.register_artifact(name, BEST_POLICY_ARTIFACT, description=description)
        return version, best["value"], best["step"]

    def learn(
        self, env_steps: int | None = None, *, total_timesteps: int | None = None, **run_options: Any
    ) -> TrainStats:
        """Train for ``env_steps`` more env steps at each call, as Stable-Baselines3's ``learn``:
        ``run(max_env_steps=<env steps so far> + env_steps, **run_options)``. Every argument is
        checked before anything runs (SB3's ``callback``, ``progress_bar``... get rl8's way).

        Args:
            env_steps: Env steps to train for from now (all envs of every rank), an int >= 1.
            total_timesteps: Stable-Baselines3's name of ``env_steps``, the same meaning (give
                one of the two).
            **run_options: Other arguments of :meth:`run` (not ``max_env_steps``: learn sets it).
        """
        steps = learn_env_steps(env_steps, total_timesteps, run_options, self.run)
        return self.run(max_env_steps=int(self.algo.env_steps) + steps, **run_options)

    def close(self, status: str = "FINISHED", *, timeout_s: float | None = None) -> None:
        """End the MLflow run with ``status``, close the dedicated eval env and
        :meth:`close <rl8.PPO.close>` the algorithm (the training envs stay open). Idempotent;
        when ending the run raises, the Trainer stays open.

        Args:
            status: The run's terminal status: ``FINISHED``, ``FAILED`` or ``KILLED``.
            timeout_s: Seconds that delivering what is queued and setting the status may take
                at most; ``None``: the tracker's HTTP policy.
        """
        if self.closed:
            return
        if str(status).upper() not in TERMINAL_STATUSES:
            raise ValueError(f"Trainer.close: status must be one of {TERMINAL_STATUSES}, got {status!r}")
        try:
            self.tracker.end(status, timeout_s=timeout_s)
        finally:
            self._release_folder()
            self.eval_envs.close()
            self.algo.close()
        # only now: when ending the run raised, the exit hook still ends it
        self.closed = True
        self._check_run_start(unless_reported=True)

    def _close_while_raising(self, status: str, timeout_s: float | None = None) -> None:
        """:meth:`close` while another exception propagates: a failed background run start is a
        :class:`~rl8.tracking.TrackingWarning`, not an error replacing it."""
        try:
            self.close(status, timeout_s=timeout_s)
        except (TrackingError, StoreSchemaError) as exc:
            warnings.warn(str(exc), TrackingWarning, stacklevel=3)

    def _close_killed(self) -> None:
        """End the run as ``KILLED`` within :data:`SIGNAL_CLOSE_TIMEOUT_S`, ignoring a further
        SIGINT/SIGTERM meanwhile."""
        self._ignore_stop_signals = True
        try:
            self._close_while_raising("KILLED", timeout_s=SIGNAL_CLOSE_TIMEOUT_S)
        finally:
            self._ignore_stop_signals = False

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close("FINISHED")
        else:
            self._close_while_raising(
                "KILLED" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "FAILED"
            )
        return False

    def __repr__(self) -> str:
        run_id = self.tracker.run_id or self._run_id
        checkpoint_dir = self._checkpoint_dir or self._checkpoints_root / str(run_id or "<run id>")
        return (
            f"Trainer(algo={self.algo!r}, experiment={self.experiment!r}, run_id={run_id!r}, "
            f"checkpoint_dir={str(checkpoint_dir)!r})"
        )
