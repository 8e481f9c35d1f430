"""The progress display of :meth:`rl8.Trainer.run`: one status line (env steps, steps/s,
latest returns, the stop condition closest to firing, an ETA) and a summary line at the end."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from .conditions import Condition, HitsLowerBound, HitsUpperBound, TimeLimit

__all__ = ["Progress"]


def _format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def _format_count(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _condition_label(condition: Condition) -> str:
    """A short name of a stop condition for the progress line."""
    if isinstance(condition, HitsUpperBound):
        return f"{condition.key} >= {condition.bound:.4g}"
    if isinstance(condition, HitsLowerBound):
        return f"{condition.key} <= {condition.bound:.4g}"
    if isinstance(condition, TimeLimit):
        return f"time limit {_format_duration(condition.seconds)}"
    return repr(condition)


def _latest(stats: Mapping[str, float], keys: Sequence[str]) -> float | None:
    """The first of ``keys`` in ``stats`` that is a number (not NaN), else ``None``."""
    for key in keys:
        value = stats.get(key)
        if value is not None and not _is_nan(value):
            return float(value)
    return None


class Progress:
    """One status line for long runs: env steps, steps/s, latest returns, the stop condition
    closest to firing and an ETA; and a summary line when the run stops.

    ``mode=None`` or ``True``: on a terminal, one line updated in place (``\r``, at most every
    0.25 s); otherwise a plain line every ``interval_s`` seconds. ``False``: never.

    How close a condition is to firing: :meth:`~rl8.conditions.Condition.progress` when it
    knows (counters, time limits), which also gives the ETA; for a bound on another stat (a
    return target), the fraction of the gap between the first value seen in this run and the
    bound that has been closed. The ETA reads ``<=`` when such a condition may fire first.
    """

    def __init__(self, mode: bool | None, stream: TextIO | None = None, *, interval_s: float = 10.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.enabled = mode is not False
        self.interval = 0.25 if self.tty else interval_s
        self._last_write = -math.inf
        self._width = 0
        self._start: tuple[float, float] | None = None  # (time, env steps) when run() began
        self._first: tuple[float, float] | None = None  # (time, fraction) at the first step
        self._first_values: dict[int, float] = {}  # id(condition): its stat's first value
        self._latest_return: float | None = None
        self._latest_eval_return: float | None = None
        self._wrote = False

    def _target_fraction(self, condition: Condition, stats: Mapping[str, float]) -> float | None:
        """Fraction of the gap from the stat's first value to the bound closed so far."""
        if not isinstance(condition, (HitsUpperBound, HitsLowerBound)):
            return None
        value = _latest(stats, [condition.key])
        if value is None:
            return None
        first = self._first_values.setdefault(id(condition), value)
        gap = condition.bound - first
        if gap == 0 or (gap < 0) == isinstance(condition, HitsUpperBound):  # at or past the bound
            return 1.0
        return min(1.0, max(0.0, (value - first) / gap))

    def update(self, stats: Mapping[str, float], conditions: Sequence[Condition], *, force: bool = False) -> None:
        """Record a step's stats; redraw the line if the last draw is old enough (or ``force``).

        Args:
            stats: The step's stats.
            conditions: The run's stop conditions.
            force: Draw now (the final state of a run).
        """
        if not self.enabled:
            return
        now = time.monotonic()
        # episodic envs: keep the last mean when no episode ended; the env's own episode
        # records (the Atari preset's unclipped games) come before PPO's episodes
        for attr, keys in (
            ("_latest_return", ["env_episodes/return_mean", "episodes/return_mean", "rollout/reward_sum_mean"]),
            ("_latest_eval_return", ["eval/env_episodes/return_mean", "eval/episodes/return_mean",
                                     "eval/rollout/reward_sum_mean"]),
        ):
            key = next((key for key in keys if key in stats), None)  # the first kind the stats have
            if key is not None and not _is_nan(stats[key]):
                setattr(self, attr, float(stats[key]))
        linear = {i: c.progress(stats) for i, c in enumerate(conditions)}
        targets = {i: self._target_fraction(c, stats) for i, c in enumerate(conditions) if linear[i] is None}
        steps = float(stats.get("env/steps", 0.0))
        if self._start is None:
            # the run started one step ago: that step's duration is in its profiling stats
            seconds = (stats.get("profiling/collect_ms", 0.0) + stats.get("profiling/step_ms", 0.0)) / 1e3
            rate = stats.get("throughput/env_steps_per_s", 0.0)
            self._start = (now - seconds, steps - rate * seconds)
        known = [f for f in linear.values() if f is not None]
        fraction = max(known) if known else None
        if fraction is not None and self._first is None:
            self._first = (now, fraction)
        if not force and now - self._last_write < self.interval:
            return
        self._last_write = now
        t0, steps0 = self._start
        rate = (steps - steps0) / max(now - t0, 1e-9)
        parts = [f"rl8 {_format_count(steps)} env steps", f"{_format_count(rate)} steps/s"]
        if self._latest_return is not None:
            parts.append(f"return {self._latest_return:.4g}")
        if self._latest_eval_return is not None:
            parts.append(f"eval return {self._latest_eval_return:.4g}")
        closeness = {i: f for i, f in {**linear, **targets}.items() if f is not None}
        if closeness:
            nearest = max(closeness, key=closeness.__getitem__)
            parts.append(f"{100 * closeness[nearest]:.0f}% to {_condition_label(conditions[nearest])}")
        if fraction is not None:
            # another condition (a return target, a plateau) may stop the run before this ETA
            bound = "<= " if len(known) < len(conditions) else ""
            t1, f1 = self._first  # type: ignore[misc]
            if fraction >= 1.0:
                parts.append("ETA 0s")
            elif fraction > f1 and now > t1:  # from the pace since the first step of this run
                parts.append(f"ETA {bound}{_format_duration((now - t1) * (1 - fraction) / (fraction - f1))}")
        self._write(" | ".join(parts))

    def _write(self, line: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._wrote = True

    def summary(self, stats: Mapping[str, float], stopped_by: Condition | None, *,
                held_at_checkpoint: bool = False) -> None:
        """The last line of a run: which condition stopped it, after how many env steps and
        how long, with the latest returns. ``held_at_checkpoint``: the run was resumed from a
        checkpoint where the stop conditions already held (``stopped_by``: the one that did,
        when known)."""
        if not self.enabled:
            return
        self.close()
        steps = float(stats.get("env/steps", 0.0))
        seconds = time.monotonic() - self._start[0] if self._start is not None else 0.0
        if held_at_checkpoint:
            cause = (f"stopped by {stopped_by!r}, which already held at the checkpoint's step"
                     if stopped_by is not None
                     else "stopped: the stop conditions already held at the checkpoint's step")
        else:
            cause = f"stopped by {stopped_by!r}" if stopped_by is not None else "stopped"
        line = f"rl8: {cause} after {_format_count(steps)} env steps in {_format_duration(seconds)}"
        returns = [
            f"{name} {value:.4g}"
            for name, value in (("return", self._latest_return), ("eval return", self._latest_eval_return))
            if value is not None
        ]
        if returns:
            line += f" ({', '.join(returns)})"
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._wrote:
            self.stream.write("\n")
            self.stream.flush()
        self._wrote = False
