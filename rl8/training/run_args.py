"""The checks of :meth:`rl8.Trainer.run`'s and :meth:`rl8.Trainer.learn`'s arguments, made
before training, and the run's MLflow params ``run/*``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rl8.fields import (
    check,
    check_int,
    did_you_mean,
    int_at_least,
    is_number,
    optional,
    unknown_names_message,
)
from rl8.training.conditions import EVAL_PREFIX, Condition, HitsUpperBound, MissingStatError, TimeLimit
from rl8.training.config import TrainerConfig

__all__ = [
    "EVAL_RETURN",
    "TRAINING_RETURN",
    "as_conditions",
    "check_eval_plan",
    "check_run_names",
    "check_run_plan",
    "checkpoint_every",
    "learn_env_steps",
    "register_metric",
    "run_params",
]

#: The stat that ranks the checkpoints for ``register_as`` and ``log_models`` when
#: ``register_metric`` is ``None``, in a run that evaluates: the evaluations' return.
EVAL_RETURN = f"{EVAL_PREFIX}episodes/return_mean"
#: The same in a run that never evaluates: the training return.
TRAINING_RETURN = "episodes/return_mean"

# the checks of Trainer.run's numbers (see rl8.fields.Check)
_RUN_CHECKS = {
    "steps_per_eval": optional(int_at_least(1)),
    "max_env_steps": optional(int_at_least(1)),
    "max_seconds": optional(check("a number of seconds > 0", lambda v: is_number(v) and v > 0)),
}


#: The arguments that :meth:`rl8.Trainer.learn` does not pass on to ``run``: ``max_env_steps``
#: and those of Stable-Baselines3's ``learn``, each with rl8's way.
_NOT_LEARN_ARGUMENTS = {
    "max_env_steps": (
        "learn sets it (the env steps so far + env_steps); trainer.run(max_env_steps=N) is a total budget"
    ),
    "callback": (
        "Stable-Baselines3's callback is callbacks=[...]: callables callback(trainer, stats) or "
        "rl8.training.callbacks.Callback objects (docs/trainer.md#callbacks)"
    ),
    "log_interval": (
        "Stable-Baselines3's log_interval is Trainer(algo, log_every=N): metrics logged every N "
        "training steps (progress_every_s=S paces the progress line)"
    ),
    "tb_log_name": (
        "Stable-Baselines3's tb_log_name is Trainer(algo, experiment=..., run_name=...): the MLflow "
        "experiment and run"
    ),
    "reset_num_timesteps": "learn always goes on from algo.env_steps; a new PPO starts from 0",
    "progress_bar": (
        "Stable-Baselines3's progress_bar is Trainer(algo, progress=True): a progress line on stderr "
        "(the default on a terminal; progress=False: none)"
    ),
}

#: The arguments that :meth:`rl8.Trainer.run` does not take, each with rl8's way: those of
#: Stable-Baselines3's ``learn``.
_NOT_RUN_ARGUMENTS = {
    "total_timesteps": (
        "Stable-Baselines3's total_timesteps is max_env_steps=N here, a total budget (a resumed "
        "run's env steps included), or trainer.learn(N) to train N more env steps"
    ),
    **{name: hint for name, hint in _NOT_LEARN_ARGUMENTS.items() if name != "max_env_steps"},
}


def _parameter_names(run: Callable[..., Any]) -> list[str]:
    """The names of ``run``'s parameters (not its ``**`` catch-all)."""
    parameters = inspect.signature(run).parameters.values()
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]


def _unknown_arguments(
    call: str, unknown: Iterable[str], known: Mapping[str, str], valid: Sequence[str]
) -> TypeError:
    """The error of ``call`` given the ``unknown`` arguments, each with its hint in ``known`` or
    the ``valid`` names close to it."""
    hints = {name: known.get(name) or did_you_mean(name, valid).removeprefix("; ") for name in unknown}
    return TypeError(f"{call}: {unknown_names_message('argument', hints, valid)}")


def check_run_names(unknown: Mapping[str, Any], run: Callable[..., Any]) -> None:
    """A ``TypeError`` naming each of the ``unknown`` arguments that :meth:`rl8.Trainer.run` (its
    ``run``) was given, with what it may mean (Stable-Baselines3's ``total_timesteps``:
    ``max_env_steps``), before anything runs; nothing when there are none."""
    if unknown:
        raise _unknown_arguments("Trainer.run", unknown, _NOT_RUN_ARGUMENTS, _parameter_names(run))


def learn_env_steps(
    env_steps: Any, total_timesteps: Any, options: Mapping[str, Any], run: Callable[..., Any]
) -> int:
    """The env steps that :meth:`rl8.Trainer.learn` trains for from now, checked with the
    ``options`` it passes on to ``run`` (its :meth:`rl8.Trainer.run`; each option one of run's
    parameters but ``max_env_steps``): a ``TypeError`` naming every other one with what it may
    mean, or neither or both of ``env_steps`` and ``total_timesteps`` (Stable-Baselines3's name
    of it) given; a ``ValueError`` for a count that is not an int >= 1."""
    passed = [name for name in _parameter_names(run) if name not in _NOT_LEARN_ARGUMENTS]
    unknown = [name for name in options if name not in passed]
    if unknown:
        valid = ["env_steps", "total_timesteps", *passed]
        raise _unknown_arguments("Trainer.learn", unknown, _NOT_LEARN_ARGUMENTS, valid)
    if (env_steps is None) == (total_timesteps is None):
        given = (
            "neither"
            if env_steps is None
            else f"both (env_steps={env_steps!r}, total_timesteps={total_timesteps!r})"
        )
        raise TypeError(
            "Trainer.learn: give the env steps to train for from now as env_steps (learn(100_000)) "
            f"or as Stable-Baselines3's total_timesteps=..., one of the two; got {given}"
        )
    if env_steps is None:
        return check_int("Trainer.learn: total_timesteps", total_timesteps, 1)
    return check_int("Trainer.learn: env_steps", env_steps, 1)


def _check_arg(name: str, value: Any) -> None:
    expected = _RUN_CHECKS[name](value, name)
    if expected is not None:
        raise ValueError(f"Trainer.run: {name} must be {expected}, got {value!r}")


def check_eval_plan(steps_per_eval: int | None, eval_env_config: Mapping[str, Any] | None) -> None:
    """Check before training that :meth:`rl8.Trainer.run` can evaluate as asked: a ``ValueError``
    for a ``steps_per_eval`` (training steps between two evaluations) that is not an int >= 1 or
    ``None``, or an ``eval_env_config`` (env parameters for evaluations) without it."""
    _check_arg("steps_per_eval", steps_per_eval)
    if eval_env_config and steps_per_eval is None:
        raise ValueError(
            "Trainer.run: eval_env_config is given but steps_per_eval is None, so no "
            "evaluation would use it; set steps_per_eval"
        )


def as_conditions(
    stop_conditions: Condition | Sequence[Condition] | None,
    *,
    max_env_steps: int | None = None,
    max_seconds: float | None = None,
) -> list[Condition]:
    """``Trainer.run``'s ``stop_conditions`` as a list, each checked to be a Condition, then
    ``HitsUpperBound("env/steps", max_env_steps)`` and ``TimeLimit(max_seconds)`` when given."""
    if stop_conditions is None:
        conditions = []
    elif isinstance(stop_conditions, Condition):
        conditions = [stop_conditions]
    elif isinstance(stop_conditions, (str, bytes)) or not isinstance(stop_conditions, Iterable):
        raise TypeError(
            f"Trainer.run: stop_conditions must be a rl8.training.conditions.Condition or a list of them, "
            f"got {stop_conditions!r}"
        )
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


def register_metric(config: TrainerConfig, steps_per_eval: int | None) -> str:
    """The stat that ranks the checkpoints for ``config.register_as`` in a run that evaluates every
    ``steps_per_eval`` training steps (``None``: never): ``config.register_metric``, else
    :data:`EVAL_RETURN` when the run evaluates and :data:`TRAINING_RETURN` when it does not."""
    if config.register_metric is not None:
        return config.register_metric
    return TRAINING_RETURN if steps_per_eval is None else EVAL_RETURN


def checkpoint_every(config: TrainerConfig, steps_per_eval: int | None) -> int | None:
    """The training steps between two checkpoints of a run that evaluates every
    ``steps_per_eval`` training steps (``None``: never): ``config.checkpoint_every``, else, when
    ``register_as`` ranks the checkpoints by an ``eval/`` stat, ``steps_per_eval`` (only the
    checkpoints written at evaluations have it); ``None``: only at the end and on signals."""
    if config.checkpoint_every is None and _ranks_by_eval(config, steps_per_eval):
        return steps_per_eval
    return config.checkpoint_every


def _ranks_by_eval(config: TrainerConfig, steps_per_eval: int | None) -> bool:
    """Whether ``register_as`` ranks the checkpoints by an ``eval/`` stat."""
    return config.register_as is not None and register_metric(config, steps_per_eval).startswith(
        EVAL_PREFIX
    )


def _check_register_plan(config: TrainerConfig, steps_per_eval: int | None) -> None:
    """A ``ValueError`` for a ``register_metric`` (an ``eval/`` stat) that no checkpoint of the
    run could have: the run never evaluates, or ``checkpoint_every`` is not a multiple of
    ``steps_per_eval``."""
    if not _ranks_by_eval(config, steps_per_eval):
        return
    metric, every = register_metric(config, steps_per_eval), config.checkpoint_every
    ranks = f"Trainer.run: register_as={config.register_as!r} ranks the checkpoints by {metric!r} (register_metric)"
    if steps_per_eval is None:
        raise ValueError(
            f"{ranks}, an evaluation stat, but steps_per_eval is None (this run never evaluates): "
            "pass steps_per_eval=N to evaluate every N training steps (rl8 train: --steps-per-eval "
            f"N), or leave register_metric None to rank them by the training return {TRAINING_RETURN!r}"
        )
    if every is not None and every % steps_per_eval:
        raise ValueError(
            f"{ranks}, an evaluation stat, which only the checkpoints written at evaluation steps "
            f"have: set checkpoint_every (now {every}) to a multiple of steps_per_eval (now "
            f"{steps_per_eval}), or leave it None for a checkpoint at every evaluation (rl8 train: "
            f"--checkpoint-every {steps_per_eval})"
        )


def check_run_plan(
    config: TrainerConfig, conditions: Sequence[Condition], steps_per_eval: int | None
) -> None:
    """Before training, check what the Trainer's ``config`` and the run's stop ``conditions`` need
    of evaluations (every ``steps_per_eval`` training steps, ``None``: never): a
    ``MissingStatError`` for a condition on an ``eval/`` stat in a run that never evaluates (it
    could never hold); a ``ValueError`` for ``record_every`` without evaluations, or for
    ``register_as`` ranking the checkpoints by an ``eval/`` stat (:func:`register_metric`) in a
    run that never evaluates or with a ``checkpoint_every`` not a multiple of ``steps_per_eval``."""
    for i, condition in enumerate(conditions if steps_per_eval is None else ()):
        for name in condition.stat_names():
            if name.startswith(EVAL_PREFIX):
                raise MissingStatError(
                    f"Trainer.run: stop_conditions[{i}] {condition!r} reads {name!r}, an evaluation "
                    "stat, but this run never evaluates (steps_per_eval=None), so it could never "
                    "hold: pass steps_per_eval=N to evaluate every N training steps (rl8 train: "
                    f"--steps-per-eval N), or bound the training stat {name[len(EVAL_PREFIX) :]!r}"
                )
    if config.record_every is not None and steps_per_eval is None:
        raise ValueError(
            f"Trainer.run: record_every={config.record_every} records a video at every "
            f"{config.record_every}-th evaluation, but steps_per_eval is None (no evaluations); "
            "set steps_per_eval"
        )
    _check_register_plan(config, steps_per_eval)


def run_params(run_args: Mapping[str, Any], conditions: Sequence[Condition]) -> dict[str, Any]:
    """The MLflow params ``run/*``: the run's arguments (``env_config``, ``eval_env_config``,
    ``steps_per_eval``) and its stop conditions."""
    return {
        "run": {
            "env_config": run_args.get("env_config") or {},
            "eval_env_config": run_args.get("eval_env_config") or {},
            "steps_per_eval": run_args.get("steps_per_eval"),
            "stop_conditions": repr(list(conditions)),
        }
    }
