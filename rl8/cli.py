"""The ``rl8`` command: train from a YAML config or flags, resume, evaluate a saved policy.

::

    rl8 train examples/cartpole.yaml
    rl8 train --env rl8.envs.CartPole --set horizon=64 --set lr=3e-4 --max-steps 200000
    rl8 train --resume checkpoints/<run id>            # or a checkpoint file, or a run id
    rl8 eval <run id or policy/checkpoint path> --episodes 10
    rl8 record <run id or policy/checkpoint path> -o cartpole.mp4
    rl8 runs --clean                                   # mark runs of dead processes FAILED
    python -m rl8 --version

See ``docs/cli.md``. Configuration mistakes (an unknown key, a bad value) print one line on
stderr and exit with status 2; other known failures (tracking server down, missing or corrupt
checkpoint) exit with status 1; SIGINT exits with 130 and SIGTERM with 143 after a checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._fields import read_numbers
from .config import TrainerConfig

__all__ = [
    "CONFIG_KEYS", "MAX_YAML_DEPTH", "MAX_YAML_VALUES", "ConfigError", "build_parser", "load_config", "main",
    "parse_assignment",
]

#: The Trainer options that ``rl8 train`` takes (in a config file; those marked ``"flag"`` also
#: as flags), declared in :class:`rl8.config.TrainerConfig`.
_TRAINER_OPTIONS = {f.name: f.metadata for f in dataclasses.fields(TrainerConfig) if f.metadata["cli"]}

#: Top-level keys of a ``rl8 train`` config file.
CONFIG_KEYS: dict[str, str] = {
    "env": "the env: a dotted path to an rl8.Env subclass (rl8.envs.CartPole) or a gymnasium id",
    "hparams": "PPO's hyper-parameters (see rl8.HParams)",
    "env_config": "env parameters for training resets (Trainer.run(env_config=...))",
    "eval_env_config": "env parameters for evaluations (default: env_config)",
    "steps_per_eval": "evaluate every this many training steps",
    "stop_conditions": "list of stop conditions (rl8.conditions.from_config specs)",
    "max_steps": "stop after this many env steps (adds hits_upper_bound on env/steps)",
    **{name: option["doc"] for name, option in _TRAINER_OPTIONS.items()},
}

#: Keys that describe *how to run* (they may change when resuming); the rest define the model.
_RUN_KEYS = ("env_config", "eval_env_config", "steps_per_eval", "stop_conditions", "max_steps")
#: Hyper-parameters that may differ when resuming (they do not change the trained state).
_RESUMABLE_HPARAMS = ("device", "check_finite_collects")

class ConfigError(ValueError):
    """A mistake in a config file or the command line; the message names the key."""


# --------------------------------------------------------------------------------------------
# values


def _close(key: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


#: Most levels of nesting (mappings and lists inside one another) a YAML config may have.
MAX_YAML_DEPTH = 100
#: Most values (scalars, mappings, lists) a YAML config may hold once its aliases (``*name``)
#: are expanded: an alias repeats a whole node, so a few lines can stand for billions of values.
MAX_YAML_VALUES = 100_000


def _safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` (no code runs, no object is built), refusing a document nested
    deeper than :data:`MAX_YAML_DEPTH` or holding more than :data:`MAX_YAML_VALUES` values
    once aliases are expanded (the "billion laughs"), or that contains itself, with a
    :class:`ConfigError` naming ``where``; those would end in a ``RecursionError`` or
    ``MemoryError`` when the config is read. Invalid YAML raises ``yaml.YAMLError``."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels "
                                  f"(line {mark.line + 1}); rl8 reads configs up to that depth")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = BoundedLoader(text)
    try:
        value = loader.get_single_data()
    finally:
        loader.dispose()
    sizes: dict[int, int] = {}  # values under each list/mapping, aliases counted each time

    def size(node: Any) -> int:
        if not isinstance(node, (list, dict)):
            return 1
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise ConfigError(f"{where}: the YAML contains itself (an alias inside its own anchor)")
            return sizes[id(node)]
        sizes[id(node)] = -1
        items = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        total = 1 + sum(size(item) for item in items)
        if total > MAX_YAML_VALUES:
            raise ConfigError(
                f"{where}: the YAML holds more than {MAX_YAML_VALUES} values once its aliases (*name) "
                "are expanded; rl8 reads configs up to that size"
            )
        sizes[id(node)] = total
        return total

    size(value)
    return value


def _parse_value(text: str) -> Any:
    """A ``--set`` value: YAML (``[64, 64]``, ``true``, ``null``), numbers from numeric strings."""
    import yaml

    if text.strip() in ("None", "none"):  # Python's spelling of null
        return None
    try:
        value = _safe_yaml(text, f"--set value {text[:40]!r}")
    except yaml.YAMLError:
        value = text  # e.g. an unbalanced bracket: keep the text, HParams will say what is wrong
    return read_numbers(value)


def parse_assignment(text: str, option: str) -> tuple[list[str], Any]:
    """Split ``"a.b=value"`` into ``(["a", "b"], parsed value)``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{option} {text!r}: expected KEY=VALUE, e.g. {option} lr=3e-4")
    return key.split("."), _parse_value(value)


def _assign(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        node = target.get(part)
        if not isinstance(node, dict):
            node = target[part] = dict(node) if isinstance(node, Mapping) else {}
        target = node
    target[path[-1]] = value


def _hparam_names() -> list[str]:
    from .hparams import HParams

    return [f.name for f in dataclasses.fields(HParams)]


def _unknown_hparam(key: Any, where: str) -> ConfigError:
    """The error for a hyper-parameter name that :class:`rl8.HParams` does not have."""
    from .hparams import unknown_hparam_message

    return ConfigError(unknown_hparam_message(key, where))


def _clean_hparams(hparams: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check hparam names (close matches on a typo) and turn numeric strings into numbers
    (:meth:`rl8.HParams.read_config`)."""
    from .hparams import HParams

    try:
        return HParams.read_config(hparams, where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _int_option(config: Mapping[str, Any], key: str, where: str, minimum: int = 1) -> int | None:
    value = read_numbers(config.get(key), whole_as_int=True)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: {key} must be an int >= {minimum}, got {config.get(key)!r}")
    return value


def _mapping_option(config: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key} must be a mapping (key: value), got {value!r}")
    return read_numbers(dict(value))


# --------------------------------------------------------------------------------------------
# config files


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``rl8 train`` YAML config (``yaml.safe_load``) and check its top-level keys.

    Raises:
        ConfigError: Unreadable file, invalid YAML, YAML nested deeper than
            :data:`MAX_YAML_DEPTH` levels or holding more than :data:`MAX_YAML_VALUES` values
            once its aliases are expanded, not a mapping, or an unknown key (the message names
            it and its close matches).
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        config = _safe_yaml(text, str(path))
    except yaml.YAMLError as exc:
        # yaml's own lines (what it expected, the line and column, the line with a caret)
        detail = str(exc).replace('"<unicode string>"', f'"{path}"')
        raise ConfigError(f"{path}: invalid YAML:\n{detail}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys ({', '.join(CONFIG_KEYS)}), "
            f"got {type(config).__name__}"
        )
    check_config(config, str(path))
    return config


def check_config(config: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` for an unknown top-level key or a badly typed section."""
    for key in config:
        if key not in CONFIG_KEYS:
            raise ConfigError(
                f"{where}: unknown key {key!r}{_close(str(key), list(CONFIG_KEYS))} "
                f"(valid keys: {', '.join(CONFIG_KEYS)})"
            )
    if config.get("env") is not None and not isinstance(config["env"], str):
        raise ConfigError(f"{where}: env must be a string (a dotted path or a gymnasium id), got {config['env']!r}")
    if config.get("hparams") is not None:
        if not isinstance(config["hparams"], Mapping):
            raise ConfigError(f"{where}: hparams must be a mapping, got {config['hparams']!r}")
        _clean_hparams(config["hparams"], f"{where}: hparams")
    for key in ("env_config", "eval_env_config"):
        _mapping_option(config, key, where)
    for key in ("steps_per_eval", "max_steps"):
        _int_option(config, key, where)
    stops = config.get("stop_conditions")
    if stops is not None and not isinstance(stops, (list, Mapping)):
        raise ConfigError(f"{where}: stop_conditions must be a list of conditions, got {stops!r}")
    _trainer_options(config, where)


def _trainer_options(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Trainer options that ``config`` gives (see :data:`_TRAINER_OPTIONS`), read and
    checked as their fields say (:meth:`TrainerConfig.read_option`: ``1e3`` is the int 1000);
    ``None`` (the Trainer's default) stays ``None``; a bad value is a :class:`ConfigError`."""
    out: dict[str, Any] = {}
    for key in [name for name in _TRAINER_OPTIONS if name in config]:
        try:
            out[key] = None if config[key] is None else TrainerConfig.read_option(key, config[key])
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def _stop_conditions(config: Mapping[str, Any]) -> list[Any]:
    from .conditions import HitsUpperBound, from_config

    specs = config.get("stop_conditions") or []
    if isinstance(specs, Mapping):
        specs = [specs]
    conditions = []
    for i, spec in enumerate(specs):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DeprecationWarning)
                conditions.append(from_config(spec))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"stop_conditions[{i}]: {exc}") from None
        for warning in caught:  # e.g. an rl8 1.0.0 stat name, shown (Python hides them)
            print(f"rl8: warning: stop_conditions[{i}]: {warning.message}", file=sys.stderr)
    max_steps = _int_option(config, "max_steps", "config")
    if max_steps is not None:
        conditions.append(HitsUpperBound("env/steps", max_steps))
    return conditions


# --------------------------------------------------------------------------------------------
# rl8 train


def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config keys, hparams) given on the command line."""
    config: dict[str, Any] = {}
    flags = [name for name, option in _TRAINER_OPTIONS.items() if option["cli"] == "flag"]
    for key in ("env", "max_steps", "steps_per_eval", *flags):
        value = getattr(args, key, None)
        if value is not None:
            config[key] = value
    hparams: dict[str, Any] = {}
    fields = _hparam_names()
    for text in args.set or []:
        path, value = parse_assignment(text, "--set")
        if path[0] not in fields:
            raise _unknown_hparam(path[0], f"--set {text}")
        _assign(hparams, path, value)
    return config, hparams


def _merge_hparams(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_hparams(out[key], value)
        else:
            out[key] = value
    return out


def _build_hparams(hparams: Mapping[str, Any], where: str) -> Any:
    from .hparams import HParams

    try:
        return HParams.from_config(hparams, where)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _summary(trainer: Any) -> None:
    """With ``--quiet``: what ``Trainer.run`` prints at the end unless quiet (the run id, the
    tracking URI, the checkpoint, how to resume, ``mlflow ui``: :func:`rl8.progress.results_lines`),
    which scripts read from stdout."""
    from .progress import results_lines

    dist = getattr(trainer.algo, "dist", None)
    if trainer.config.progress is not False or (dist is not None and not dist.is_main):
        return  # Trainer.run printed it; under torchrun only rank 0 prints
    print("\n".join(results_lines(trainer)), flush=True)


def _config_file(arg: str) -> str | os.PathLike[str]:
    """The config file that ``rl8 train ARG`` reads: ``preset:NAME`` is always the preset
    ``NAME``; an existing path is that file (as before presets); any other ``ARG`` that is a
    preset's name (``HalfCheetah-v5``) is that preset. A missing ``ARG`` that looks like a
    path (a folder or a ``.yaml`` / ``.yml`` suffix) is returned, to fail with "cannot read
    config file"; any other name is a :class:`ConfigError` naming the close presets and
    ``rl8 train --env ARG``, which trains a gymnasium id without a preset. See
    ``rl8.presets``."""
    from . import presets

    if arg.startswith(presets.PREFIX) or (not Path(arg).exists() and arg in presets.names()):
        try:
            return presets.path(arg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if Path(arg).exists() or "/" in arg or os.sep in arg or Path(arg).suffix.lower() in (".yaml", ".yml"):
        return arg
    raise ConfigError(_no_preset_message(arg, presets.names()))


def _no_preset_message(name: str, known: Sequence[str]) -> str:
    """What ``rl8 train NAME`` says when ``NAME`` is neither a file nor a preset."""
    import gymnasium

    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else f" Presets: {', '.join(known)}."
    if name in gymnasium.registry:
        return (f"no preset or config file {name!r}; {name} is a gymnasium id without a preset: "
                f"train it with rl8 train --env {name}.{hint}")
    return f"no preset or config file {name!r}.{hint} To train a gymnasium id without a preset: rl8 train --env ID"


def _train(args: argparse.Namespace) -> int:
    from .distributed import init_distributed
    from .trainer import Trainer

    if args.trust_code and not args.resume:
        raise ConfigError("--trust-code only applies with --resume (it lets a checkpoint you trust "
                          "name a plain function as its env factory)")
    file_config = load_config(_config_file(args.config)) if args.config else {}
    cli_config, cli_hparams = _overrides(args)
    # under torchrun (WORLD_SIZE > 1): join the process group (with --actors: as actor or
    # learner); a no-op otherwise
    actors = cli_config.get("actors", file_config.get("actors"))
    try:
        init_distributed(actors=_int_option({"actors": actors}, "actors", "config") if actors is not None else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    given_hparams = _merge_hparams(file_config.get("hparams") or {}, cli_hparams)
    progress = False if args.quiet else None

    if args.resume:
        return _resume(args, file_config, cli_config, given_hparams, progress)

    config = {**file_config, **cli_config}
    check_config({k: v for k, v in config.items() if k != "hparams"}, "config")
    env = config.get("env")
    if not env:
        raise ConfigError("no env: name one in the config file (env: rl8.envs.CartPole) or with --env")
    hparams = _build_hparams(given_hparams, "hparams")
    hparams = _rank_hparams(hparams)
    conditions = _stop_conditions(config)
    run_args = _run_args(config)
    _check_eval_plan(hparams.horizons_per_env_reset, config, run_args)
    algo = _build_algo(env, hparams)
    _check_env_configs(algo, run_args)
    stored = {k: v for k, v in config.items() if k in _RUN_KEYS or k == "env"}
    stored["hparams"] = given_hparams
    # an option set to null in the file keeps the Trainer's default
    options = {k: v for k, v in _trainer_options(config, "config").items() if v is not None}
    trainer = Trainer(algo, progress=progress, metadata={"config": stored}, **options)
    return _run(trainer, conditions, run_args)


def _run_args(config: Mapping[str, Any], stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The arguments of ``Trainer.run`` that ``config`` gives, else those ``stored`` (how a
    checkpoint's run was called)."""
    read = {"env_config": _mapping_option, "eval_env_config": _mapping_option, "steps_per_eval": _int_option}
    stored = stored or {}
    return {key: option(config, key, "config") if key in config else stored.get(key) for key, option in read.items()}


def _rank_hparams(hparams: Any) -> Any:
    """Under torchrun with CUDA, each local rank trains on its own GPU (``cuda:LOCAL_RANK``)."""
    from .distributed import rank_device

    device = rank_device(hparams.device)
    return hparams if device == hparams.device else hparams.replace(device=device)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _import_given(name: Any, field: str) -> None:
    """Import a dotted path that you gave on the command line or in your config file (never one
    read from a checkpoint or policy file) with the working folder on ``sys.path``, as under
    ``python -m rl8``: ``rl8 train --env myenv.Reach`` works from the folder holding
    ``myenv.py``. Gymnasium ids and registered names are left alone.

    Raises:
        ImportError: The name cannot be imported.
        ValueError: It is not a dotted path of Python names.
    """
    from . import registry
    from ._resolve import import_user_path, is_dotted_path

    if is_dotted_path(name) and registry.lookup(name) is None:
        import_user_path(name, field=field, search_working_dir=True)


def _build_algo(env: str, hparams: Any) -> Any:
    import gymnasium

    from .ppo import PPO

    try:
        _import_given(env, "env")
        for key in ("model_cls", "distribution_cls", "optimizer_cls"):
            _import_given(getattr(hparams, key), f"hparam {key}")
        return PPO(env, **hparams.to_dict())
    except (ValueError, TypeError, ImportError, KeyError, gymnasium.error.Error) as exc:
        message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"cannot build PPO for env {env!r}: {message}") from None


def _check_env_configs(algo: Any, run_args: Mapping[str, Any]) -> None:
    """Reset a one-env copy of ``algo``'s env (on the CPU) with each env config the run will
    use (``hparams.env_config``, and over it ``env_config`` and ``eval_env_config``), so that a
    mistake (an unknown key, a bad value) is a :class:`ConfigError` before the MLflow run is
    created, not an error at the first step. Nothing is built when no env config is given."""
    from .ppo import make_env

    base = dict(algo.hparams.env_config or {})
    checks = [("hparams: env_config", base)] if base else []
    for key in ("env_config", "eval_env_config"):
        if run_args.get(key):
            checks.append((key, {**base, **run_args[key]}))
    if not checks:
        return
    try:
        env = make_env(algo.env_spec, 1, algo.hparams.horizon, device="cpu", env_kwargs=algo.hparams.env_kwargs)
    except Exception:  # noqa: BLE001 - the training env was built: let it report its own problems
        return
    try:
        for where, config in checks:
            try:
                env.reset(config=config, seed=0)
            except (KeyError, ValueError, TypeError) as exc:
                message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
                raise ConfigError(f"{where}: {message}") from None
    finally:
        env.close()


def _resume(args: argparse.Namespace, file_config: Mapping[str, Any], cli_config: Mapping[str, Any],
            given_hparams: Mapping[str, Any], progress: bool | None) -> int:
    from ._resume import read_trainer_checkpoint
    from .hparams import HParams
    from .trainer import Trainer

    tracking_uri = _str(cli_config.get("tracking_uri") or file_config.get("tracking_uri"))
    # under torchrun rank 0 reads the file and hands every rank its own part
    path, state = read_trainer_checkpoint(args.resume, tracking_uri=tracking_uri)
    if not isinstance(state.get("algo"), Mapping) or not isinstance(state.get("trainer"), Mapping):
        from .checkpoint import CheckpointError

        raise CheckpointError(f"{path} is an rl8 checkpoint but not a Trainer checkpoint")
    stored_hparams = state["algo"].get("hparams")
    if not isinstance(stored_hparams, Mapping):
        from .checkpoint import CheckpointError

        raise CheckpointError(f"{path}: entry 'algo.hparams' must be a dict of hyper-parameters, "
                              f"got {type(stored_hparams).__name__}")
    stored_config = dict((state["trainer"].get("metadata") or {}).get("config") or {})
    # the model is fixed by the checkpoint: only settings that do not change it may differ
    env = cli_config.get("env") or file_config.get("env")
    try:
        _import_given(env, "env")
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"--resume: cannot import env {env!r}: {exc}") from None
    stored_env = (state.get("env") or {}).get("spec")
    if env and stored_env and not _same_env(env, stored_env, source=path, trust_code=args.trust_code):
        raise ConfigError(f"--resume: the checkpoint was trained on env {stored_env!r}, not {env!r}")
    # an env class this process lacks (a script's __main__.Reach) is handed over with --env
    handed = env if env and stored_env and _unregistered(stored_env, args.trust_code) else None
    hparams = _build_hparams(_merge_hparams(stored_hparams, given_hparams), "hparams")
    merged = hparams.to_plain()
    # a hyper-parameter newer than the checkpoint has its default there (as from_checkpoint reads it)
    saved = {**HParams().to_plain(), **stored_hparams}
    changed = [k for k in merged if merged[k] != saved.get(k) and k not in _RESUMABLE_HPARAMS]
    if changed:
        detail = ", ".join(f"{k} (checkpoint: {saved.get(k)!r}, given: {merged[k]!r})" for k in changed)
        raise ConfigError(f"--resume: hyper-parameters cannot change when resuming: {detail}")
    overrides = {k: merged[k] for k in _RESUMABLE_HPARAMS if merged[k] != saved.get(k)}

    config = {**stored_config, **{k: v for k, v in file_config.items() if k != "hparams"}, **cli_config}
    check_config({k: v for k, v in config.items() if k != "hparams"}, "config")
    # the config's conditions, else those the checkpoint's run used (also when run from Python)
    conditions = _stop_conditions(config) or _checkpoint_conditions(state["trainer"], path)
    # how the checkpoint's run() was called, unless the config or flags say otherwise
    run_args = _run_args(config, state["trainer"].get("run") or {})
    eval_config = {"eval_num_envs": state["trainer"].get("eval_num_envs"), **config}
    _check_eval_plan(hparams.horizons_per_env_reset, eval_config, run_args)
    # the options given change the resumed Trainer's, except those naming its MLflow run
    given = _trainer_options({**file_config, **cli_config}, "config")
    kwargs: dict[str, Any] = {k: v for k, v in given.items() if not _TRAINER_OPTIONS[k]["names_run"]}
    kwargs["progress"] = progress
    stored_config.update({k: v for k, v in config.items() if k in _RUN_KEYS})
    kwargs["metadata"] = {**(state["trainer"].get("metadata") or {}), "config": stored_config}
    trainer = Trainer.from_checkpoint(
        path, env=handed, hparams=overrides, tracking_uri=tracking_uri, trust_code=args.trust_code, **kwargs
    )
    return _run(trainer, conditions, run_args)


def _checkpoint_conditions(saved: Mapping[str, Any], path: Any) -> list[Any]:
    """The stop conditions recorded in a Trainer checkpoint, rebuilt (without their state,
    which ``Trainer.run`` restores) from their stored ``from_config`` mappings (rl8 1.0.0's
    stat names replaced by the current ones)."""
    from .conditions import from_config, with_current_stat_names

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
    try:
        return [from_config(with_current_stat_names(config)) for config in configs]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--resume: {path}: stored stop condition: {exc}") from None


def _unregistered(stored: str, trust_code: bool) -> bool:
    """Whether a file's env name is a dotted path that this process's registry lacks (and that
    ``--trust-code`` does not import)."""
    from . import registry
    from ._resolve import is_dotted_path

    return is_dotted_path(stored) and not trust_code and registry.lookup(stored) is None


def _same_env(given: str, stored: str, *, source: Any, trust_code: bool) -> bool:
    """Whether ``--env`` names the env a file stores: the same class (``rl8.envs.CartPole`` and
    ``rl8.envs.cartpole.CartPole``), or, when the stored class is not registered in this process
    (a script's ``__main__.Reach``), a class of the same name that you hand over
    (``myenv.Reach``)."""
    if given == stored:
        return True
    if _unregistered(stored, trust_code):
        return given.rpartition(".")[2] == stored.rpartition(".")[2]
    return _canonical_env(given) == _canonical_env(stored, source=source, trust_code=trust_code)


def _canonical_env(spec: str, *, source: Any = None, trust_code: bool = False) -> str:
    """``rl8.envs.CartPole`` and ``rl8.envs.cartpole.CartPole`` name the same class. A spec read
    from a file (``source``) is checked for its kind before use (see docs/security.md)."""
    from ._resolve import env_spec_string, env_target
    from .checkpoint import CheckpointError

    try:
        return env_spec_string(env_target(spec, source=source, trust_code=trust_code).target) or spec
    except CheckpointError:
        raise
    except (ValueError, ImportError):
        return spec


def _check_eval_plan(horizons_per_env_reset: int, config: Mapping[str, Any], run_args: Mapping[str, Any]) -> None:
    from .trainer import check_eval_plan

    try:
        check_eval_plan(
            horizons_per_env_reset,
            eval_num_envs=_int_option(config, "eval_num_envs", "config"),
            steps_per_eval=run_args["steps_per_eval"],
            eval_env_config=run_args["eval_env_config"],
        )
    except ValueError as exc:
        raise ConfigError(str(exc).replace("Trainer.run: ", "")) from None


def _run(trainer: Any, conditions: list[Any], run_args: Mapping[str, Any]) -> int:
    from .conditions import MissingStatError

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


# --------------------------------------------------------------------------------------------
# rl8 eval


def _policy_and_env(args: argparse.Namespace, make: Any) -> tuple[Any, Any, str, dict[str, Any]]:
    """The saved policy named on the command line, the env ``make(spec, env_kwargs)`` builds
    for it (its spaces checked against the policy's), the env spec used (``--env``, or the
    stored one checked for its kind, see docs/security.md) and the env config (stored, then
    ``--env-config``)."""
    import gymnasium

    from ._resolve import spec_from_env_info
    from .export import check_env_spaces, policy_from_dict, read_policy

    try:  # first: a module of yours may also define the policy's model class
        _import_given(args.env, "--env")
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot build env {args.env!r}: {exc}") from None
    info = read_policy(args.policy, tracking_uri=args.tracking_uri)
    policy = policy_from_dict(info, map_location="cpu", source=args.policy, trust_code=args.trust_code)
    env_info = info.get("env") or {}
    if not isinstance(env_info, Mapping):
        from .checkpoint import CheckpointError

        raise CheckpointError(f"{args.policy}: the stored env must be a dict, got {type(env_info).__name__}")
    spec = args.env or spec_from_env_info(env_info, source=args.policy, trust_code=args.trust_code)
    if not spec:
        raise ConfigError("the policy does not name its env; pass --env (e.g. --env rl8.envs.CartPole)")
    config = dict(env_info.get("env_config") or {})
    for text in args.env_config or []:
        path, value = parse_assignment(text, "--env-config")
        _assign(config, path, value)
    env_kwargs = _stored_env_kwargs(args, env_info)
    try:
        env = make(spec, env_kwargs)
    except (ValueError, TypeError, KeyError, ImportError, gymnasium.error.Error) as exc:
        raise ConfigError(f"cannot build env {spec!r}: {exc}") from None
    try:
        check_env_spaces(env, policy.observation_space, policy.action_space,
                         what=f"the env {args.env or env_info.get('spec')!r}", source=args.policy)
    except ValueError as exc:
        env.close()
        raise ConfigError(str(exc)) from None
    return policy, env, spec, config


def _stored_env_kwargs(args: argparse.Namespace, env_info: Mapping[str, Any]) -> Any:
    """The stored env's arguments when the env used is the stored one (no ``--env``, or an
    ``--env`` naming the same env, see :func:`_same_env`), else ``None``: they belong to that
    env. When ``--env`` is given the names inside them are checked here for the env it names,
    as :func:`_policy_and_env` checks them without ``--env`` (see docs/security.md)."""
    from ._resolve import check_stored_env_kwargs, env_target

    if not args.env:
        return env_info.get("env_kwargs")
    stored = env_info.get("spec")
    if not stored or not _same_env(args.env, stored, source=args.policy, trust_code=args.trust_code):
        return None
    check_stored_env_kwargs(env_target(args.env).target, env_info.get("env_kwargs"), source=args.policy,
                            trust_code=args.trust_code)
    return env_info.get("env_kwargs")


def _eval(args: argparse.Namespace) -> int:
    import torch

    from .ppo import make_env

    num_envs = args.num_envs or args.episodes
    policy, env, spec, config = _policy_and_env(
        args, lambda spec, env_kwargs: make_env(spec, num_envs, None, device="cpu", env_kwargs=env_kwargs)
    )
    try:
        obs = env.reset(config=config or None, seed=args.seed)
    except (ValueError, TypeError, KeyError) as exc:
        env.close()
        raise ConfigError(f"cannot evaluate in env {spec!r}: {exc}") from None
    deterministic = not args.stochastic
    if args.seed is not None:
        torch.manual_seed(args.seed)
    try:
        if env.episodic:
            _eval_episodes(policy, env, obs, args.episodes, args.max_steps or 100_000, deterministic)
        else:
            _eval_steps(policy, env, obs, args.max_steps or 1000, deterministic)
    finally:
        env.close()
    return 0


def _eval_episodes(policy: Any, env: Any, obs: Any, episodes: int, max_steps: int, deterministic: bool) -> None:
    import torch

    from .runner import run_policy

    n = env.num_envs
    quota = math.ceil(episodes / n)  # episodes per env: no env's short episodes dominate
    ep_return = torch.zeros(n, dtype=torch.float64)
    ep_length = torch.zeros(n, dtype=torch.int64)
    done_per_env = [0] * n
    results: list[tuple[int, int, float, int]] = []  # (k-th episode of env, env, return, length)
    for step in run_policy(policy, env, obs, num_steps=max_steps, deterministic=deterministic):
        ep_return += step.rewards.double().cpu()
        ep_length += 1
        if step.done is not None:
            for i in step.done.nonzero()[:, 0].tolist():
                if done_per_env[i] < quota:
                    results.append((done_per_env[i], i, float(ep_return[i]), int(ep_length[i])))
                done_per_env[i] += 1
                ep_return[i] = 0.0
                ep_length[i] = 0
        if sum(min(c, quota) for c in done_per_env) >= episodes:
            break
    results = sorted(results)[:episodes]
    returns = [r for _, _, r, _ in results]
    for k, (_, env_index, ret, length) in enumerate(results, start=1):
        print(f"episode {k}: return {ret:.6g}, length {length} (env {env_index})")
    if not returns:
        print(f"no episode ended within {max_steps} steps (raise --max-steps)")
        return
    mean = sum(returns) / len(returns)
    std = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
    note = f" (stopped at --max-steps {max_steps})" if len(returns) < episodes else ""
    print(f"mean return over {len(returns)} episodes: {mean:.6g} (std {std:.3g}){note}")


def _eval_steps(policy: Any, env: Any, obs: Any, steps: int, deterministic: bool) -> None:
    import torch

    from .runner import run_policy

    total = torch.zeros(env.num_envs, dtype=torch.float64)
    for step in run_policy(policy, env, obs, num_steps=steps, deterministic=deterministic):
        total += step.rewards.double().cpu()
    print(f"{type(env).__name__} does not end episodes: returns over {steps} steps per env")
    for i, ret in enumerate(total.tolist()):
        print(f"env {i}: return {ret:.6g}")
    print(f"mean return over {env.num_envs} envs: {float(total.mean()):.6g}")


# --------------------------------------------------------------------------------------------
# rl8 record


def _record(args: argparse.Namespace) -> int:
    from .video import RenderError, make_recording_env, prepare_headless_rendering, record_video

    prepare_headless_rendering()  # before an env imports mujoco
    try:
        policy, env, _, config = _policy_and_env(
            args, lambda spec, env_kwargs: make_recording_env(spec, env_kwargs=env_kwargs, device="cpu")
        )
    except RenderError as exc:
        raise ConfigError(str(exc)) from None
    try:
        path = record_video(
            policy, env, args.output, deterministic=not args.stochastic, max_steps=args.max_steps,
            fps=args.fps, env_config=config or None, seed=args.seed,
        )
    except (NotImplementedError, KeyError, ValueError, TypeError, RenderError) as exc:  # no render, bad config
        message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(message) from None
    finally:
        env.close()
    print(path)
    return 0


# --------------------------------------------------------------------------------------------
# rl8 runs


def _runs(args: argparse.Namespace) -> int:
    import time

    from .tracking import clean_runs, running_runs

    if args.older_than is not None and not args.clean:
        raise ConfigError("--older-than only applies with --clean")
    if args.dry_run and not args.clean:
        raise ConfigError("--dry-run only applies with --clean")
    uri = args.tracking_uri
    if args.clean:
        runs = clean_runs(uri, experiment=args.experiment, older_than_s=args.older_than, dry_run=args.dry_run)
        verb = "would mark" if args.dry_run else "marked"
        print(f"rl8: {verb} {len(runs)} RUNNING run(s) FAILED (their process is gone)", file=sys.stderr)
    else:
        runs = running_runs(uri, experiment=args.experiment)
        print(f"rl8: {len(runs)} RUNNING run(s)", file=sys.stderr)
    for run in runs:
        owner = f"{run.host}:{run.pid}" if run.host else "-"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.start_time_s))
        print(f"{run.run_id}  {run.experiment}  {run.run_name or '-'}  {owner}  "
              f"process {run.process}  started {started}")
    return 0


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h`` or ``2d``."""
    unit = text[-1:].lower() if text[-1:].lower() in _DURATION_UNITS else "s"
    number = text[:-1] if text[-1:].lower() in _DURATION_UNITS else text
    try:
        value = float(number) * _DURATION_UNITS[unit]
        if not value >= 0 or math.isinf(value):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration >= 0 (seconds, or with a unit: 30m, 12h, 2d), got {text!r}"
        ) from None
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
        if not value > 0 or math.isinf(value):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    return value


# --------------------------------------------------------------------------------------------
# parser and entry point


def _option_flag(name: str) -> Any:
    """The ``type`` of the ``rl8 train`` flag of Trainer option ``name``: the text read and
    checked as the option's field says (:meth:`TrainerConfig.read_option`)."""

    def read(text: str) -> Any:
        try:
            return TrainerConfig.read_option(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = name
    return read


def _positive_int(text: str) -> int:
    try:
        value = read_numbers(text, whole_as_int=True)
        if not isinstance(value, int) or value < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    return value


def _add_policy_run_arguments(parser: argparse.ArgumentParser, *, seed_help: str) -> None:
    """The arguments ``rl8 eval`` and ``rl8 record`` share: which policy, in which env, how."""
    parser.add_argument("policy", metavar="PATH_OR_RUN_ID")
    parser.add_argument("--env", help="env to run in (default: the one the policy was trained on)")
    parser.add_argument("--env-config", action="append", metavar="KEY=VALUE", help="env parameter (repeatable)")
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the modes")
    parser.add_argument("--seed", type=int, help=seed_help)
    parser.add_argument("--tracking-uri", help="MLflow tracking URI, for a run id")
    parser.add_argument("--trust-code", action="store_true",
                        help="trust the file: import the modules it names that rl8's registry does not "
                             "hold, and let it name a plain function as its env factory, which rl8 then "
                             "calls (off by default; see docs/security.md)")


def build_parser() -> argparse.ArgumentParser:
    """The ``rl8`` argument parser."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="rl8", description="Fast PPO for batched environments: train, resume, evaluate."
    )
    parser.add_argument("--version", action="version", version=f"rl8 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train", help="train a policy (from a YAML config and/or flags)",
        description="Train with PPO. Flags override the config file. See docs/cli.md.",
    )
    train.add_argument("config", nargs="?", help="YAML config file, or a preset: NAME or preset:NAME "
                       "(rl8.presets.names()) (keys: " + ", ".join(CONFIG_KEYS) + ")")
    train.add_argument("--env", help="env: dotted path (rl8.envs.CartPole) or gymnasium id (CartPole-v1)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="set a hyper-parameter (repeatable), e.g. --set lr=3e-4 "
                            "--set model_config.hiddens=[32,32]")
    train.add_argument("--max-steps", "--max-env-steps", dest="max_steps", type=_positive_int, metavar="N",
                       help="stop after N env steps (Trainer.run(max_env_steps=N))")
    train.add_argument("--steps-per-eval", type=_positive_int, metavar="N", help="evaluate every N training steps")
    train.add_argument("--resume", metavar="PATH_OR_RUN_ID",
                       help="continue from a checkpoint file, a checkpoint folder (latest) or an MLflow run id")
    for field in dataclasses.fields(TrainerConfig):  # the options marked cli="flag"
        if field.metadata["cli"] == "flag":
            number = str(field.type).startswith(("int", "float"))
            train.add_argument("--" + field.name.replace("_", "-"), type=_option_flag(field.name),
                               metavar="N" if number else None, help=field.metadata["doc"])
    train.add_argument("--quiet", action="store_true", help="no progress line")
    train.add_argument("--trust-code", action="store_true",
                       help="with --resume: trust the checkpoint: import the modules it names that "
                            "rl8's registry does not hold, and let it name a plain function as its "
                            "env factory, which rl8 then calls (off by default; see docs/security.md)")
    train.set_defaults(func=_train)

    evaluate = commands.add_parser(
        "eval", help="run a saved policy and print episode returns",
        description="Run a policy from a policy file, a checkpoint (file or folder) or an MLflow run.",
    )
    _add_policy_run_arguments(evaluate, seed_help="seed of the env and of sampling")
    evaluate.add_argument("--episodes", type=_positive_int, default=10, metavar="N",
                          help="episodes to run (default 10)")
    evaluate.add_argument("--num-envs", type=_positive_int, metavar="N", help="envs in parallel (default: --episodes)")
    evaluate.add_argument("--max-steps", type=_positive_int, metavar="N",
                          help="steps per env at most (default 100000; 1000 for envs without episodes)")
    evaluate.set_defaults(func=_eval)

    record = commands.add_parser(
        "record", help="record an MP4 video of a saved policy (needs imageio and imageio-ffmpeg: the video extra)",
        description="Run a policy for one episode and write an MP4 video of it (H.264). The "
                    "policy comes from a policy file, a checkpoint (file or folder) or an MLflow run.",
    )
    _add_policy_run_arguments(record, seed_help="seed of the env's reset and of sampling")
    record.add_argument("-o", "--output", default="video.mp4", metavar="FILE",
                        help="the MP4 file to write (default video.mp4)")
    record.add_argument("--max-steps", type=_positive_int, metavar="N",
                        help="env steps at most (default: one episode, at most the env's episode "
                             "limit, else 1000)")
    record.add_argument("--fps", type=_positive_float, metavar="N",
                        help="frames per second (default: the env's metadata['render_fps'])")
    record.set_defaults(func=_record)

    runs = commands.add_parser(
        "runs", help="list RUNNING MLflow runs and their process; --clean marks dead ones FAILED",
        description="List the RUNNING MLflow runs with the host and pid of their process (alive, "
                    "dead or unknown). --clean marks FAILED those whose process on this host is "
                    "gone (killed before it could end its run).",
    )
    runs.add_argument("--clean", action="store_true", help="mark the runs of dead processes FAILED")
    runs.add_argument("--older-than", type=_duration, metavar="AGE",
                      help="with --clean: also runs of unknown process (another host, not rl8) "
                           "started more than AGE ago (seconds, or 30m, 12h, 2d)")
    runs.add_argument("--dry-run", action="store_true", help="with --clean: only list what it would mark")
    runs.add_argument("--experiment", help="only this experiment (default: all)")
    runs.add_argument("--tracking-uri",
                      help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    runs.set_defaults(func=_runs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rl8`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    from .checkpoint import CheckpointDirError, CheckpointError
    from .tracking import TrackingError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, CheckpointDirError) as exc:  # CheckpointDirError: an unusable checkpoint_dir
        print(f"rl8: error: {exc}", file=sys.stderr)
        return 2
    except (TrackingError, CheckpointError, FileNotFoundError, ImportError) as exc:
        print(f"rl8: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
