"""The loop of :meth:`rl8.Trainer.run`: steps, evaluations and videos on schedule, stop
conditions, checkpoints, signals, and how the MLflow run ends when the loop is interrupted."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rl8.fields import check, int_at_least, is_number, optional
from rl8.ppo.stats import Stats
from rl8.tracking.common import TrackingWarning
from rl8.training.callbacks import Callback, CallbackLike, asks_to_stop
from rl8.training.conditions import EVAL_PREFIX, Condition, HitsUpperBound, MissingStatError, TimeLimit
from rl8.training.progress import Progress
from rl8.training.signals import StopSignals, signal_exit

if TYPE_CHECKING:
    from rl8.training.trainer import Trainer

__all__ = [
    "TrainStats", "as_conditions", "check_eval_plan", "check_eval_stats", "check_record_plan",
    "log_run_params", "train_until",
]

# the checks of Trainer.run's numbers (see rl8.fields.Check)
_RUN_CHECKS = {
    "steps_per_eval": optional(int_at_least(1)),
    "max_env_steps": optional(int_at_least(1)),
    "max_seconds": optional(check("a number of seconds > 0", lambda v: is_number(v) and v > 0)),
}


class TrainStats(Stats):
    """All stats of one training step, a ``dict[str, float]`` (a :class:`rl8.ppo.stats.Stats`):
    counters, the collect's and update's stats, ``profiling/*`` (ms), ``throughput/*``,
    ``memory/*`` (MiB) and on evaluation steps ``eval/*`` (see ``docs/trainer.md#metrics``)."""


def _check_arg(name: str, value: Any) -> None:
    expected = _RUN_CHECKS[name](value, name)
    if expected is not None:
        raise ValueError(f"Trainer.run: {name} must be {expected}, got {value!r}")


def check_eval_plan(steps_per_eval: int | None, eval_env_config: Mapping[str, Any] | None) -> None:
    """Check before training that :meth:`rl8.Trainer.run` can evaluate as asked (any cadence
    works: evaluations off an env-reset boundary run on a dedicated eval env).

    Args:
        steps_per_eval: Evaluate every this many training steps, ``None``: never.
        eval_env_config: Env parameters for evaluations.

    Raises:
        ValueError: ``steps_per_eval`` is not an int >= 1 or ``None``; an ``eval_env_config``
            without ``steps_per_eval``.
    """
    _check_arg("steps_per_eval", steps_per_eval)
    if eval_env_config and steps_per_eval is None:
        raise ValueError(
            "Trainer.run: eval_env_config is given but steps_per_eval is None, so no "
            "evaluation would use it; set steps_per_eval"
        )


def as_conditions(stop_conditions: Condition | Sequence[Condition] | None, *, max_env_steps: int | None = None,
                  max_seconds: float | None = None) -> list[Condition]:
    """``Trainer.run``'s ``stop_conditions`` as a list, each checked to be a Condition, then
    ``HitsUpperBound("env/steps", max_env_steps)`` and ``TimeLimit(max_seconds)`` when given."""
    if stop_conditions is None:
        conditions = []
    elif isinstance(stop_conditions, Condition):
        conditions = [stop_conditions]
    elif isinstance(stop_conditions, (str, bytes)) or not isinstance(stop_conditions, Iterable):
        raise TypeError(f"Trainer.run: stop_conditions must be a rl8.training.conditions.Condition or a list of them, "
                        f"got {stop_conditions!r}")
    else:
        conditions = list(stop_conditions)
    for i, condition in enumerate(conditions):
        if not isinstance(condition, Condition):
            raise TypeError(
                f"Trainer.run: stop_conditions[{i}] must be a rl8.training.conditions.Condition, got {condition!r}"
            )
    _check_arg("max_env_steps", max_env_steps)
    _check_arg("max_seconds", max_seconds)
    if max_env_steps is not None:
        conditions.append(HitsUpperBound("env/steps", max_env_steps))
    if max_seconds is not None:
        conditions.append(TimeLimit(max_seconds))
    return conditions


def check_eval_stats(conditions: Sequence[Condition], steps_per_eval: int | None) -> None:
    """Before training: a ``MissingStatError`` for a condition on an ``eval/`` stat in a run
    without evaluations (it could never hold)."""
    if steps_per_eval is not None:
        return
    for i, condition in enumerate(conditions):
        for name in condition.stat_names():
            if name.startswith(EVAL_PREFIX):
                raise MissingStatError(
                    f"Trainer.run: stop_conditions[{i}] {condition!r} reads {name!r}, an evaluation "
                    "stat, but this run never evaluates (steps_per_eval=None), so it could never "
                    "hold: pass steps_per_eval=N to evaluate every N training steps (rl8 train: "
                    f"--steps-per-eval N), or bound the training stat {name[len(EVAL_PREFIX):]!r}"
                )


def check_record_plan(trainer: Trainer, steps_per_eval: int | None) -> None:
    """Before training: ``record_every`` needs evaluations, imageio and an env that renders."""
    record_every = trainer.config.record_every
    if record_every is None:
        return
    if steps_per_eval is None:
        raise ValueError(
            f"Trainer.run: record_every={record_every} records a video at every "
            f"{record_every}-th evaluation, but steps_per_eval is None (no evaluations); "
            "set steps_per_eval"
        )
    if trainer._dist.is_main:
        trainer.eval_envs.check_can_record()


def log_run_params(trainer: Trainer, conditions: Sequence[Condition], steps_per_eval: int | None) -> None:
    """The run's arguments and stop conditions as MLflow params ``run/*``."""
    args = trainer._run_args or {}
    params = {
        "run": {
            "env_config": args.get("env_config") or {},
            "eval_env_config": args.get("eval_env_config") or {},
            "steps_per_eval": steps_per_eval,
            "stop_conditions": repr(list(conditions)),
        }
    }
    with warnings.catch_warnings():
        # a resumed run records a changed value once as "resumed/run/..."; later ones are expected
        warnings.filterwarnings("ignore", message="MLflow param 'run/", category=TrackingWarning)
        trainer.tracker.log_params(params)  # queued with async_logging


def _record_eval(trainer: Trainer, env_config: dict[str, Any] | None) -> TrainStats:
    """The video of an evaluation step (``record_every``), on rank 0; its duration in ms."""
    if not trainer._dist.is_main:
        return TrainStats()
    t0 = time.perf_counter()
    trainer.record(trainer.checkpoint_dir / "videos" / f"eval-{int(trainer.algo.env_steps)}.mp4",
                   env_config=env_config)
    return TrainStats({"profiling/record_ms": 1000.0 * (time.perf_counter() - t0)})


def _handle_signals(trainer: Trainer, signals: StopSignals, progress: Progress) -> None:
    """Act on the signals received: a checkpoint for SIGUSR1; for SIGINT/SIGTERM a checkpoint,
    the run ended as ``KILLED``, and the signal's exception."""
    checkpoint, signum = signals.take()
    main = trainer._dist.is_main
    if checkpoint:
        path = trainer.save_checkpoint()
        progress.close()
        if main:
            print(f"rl8: SIGUSR1: checkpoint written to {path}", file=sys.stderr, flush=True)
    if signum is None:
        return
    progress.close()
    if trainer._last_checkpoint_step != trainer.algo.env_steps:
        trainer.save_checkpoint(wait_for_run=False)
    trainer._close_killed()
    if main:
        print(f"rl8: {signal.Signals(signum).name}: checkpoint written to {trainer.last_checkpoint}"
              f"{trainer.tracker.end_report('KILLED')}", file=sys.stderr, flush=True)
    progress.results(trainer)
    raise signal_exit(signum)


def _callback_name(callback: CallbackLike) -> str:
    return getattr(callback, "__name__", None) or repr(callback)


def _run_callbacks(trainer: Trainer, callbacks: Sequence[CallbackLike], stats: TrainStats,
                   evaluated: bool) -> CallbackLike | None:
    """Run every callback on the step's stats; the first that asked to stop, or ``None``."""
    stop = None
    for callback in callbacks:
        if isinstance(callback, Callback):
            asked = asks_to_stop(callback.on_step(trainer, stats), callback)
            if evaluated:
                asked = asks_to_stop(callback.on_eval(trainer, stats), callback) or asked
        else:
            asked = asks_to_stop(callback(trainer, stats), callback)
        if asked and stop is None:
            stop = callback
    return stop


def _step_and_evaluate(trainer: Trainer, env_config: dict[str, Any] | None,
                       eval_env_config: dict[str, Any] | None,
                       steps_per_eval: int | None) -> tuple[TrainStats, bool]:
    """One training step, then an evaluation (and a video) when due; the stats and whether it
    evaluated."""
    algo, config = trainer.algo, trainer.config
    stats = trainer._train_step(env_config)
    evaluated = bool(steps_per_eval) and algo.steps % steps_per_eval == 0
    if evaluated:
        stats.update(trainer._eval(eval_env_config, deterministic=True))
        if config.record_every and (algo.steps // steps_per_eval) % config.record_every == 0:
            stats.update(_record_eval(trainer, eval_env_config))
    return stats, evaluated


def _finish_run(trainer: Trainer, conditions: list[Condition], stats: TrainStats, stop: list[bool],
                progress: Progress, signals: StopSignals, *, held_at_checkpoint: bool,
                stopped_by_callback: CallbackLike | None) -> None:
    """After the last step (``stop``: which conditions held): set ``trainer.stopped_by``, print
    the summary, write the last checkpoint, handle a late signal, stop the actors."""
    progress.update(stats, conditions, force=True, held=stop)
    trainer.stopped_by = next((c for c, fired in zip(conditions, stop) if fired), None)
    if held_at_checkpoint and len(conditions) == 1:  # then it is the one that held
        trainer.stopped_by = conditions[0]
    progress.summary(stats, trainer.stopped_by, held_at_checkpoint=held_at_checkpoint,
                     callback=None if stopped_by_callback is None else _callback_name(stopped_by_callback))
    if trainer._last_checkpoint_step != trainer.algo.env_steps:
        trainer.save_checkpoint()
    signals.agree(False)
    _handle_signals(trainer, signals, progress)  # one that arrived during the last checkpoint
    trainer._stop_actors()
    progress.results(trainer)


def train_until(trainer: Trainer, conditions: list[Condition], stats: TrainStats, *, finished: bool,
                env_config: dict[str, Any] | None, eval_env_config: dict[str, Any] | None,
                steps_per_eval: int | None, callbacks: Sequence[CallbackLike] = ()) -> TrainStats:
    """The body of :meth:`rl8.Trainer.run` once its arguments are checked: steps until a
    condition holds or a callback asks to stop (none when ``finished``), signals handled; the
    last step's stats (``stats`` when no step ran)."""
    algo, config, dist = trainer.algo, trainer.config, trainer._dist
    held_at_checkpoint = finished
    progress = Progress(config.progress if dist.is_main else False, interval_s=config.progress_every_s)
    stop = [False] * len(conditions)  # which conditions held at the latest step
    stopped_by_callback: CallbackLike | None = None
    signals = StopSignals(dist, lambda: trainer._ignore_stop_signals)
    with signals.installed():
        try:
            progress.announce(trainer)  # where the results go, once the run has an id
            for condition in conditions:
                condition.start()
            while not finished:
                stats, evaluated = _step_and_evaluate(trainer, env_config, eval_env_config, steps_per_eval)
                stopped_by_callback = _run_callbacks(trainer, callbacks, stats, evaluated)
                trainer._log(stats)
                stop = [bool(condition(stats)) for condition in conditions]
                trainer._conditions_met = any(stop)
                progress.update(stats, conditions, held=stop)
                progress.announce(trainer)
                if config.checkpoint_every and algo.steps % config.checkpoint_every == 0:
                    trainer.save_checkpoint()
                stop_now = signals.agree(any(stop) or stopped_by_callback is not None)
                _handle_signals(trainer, signals, progress)
                if stop_now:
                    break
            _finish_run(trainer, conditions, stats, stop, progress, signals,
                        held_at_checkpoint=held_at_checkpoint, stopped_by_callback=stopped_by_callback)
        except (KeyboardInterrupt, SystemExit):
            progress.close()
            with contextlib.suppress(Exception):  # a signal's exit: the actors exit with it
                trainer._stop_actors()
            trainer._close_killed()
            raise
        except BaseException as exc:
            progress.close()
            signum = signals.stop_signal
            if signum is None:
                trainer._close_while_raising("FAILED")
                raise
            # stopping on a signal failed (e.g. its checkpoint): still the signal's exit
            trainer._close_killed()
            if dist.is_main:
                print(f"rl8: {signal.Signals(signum).name}: {type(exc).__name__}: {exc} while "
                      f"stopping; latest checkpoint: {trainer.last_checkpoint}"
                      f"{trainer.tracker.end_report('KILLED')}", file=sys.stderr, flush=True)
            raise signal_exit(signum) from exc
    return stats
