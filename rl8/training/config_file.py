"""``rl8 train`` config files (presets too) and ``--set KEY=VALUE`` values. HParams and the
conditions are imported where a config is checked, so that ``rl8 --help`` and the first checks
start without torch."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl8.fields import did_you_mean, int_at_least, read_numbers
from rl8.training.config import TrainerConfig

__all__ = [
    "CONFIG_KEYS",
    "ConfigError",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "RESUMABLE_HPARAMS",
    "RUN_KEYS",
    "TRAINER_OPTIONS",
    "assign",
    "check_config",
    "hparam_names",
    "int_option",
    "load_config",
    "mapping_option",
    "parse_assignment",
    "stop_conditions",
    "trainer_options",
    "unknown_hparam",
]

#: The Trainer options that ``rl8 train`` takes (in a config file; those marked ``"flag"`` also
#: as flags), declared in :class:`rl8.training.config.TrainerConfig`.
TRAINER_OPTIONS = {f.name: f.metadata for f in dataclasses.fields(TrainerConfig) if f.metadata["cli"]}

#: Top-level keys of a ``rl8 train`` config file.
CONFIG_KEYS: dict[str, str] = {
    "env": "the env: a dotted path to an rl8.Env subclass (rl8.envs.CartPole) or a gymnasium id",
    "algorithm": "the algorithm: PPO (the default) or Distillation (docs/distillation.md)",
    "teacher": "Distillation's teacher: a policy file, checkpoint, folder, run id or models:/ URI (rl8.load_policy)",
    "hparams": "the algorithm's hyper-parameters (see rl8.HParams, rl8.DistillationHParams)",
    "env_config": "env parameters for training resets (Trainer.run(env_config=...))",
    "eval_env_config": "env parameters for evaluations (default: env_config)",
    "steps_per_eval": "evaluate every this many training steps",
    "stop_conditions": "list of stop conditions (rl8.training.conditions.from_config specs)",
    "max_steps": "stop after this many env steps (adds hits_upper_bound on env/steps)",
    **{name: option["doc"] for name, option in TRAINER_OPTIONS.items()},
}

#: Keys that describe *how to run* (they may change when resuming); the rest define the model.
RUN_KEYS = ("env_config", "eval_env_config", "steps_per_eval", "stop_conditions", "max_steps")
#: Hyper-parameters that may differ when resuming (they do not change the trained state).
RESUMABLE_HPARAMS = ("device", "check_finite_collects")
#: Most levels of nesting (mappings and lists inside one another) a YAML config may have.
MAX_YAML_DEPTH = 100
#: Most values (scalars, mappings, lists) a YAML config may hold once its aliases (``*name``)
#: are expanded: an alias repeats a whole node, so a few lines can stand for billions of values.
MAX_YAML_VALUES = 100_000
#: rl8 1.0's config keys and what replaced them.
_RL8_1_KEYS = {
    "algorithm_config": "hparams",
    "env_cls": "env",
    "recurrent": "hparams: model_cls (rl8.policies.recurrent.LSTMModel or GRUModel)",
}
#: Most bytes of a config file.
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A mistake in a config file or the command line; the message names the key."""


def _safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing with a :class:`ConfigError` naming ``where`` a document
    nested deeper than :data:`MAX_YAML_DEPTH`, holding more than :data:`MAX_YAML_VALUES` values
    once aliases are expanded (the "billion laughs"), or containing itself."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels "
                    f"(line {mark.line + 1}); rl8 reads configs up to that depth"
                )
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    value = yaml.load(text, Loader=BoundedLoader)  # a SafeLoader
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


def parse_assignment(text: str, option: str) -> tuple[list[str], Any]:
    """Split ``"a.b=value"`` into ``(["a", "b"], value)``, the value read as YAML (``[64, 64]``,
    ``true``, ``null``; ``None`` too) with numbers from numeric strings."""
    import yaml

    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{option} {text!r}: expected KEY=VALUE, e.g. {option} lr=3e-4")
    if value.strip() in ("None", "none"):  # Python's spelling of null
        return key.split("."), None
    try:
        value = _safe_yaml(value, f"--set value {value[:40]!r}")
    except yaml.YAMLError:
        pass  # e.g. an unbalanced bracket: keep the text, HParams will say what is wrong
    return key.split("."), read_numbers(value)


def assign(target: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``target[path[0]][path[1]]... = value``, making the dicts on the way (``--set a.b=1``)."""
    for part in path[:-1]:
        node = target.get(part)
        if not isinstance(node, dict):
            node = target[part] = dict(node) if isinstance(node, Mapping) else {}
        target = node
    target[path[-1]] = value


def hparam_names() -> list[str]:
    """The names of the fields of every algorithm's hyper-parameters (:class:`rl8.HParams`, then
    those :class:`rl8.DistillationHParams` adds)."""
    from rl8.training.resume import ALGORITHMS

    names = [
        f.name for algo_cls in ALGORITHMS.values() for f in dataclasses.fields(algo_cls.hparams_cls)
    ]
    return list(dict.fromkeys(names))


def unknown_hparam(key: Any, where: str) -> ConfigError:
    """The error for a hyper-parameter name that no algorithm's hyper-parameters have
    (:func:`hparam_names`)."""
    from rl8.ppo.hparams import unknown_hparams_message

    return ConfigError(unknown_hparams_message([key], where, hparam_names()))


def int_option(config: Mapping[str, Any], key: str, where: str, minimum: int = 1) -> int | None:
    """``config[key]`` as an int >= ``minimum`` (numeric strings as numbers) or ``None``, else a
    :class:`ConfigError` naming ``where`` and ``key``."""
    value = read_numbers(config.get(key), whole_as_int=True)
    if value is not None and int_at_least(minimum)(value, key) is not None:
        raise ConfigError(f"{where}: {key} must be an int >= {minimum}, got {config.get(key)!r}")
    return value


def mapping_option(config: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    """``config[key]`` as a dict (numeric strings as numbers) or ``None``, else a
    :class:`ConfigError` naming ``where`` and ``key``."""
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key} must be a mapping (key: value), got {value!r}")
    return read_numbers(dict(value))


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``rl8 train`` YAML config (``yaml.safe_load``, bounded) and check its top-level
    keys; a :class:`ConfigError` for an unreadable file, invalid or too large YAML, not a
    mapping, or an unknown key (with close matches)."""
    import yaml

    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a pipe would be read forever
        raise ConfigError(f"config file {path} is not a regular file")
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES)"
        )
    try:
        config = _safe_yaml(text, str(path))
    except yaml.YAMLError as exc:  # yaml's own lines (what it expected, where)
        detail = str(exc).replace('"<unicode string>"', f'"{path}"')
        raise ConfigError(f"{path}: invalid YAML:\n{detail}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys ({', '.join(CONFIG_KEYS)}), got {type(config).__name__}"
        )
    check_config(config, str(path))
    return config


def check_config(config: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` for an unknown top-level key or a badly typed section."""
    for key in config:
        if key not in CONFIG_KEYS:
            hint = did_you_mean(key, CONFIG_KEYS)
            if key in _RL8_1_KEYS:
                hint = f"; rl8 1.0's {key} is now {_RL8_1_KEYS[key]} (see docs/migrating.md)"
            valid = ", ".join(CONFIG_KEYS)
            raise ConfigError(f"{where}: unknown key {key!r}{hint} (valid keys: {valid})")
    if config.get("env") is not None and not isinstance(config["env"], str):
        raise ConfigError(
            f"{where}: env must be a string (a dotted path or a gymnasium id), got {config['env']!r}"
        )
    from rl8.training.resume import ALGORITHMS

    algo_cls = ALGORITHMS.get(config.get("algorithm", "PPO"))
    if algo_cls is None:
        raise ConfigError(
            f"{where}: algorithm: expected one of {sorted(ALGORITHMS)}, got {config['algorithm']!r}"
        )
    if config.get("hparams") is not None:
        if not isinstance(config["hparams"], Mapping):
            raise ConfigError(f"{where}: hparams must be a mapping, got {config['hparams']!r}")
        try:  # names checked, numeric strings read as numbers
            algo_cls.hparams_cls.read_config(config["hparams"], f"{where}: hparams")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    for key in ("env_config", "eval_env_config"):
        mapping_option(config, key, where)
    for key in ("steps_per_eval", "max_steps"):
        int_option(config, key, where)
    stops = config.get("stop_conditions")
    if stops is not None and not isinstance(stops, (list, Mapping)):
        raise ConfigError(f"{where}: stop_conditions must be a list of conditions, got {stops!r}")
    trainer_options(config, where)


def trainer_options(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Trainer options that ``config`` gives, read and checked as their fields say
    (:meth:`TrainerConfig.read_option`); ``None`` (the default) stays ``None``."""
    out: dict[str, Any] = {}
    for key in [name for name in TRAINER_OPTIONS if name in config]:
        try:
            out[key] = None if config[key] is None else TrainerConfig.read_option(key, config[key])
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def stop_conditions(config: Mapping[str, Any]) -> list[Any]:
    """The stop conditions of a config: its ``stop_conditions`` and ``max_steps`` (a
    ``HitsUpperBound`` on ``env/steps``)."""
    from rl8.training.conditions import HitsUpperBound, from_config

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
    max_steps = int_option(config, "max_steps", "config")
    if max_steps is not None:
        conditions.append(HitsUpperBound("env/steps", max_steps))
    return conditions
