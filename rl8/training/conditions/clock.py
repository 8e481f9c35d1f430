"""A condition on the wall clock: :class:`TimeLimit`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rl8.training.conditions.base import Condition, check_number

__all__ = ["TimeLimit"]


class TimeLimit(Condition):
    """Stop when ``seconds`` of wall-clock time have elapsed since the first check or
    :meth:`start`; :meth:`progress` is the elapsed fraction. A checkpoint keeps the elapsed time
    (the time between two runs is not counted; see ``docs/conditions.md``).

    Args:
        seconds: Wall-clock budget in seconds, a finite number > 0.
    """

    config_name = "time_limit"

    def __init__(self, seconds: float) -> None:
        self.seconds = check_number(type(self).__name__, "seconds", seconds, strictly_positive=True)
        self._offset = 0.0  # seconds elapsed in earlier runs (restored from a checkpoint)
        self._started_at: float | None = None

    @property
    def elapsed(self) -> float:
        """Seconds counted so far (0 before the clock starts)."""
        return self._offset + (0.0 if self._started_at is None else time.monotonic() - self._started_at)

    def start(self) -> None:
        if self._started_at is None:
            self._started_at = time.monotonic()

    def __call__(self, stats: Mapping[str, float]) -> bool:
        self.start()
        return self.elapsed >= self.seconds

    def progress(self, stats: Mapping[str, float]) -> float | None:
        return min(1.0, self.elapsed / self.seconds)

    def reset(self) -> None:
        self._offset = 0.0
        self._started_at = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "elapsed": self.elapsed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        self._offset = float(state["elapsed"])
        self._started_at = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seconds={self.seconds!r})"
