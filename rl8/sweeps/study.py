"""``rl8 sweep``: an Optuna study of a config's hyper-parameters in an RDB storage, each trial a
process of its own and an MLflow run nested under the study's run (docs/sweeps.md)."""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing
import os
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from rl8 import presets
from rl8.ppo.algorithm import PPO
from rl8.ppo.hparams import HParams
from rl8.sweeps.space import read_space
from rl8.tracking import Tracker
from rl8.tracking.runs import tag_run
from rl8.training.callbacks import STOP, Callback
from rl8.training.config_file import (
    ConfigError,
    assign,
    int_option,
    load_config,
    mapping_option,
    stop_conditions,
    trainer_options,
)
from rl8.training.trainer import Trainer

__all__ = ["PRUNERS", "TrialReport", "read_config", "sweep"]

#: The pruners ``rl8 sweep --pruner`` names: Optuna's MedianPruner, SuccessiveHalvingPruner, none.
PRUNERS = ("median", "halving", "none")
#: The heavy modules of a trial's process, imported once by the forkserver that forks the trials
#: (not rl8: a trial imports the rl8 of the sweep's sys.path).
_PRELOAD = ["torch", "optuna"]


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
) -> Any:
    """Run ``trials`` more trials of an Optuna study of ``config``'s hyper-parameters, ``jobs`` at
    once, each in a process of its own with ``torch.set_num_threads(cpu_count // jobs)``; the
    study (an ``optuna.Study``). Each trial is an MLflow run nested under the study's run, which
    holds the best value and params and the plots; a trial that raises or whose process dies is
    marked failed and the sweep goes on. Running it again with the same study continues it.

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
    """
    import optuna

    name, config = read_config(config)
    distributions = read_space(space, config.get("hparams") or {})
    for key, value, least in (
        ("trials", trials, 1),
        ("jobs", jobs, 1),
        ("startup_trials", startup_trials, 0),
    ):
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"sweep: {key} must be an int >= {least}, got {value!r}")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(f"sweep: direction must be 'maximize' or 'minimize', got {direction!r}")
    if objective.startswith("eval/") and not config.get("steps_per_eval"):
        raise ConfigError(
            f"sweep: the objective {objective!r} is an evaluation stat: the config needs steps_per_eval"
        )
    pruner = _pruner(
        pruner, startup_trials, max_env_steps or int_option(config, "max_steps", "config") or 0
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or f"sqlite:///{Path('optuna.db').resolve()}"
    the_study = optuna.create_study(
        storage=storage, study_name=study or name, direction=direction, load_if_exists=True
    )
    parent = Tracker(
        experiment=config.get("experiment") or str(config["env"]).rsplit(".", 1)[-1],
        run_name=the_study.study_name,
        tracking_uri=config.get("tracking_uri"),
        run_id=the_study.user_attrs.get("mlflow_run_id"),
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
    )
    status = "KILLED"
    try:
        for number, exitcode in _trial_processes(spec, trials, jobs, seed, len(the_study.trials)):
            _after_trial(the_study, parent, number, exitcode)
        _log_plots(the_study, parent)
        status = "FINISHED"
    finally:
        parent.end(status)
    return the_study


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


def _trial_processes(
    spec: _TrialSpec, trials: int, jobs: int, seed: int | None, first: int
) -> Iterator[tuple[int | None, int | None]]:
    """Start ``trials`` trial processes, ``jobs`` at once; yield each one's ``(trial number,
    exit code)`` as it ends (the number is ``None`` when it died before asking for a trial)."""
    forkserver = "forkserver" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if forkserver else "spawn")
    if forkserver:
        context.set_forkserver_preload(_PRELOAD)
    running: dict[Any, tuple[Any, Any]] = {}
    launched = 0
    try:
        while launched < trials or running:
            while launched < trials and len(running) < jobs:
                receiver, sender = context.Pipe(duplex=False)
                sampler_seed = None if seed is None else seed + first + launched
                process = context.Process(target=_run_trial, args=(spec, sampler_seed, sender))
                process.start()
                sender.close()
                running[process.sentinel] = (process, receiver)
                launched += 1
            for sentinel in wait(list(running)):
                process, receiver = running.pop(sentinel)
                process.join()
                yield (receiver.recv() if receiver.poll() else None), process.exitcode
    finally:  # interrupted: the trials end as the Trainer ends on SIGTERM (KILLED)
        for process, _ in running.values():
            process.terminate()
            process.join()


def _run_trial(spec: _TrialSpec, seed: int | None, sender: Any) -> None:
    """A trial's process: ask the study for a trial, send its number, train the config with the
    trial's hyper-parameters reporting to it, tell the result (a failure for any exception, which
    is raised again: the process exits with 1)."""
    import optuna
    import torch

    os.chdir(spec.cwd)
    torch.set_num_threads(spec.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)
    study = optuna.load_study(
        study_name=spec.study, storage=spec.storage, sampler=sampler, pruner=spec.pruner
    )
    trial = study.ask(spec.distributions)
    sender.send(trial.number)
    sender.close()
    config, report = spec.config, TrialReport(trial, spec.objective)
    try:
        hparams = copy.deepcopy(dict(config.get("hparams") or {}))
        for name, value in trial.params.items():
            assign(hparams, name.split("."), value)
        algo = PPO(config["env"], **HParams.from_config(hparams, "hparams").to_dict())
        options = {k: v for k, v in trainer_options(config, "config").items() if v is not None}
        trainer = Trainer(
            algo,
            **{
                **options,
                "experiment": spec.experiment,
                "tracking_uri": spec.tracking_uri,
                "parent_run_id": spec.parent_run_id,
                "run_name": f"{spec.study}-{trial.number}",
                "progress": False,
            },
        )
        if trainer.run_id is not None:
            trial.set_user_attr("mlflow_run_id", trainer.run_id)
        budget = {**config, "max_steps": spec.max_env_steps or config.get("max_steps")}
        with trainer:  # FAILED when the run raises, even before its first step
            trainer.run(
                stop_conditions=stop_conditions(budget),
                max_seconds=spec.max_seconds,
                callbacks=[report],
                steps_per_eval=int_option(config, "steps_per_eval", "config"),
                env_config=mapping_option(config, "env_config", "config"),
                eval_env_config=mapping_option(config, "eval_env_config", "config"),
            )
        if report.value is None and not report.pruned:
            raise RuntimeError(f"trial {trial.number} ended before its first {spec.objective}")
    except BaseException:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    if report.pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, report.value)


def _after_trial(study: Any, parent: Any, number: int | None, exitcode: int | None) -> None:
    """Mark a trial whose process died failed, tag its run, update the study's run and print."""
    from optuna.trial import TrialState

    if number is None:
        print(
            f"rl8: sweep: a trial process ended (exit code {exitcode}) before its trial started",
            file=sys.stderr,
        )
        return
    trial = study.trials[number]
    killed = trial.state == TrialState.RUNNING
    if killed:  # its process died
        study.tell(number, state=TrialState.FAIL)
        trial = study.trials[number]
    run_id = trial.user_attrs.get("mlflow_run_id")
    if run_id is not None:
        tags = {
            "rl8.sweep.state": trial.state.name,
            "rl8.sweep.study": study.study_name,
            "rl8.sweep.trial": number,
        }
        tag_run(parent.tracking_uri, run_id, tags, fail_if_running=killed)
    counts = Counter(t.state.name for t in study.trials)
    metrics = {f"trials/{state.lower()}": counts[state] for state in ("COMPLETE", "PRUNED", "FAIL")}
    if counts["COMPLETE"]:
        best = study.best_trial
        metrics["best/value"] = best.value
        tag_run(
            parent.tracking_uri,
            parent.run_id,
            {f"best/{k}": v for k, v in {"trial": best.number, **best.params}.items()},
        )
    parent.log_metrics(metrics, step=sum(counts.values()))
    value = "" if trial.value is None else f" {trial.value:.4g}"
    print(
        f"rl8: sweep {study.study_name}: trial {number} {trial.state.name}{value} {trial.params} "
        f"(run {run_id}); best: {metrics.get('best/value')}",
        file=sys.stderr,
        flush=True,
    )


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
