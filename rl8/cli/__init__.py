"""The ``rl8`` command (``rl8 = "rl8.cli:main"``; ``python -m rl8``, ``python -m rl8.cli``):
one module per command (:mod:`~rl8.cli.train`, :mod:`~rl8.cli.evaluate`, :mod:`~rl8.cli.record`,
:mod:`~rl8.cli.runs`, what they share in :mod:`~rl8.cli.common`), the parser and entry point in
:mod:`~rl8.cli.main`; config files are read by :mod:`rl8.training.config_file`. See
``docs/cli.md``."""

from rl8.cli.main import build_parser, main
from rl8.training.config_file import CONFIG_KEYS, ConfigError, load_config, parse_assignment

__all__ = ["CONFIG_KEYS", "ConfigError", "build_parser", "load_config", "main", "parse_assignment"]
