"""Conditions on one stat: bounds (:class:`HitsUpperBound`, :class:`HitsLowerBound`) and patience
(:class:`Plateaus`, :class:`StopsIncreasing`, :class:`StopsDecreasing`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl8.training.conditions.base import COUNTER_PREFIXES, StatCondition, check_number, check_patience

__all__ = ["HitsLowerBound", "HitsUpperBound", "Plateaus", "StopsDecreasing", "StopsIncreasing"]


class HitsUpperBound(StatCondition):
    """Stop when ``stats[key] >= bound``.

    An upper bound on a counter (a key starting with ``env/`` or ``algorithm/``) reports
    :meth:`progress` as ``value / bound``, which the Trainer turns into an ETA.

    Args:
        key: Stat name, e.g. ``"episodes/return_mean"`` or ``"env/steps"``.
        bound: Finite number in the stat's own unit (e.g. environment steps).

    Example:
        ``HitsUpperBound("env/steps", 1_000_000)`` stops after one million environment steps.
    """

    config_name = "hits_upper_bound"

    def __init__(self, key: str, bound: float) -> None:
        super().__init__(key)
        self.bound = check_number(type(self).__name__, "bound", bound)

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        return value is not None and value >= self.bound

    def progress(self, stats: Mapping[str, float]) -> float | None:
        if not self.key.startswith(COUNTER_PREFIXES):
            return None
        value = self._peek(stats)
        if value is None or math.isnan(value):
            return None
        if self.bound <= 0:
            return 1.0 if value >= self.bound else 0.0
        return min(1.0, max(0.0, value / self.bound))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, {self.bound!r})"


class HitsLowerBound(StatCondition):
    """Stop when ``stats[key] <= bound``.

    Args:
        key: Stat name, e.g. ``"losses/vf"``.
        bound: Finite number in the stat's own unit.

    Example:
        ``HitsLowerBound("eval/episodes/length_mean", 50)`` stops once evaluation episodes are
        50 steps or shorter (e.g. a goal is reached quickly).
    """

    config_name = "hits_lower_bound"

    def __init__(self, key: str, bound: float) -> None:
        super().__init__(key)
        self.bound = check_number(type(self).__name__, "bound", bound)

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        return value is not None and value <= self.bound

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, {self.bound!r})"


class _Patience(StatCondition):
    """Shared logic of the conditions that stop after ``patience`` consecutive checks without
    progress (:class:`Plateaus`, :class:`StopsIncreasing`, :class:`StopsDecreasing`).

    Each non-NaN value either counts (``count`` goes up by one) or becomes the new mark, the
    value later ones are compared with (``count`` back to 0); the first value is a mark. The
    mark is the attribute and state entry named :attr:`_mark`.
    """

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
    """Stop when a stat has stayed within a tolerance of a reference for ``patience`` checks.

    Precisely: the first (non-NaN) value seen becomes the *reference* ``r`` and the counter is 0.
    At each later check with value ``v``:

    * if ``|v - r| <= rtol * |r| + atol`` the counter goes up by one;
    * otherwise ``v`` becomes the new reference and the counter goes back to 0.

    The condition is ``True`` once the counter reaches ``patience``, i.e. after ``patience + 1``
    consecutive values that all lie within the tolerance of the first of them. The reference is
    not updated while values stay within tolerance, so a slow drift (each step close to the
    previous one) still resets the counter once it has moved ``rtol`` away from the reference.

    Args:
        key: Stat name, e.g. ``"episodes/return_mean"``.
        patience: Number of consecutive checks (after the reference) within the tolerance;
            an int >= 1.
        rtol: Relative tolerance, >= 0 (``0.01``: within 1 % of the reference).
        atol: Absolute tolerance in the stat's unit, >= 0 (default 0). Useful when the
            reference may be 0, where a purely relative tolerance only accepts exact equality.

    Example:
        ``Plateaus("episodes/return_mean", patience=20, rtol=0.01)``
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
    """Shared logic of :class:`StopsIncreasing` and :class:`StopsDecreasing`."""

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
    """Stop when a stat has not set a new maximum for ``patience`` consecutive checks.

    The first (non-NaN) value is the initial maximum. A value counts as a new maximum when it
    exceeds the best so far by more than ``min_delta``; it then becomes the best and the counter
    goes back to 0, otherwise the counter goes up by one. ``True`` once the counter reaches
    ``patience`` (early stopping).

    Args:
        key: Stat name, e.g. ``"eval/episodes/return_mean"``.
        patience: Number of consecutive checks without a new maximum; an int >= 1.
        min_delta: Smallest improvement that counts, in the stat's unit, >= 0 (default 0:
            any strict increase).
    """

    config_name = "stops_increasing"

    _sign = 1.0


class StopsDecreasing(_NoNewBest):
    """Stop when a stat has not set a new minimum for ``patience`` consecutive checks.

    The mirror image of :class:`StopsIncreasing`: a value counts as a new minimum when it is
    below the best so far by more than ``min_delta``.

    Args:
        key: Stat name, e.g. ``"losses/vf"``.
        patience: Number of consecutive checks without a new minimum; an int >= 1.
        min_delta: Smallest improvement that counts, in the stat's unit, >= 0 (default 0:
            any strict decrease).
    """

    config_name = "stops_decreasing"

    _sign = -1.0
