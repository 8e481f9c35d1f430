"""Search spaces of ``rl8 sweep``: a YAML mapping of hyper-parameter names (``lr``,
``model_config.hiddens``...) to distributions, read into Optuna distributions and checked before
any trial runs (docs/sweeps.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl8.fields import did_you_mean, read_numbers
from rl8.ppo.hparams import HParams
from rl8.training.config_file import ConfigError, assign, hparam_names, unknown_hparam

__all__ = ["FIELDS", "MAPPING_HPARAMS", "read_space"]

#: The fields of each ``type`` of entry (``low``, ``high`` and ``choices`` are required).
FIELDS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
#: The hyper-parameters whose keys a space may name (``model_config.hiddens``).
MAPPING_HPARAMS = ("model_config", "env_config", "env_kwargs", "optimizer_kwargs")
_OVERRIDDEN = {"lr": "lr_schedule", "entropy_coeff": "entropy_coeff_schedule"}


def read_space(
    space: str | os.PathLike[str] | Mapping[str, Any], hparams: Mapping[str, Any]
) -> dict[str, Any]:
    """The Optuna distributions of the search ``space`` (a YAML file, or its mapping ``{"lr":
    {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}``), by hyper-parameter name; a
    :class:`ConfigError` naming the entry for an unknown name or type or field, an empty range, a
    log range through 0, a categorical of one choice, or a value that ``hparams`` (the config's,
    that the trials train) do not accept."""
    import optuna
    import yaml

    where = "search space"
    if not isinstance(space, Mapping):
        where = str(space)
        try:
            space = yaml.safe_load(Path(space).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read search space {space}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: invalid YAML:\n{exc}") from None
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"{where}: expected a mapping of hyper-parameter names to distributions, got {space!r}"
        )
    out = {}
    for name, spec in space.items():
        at = f"{where}: {name}"
        top, *rest = str(name).split(".")
        if top not in hparam_names():
            raise unknown_hparam(top, at)
        if rest and top not in MAPPING_HPARAMS:
            raise ConfigError(
                f"{at}: only the keys of {', '.join(MAPPING_HPARAMS)} may be named with a dot"
            )
        if hparams.get(_OVERRIDDEN.get(name)) is not None:
            raise ConfigError(
                f"{at}: the config's {_OVERRIDDEN[name]} overrides {name}; remove it from the config"
            )
        out[name] = dist = _distribution(spec, at, optuna.distributions)
        if rest:  # a key of model_config, env_config...: what reads it checks it
            continue
        categorical = isinstance(dist, optuna.distributions.CategoricalDistribution)
        for value in dist.choices if categorical else (dist.low, dist.high):
            trial = dict(hparams)
            assign(trial, [name], value)
            try:
                HParams.from_config(trial, "hparams")
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{at}: {value!r} is not a valid {name} here: {exc}") from None
    return out


def _distribution(spec: Any, at: str, distributions: Any) -> Any:
    if not isinstance(spec, Mapping) or spec.get("type") not in FIELDS:
        raise ConfigError(f"{at}: expected a mapping with type: {' or '.join(FIELDS)}, got {spec!r}")
    kind = spec["type"]
    spec = read_numbers(dict(spec), whole_as_int=kind == "int")
    for key in spec:
        if key not in FIELDS[kind]:
            hint = did_you_mean(key, FIELDS[kind], n=1)
            raise ConfigError(
                f"{at}: unknown field {key!r} of a {kind}{hint} (fields: {', '.join(FIELDS[kind])})"
            )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or len(choices) < 2:
            raise ConfigError(
                f"{at}: choices must be a list of at least 2 values (set a fixed value in "
                f"the config's hparams instead), got {choices!r}"
            )
        if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
            raise ConfigError(
                f"{at}: choices must be numbers, strings, booleans or null, got {choices!r}"
            )
        return distributions.CategoricalDistribution(choices)
    number = int if kind == "int" else (int, float)
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    for key, value in (("low", low), ("high", high), ("step", step)):
        if (key != "step" or value is not None) and (
            isinstance(value, bool) or not isinstance(value, number)
        ):
            raise ConfigError(
                f"{at}: {key} must be {'an int' if kind == 'int' else 'a number'}, got {value!r}"
            )
    if low >= high:
        raise ConfigError(f"{at}: empty range: low must be < high, got low={low!r}, high={high!r}")
    if not isinstance(log, bool):
        raise ConfigError(f"{at}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{at}: a log range must be > 0 (low={low!r}): it cannot reach or cross 0")
    if step is not None and (log or step <= 0):
        raise ConfigError(f"{at}: step must be > 0 and cannot go with log: true, got step={step!r}")
    if kind == "int":
        return distributions.IntDistribution(low, high, log=log, step=step or 1)
    return distributions.FloatDistribution(float(low), float(high), log=log, step=step)
