"""The ``rl8`` command (``python -m rl8``): one module per command, the parser and entry point in
:mod:`~rl8.cli.main`. See ``docs/cli.md``."""

from rl8.cli.main import build_parser, main
from rl8.training.config_file import CONFIG_KEYS, ConfigError, load_config, parse_assignment

__all__ = ["CONFIG_KEYS", "ConfigError", "build_parser", "load_config", "main", "parse_assignment"]
