"""Numbers in config files: YAML reads ``3e-4`` (no dot) as a string; rl8 means the number.

A bottom module (it imports no rl8 module), used by the hyper-parameters, the Trainer's
options, the presets and the ``rl8`` command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["read_numbers"]

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def read_numbers(value: Any) -> Any:
    """``value`` with its numeric strings as numbers, recursively (in dicts and lists): YAML
    reads ``3e-4`` (no dot) as the string ``"3e-4"``; config files (``rl8 train``, presets)
    mean the number. ``"12"`` becomes the int 12, ``"3e-4"`` the float; other values are
    returned as they are.

    Args:
        value: A value read from a config file.
    """
    if isinstance(value, str):
        text = value.strip()
        if _INT.fullmatch(text):
            return int(text)
        if _FLOAT.fullmatch(text):
            return float(text)
        return value
    if isinstance(value, Mapping):
        return {k: read_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [read_numbers(v) for v in value]
    return value
