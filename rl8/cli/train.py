"""``rl8 train``: train from a YAML config (or a preset) and flags, or resume from a checkpoint
(``docs/cli.md``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl8.cli.common import config_errors, import_given, same_env, unregistered
from rl8.fields import did_you_mean
from rl8.training.config_file import (
    RESUMABLE_HPARAMS,
    RUN_KEYS,
    TRAINER_OPTIONS,
    ConfigError,
    assign,
    check_config,
    hparam_names,
    int_option,
    load_config,
    mapping_option,
    parse_assignment,
    stop_conditions,
    trainer_options,
    unknown_hparam,
)

__all__ = ["run"]


def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config keys, hparams) given on the command line."""
    flags = [name for name, option in TRAINER_OPTIONS.items() if option["cli"] == "flag"]
    keys = ("env", "max_steps", "steps_per_eval", *flags)
    config = {key: getattr(args, key) for key in keys if getattr(args, key, None) is not None}
    if args.no_stop_conditions:  # e.g. a preset's stop at the solved return: train on
        config["stop_conditions"] = []
    hparams: dict[str, Any] = {}
    fields = hparam_names()
    for text in args.set or []:
        path, value = parse_assignment(text, "--set")
        if path[0] not in fields:
            raise unknown_hparam(path[0], f"--set {text}")
        assign(hparams, path, value)
    return config, hparams


def _merge_hparams(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_hparams(out[key], value)
        else:
            out[key] = value
    return out


def _task_hparams(env: Any) -> dict[str, Any]:
    """The hyper-parameters of ``--task-hparams``: the rsl_rl runner config that the named task
    ``env``'s simulator registers (``rl8.envs.tasks.task_runner_cfg``), mapped by
    ``rl8.presets.from_rsl_rl`` (which warns of the fields it cannot map)."""
    from rl8.envs.tasks import TASK_RUNNER_CONFIGS, task_runner_cfg
    from rl8.presets import from_rsl_rl

    prefix = str(env).partition(":")[0]
    if not isinstance(env, str) or ":" not in env or prefix not in TASK_RUNNER_CONFIGS:
        raise ConfigError(
            f"--task-hparams needs a named task of a simulator that registers rsl_rl configs "
            f"('<prefix>:<task>' with a prefix of {sorted(TASK_RUNNER_CONFIGS)}), got env {env!r}"
        )
    with config_errors(f"--task-hparams: env {env!r}: ", (ValueError, ImportError)):
        return from_rsl_rl(task_runner_cfg(env)).hparams


def _algorithm(name: Any, where: str) -> Any:
    """The algorithm class a config (or a checkpoint) names (``rl8.training.resume.ALGORITHMS``)."""
    from rl8.training.resume import ALGORITHMS

    if name not in ALGORITHMS:
        raise ConfigError(f"{where}: expected one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]


def _build_hparams(hparams: Mapping[str, Any], algo_cls: Any = None) -> Any:
    from rl8.ppo.hparams import HParams

    hparams_cls = HParams if algo_cls is None else algo_cls.hparams_cls
    with config_errors(errors=(TypeError, ValueError)):
        return hparams_cls.from_config(hparams, "hparams")


def _summary(trainer: Any) -> None:
    """With ``--quiet``: what ``Trainer.run`` prints at the end unless quiet (scripts read it)."""
    from rl8.training.progress import results_lines

    if trainer.config.progress is not False or not trainer.algo.dist.is_main:
        return  # Trainer.run printed it; under torchrun only rank 0 prints
    print("\n".join(results_lines(trainer)), flush=True)


def _config_file(arg: str) -> str | os.PathLike[str]:
    """The config file that ``rl8 train ARG`` reads (see ``docs/cli.md#presets``): a preset or a
    path; a name that is neither is a :class:`ConfigError` naming the close presets."""
    from rl8 import presets

    if arg.startswith(presets.PREFIX) or (not Path(arg).exists() and arg in presets.names()):
        with config_errors():
            return presets.path(arg)
    if (
        Path(arg).exists()
        or "/" in arg
        or os.sep in arg
        or Path(arg).suffix.lower() in (".yaml", ".yml")
    ):
        return arg
    import gymnasium

    hint = did_you_mean(arg, close=presets.close_names(arg)) or "."
    unknown = f"no preset or config file {arg!r}{hint} Presets: {', '.join(presets.names())}."
    if arg in gymnasium.registry:
        raise ConfigError(
            f"{unknown} {arg} is a gymnasium id without a preset: train it with rl8 train --env {arg}"
        )
    raise ConfigError(f"{unknown} To train a gymnasium id without a preset: rl8 train --env ID")


def run(args: argparse.Namespace) -> int:
    """``rl8 train``: train (or resume) as ``args`` (the parsed command line) say and print where
    the results are; the exit status."""
    from rl8.ppo.distributed import init_distributed, rank_device
    from rl8.training.trainer import Trainer

    if args.old_file:
        raise ConfigError(
            f"rl8 train takes the config file as its argument: rl8 train {args.old_file} "
            "(rl8 1.0's -f/--file is gone; see docs/migrating.md)"
        )
    if args.model_cls and not args.resume:
        raise ConfigError(
            "--model-cls applies with --resume (a model class stored as __main__.Net); for a "
            f"new run: --set model_cls={args.model_cls}"
        )
    if args.trust_code and not args.resume:
        raise ConfigError(
            "--trust-code only applies with --resume (it lets a checkpoint you trust "
            "name a plain function as its env factory)"
        )
    file_config = load_config(_config_file(args.config)) if args.config else {}
    cli_config, cli_hparams = _overrides(args)
    # under torchrun: join the process group (with --actors: as actor or learner)
    actors = cli_config.get("actors", file_config.get("actors"))
    with config_errors():
        init_distributed(
            actors=int_option({"actors": actors}, "actors", "config") if actors is not None else None
        )
    given_hparams = _merge_hparams(file_config.get("hparams") or {}, cli_hparams)
    progress = False if args.quiet else None

    if args.resume:
        if args.task_hparams:
            raise ConfigError(
                "--task-hparams applies to a new run: a resumed run keeps its checkpoint's "
                "hyper-parameters"
            )
        return _resume(args, file_config, cli_config, given_hparams, progress)

    config = {**file_config, **cli_config}
    check_config({k: v for k, v in config.items() if k != "hparams"}, "config")
    env = config.get("env")
    if not env:
        raise ConfigError("no env: name one in the config file (env: rl8.envs.CartPole) or with --env")
    if args.task_hparams:
        given_hparams = _merge_hparams(_task_hparams(env), given_hparams)
    algo_cls = _algorithm(config.get("algorithm", "PPO"), "config algorithm")
    hparams = _build_hparams(given_hparams, algo_cls)
    hparams = hparams.replace(
        device=rank_device(hparams.device)
    )  # under torchrun with CUDA: cuda:LOCAL_RANK
    conditions = stop_conditions(config)
    run_args = _run_args(config)
    algo = _build_algo(env, hparams, algo_cls, config.get("teacher"))
    _check_env_configs(algo, run_args)
    max_steps = int_option(config, "max_steps", "config")
    if max_steps is not None and max_steps < algo.hparams.batch_size:
        print(
            f"rl8: note: max_steps counts env steps (rl8 1.0: training steps); {max_steps} is less "
            f"than one training step ({algo.hparams.batch_size} env steps), so one step is trained",
            file=sys.stderr,
        )
    stored = {k: v for k, v in config.items() if k in RUN_KEYS or k == "env"}
    stored["hparams"] = given_hparams
    # an option set to null in the file keeps the Trainer's default
    options = {k: v for k, v in trainer_options(config, "config").items() if v is not None}
    trainer = Trainer(algo, progress=progress, metadata={"config": stored}, **options)
    return _run(trainer, conditions, run_args)


def _run_args(config: Mapping[str, Any], stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The arguments of ``Trainer.run`` that ``config`` gives, else those ``stored``; their
    evaluation plan checked."""
    from rl8.training.run_args import check_eval_plan

    read = {
        "env_config": mapping_option,
        "eval_env_config": mapping_option,
        "steps_per_eval": int_option,
    }
    stored = stored or {}
    out = {
        key: option(config, key, "config") if key in config else stored.get(key)
        for key, option in read.items()
    }
    with config_errors():
        check_eval_plan(out["steps_per_eval"], out["eval_env_config"])
    return out


def _build_algo(env: str, hparams: Any, algo_cls: Any, teacher: Any) -> Any:
    import gymnasium

    extra = {}
    if algo_cls.algorithm == "Distillation":
        extra["teacher"] = _teacher(teacher, hparams)
    elif teacher is not None:
        raise ConfigError(f"config teacher: only applies with algorithm: Distillation, got {teacher!r}")
    with config_errors(
        f"cannot build {algo_cls.algorithm} for env {env!r}: ",
        (ValueError, TypeError, ImportError, KeyError, gymnasium.error.Error),
    ):
        import_given(env, "env")
        for key in ("model_cls", "distribution_cls", "optimizer_cls"):
            import_given(getattr(hparams, key), f"hparam {key}")
        return algo_cls(env, **hparams.to_dict(), **extra)


def _teacher(source: Any, hparams: Any) -> Any:
    """The teacher policy a config's ``teacher`` names (:func:`rl8.load_policy`)."""
    from rl8.io.checkpoint import CheckpointError
    from rl8.io.export import load_policy

    if not isinstance(source, str) or not source:
        raise ConfigError(
            "config teacher: algorithm Distillation needs the teacher's policy (a policy file, "
            f"checkpoint, folder, run id or models:/ URI), got {source!r}"
        )
    with config_errors("config teacher: ", (CheckpointError, FileNotFoundError, ValueError)):
        return load_policy(source, map_location=hparams.resolved_device())


def _check_env_configs(algo: Any, run_args: Mapping[str, Any]) -> None:
    """:func:`rl8.ppo.algorithm.check_env_configs` of the run's env configs, a :class:`ConfigError`
    before the MLflow run is created."""
    from rl8.ppo.algorithm import check_env_configs

    with config_errors():
        check_env_configs(algo, {key: run_args.get(key) for key in ("env_config", "eval_env_config")})


def _resume(
    args: argparse.Namespace,
    file_config: Mapping[str, Any],
    cli_config: Mapping[str, Any],
    given_hparams: Mapping[str, Any],
    progress: bool | None,
) -> int:
    from rl8.io.checkpoint import CheckpointError
    from rl8.io.checkpoint_dir import read_checkpoint
    from rl8.ppo.hparams import changed_hparams
    from rl8.training.trainer import Trainer

    tracking_uri = cli_config.get("tracking_uri") or file_config.get("tracking_uri")
    tracking_uri = None if tracking_uri is None else str(tracking_uri)
    # under torchrun rank 0 reads the file and hands every rank its own part
    path, state = read_checkpoint(args.resume, tracking_uri=tracking_uri)
    if not isinstance(state.get("algo"), Mapping) or not isinstance(state.get("trainer"), Mapping):
        raise CheckpointError(f"{path} is an rl8 checkpoint but not a Trainer checkpoint")
    stored_hparams = state["algo"].get("hparams")
    if not isinstance(stored_hparams, Mapping):
        raise CheckpointError(
            f"{path}: entry 'algo.hparams' must be a dict of hyper-parameters, "
            f"got {type(stored_hparams).__name__}"
        )
    stored_config = dict((state["trainer"].get("metadata") or {}).get("config") or {})
    # the model is fixed by the checkpoint: only settings that do not change it may differ
    env = cli_config.get("env") or file_config.get("env")
    with config_errors(f"--resume: cannot import env {env!r}: ", (ImportError, ValueError)):
        import_given(env, "env")
    stored_env = (state.get("env") or {}).get("spec")
    if env and stored_env and not same_env(env, stored_env, source=path, trust_code=args.trust_code):
        raise ConfigError(f"--resume: the checkpoint was trained on env {stored_env!r}, not {env!r}")
    # an env class this process lacks (a script's __main__.Reach) is handed over with --env
    handed = env if env and stored_env and unregistered(stored_env, args.trust_code) else None
    algo_cls = _algorithm(state["algo"].get("algorithm", "PPO"), f"{path}: entry 'algo.algorithm'")
    hparams = _build_hparams(_merge_hparams(stored_hparams, given_hparams), algo_cls)
    merged = hparams.to_plain()
    changed = changed_hparams(stored_hparams, merged, may_change=RESUMABLE_HPARAMS)
    if changed:
        detail = ", ".join(
            f"{k} (checkpoint: {saved!r}, given: {given!r})" for k, (saved, given) in changed.items()
        )
        raise ConfigError(f"--resume: hyper-parameters cannot change when resuming: {detail}")
    resumable = {k: merged[k] for k in RESUMABLE_HPARAMS}
    overrides = {k: given for k, (_, given) in changed_hparams(stored_hparams, resumable).items()}
    if args.model_cls:  # a class of yours for the stored one (a script's __main__.Net)
        with config_errors("--model-cls: ", (ImportError, ValueError)):
            import_given(args.model_cls, "--model-cls")
        overrides["model_cls"] = args.model_cls

    config = {**stored_config, **{k: v for k, v in file_config.items() if k != "hparams"}, **cli_config}
    check_config({k: v for k, v in config.items() if k != "hparams"}, "config")
    # the config's conditions, else those the checkpoint's run used (also when run from Python)
    conditions = stop_conditions(config)
    if not conditions and not args.no_stop_conditions:
        conditions = _checkpoint_conditions(state["trainer"], path)
    # how the checkpoint's run() was called, unless the config or flags say otherwise
    run_args = _run_args(config, state["trainer"].get("run") or {})
    # the options given change the resumed Trainer's, except those naming its MLflow run
    given = trainer_options({**file_config, **cli_config}, "config")
    kwargs: dict[str, Any] = {k: v for k, v in given.items() if not TRAINER_OPTIONS[k]["names_run"]}
    kwargs["progress"] = progress
    stored_config.update({k: v for k, v in config.items() if k in RUN_KEYS})
    kwargs["metadata"] = {**(state["trainer"].get("metadata") or {}), "config": stored_config}
    trainer = Trainer.from_checkpoint(
        path,
        env=handed,
        hparams=overrides,
        tracking_uri=tracking_uri,
        trust_code=args.trust_code,
        **kwargs,
    )
    try:  # before any step
        _check_env_configs(trainer.algo, run_args)
    except ConfigError:
        trainer.close("FAILED")
        raise
    return _run(trainer, conditions, run_args)


def _checkpoint_conditions(saved: Mapping[str, Any], path: Any) -> list[Any]:
    """The stop conditions recorded in a Trainer checkpoint, rebuilt from their stored
    ``from_config`` mappings (``Trainer.run`` restores their state)."""
    from rl8.training.conditions import from_config, with_current_stat_names

    states = saved.get("stop_conditions") or []
    if not states:
        return []
    configs = saved.get("stop_condition_configs")
    if not isinstance(configs, list) or len(configs) != len(states) or None in configs:
        kinds = ", ".join(str(s.get("type") if isinstance(s, Mapping) else s) for s in states)
        raise ConfigError(
            f"--resume: {path} was trained with stop conditions ({kinds}) that it cannot "
            "rebuild (a condition class of your own, or a checkpoint of an older rl8); give "
            "the stop conditions again with --max-steps or a config file's stop_conditions"
        )
    with config_errors(f"--resume: {path}: stored stop condition: ", (ValueError, TypeError)):
        return [from_config(with_current_stat_names(config)) for config in configs]


def _run(trainer: Any, conditions: list[Any], run_args: Mapping[str, Any]) -> int:
    from rl8.training.conditions import MissingStatError
    from rl8.training.run_args import check_run_plan

    with config_errors():  # before training, like a stop condition's missing stat
        check_run_plan(trainer.config, [], run_args["steps_per_eval"])
    try:
        trainer.run(stop_conditions=conditions, **run_args)
    except KeyboardInterrupt:
        _summary(trainer)
        return 130
    except SystemExit:
        _summary(trainer)
        raise
    except MissingStatError as exc:  # a stop condition names a stat that does not exist
        raise ConfigError(f"stop_conditions: {exc}") from None
    trainer.close("FINISHED")
    _summary(trainer)
    return 0
