"""The ``rl8`` command (``rl8 = "rl8.cli:main"``; ``python -m rl8``, ``python -m rl8.cli``):
train from a YAML config or flags, resume, evaluate or record a saved policy, list and clean
runs. The commands are in :mod:`rl8.cli.main`; config files in :mod:`rl8.presets.config_file`.
See ``docs/cli.md``."""

from rl8.cli.main import build_parser, main
from rl8.presets.config_file import CONFIG_KEYS, ConfigError, load_config, parse_assignment

__all__ = ["CONFIG_KEYS", "ConfigError", "build_parser", "load_config", "main", "parse_assignment"]
