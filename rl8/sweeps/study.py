"""``rl8 sweep``: an Optuna study of a config's hyper-parameters in an RDB storage, each trial a
process of its own and an MLflow run nested under the study's run (docs/sweeps.md)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Mapping
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from rl8 import presets
from rl8.ppo.algorithm import PPO
from rl8.ppo.hparams import HParams
from rl8.sweeps.space import read_space
from rl8.tracking import Tracker
from rl8.tracking.runs import tag_run
from rl8.training.callbacks import STOP, Callback
from rl8.training.conditions import MissingStatError
from rl8.training.config import TrainerConfig
from rl8.training.config_file import (
    ConfigError,
    assign,
    int_option,
    load_config,
    mapping_option,
    stop_conditions,
    trainer_options,
)
from rl8.training.run_args import check_eval_plan, check_run_plan
from rl8.training.signals import handling
from rl8.training.trainer import Trainer

__all__ = [
    "FINISHED_STATES",
    "GRACE_PERIOD_ENV",
    "HEARTBEAT_INTERVAL_ENV",
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEATS_OF_GRACE",
    "PRUNERS",
    "STATES",
    "SweepInterrupted",
    "TrialReport",
    "read_config",
    "state_counts",
    "sweep",
]

#: The pruners ``rl8 sweep --pruner`` names: Optuna's MedianPruner, SuccessiveHalvingPruner, none.
PRUNERS = ("median", "halving", "none")
#: The states of a trial that has ended (``optuna.trial.TrialState`` names).
FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")
#: Every state of a trial: the finished ones, then a trial training (``RUNNING``) or enqueued.
STATES = (*FINISHED_STATES, "RUNNING", "WAITING")
#: The heavy modules of a trial's process, imported once by the forkserver that forks the trials
#: (not rl8: a trial imports the rl8 of the sweep's sys.path).
_PRELOAD = ["torch", "optuna"]
#: Seconds an interrupted trial's process has to end after each of SIGINT and SIGTERM (then SIGKILL).
_STOP_WAIT_S = 30.0
#: Seconds a sweep that loads a study with no trials and no MLflow run waits for the sweep that
#: created it (started at the same time) to start the study's run, so that both share it.
_RUN_WAIT_S = 60.0
#: Seconds between the heartbeats of a trial's process in the study's storage (the default).
HEARTBEAT_INTERVAL_S = 30
#: The default grace period, in heartbeat intervals: a ``RUNNING`` trial whose last heartbeat is
#: older than this is stale (its process or machine died) and the next sweep marks it ``FAIL``.
HEARTBEATS_OF_GRACE = 4
#: The environment variable that sets ``sweep``'s heartbeat interval (seconds) when its argument
#: is ``None`` (so ``rl8 sweep`` reads it).
HEARTBEAT_INTERVAL_ENV = "RL8_SWEEP_HEARTBEAT_INTERVAL"
#: The environment variable that sets ``sweep``'s grace period (seconds) when its argument is
#: ``None``.
GRACE_PERIOD_ENV = "RL8_SWEEP_GRACE_PERIOD"


@dataclasses.dataclass(frozen=True)
class _TrialSpec:
    """What a trial's process needs to train (pickled to it)."""

    config: dict[str, Any]
    distributions: dict[str, Any]
    study: str
    storage: str
    pruner: Any
    startup_trials: int
    objective: str
    experiment: str
    tracking_uri: str
    parent_run_id: str
    max_env_steps: int | None
    max_seconds: float | None
    threads: int
    cwd: str
    heartbeat_interval: int


class TrialReport(Callback):
    """A Trainer callback that reports the stat ``stat`` (``eval/episodes/return_mean``) to the
    ``optuna.Trial`` ``trial`` at every step that has it (the evaluations, for an ``eval/`` stat),
    at step ``env/steps``, and stops the run when the trial's pruner prunes it.

    Attributes:
        value: The latest value reported (``None`` before the first).
        pruned: Whether the pruner stopped the run.
    """

    def __init__(self, trial: Any, stat: str) -> None:
        self.trial, self.stat = trial, stat
        self.value: float | None = None
        self.pruned = False

    def on_step(self, trainer: Any, stats: dict[str, float]) -> str | None:
        """Report the stat when the step has it; :data:`~rl8.training.callbacks.STOP` once pruned."""
        value = stats.get(self.stat)
        if value is None or not math.isfinite(value):
            return None
        self.value = float(value)
        self.trial.report(self.value, int(stats["env/steps"]))
        self.pruned = self.trial.should_prune()
        return STOP if self.pruned else None


def read_config(config: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """``(name, config)`` of an ``rl8 train`` config file or preset (``rl8 train CONFIG``);
    the name is the file's stem or the preset's name."""
    text = os.fspath(config)
    if not Path(text).exists() and (text.startswith(presets.PREFIX) or text in presets.names()):
        return text.removeprefix(presets.PREFIX), presets.load(text)
    read = load_config(text)
    if not read.get("env"):
        raise ConfigError(f"{text}: no env (env: rl8.envs.CartPole or a gymnasium id)")
    return Path(text).stem, read


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped :func:`sweep`: the trials it was running are ``FAIL`` in the study,
    their MLflow runs and the study's run ``KILLED``; running the sweep again continues the study.
    Its message is the line ``rl8 sweep`` prints.

    Attributes:
        study: The ``optuna.Study``.
        stopped: The numbers of the trials stopped.
        left: How many of the trials asked for did not run to their end (the stopped ones too).
        asked: How many trials the sweep was asked to run (its ``trials``).
    """

    def __init__(self, study: Any, stopped: list[int], left: int, asked: int) -> None:
        self.study, self.stopped, self.left, self.asked = study, stopped, left, asked
        if stopped:
            plural = "s" if len(stopped) > 1 else ""
            what = f"trial{plural} {', '.join(map(str, stopped))} marked FAIL"
        else:
            what = "no trial was running"
        if left:
            then = (
                f"rerun the same command to continue the study (--trials {left} runs the {left} "
                f"of its {asked} trials left)"
            )
        else:
            then = f"its {asked} trials had ended (the study's plots were not logged)"
        super().__init__(f"sweep {study.study_name}: interrupted: {what}; {then}")


def sweep(
    config: str | os.PathLike[str],
    space: str | os.PathLike[str] | Mapping[str, Any],
    *,
    trials: int,
    jobs: int = 1,
    study: str | None = None,
    storage: str | None = None,
    objective: str = "eval/episodes/return_mean",
    direction: str = "maximize",
    pruner: Any = "median",
    startup_trials: int = 5,
    max_env_steps: int | None = None,
    max_seconds: float | None = None,
    seed: int | None = None,
    no_stop_conditions: bool = False,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
) -> Any:
    """Run ``trials`` more trials of an Optuna study of ``config``'s hyper-parameters, ``jobs`` at
    once, each in a process of its own with ``torch.set_num_threads(cpu_count // jobs)``; the
    study (an ``optuna.Study``). Each trial is an MLflow run nested under the study's run, which
    holds the best value and params and the plots; a trial that raises or whose process dies is
    marked failed (its run ``FAILED``) and the sweep goes on. Running it again with the same study
    continues it; so does another sweep of it at the same time. Each trial's process records a
    heartbeat in the storage every ``heartbeat_interval`` seconds; a trial ``RUNNING`` without one
    for over ``grace_period`` seconds (its process or machine died) is marked ``FAIL`` and its run
    ``FAILED`` when a sweep of the study starts and before each trial it starts. Before the study
    or any run is made, the config's evaluation plan is checked as ``Trainer.run`` checks it, and
    an ``eval/`` objective needs evaluations that each trial's env-step budget reaches (with the
    largest ``num_envs`` and ``horizon`` the space samples).

    Args:
        config: An ``rl8 train`` config file or a preset name.
        space: The search space: a YAML file or its mapping (:func:`rl8.sweeps.space.read_space`).
        trials: Trials to run now (added to those the study holds).
        jobs: Trials at once (processes).
        study: The study's name; default: the config file's stem or the preset's name.
        storage: Optuna's storage URL (SQLAlchemy); default: ``sqlite:///optuna.db`` in the
            current folder.
        objective: The stat to optimise: its value at the trial's last evaluation.
        direction: ``"maximize"`` or ``"minimize"``.
        pruner: ``"median"``, ``"halving"``, ``"none"`` (:data:`PRUNERS`) or an ``optuna`` pruner.
        startup_trials: Trials sampled at random (TPE after) and never pruned by ``"median"``,
            which prunes from a third of ``max_env_steps`` on.
        max_env_steps: Each trial's budget in env steps; default: the config's ``max_steps``.
        max_seconds: Each trial's budget in seconds of training.
        seed: Seed of the sampler (trial ``i`` of the study samples with ``seed + i``); the
            trials train with the config's seed.
        no_stop_conditions: Leave out the config's ``stop_conditions`` (a preset's stop at the
            solved return), as ``rl8 train --no-stop-conditions``: each trial trains its budget.
        heartbeat_interval: Seconds between a trial's heartbeats (a whole number); default: the
            environment variable ``RL8_SWEEP_HEARTBEAT_INTERVAL``, else
            :data:`HEARTBEAT_INTERVAL_S` (30).
        grace_period: Seconds without a heartbeat after which a running trial is stale (a whole
            number, more than ``heartbeat_interval``); default: ``RL8_SWEEP_GRACE_PERIOD``, else
            :data:`HEARTBEATS_OF_GRACE` (4) heartbeat intervals. Give every sweep of a study the
            same: a shorter one marks the trials of a slower one stale.

    Raises:
        rl8.training.config_file.ConfigError: Before any trial, a bad argument, space or config.
        SweepInterrupted: Ctrl-C (a ``KeyboardInterrupt``), once the trials it stopped are
            ``FAIL`` and their runs and the study's run ``KILLED``.
    """
    import optuna

    name, config = read_config(config)
    if no_stop_conditions:  # e.g. a preset's stop at the solved return: each trial trains on
        config = {**config, "stop_conditions": []}
    distributions = read_space(space, config.get("hparams") or {})
    for key, value, least in (
        ("trials", trials, 1),
        ("jobs", jobs, 1),
        ("startup_trials", startup_trials, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"sweep: {key} must be an int >= {least}, got {value!r}")
    if max_env_steps is not None and (
        not isinstance(max_env_steps, int) or isinstance(max_env_steps, bool) or max_env_steps < 1
    ):
        raise ConfigError(f"sweep: max_env_steps must be an int >= 1 or None, got {max_env_steps!r}")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(f"sweep: direction must be 'maximize' or 'minimize', got {direction!r}")
    heartbeat_interval = _whole_seconds(
        "heartbeat_interval", heartbeat_interval, HEARTBEAT_INTERVAL_ENV, HEARTBEAT_INTERVAL_S
    )
    grace_period = _whole_seconds(
        "grace_period", grace_period, GRACE_PERIOD_ENV, HEARTBEATS_OF_GRACE * heartbeat_interval
    )
    if grace_period <= heartbeat_interval:
        raise ConfigError(
            f"sweep: grace_period must be more than heartbeat_interval ({heartbeat_interval} s), "
            f"got {grace_period}"
        )
    _check_plan(config, distributions, objective, max_env_steps)
    budget = max_env_steps or int_option(config, "max_steps", "config") or 0
    pruner = _pruner(pruner, startup_trials, budget)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or f"sqlite:///{Path('optuna.db').resolve()}"
    stale = _StaleTrials(grace_period)
    heartbeat_storage = _heartbeat_storage(storage, heartbeat_interval, grace_period, stale)
    the_study, created = _open_study(heartbeat_storage, study or name, direction)
    parent = Tracker(
        experiment=config.get("experiment") or str(config["env"]).rsplit(".", 1)[-1],
        run_name=the_study.study_name,
        tracking_uri=config.get("tracking_uri"),
        run_id=_study_run_id(the_study, created),
        tags={"rl8.sweep.study": the_study.study_name},
    )
    the_study.set_user_attr("mlflow_run_id", parent.start())
    parent.log_params(
        {"sweep": {"config": name, "objective": objective, "direction": direction, "storage": storage}}
    )
    spec = _TrialSpec(
        config,
        distributions,
        the_study.study_name,
        storage,
        pruner,
        startup_trials,
        objective,
        parent.experiment,
        parent.tracking_uri,
        parent.run_id,
        max_env_steps,
        max_seconds,
        max(1, (os.cpu_count() or 1) // jobs),
        os.getcwd(),
        heartbeat_interval,
    )
    processes = _TrialProcesses(spec, the_study, parent, stale)
    try:
        processes.run(trials, jobs, seed)
        _log_plots(the_study, parent)
    except KeyboardInterrupt:
        with handling([signal.SIGINT], signal.SIG_IGN):  # a second Ctrl-C: the ending goes on
            stopped = processes.stop()
            parent.end("KILLED")
        raise SweepInterrupted(the_study, stopped, trials - processes.ended, trials) from None
    except BaseException:
        parent.end("FAILED")
        raise
    parent.end("FINISHED")
    return the_study


def state_counts(study: Any) -> dict[str, int]:
    """How many trials of the ``optuna.Study`` ``study`` are in each state, by state name: every
    one of :data:`STATES` (0 included) first, so the counts add up to the trials."""
    return {**dict.fromkeys(STATES, 0), **Counter(t.state.name for t in study.trials)}


def _budgeted(config: Mapping[str, Any], max_env_steps: int | None) -> dict[str, Any]:
    """``config`` with a trial's budget: ``max_steps`` replaced by ``max_env_steps`` if given."""
    return {**config, "max_steps": max_env_steps or config.get("max_steps")}


def _trainer_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The Trainer options that ``config`` sets (one set to null keeps the Trainer's default)."""
    return {k: v for k, v in trainer_options(config, "config").items() if v is not None}


def _check_plan(
    config: Mapping[str, Any],
    distributions: Mapping[str, Any],
    objective: str,
    max_env_steps: int | None,
) -> None:
    """Before any trial, what every trial's ``Trainer.run`` would refuse of ``config``'s evaluation
    plan, stop conditions and Trainer options (``check_eval_plan``, ``check_run_plan``); for an
    ``eval/`` ``objective``, evaluations, and a budget (``max_env_steps``, else the config's
    ``max_steps``) that reaches the first (:func:`_check_budget`): a :class:`ConfigError`."""
    steps_per_eval = int_option(config, "steps_per_eval", "config")
    budgeted = _budgeted(config, max_env_steps)
    try:
        check_eval_plan(steps_per_eval, mapping_option(config, "eval_env_config", "config"))
        check_run_plan(
            TrainerConfig(**_trainer_options(config)), stop_conditions(budgeted), steps_per_eval
        )
    except (ValueError, MissingStatError) as exc:  # a KeyError's message is its first argument
        message = str(exc.args[0] if exc.args else exc).replace("Trainer.run: ", "")
        raise ConfigError(f"sweep: {message}") from None
    if not objective.startswith("eval/"):
        return
    if steps_per_eval is None:
        raise ConfigError(
            f"sweep: the objective {objective!r} is an evaluation stat: the config needs steps_per_eval"
        )
    budget = int_option(budgeted, "max_steps", "config")
    if budget is not None:
        where = (
            f"max_env_steps={budget} (--max-env-steps)"
            if max_env_steps
            else f"max_steps: {budget} of the config"
        )
        _check_budget(
            budget, where, steps_per_eval, config.get("hparams") or {}, distributions, objective
        )


def _check_budget(
    budget: int,
    where: str,
    steps_per_eval: int,
    hparams: Mapping[str, Any],
    distributions: Mapping[str, Any],
    objective: str,
) -> None:
    """A :class:`ConfigError` when a trial's ``budget`` (env steps; ``where`` says it) stops it
    before its first evaluation, at ``steps_per_eval`` training steps of ``num_envs * horizon``
    env steps each: the config's ``hparams`` or the largest values ``distributions`` (the space)
    samples, so that every trial reports ``objective``. A trial stops at the first training step
    that reaches the budget."""
    import optuna

    try:
        given = HParams.read_config(hparams, "hparams")
    except ValueError as exc:
        raise ConfigError(f"sweep: {exc}") from None
    defaults = {f.name: f.default for f in dataclasses.fields(HParams)}
    sizes, sampled = {}, []
    for field in ("num_envs", "horizon"):
        distribution = distributions.get(field)
        if distribution is None:
            sizes[field] = given.get(field) or defaults[field]
        else:  # the trials that sample the largest value evaluate last
            categorical = isinstance(distribution, optuna.distributions.CategoricalDistribution)
            sizes[field] = max(distribution.choices) if categorical else distribution.high
            sampled.append(field)
    per_step = sizes["num_envs"] * sizes["horizon"]
    if math.ceil(budget / per_step) >= steps_per_eval:
        return
    first = steps_per_eval * per_step
    largest = " and ".join(f"{field} {sizes[field]}" for field in sampled)
    trials = f"the trials that sample {largest} (the space's largest)" if sampled else "each trial"
    fields = [f"the space's largest {f}" if f in sampled else f for f in sizes]
    raise ConfigError(
        f"sweep: the budget {where} ends {trials} before the first evaluation, at {first} env steps "
        f"(steps_per_eval {steps_per_eval} x num_envs {sizes['num_envs']} x horizon "
        f"{sizes['horizon']}), so {'they' if sampled else 'it'} would never report {objective}: "
        f"raise the budget to {first} or more (--max-env-steps {first}), or lower steps_per_eval, "
        f"{fields[0]} or {fields[1]}"
    )


def _pruner(pruner: Any, startup_trials: int, budget: int) -> Any:
    """The pruner named; ``"median"`` prunes from a third of the trials' budget (as rl-zoo)."""
    import optuna

    if not isinstance(pruner, str):
        return pruner
    if pruner not in PRUNERS:
        raise ConfigError(
            f"sweep: pruner must be one of {', '.join(PRUNERS)} or an optuna pruner, got {pruner!r}"
        )
    return {
        "median": lambda: optuna.pruners.MedianPruner(
            n_startup_trials=startup_trials, n_warmup_steps=budget // 3
        ),
        "halving": optuna.pruners.SuccessiveHalvingPruner,
        "none": optuna.pruners.NopPruner,
    }[pruner]()


def _whole_seconds(name: str, value: int | None, env: str, default: int) -> int:
    """The argument ``name`` of :func:`sweep`, a whole number of seconds >= 1: ``value``, else
    the environment variable ``env``, else ``default``; a :class:`ConfigError` naming it when bad."""
    if value is None:
        text = os.environ.get(env)
        if text is None:
            return default
        if not text.strip().isdigit() or int(text) < 1:
            raise ConfigError(
                f"sweep: the environment variable {env} ({name}) must be a whole number of "
                f"seconds >= 1, got {text!r}"
            )
        return int(text)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"sweep: {name} must be a whole number of seconds >= 1, got {value!r}")
    return value


def _heartbeat_storage(url: str, interval: int, grace_period: int, stale: _StaleTrials) -> Any:
    """The ``optuna.storages.RDBStorage`` at ``url`` that fails the trials without a heartbeat for
    ``grace_period`` seconds (heartbeats every ``interval`` seconds) and tells ``stale`` of each.
    Of two sweeps that make a new storage at once, one writes its schema first: the other,
    refused, opens it again."""
    import optuna
    import sqlalchemy

    def open_storage() -> Any:
        with warnings.catch_warnings():  # Optuna's heartbeat is "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=stale.collect,
            )

    try:
        return open_storage()
    except sqlalchemy.exc.IntegrityError:  # the other sweep wrote the schema's version first
        return open_storage()


def _open_study(storage: Any, name: str, direction: str) -> tuple[Any, bool]:
    """The study ``name`` of ``storage``, made with ``direction`` if it is not there, and whether
    this call made it (of sweeps started at once, exactly one does)."""
    import optuna

    try:
        return optuna.create_study(storage=storage, study_name=name, direction=direction), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(study_name=name, storage=storage), False


def _study_run_id(study: Any, created: bool) -> str | None:
    """The id of the study's MLflow run (its user attribute ``mlflow_run_id``); ``None``: none yet.
    The sweep that did not create a study that has no trials and no run yet waits up to
    :data:`_RUN_WAIT_S` for the sweep that did (``created``) to start it, so that two sweeps
    started at once share one run."""
    deadline = time.monotonic() + _RUN_WAIT_S
    while True:
        run_id = study.user_attrs.get("mlflow_run_id")
        if run_id is not None or created or study.trials or time.monotonic() > deadline:
            return run_id
        time.sleep(0.2)


class _StaleTrials:
    """The trials that a sweep finds stale: Optuna's ``fail_stale_trials`` marks them ``FAIL`` and
    calls :meth:`collect` (the storage's ``heartbeat_stale_trial_callback``) for each it marked,
    then :meth:`end` ends their runs.

    Attributes:
        grace_period: Seconds without a heartbeat after which a running trial is stale.
        numbers: The trials' numbers collected and not ended yet.
    """

    def __init__(self, grace_period: int) -> None:
        self.grace_period = grace_period
        self.numbers: list[int] = []

    def collect(self, study: Any, trial: Any) -> None:
        """Keep the number of ``trial`` (an ``optuna.trial.FrozenTrial``, just marked ``FAIL``)."""
        self.numbers.append(trial.number)

    def end(self, study: Any, parent: Tracker) -> None:
        """Mark the stale trials of ``study`` ``FAIL``, end their runs ``FAILED`` (if still
        ``RUNNING``), print a line for each and log the study's counts on ``parent``."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        for number in self.numbers:
            run_id = _tag_trial_run(study, number, parent.tracking_uri, end_if_running="FAILED")
            print(
                f"rl8: sweep {study.study_name}: trial {number} had no heartbeat for over "
                f"{self.grace_period} s (its process or machine died): marked FAIL, its run "
                f"{run_id} FAILED",
                file=sys.stderr,
                flush=True,
            )
        if self.numbers:
            _log_counts(study, parent)
        self.numbers.clear()


class _Heartbeat(threading.Thread):
    """A trial process's thread: records the trial's heartbeat in the study's storage every
    ``interval`` seconds, and stops the trial (SIGINT, as Ctrl-C does) once the sweep's process
    is gone, so that a sweep that was killed leaves no trial training.

    Attributes:
        storage: The study's ``optuna.storages.RDBStorage``.
        trial_id: The trial's id in the storage (not its number).
        interval: Seconds between heartbeats.
        sweep_gone: Set when the sweep's process ended before the trial.
    """

    def __init__(self, storage: Any, trial_id: int, interval: int) -> None:
        super().__init__(name="rl8-sweep-heartbeat", daemon=True)
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.sweep_gone = threading.Event()
        self._stopped = threading.Event()

    def run(self) -> None:
        """Record heartbeats until :meth:`stop`; SIGINT this process when the sweep's ends."""
        sweep_process = multiprocessing.parent_process()
        while not self._stopped.is_set():
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as exc:  # a storage busy or away for a moment: the next one may reach it
                print(f"rl8: sweep: a trial's heartbeat was not recorded: {exc}", file=sys.stderr)
            if wait([sweep_process.sentinel], timeout=self.interval) and not self._stopped.is_set():
                self.sweep_gone.set()
                os.kill(os.getpid(), signal.SIGINT)
                return

    def stop(self) -> None:
        """Record no more heartbeats (the thread ends at its next wake, or with the process)."""
        self._stopped.set()


@dataclasses.dataclass
class _TrialProcess:
    """A trial's process and the pipe on which it sends its trial's number once asked."""

    process: Any
    receiver: Any
    number: int | None = None

    def read_number(self) -> int | None:
        """The trial's number once sent (``None`` before, or when the process ended first)."""
        if self.number is None:
            with contextlib.suppress(EOFError, OSError):  # the process ended without sending it
                if self.receiver.poll():
                    self.number = self.receiver.recv()
        return self.number


class _TrialProcesses:
    """The trial processes of one :func:`sweep`: :meth:`run` starts them, each trial ended by
    :func:`_end_trial` as its process ends; :meth:`stop` stops those running (Ctrl-C).

    Attributes:
        running: The processes running, by their sentinel.
        ended: How many trials ended by themselves (``FAIL`` too), not stopped.
    """

    def __init__(self, spec: _TrialSpec, study: Any, parent: Tracker, stale: _StaleTrials) -> None:
        self.spec, self.study, self.parent, self.stale = spec, study, parent, stale
        self.running: dict[Any, _TrialProcess] = {}
        self.ended = 0
        forkserver = "forkserver" in multiprocessing.get_all_start_methods()
        self.context = multiprocessing.get_context("forkserver" if forkserver else "spawn")
        if forkserver:
            self.context.set_forkserver_preload(_PRELOAD)

    def run(self, trials: int, jobs: int, seed: int | None) -> None:
        """Run ``trials`` trials, ``jobs`` at once, each after the stale trials are ended
        (:meth:`_StaleTrials.end`); trial ``i`` of the study samples with ``seed + i`` (``seed``
        ``None``: unseeded)."""
        first = len(self.study.trials)
        launched = 0
        while launched < trials or self.running:
            while launched < trials and len(self.running) < jobs:
                self.stale.end(self.study, self.parent)
                self._start(None if seed is None else seed + first + launched)
                launched += 1
            for sentinel in wait(list(self.running)):
                _end_trial(self.study, self.parent, self.running[sentinel], interrupted=False)
                # only now: a Ctrl-C while it was being ended ends it again, in stop()
                del self.running[sentinel]
                self.ended += 1

    def _start(self, sampler_seed: int | None) -> None:
        receiver, sender = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_run_trial, args=(self.spec, sampler_seed, sender))
        process.start()
        sender.close()
        self.running[process.sentinel] = _TrialProcess(process, receiver)

    def stop(self) -> list[int]:
        """Stop the running processes and end their trials as interrupted; the trials' numbers.
        Each process still alive gets SIGINT (its Trainer ends the run ``KILLED``; a second SIGINT,
        when Ctrl-C reached the trials too, stops it at once), then SIGTERM, then SIGKILL, each
        :data:`_STOP_WAIT_S` after the last."""
        processes = [trial.process for trial in self.running.values()]
        for stop in (_interrupt, BaseProcess.terminate, BaseProcess.kill):
            alive = [process for process in processes if process.is_alive()]
            for process in alive:
                with contextlib.suppress(ProcessLookupError):  # it has just ended
                    stop(process)
            deadline = time.monotonic() + _STOP_WAIT_S
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))
        numbers = [
            _end_trial(self.study, self.parent, t, interrupted=True) for t in self.running.values()
        ]
        self.running.clear()
        return [number for number in numbers if number is not None]


def _interrupt(process: BaseProcess) -> None:
    """Send SIGINT to ``process`` (on Windows, where only a console's Ctrl-C is, it terminates it)."""
    os.kill(process.pid, signal.SIGINT)


def _run_trial(spec: _TrialSpec, seed: int | None, sender: Any) -> None:
    """A trial's process: ask the study for a trial, send its number, train it
    (:func:`_train_trial`) with its heartbeat (:class:`_Heartbeat`). Ctrl-C ends it quietly with
    exit status 130 (its Trainer ends the run ``KILLED``; the sweep marks the trial ``FAIL``,
    :func:`_end_trial`); so does the end of the sweep's process, after which the trial marks
    itself ``FAIL``."""
    import optuna
    import torch

    # ignored until the sweep knows the trial's number, so that it can end every trial it started
    with handling([signal.SIGINT], signal.SIG_IGN):
        os.chdir(spec.cwd)
        torch.set_num_threads(spec.threads)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)
        storage = optuna.storages.RDBStorage(spec.storage)  # no heartbeat_interval: ask() warns
        study = optuna.load_study(
            study_name=spec.study, storage=storage, sampler=sampler, pruner=spec.pruner
        )
        trial = study.ask(spec.distributions)
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(spec.study), trial.number
        )
        sender.send(trial.number)
        sender.close()
    heartbeat = _Heartbeat(storage, trial_id, spec.heartbeat_interval)
    heartbeat.start()  # here, where SIGINT (which it sends once the sweep is gone) is handled again
    try:
        _train_trial(spec, study, trial)
    except KeyboardInterrupt:
        if heartbeat.sweep_gone.is_set():  # no sweep is left to end the trial
            _fail_if_running(study, trial.number)
            _tag_trial_run(study, trial.number, spec.tracking_uri, end_if_running="KILLED")
        raise SystemExit(130) from None
    finally:
        heartbeat.stop()


def _train_trial(spec: _TrialSpec, study: Any, trial: Any) -> None:
    """Train the config with the trial's hyper-parameters, reporting to it, and tell the study the
    trial's outcome: ``COMPLETE`` with its last value, ``PRUNED``, or ``FAIL`` for an exception
    (raised again: the process exits with 1 and prints it; the run ends ``FAILED``)."""
    import optuna

    config, report = spec.config, TrialReport(trial, spec.objective)
    try:
        hparams = copy.deepcopy(dict(config.get("hparams") or {}))
        for name, value in trial.params.items():
            assign(hparams, name.split("."), value)
        algo = PPO(config["env"], **HParams.from_config(hparams, "hparams").to_dict())
        trainer = Trainer(
            algo,
            **{
                **_trainer_options(config),
                "experiment": spec.experiment,
                "tracking_uri": spec.tracking_uri,
                "parent_run_id": spec.parent_run_id,
                "run_name": f"{spec.study}-{trial.number}",
                "progress": False,
            },
        )
        with trainer:  # FAILED when this block raises, even before the first step; KILLED on Ctrl-C
            if trainer.run_id is not None:
                trial.set_user_attr("mlflow_run_id", trainer.run_id)
            trainer.run(
                stop_conditions=stop_conditions(_budgeted(config, spec.max_env_steps)),
                max_seconds=spec.max_seconds,
                callbacks=[report],
                steps_per_eval=int_option(config, "steps_per_eval", "config"),
                env_config=mapping_option(config, "env_config", "config"),
                eval_env_config=mapping_option(config, "eval_env_config", "config"),
            )
            if report.value is None and not report.pruned:
                raise RuntimeError(
                    f"trial {trial.number} ended before its first {spec.objective}: "
                    f"{trainer.stopped_by!r} stopped it first"
                )
    except Exception:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    if report.pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, report.value)


def _end_trial(study: Any, parent: Tracker, process: _TrialProcess, *, interrupted: bool) -> int | None:
    """After a trial's process ended, end what it could not (the process tells its trial's outcome
    itself): a trial still ``RUNNING`` is marked ``FAIL``, and its MLflow run, if still
    ``RUNNING``, ends ``KILLED`` when the sweep was ``interrupted``, else ``FAILED`` (its process
    died). Then the run's tags, the study's run's counts and best, and (unless ``interrupted``:
    the sweep prints one line for all) a line. The trial's number; ``None`` when the process
    ended before it had a trial."""
    number = process.read_number()
    if number is None:
        print(
            f"rl8: sweep: a trial process ended (exit code {process.process.exitcode}) before its "
            "trial started",
            file=sys.stderr,
        )
        return None
    ended_here = _fail_if_running(study, number)
    status = "KILLED" if interrupted else "FAILED"
    run_id = _tag_trial_run(
        study, number, parent.tracking_uri, end_if_running=status if ended_here else None
    )
    metrics = _log_counts(study, parent)
    if not interrupted:
        trial = study.trials[number]
        value = "" if trial.value is None else f" {trial.value:.4g}"
        print(
            f"rl8: sweep {study.study_name}: trial {number} {trial.state.name}{value} {trial.params} "
            f"(run {run_id}); best: {metrics.get('best/value')}",
            file=sys.stderr,
            flush=True,
        )
    return number


def _fail_if_running(study: Any, number: int) -> bool:
    """Mark the trial ``number`` of ``study`` ``FAIL`` if it is still ``RUNNING``; whether it was."""
    from optuna.trial import TrialState

    if study.trials[number].state != TrialState.RUNNING:
        return False
    study.tell(number, state=TrialState.FAIL)
    return True


def _tag_trial_run(
    study: Any, number: int, tracking_uri: str, *, end_if_running: str | None
) -> str | None:
    """Tag the MLflow run of the trial ``number`` of ``study`` with its study, number and state
    (``rl8.sweep.*``), first ending it with the status ``end_if_running`` if it is still
    ``RUNNING`` (:func:`rl8.tracking.runs.tag_run`); the run's id (``None``: the trial has none)."""
    trial = study.trials[number]
    run_id = trial.user_attrs.get("mlflow_run_id")
    if run_id is not None:
        tags = {
            "rl8.sweep.state": trial.state.name,
            "rl8.sweep.study": study.study_name,
            "rl8.sweep.trial": number,
        }
        tag_run(tracking_uri, run_id, tags, end_if_running=end_if_running)
    return run_id


def _log_counts(study: Any, parent: Tracker) -> dict[str, float]:
    """Log on the study's run ``parent`` the trials of ``study`` in each state
    (``trials/<state>``), and the best value (``best/value``) and its trial and params (tags
    ``best/*``) once a trial is complete, at step "trials finished"; the metrics logged."""
    counts = state_counts(study)
    metrics = {f"trials/{state.lower()}": count for state, count in counts.items()}
    if counts["COMPLETE"]:
        best = study.best_trial
        metrics["best/value"] = best.value
        tag_run(
            parent.tracking_uri,
            parent.run_id,
            {f"best/{k}": v for k, v in {"trial": best.number, **best.params}.items()},
        )
    parent.log_metrics(metrics, step=sum(counts[state] for state in FINISHED_STATES))
    return metrics


def _log_plots(study: Any, parent: Any) -> None:
    """The study's optimisation history, parameter importances and intermediate values as PNG
    artifacts ``plots/`` of its run (a plot the trials cannot make yet is left out)."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna.visualization.matplotlib is "experimental"
        for name in ("optimization_history", "param_importances", "intermediate_values"):
            try:
                axes = getattr(plots, f"plot_{name}")(study)
            except (ValueError, RuntimeError, ZeroDivisionError) as exc:
                print(f"rl8: sweep: no {name} plot yet: {exc}", file=sys.stderr)
                continue
            path = Path(folder) / f"{name}.png"
            axes.figure.savefig(path, bbox_inches="tight")
            plt.close(axes.figure)
            parent.log_artifact(path, "plots")
