"""Piecewise schedules of a coefficient over environment steps (learning rate, entropy)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Literal

__all__ = ["Schedule", "ScheduleKind"]

#: How a schedule goes from one point to the next (see :class:`Schedule`).
ScheduleKind = Literal["step", "linear"]


class Schedule:
    """A value that changes with the number of environment steps taken.

    Args:
        points: ``[(env_steps, value), ...]`` with strictly increasing ``env_steps`` (env
            transitions, from 0) and finite values.
        kind: ``"step"``: the value of the last point reached; ``"linear"``: interpolated
            between neighbouring points (the first and last values hold outside them).
        field: Name of the hyper-parameter, used in error messages.
    """

    def __init__(
        self, points: Sequence[Sequence[float]], kind: ScheduleKind = "step", *, field: str = "schedule"
    ) -> None:
        if kind not in ("step", "linear"):
            raise ValueError(f"{field}: kind must be 'step' or 'linear', got {kind!r}")
        if len(points) == 0:
            raise ValueError(f"{field}: expected at least one (env_steps, value) point, got []")
        self.kind: ScheduleKind = kind
        self.steps: list[float] = []
        self.values: list[float] = []
        for i, point in enumerate(points):
            if len(point) != 2:
                raise ValueError(f"{field}[{i}]: expected an (env_steps, value) pair, got {point!r}")
            s, v = float(point[0]), float(point[1])
            if not (math.isfinite(s) and math.isfinite(v)) or s < 0:
                raise ValueError(
                    f"{field}[{i}]: expected env_steps >= 0 and a finite value, got {tuple(point)!r}"
                )
            if self.steps and s <= self.steps[-1]:
                raise ValueError(
                    f"{field}: env_steps must be strictly increasing, got {self.steps[-1]:g} then {s:g}"
                )
            self.steps.append(s)
            self.values.append(v)

    def __call__(self, env_steps: int) -> float:
        """The value after ``env_steps`` environment transitions."""
        i = bisect.bisect_right(self.steps, env_steps) - 1
        if i < 0:
            return self.values[0]
        if self.kind == "step" or i == len(self.steps) - 1:
            return self.values[i]
        s0, s1 = self.steps[i], self.steps[i + 1]
        v0, v1 = self.values[i], self.values[i + 1]
        return v0 + (v1 - v0) * (env_steps - s0) / (s1 - s0)

    def __repr__(self) -> str:
        return f"Schedule({list(zip(self.steps, self.values))!r}, kind={self.kind!r})"
