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

import dataclasses
from typing import Any

from rl8.fields import read_numbers
from rl8.ppo.presets import PREFIX, for_env, hparams, names, path
from rl8.training.config_file import load_config
from rl8.training.conditions import from_config
from rl8.training.config import TrainerConfig

__all__ = ["PREFIX", "for_env", "hparams", "load", "names", "path", "run_args", "trainer_options"]


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
    config = load_config(path(name))
    hparams(config)  # the values too, not only the names
    return config


def trainer_options(name: str) -> dict[str, Any]:
    """The :class:`rl8.Trainer` options that preset ``name`` sets (``eval_num_envs``,
    ``eval_num_steps``, ``experiment``...), for ``Trainer(algo, **trainer_options(name))``.

    Args:
        name: A name from :func:`names`.
    """
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    return {key: TrainerConfig.read_option(key, value) for key, value in load(name).items() if key in fields}


def run_args(name: str) -> dict[str, Any]:
    """The :meth:`rl8.Trainer.run` arguments that preset ``name`` sets: ``max_env_steps`` (its
    ``max_steps``), ``steps_per_eval``, ``stop_conditions`` (built with
    :func:`rl8.training.conditions.from_config`), ``env_config`` and ``eval_env_config``, those it has.

    Args:
        name: A name from :func:`names`.
    """
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
