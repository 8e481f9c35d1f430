"""Presets: ``rl8 train`` config files shipped with rl8, one per task; from Python,
``Trainer(PPO.from_preset(name), **trainer_options(name)).run(**run_args(name))`` (docs/cli.md);
rsl_rl runner configs: :func:`from_rsl_rl` (docs/rsl_rl.md)."""

from __future__ import annotations

from typing import Any

from rl8.fields import read_numbers
from rl8.ppo.presets import PREFIX, close_names, for_env, hparams, names, path
from rl8.presets.rsl_rl import (
    RslRlConfig,
    RslRlConfigWarning,
    from_rsl_rl,
    rsl_rl_run_args,
    rsl_rl_teacher_args,
)
from rl8.training.conditions import from_config
from rl8.training.config import TrainerConfig
from rl8.training.config_file import load_config

__all__ = [
    "PREFIX",
    "RslRlConfig",
    "RslRlConfigWarning",
    "close_names",
    "for_env",
    "from_rsl_rl",
    "hparams",
    "load",
    "names",
    "path",
    "rsl_rl_run_args",
    "rsl_rl_teacher_args",
    "run_args",
    "trainer_options",
]


def load(name: str) -> dict[str, Any]:
    """Preset ``name`` (from :func:`names`, ``"HalfCheetah-v5"``, with or without ``preset:``) as a
    config dict (keys of :data:`rl8.cli.CONFIG_KEYS`), checked as ``rl8 train`` checks a config
    file (a ``ValueError`` for an unknown name or a bad preset)."""
    config = load_config(path(name))
    hparams(config)  # the values too, not only the names
    return config


def trainer_options(name: str) -> dict[str, Any]:
    """The :class:`rl8.Trainer` options that preset ``name`` (from :func:`names`) sets (``eval_num_envs``...)."""
    fields = TrainerConfig.names()
    return {
        key: TrainerConfig.read_option(key, value) for key, value in load(name).items() if key in fields
    }


def run_args(name: str) -> dict[str, Any]:
    """The :meth:`rl8.Trainer.run` arguments that preset ``name`` (from :func:`names`) sets:
    ``max_env_steps`` (its ``max_steps``), ``steps_per_eval``, ``stop_conditions``, ``env_config``,
    ``eval_env_config``."""
    config = load(name)
    out: dict[str, Any] = {}
    if config.get("max_steps") is not None:
        out["max_env_steps"] = int(read_numbers(config["max_steps"], whole_as_int=True))
    for key in ("steps_per_eval", "env_config", "eval_env_config"):
        if config.get(key) is not None:
            out[key] = read_numbers(config[key])
    specs = config.get("stop_conditions") or []
    if specs:
        out["stop_conditions"] = [
            from_config(spec) for spec in ([specs] if isinstance(specs, dict) else specs)
        ]
    return out
