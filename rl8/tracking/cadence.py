"""Which training steps a :class:`~rl8.tracking.Tracker` logs: the :class:`LogCadence`."""

from __future__ import annotations

import math
import numbers

from rl8.fields import check_int

__all__ = ["INTERVAL_S", "YOUNG_S", "YOUNG_STEPS", "LogCadence"]

#: Seconds from the first step during which the automatic cadence logs every step (a young run):
#: a short run gets a full curve.
YOUNG_S = 60.0
#: Most steps of a young run logged that way: a fast run logs at most 1,000 points so.
YOUNG_STEPS = 1000
#: Then one step per INTERVAL_S seconds: 3,600 points in 10 hours, whatever the step rate.
INTERVAL_S = 10.0


class LogCadence:
    """Decides, as each new step begins, whether its metrics are logged now (the values of the
    steps it skips are held: each log has the latest value of every metric).

    The rules:

    - ``every=N`` (a fixed cadence): the N-th, 2N-th, 3N-th ... step this cadence sees.
    - ``every=None`` (the automatic cadence): every step while the run is young, that is during
      the ``young_s`` seconds from its first step and for at most ``young_steps`` steps; then a
      step when at least ``interval_s`` seconds passed since the previous step it logged (so a
      run slower than one step per ``interval_s`` still logs every step).
    - Either way, the caller logs some steps whatever the cadence says (the Tracker: values
      logged with ``always=True`` such as evaluations, a checkpoint's step, and what is held at
      ``flush`` or ``end``, which is the last step); they do not change the cadence.

    Args:
        every: Steps between two logs of a fixed cadence (>= 1; 1: every step); ``None``: the
            automatic cadence.
        young_s: Seconds from the first step during which every step is logged (automatic).
        young_steps: Most steps logged that way (automatic).
        interval_s: Seconds between two logs once the run is no longer young (automatic).
    """

    def __init__(
        self,
        every: int | None = None,
        *,
        young_s: float = YOUNG_S,
        young_steps: int = YOUNG_STEPS,
        interval_s: float = INTERVAL_S,
    ) -> None:
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1
        ):
            raise ValueError(
                f"log_every must be an int >= 1 or None (the automatic cadence), got {every!r}"
            )
        check_int("young_steps", young_steps, 0)
        for name, value in (("young_s", young_s), ("interval_s", interval_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.every = None if every is None else int(every)
        self.young_s = float(young_s)
        self.young_steps = young_steps
        self.interval_s = float(interval_s)
        self.steps = 0  # the steps seen so far
        self.started_at = math.nan  # the time of the first
        self.logged_at = -math.inf  # the time of the latest step this cadence logged

    def due(self, now: float) -> bool:
        """A new step begins at ``now`` (seconds of a monotonic clock): whether it is logged."""
        self.steps += 1
        if self.steps == 1:
            self.started_at = now
        if self.every is not None:
            due = self.steps % self.every == 0
        else:
            young = self.steps <= self.young_steps and now - self.started_at < self.young_s
            due = young or now - self.logged_at >= self.interval_s
        if due:
            self.logged_at = now
        return due
