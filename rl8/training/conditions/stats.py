"""Conditions on one stat: bounds (:class:`HitsUpperBound`, :class:`HitsLowerBound`) and patience
(:class:`Plateaus`, :class:`StopsIncreasing`, :class:`StopsDecreasing`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl8.training.conditions.base import COUNTER_PREFIXES, StatCondition, check_number, check_patience

__all__ = ["HitsLowerBound", "HitsUpperBound", "Plateaus", "StopsDecreasing", "StopsIncreasing"]


class _Bound(StatCondition):
    def __init__(self, key: str, bound: float) -> None:
        super().__init__(key)
        self.bound = check_number(type(self).__name__, "bound", bound)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, {self.bound!r})"


class HitsUpperBound(_Bound):
    """Stop when ``stats[key] >= bound`` (``HitsUpperBound("env/steps", 1_000_000)``: after a
    million env steps). On a counter (``env/``, ``algorithm/``), :meth:`progress` is
    ``value / bound``, which the Trainer turns into an ETA.

    Args:
        key: Stat name, e.g. ``"episodes/return_mean"`` or ``"env/steps"``.
        bound: Finite number in the stat's own unit (e.g. environment steps).
    """

    config_name = "hits_upper_bound"

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        return value is not None and value >= self.bound

    def progress(self, stats: Mapping[str, float]) -> float | None:
        if not self.key.startswith(COUNTER_PREFIXES):
            return None
        try:  # never raises for a missing or bad value
            value = float(stats[self.key])
        except (KeyError, TypeError, ValueError):
            return None
        if math.isnan(value):
            return None
        if self.bound <= 0:
            return 1.0 if value >= self.bound else 0.0
        return min(1.0, max(0.0, value / self.bound))


class HitsLowerBound(_Bound):
    """Stop when ``stats[key] <= bound``.

    Args:
        key: Stat name, e.g. ``"losses/vf"`` or ``"eval/episodes/length_mean"``.
        bound: Finite number in the stat's own unit.
    """

    config_name = "hits_lower_bound"

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        return value is not None and value <= self.bound


class _Patience(StatCondition):
    """Stop after ``patience`` consecutive checks without progress: each non-NaN value either
    counts (``count += 1``) or becomes the new mark (the attribute and state entry named
    ``_mark``) that later values are compared with (``count = 0``); the first value is a mark."""

    _mark: str  # "reference" or "best"

    def __init__(self, key: str, patience: int) -> None:
        super().__init__(key)
        self.patience = check_patience(type(self).__name__, patience)
        self.reset()

    def _counts(self, value: float, mark: float) -> bool:
        """Whether ``value`` adds to the count (rather than becoming the new mark)."""
        raise NotImplementedError

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        if value is not None and not math.isnan(value):
            mark = getattr(self, self._mark)
            if mark is not None and self._counts(value, mark):
                self.count += 1
            else:
                setattr(self, self._mark, value)
                self.count = 0
        return self.count >= self.patience

    def reset(self) -> None:
        setattr(self, self._mark, None)
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), self._mark: getattr(self, self._mark), "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        mark = state[self._mark]
        setattr(self, self._mark, None if mark is None else float(mark))
        self.count = int(state["count"])


class Plateaus(_Patience):
    """Stop when a stat has stayed within a tolerance of a reference for ``patience`` checks:
    ``patience + 1`` consecutive values within ``rtol * |r| + atol`` of the first of them, ``r``
    (a value outside becomes the new reference; see ``docs/conditions.md``).

    Args:
        key: Stat name, e.g. ``"episodes/return_mean"``.
        patience: Consecutive checks (after the reference) within the tolerance; an int >= 1.
        rtol: Relative tolerance, >= 0 (``0.01``: within 1 % of the reference).
        atol: Absolute tolerance in the stat's unit, >= 0 (for a reference that may be 0).
    """

    config_name = "plateaus"
    _mark = "reference"

    def __init__(self, key: str, *, patience: int, rtol: float, atol: float = 0.0) -> None:
        super().__init__(key, patience)
        name = type(self).__name__
        self.rtol = float(check_number(name, "rtol", rtol, minimum=0))
        self.atol = float(check_number(name, "atol", atol, minimum=0))

    def _counts(self, value: float, mark: float) -> bool:
        return abs(value - mark) <= self.rtol * abs(mark) + self.atol

    def __repr__(self) -> str:
        atol = f", atol={self.atol!r}" if self.atol else ""
        return f"{type(self).__name__}({self.key!r}, patience={self.patience}, rtol={self.rtol!r}{atol})"


class _NoNewBest(_Patience):
    _mark = "best"
    _sign: float  # +1: a best is a maximum, -1: a minimum

    def __init__(self, key: str, *, patience: int, min_delta: float = 0.0) -> None:
        super().__init__(key, patience)
        self.min_delta = float(check_number(type(self).__name__, "min_delta", min_delta, minimum=0))

    def _counts(self, value: float, mark: float) -> bool:
        return not self._sign * (value - mark) > self.min_delta  # also for inf - inf

    def __repr__(self) -> str:
        delta = f", min_delta={self.min_delta!r}" if self.min_delta else ""
        return f"{type(self).__name__}({self.key!r}, patience={self.patience}{delta})"


class StopsIncreasing(_NoNewBest):
    """Stop when a stat has not set a new maximum (the best so far plus more than
    ``min_delta``) for ``patience`` consecutive checks (early stopping).

    Args:
        key: Stat name, e.g. ``"eval/episodes/return_mean"``.
        patience: Consecutive checks without a new maximum; an int >= 1.
        min_delta: Smallest improvement that counts, in the stat's unit, >= 0.
    """

    config_name = "stops_increasing"
    _sign = 1.0


class StopsDecreasing(_NoNewBest):
    """Stop when a stat has not set a new minimum (the best so far less more than
    ``min_delta``) for ``patience`` consecutive checks.

    Args:
        key: Stat name, e.g. ``"losses/vf"``.
        patience: Consecutive checks without a new minimum; an int >= 1.
        min_delta: Smallest improvement that counts, in the stat's unit, >= 0.
    """

    config_name = "stops_decreasing"
    _sign = -1.0
