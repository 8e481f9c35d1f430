"""Presets: ``rl8 train`` config files shipped with rl8, one per task.

A preset is a YAML config file in the format of ``rl8 train CONFIG.yaml`` (``docs/cli.md``):
the env, PPO's hyper-parameters (with a comment citing where they come from), the env-step
budget it is meant for (``max_steps``), the evaluation settings and a seed. ``rl8 train
CartPole-v1`` and ``rl8 train preset:CartPole-v1`` train one; from Python, what ``rl8 train
NAME`` does::

    import rl8.presets
    from rl8 import PPO, Trainer

    name = "Pendulum-v1"
    trainer = Trainer(PPO.from_preset(name), **rl8.presets.trainer_options(name))
    trainer.run(**rl8.presets.run_args(name))  # max_env_steps, steps_per_eval...

    rl8.presets.names()                     # ['Acrobot-v1', 'Ant-v5', ..., 'Walker2d-v5']
    config = rl8.presets.load("Hopper-v5")  # a checked dict: {'env': 'Hopper-v5', ...}

The files are read with ``yaml.safe_load`` only. See ``docs/results/index.md`` for what each
preset reaches and ``docs/results/sweeps.md`` for how its hyper-parameters were chosen.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["PREFIX", "for_env", "hparams", "load", "names", "path", "run_args", "trainer_options"]

#: ``rl8 train preset:NAME`` always names a preset (even where a file ``NAME`` exists).
PREFIX = "preset:"


def _folder() -> Path:
    return Path(str(resources.files(__name__)))


def names() -> list[str]:
    """The names of the presets shipped with rl8 (their file names without ``.yaml``), sorted."""
    return sorted(p.stem for p in _folder().glob("*.yaml"))


def path(name: str) -> Path:
    """The YAML file of preset ``name`` (with or without the ``preset:`` prefix).

    Raises:
        ValueError: No preset has this name; the message lists close matches and all names.
    """
    if not isinstance(name, str):
        raise ValueError(f"preset name: expected a string, got {type(name).__name__} {name!r}")
    if name.startswith(PREFIX):
        name = name[len(PREFIX):]
    known = names()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown preset {name!r}{hint} (presets: {', '.join(known)})")
    return _folder() / f"{name}.yaml"


def load(name: str) -> dict[str, Any]:
    """Preset ``name`` as a config dict, checked as ``rl8 train`` checks a config file.

    Args:
        name: A name from :func:`names` (``"HalfCheetah-v5"``), with or without ``preset:``.

    Returns:
        The config mapping (keys of :data:`rl8.cli.CONFIG_KEYS`: ``env``, ``hparams``,
        ``max_steps``...), whose ``hparams`` build a valid :class:`rl8.HParams` (see
        :func:`hparams`).

    Raises:
        ValueError: Unknown name, or a preset that does not validate (a
            :class:`rl8.cli.ConfigError` for its keys, a ``ValueError`` naming the preset and
            the field for a hyper-parameter).
    """
    from ..cli import load_config

    config = load_config(path(name))
    hparams(config)  # the values too, not only the names
    return config


def hparams(config: dict[str, Any]) -> Any:
    """The :class:`rl8.HParams` of a config dict such as :func:`load` returns (numeric strings
    read as numbers, as ``rl8 train`` reads them: :meth:`rl8.HParams.from_config`).

    Raises:
        ValueError: A hyper-parameter with a bad value (naming the preset and the field).
    """
    from ..hparams import HParams

    return HParams.from_config(config.get("hparams") or {}, f"preset {config.get('env')!r}: hparams")


def trainer_options(name: str) -> dict[str, Any]:
    """The :class:`rl8.Trainer` options that preset ``name`` sets (``eval_num_envs``,
    ``eval_num_steps``, ``experiment``...), for ``Trainer(algo, **trainer_options(name))``.

    Args:
        name: A name from :func:`names`.
    """
    import dataclasses

    from ..config import TrainerConfig

    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    return {key: TrainerConfig.read_option(key, value) for key, value in load(name).items() if key in fields}


def run_args(name: str) -> dict[str, Any]:
    """The :meth:`rl8.Trainer.run` arguments that preset ``name`` sets: ``max_env_steps`` (its
    ``max_steps``), ``steps_per_eval``, ``stop_conditions`` (built with
    :func:`rl8.conditions.from_config`), ``env_config`` and ``eval_env_config``, those it has.

    Args:
        name: A name from :func:`names`.
    """
    from ..conditions import from_config
    from .._fields import read_numbers

    config = load(name)
    out: dict[str, Any] = {}
    if config.get("max_steps") is not None:
        out["max_env_steps"] = int(read_numbers(config["max_steps"], whole_as_int=True))
    for key in ("steps_per_eval", "env_config", "eval_env_config"):
        if config.get(key) is not None:
            out[key] = read_numbers(config[key])
    specs = config.get("stop_conditions") or []
    if specs:
        out["stop_conditions"] = [from_config(spec) for spec in ([specs] if isinstance(specs, dict) else specs)]
    return out


def for_env(env: Any) -> str | None:
    """The name of the preset tuned for ``env`` when ``env`` is a gymnasium id that has one
    (``"Pendulum-v1"``), else ``None`` (classes, dotted paths and ids without a preset)."""
    if not isinstance(env, str) or env not in names():
        return None
    import yaml

    return env if yaml.safe_load(path(env).read_text()).get("env") == env else None
