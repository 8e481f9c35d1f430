"""The preset files (this folder's ``*.yaml``, read with ``yaml.safe_load``), for
:meth:`rl8.PPO.from_preset`; :mod:`rl8.presets` is the public module."""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rl8.fields import did_you_mean
from rl8.ppo.hparams import HParams

__all__ = ["PREFIX", "close_names", "for_env", "hparams", "load", "names", "path"]

#: ``rl8 train preset:NAME`` always names a preset (even where a file ``NAME`` exists).
PREFIX = "preset:"


def _folder() -> Path:
    return Path(str(resources.files(__name__)))


def names() -> list[str]:
    """The names of the presets shipped with rl8 (their file names without ``.yaml``), sorted."""
    return sorted(p.stem for p in _folder().glob("*.yaml"))


def close_names(name: str) -> list[str]:
    """The presets that ``name`` (not a preset) may have meant: the one it names up to case
    (``cartpole``: ``CartPole``), else up to 3 close to it whatever the case (difflib's ratio
    at least 0.7: lower-case names share more letters, so 0.6 would find ``Acrobot-v1`` for
    ``CartPol-v1``).

    Args:
        name: The name given.
    """
    known = {preset.lower(): preset for preset in names()}
    if name.lower() in known:
        return [known[name.lower()]]
    return [
        known[close] for close in difflib.get_close_matches(name.lower(), list(known), n=3, cutoff=0.7)
    ]


def path(name: str) -> Path:
    """The YAML file of preset ``name`` (with or without ``preset:``; ``ValueError`` if none)."""
    if not isinstance(name, str):
        raise ValueError(f"preset name: expected a string, got {type(name).__name__} {name!r}")
    if name.startswith(PREFIX):
        name = name[len(PREFIX) :]
    known = names()
    if name not in known:
        raise ValueError(
            f"unknown preset {name!r}{did_you_mean(name, close=close_names(name))} "
            f"(presets: {', '.join(known)})"
        )
    return _folder() / f"{name}.yaml"


def load(name: str) -> dict[str, Any]:
    """Preset ``name`` (from :func:`names`, with or without ``preset:``) as a dict, its
    ``hparams`` checked (``ValueError``)."""
    config = yaml.safe_load(path(name).read_text()) or {}
    hparams(config)
    return config


def hparams(config: dict[str, Any]) -> HParams:
    """The :class:`rl8.HParams` of a config dict such as :func:`load` returns."""
    return HParams.from_config(config.get("hparams") or {}, f"preset {config.get('env')!r}: hparams")


def for_env(env: Any) -> str | None:
    """The name of the preset tuned for ``env`` (a gymnasium id), or ``None``."""
    if not isinstance(env, str) or env not in names():
        return None
    return env if yaml.safe_load(path(env).read_text()).get("env") == env else None
