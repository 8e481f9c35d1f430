"""Whether the process that a lock file or an MLflow run names still runs (``rl8 runs``, the
lock of a checkpoint folder)."""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["process_state"]


def process_state(host: Any, pid: Any) -> str:
    """``"alive"``, ``"dead"`` or ``"unknown"`` (another host, or no pid): the process ``pid``
    (an int) of the machine named ``host`` (as ``socket.gethostname()`` names it)."""
    if host != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return "unknown"
    if pid == os.getpid():
        return "alive"
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return "dead"
    except OSError:  # it exists, owned by another user
        pass
    return "alive"
