"""What :meth:`rl8.Trainer.run` prints (the ``rl8`` command prints :func:`results_lines` too);
see ``docs/trainer.md#progress``."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from rl8.ppo.distributed import current_roles
from rl8.training.conditions import Condition, HitsLowerBound, HitsUpperBound, TimeLimit

__all__ = ["Progress", "RunView", "is_nan", "mlflow_ui_command", "results_lines", "start_lines"]

#: Another condition becomes the progress line's target only when its ETA is under this fraction
#: of the target's: the line does not switch between two conditions whose ETAs are close.
SWITCH_ETA_RATIO = 0.8
#: While no condition has an ETA: another condition becomes the target only when it is this much
#: closer to holding (a fraction of the way) than the current target.
SWITCH_MARGIN = 0.1
#: Values of a target stat kept for its trend (the ETA of a return target).
TREND_POINTS = 10


class RunView(Protocol):
    """What the progress lines read of a :class:`rl8.Trainer` (its public attributes)."""

    algo: Any  #: the PPO: its ``env_steps``, ``steps`` and ``dist``
    config: Any  #: the TrainerConfig: ``actors``
    tracker: Any  #: the Tracker: ``run_id``, ``enabled``, ``tracking_uri``, ``start_error``
    metadata: dict[str, Any]  #: ``"config"`` there: a run of the ``rl8`` command
    last_checkpoint: Path | None

    @property
    def checkpoint_dir(self) -> Path: ...


#: The stats a line shows as the return, the first the stats have (the env's own records first).
_RETURN_KEYS = ("env_episodes/return_mean", "episodes/return_mean", "rollout/reward_sum_mean")


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


def is_nan(value: Any) -> bool:
    """Whether ``value`` is a float NaN (a stat that has no value at this step)."""
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


def mlflow_ui_command(uri: str) -> str:
    """The command that shows the runs of the resolved tracking URI ``uri``
    (``trainer.tracker.tracking_uri``): ``mlflow ui``, with ``--backend-store-uri URI`` for another
    store than ``./mlflow.db``, or the server's address; with what to install first when MLflow's
    UI server is missing."""
    if uri.lower().startswith(("http://", "https://")):
        return f"open {uri} (the tracking server already serves the UI)"
    command = f"mlflow ui --backend-store-uri {uri}"
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        if db.resolve() == (Path.cwd() / "mlflow.db").resolve():
            command = "mlflow ui"
    if importlib.util.find_spec("flask") is None:  # mlflow-skinny: no UI server
        # the release of the installed mlflow-skinny: another would move skinny off it (and a
        # store migrated by a newer one is unreadable by an older one)
        command += f' (after pip install "mlflow=={importlib.metadata.version("mlflow-skinny")}")'
    return command


def _launcher(trainer: RunView) -> str:
    """How to start the same number of ranks again (empty outside torchrun)."""
    roles, dist = current_roles(), trainer.algo.dist
    if roles is None and not dist.enabled:
        return ""
    world_size = roles.world_size if roles is not None else dist.world_size  # actors included
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    nodes = world_size // max(per_node, 1)
    return f"torchrun {f'--nnodes={nodes} ' if nodes > 1 else ''}--nproc_per_node={per_node} -m "


def _resume_command(trainer: RunView, checkpoint: Path) -> str:
    """How to go on from ``checkpoint``: ``rl8 train --resume`` for a run of the ``rl8`` command
    (its metadata holds the command's config), else the Python call."""
    if "config" in trainer.metadata:
        actors = f" --actors {trainer.config.actors}" if trainer.config.actors else ""
        return f"{_launcher(trainer)}rl8 train --resume {checkpoint}{actors}"
    return f"Trainer.from_checkpoint({str(checkpoint)!r})"


def start_lines(trainer: RunView) -> list[str] | None:
    """Where the results of a run go (the MLflow run, its tracking URI and the command that shows
    it, the checkpoint folder); ``None`` while a run starting in the background has no id yet."""
    tracker = trainer.tracker
    run_id = trainer.tracker.run_id  # never waits for a start in progress
    if (tracker.enabled and run_id is None) or tracker.start_error is not None:
        return None  # starting, or failed to start (an error the next step raises)
    lines = []
    if run_id is not None:
        uri = tracker.tracking_uri
        lines.append(f"rl8: MLflow run {run_id} in {uri} (to see it: {mlflow_ui_command(uri)})")
    lines.append(f"rl8: checkpoints in {trainer.checkpoint_dir}")
    return lines


def results_lines(trainer: RunView) -> list[str]:
    """Where the results of a run went (steps, the MLflow run, the latest checkpoint and how to
    resume from it, the ``mlflow ui`` command); never waits or raises."""
    algo = trainer.algo
    lines = [f"rl8: {algo.env_steps} env steps, {algo.updates} training steps"]
    run_id = trainer.tracker.run_id  # never waits for a start in progress
    uri = trainer.tracker.tracking_uri if run_id else None
    if run_id:
        lines += [f"run id:     {run_id}", f"tracking:   {uri}"]
    if trainer.last_checkpoint is not None:
        lines.append(f"checkpoint: {trainer.last_checkpoint}")
        lines.append(f"resume:     {_resume_command(trainer, trainer.last_checkpoint)}")
    if uri:
        lines.append(f"mlflow ui:  {mlflow_ui_command(uri)}")
    return lines


class Progress:
    """One status line for long runs (naming the nearest stop condition and its ETA), a summary
    line when the run stops, and where the results go (see ``docs/trainer.md#progress``).

    Args:
        mode: ``None``/``True``: show (in place on a terminal, at most every 0.25 s, else a plain
            line every ``interval_s`` seconds); ``False``: quiet.
        stream: Where the lines go (default ``sys.stderr``); :meth:`results` prints on stdout.
        interval_s: Seconds between two plain lines when ``stream`` is not a terminal.
        run: The Trainer whose run this is: the lines saying where its results go
            (:func:`start_lines`) come first, on ``stream``, and no progress line is drawn before
            them; ``None``: progress lines only.
    """

    def __init__(
        self,
        mode: bool | None,
        stream: TextIO | None = None,
        *,
        interval_s: float = 10.0,
        run: RunView | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.enabled = mode is not False
        self.interval = 0.25 if self.tty else interval_s
        self.run = run
        self._last_write = -math.inf
        self._width = 0
        self._started_at: float | None = None  # the time run() began
        # by condition: (time, progress or stat) first seen; (time, value)s of its stat
        self._first: dict[int, tuple[float, float]] = {}
        self._trends: dict[int, deque[tuple[float, float]]] = {}
        # by condition: the fraction done, the last known (an eval/ stat is missing between
        # evaluations); the ETA at the pace of a counter or clock; the ETA at a stat's trend
        self._closeness: dict[int, float] = {}
        self._pace_etas: dict[int, float | None] = {}
        self._trend_etas: dict[int, float | None] = {}
        self._target: int | None = None  # the condition the line names
        self._latest_returns: dict[str, float | None] = {"return": None, "eval return": None}
        self._drawn_steps: float | None = None  # the env steps of the line drawn last
        self._wrote = False
        self._announced = run is None

    def _gap_closed(
        self, i: int, condition: Condition, stats: Mapping[str, float], now: float
    ) -> float | None:
        """A bound on a stat that is not a counter: the fraction of the gap from the stat's first
        value to the bound closed so far (its values feed the trend)."""
        if not isinstance(condition, (HitsUpperBound, HitsLowerBound)):
            return None
        value = stats.get(condition.key)
        if value is None or is_nan(value):
            return None
        value = float(value)
        self._trends.setdefault(i, deque(maxlen=TREND_POINTS)).append((now, value))
        _, first = self._first.setdefault(i, (now, value))
        gap = condition.bound - first
        if gap == 0 or (gap < 0) == isinstance(condition, HitsUpperBound):  # at or past the bound
            return 1.0
        return min(1.0, max(0.0, (value - first) / gap))

    def _pace_eta(self, i: int, fraction: float, now: float) -> float | None:
        """Seconds until ``fraction`` reaches 1 at the pace since it was first seen."""
        t1, f1 = self._first.setdefault(i, (now, fraction))
        if fraction >= 1.0:
            return 0.0
        return (now - t1) * (1 - fraction) / (fraction - f1) if fraction > f1 and now > t1 else None

    def _trend_eta(self, i: int, condition: Condition, now: float) -> float | None:
        """Seconds from ``now`` until the stat reaches its bound at its recent trend (a straight
        line through its last values), or ``None`` while that line does not head for the bound."""
        points = self._trends.get(i, ())
        if len(points) < 3:
            return None
        try:  # value per second, least squares
            slope = statistics.linear_regression(*zip(*points)).slope
        except statistics.StatisticsError:  # all at one time
            return None
        last_time, last_value = points[-1]
        remaining = condition.bound - last_value  # type: ignore[attr-defined]
        if slope == 0 or (remaining > 0) != (slope > 0):
            return None
        seconds = remaining / slope - (now - last_time)  # from the last value, which may be old
        return max(0.0, seconds) if seconds < 100 * 86400 else None

    def _measure(self, stats: Mapping[str, float], conditions: Sequence[Condition], now: float) -> None:
        """Each condition's fraction done and ETA at this step."""
        self._pace_etas, self._trend_etas = {}, {}
        for i, condition in enumerate(conditions):
            fraction = condition.progress(stats)
            if fraction is not None:  # a counter or a clock
                self._closeness[i] = fraction
                self._pace_etas[i] = self._pace_eta(i, fraction, now)
                continue
            if (fraction := self._gap_closed(i, condition, stats, now)) is not None:
                self._closeness[i] = fraction
            if i in self._trends:
                self._trend_etas[i] = self._trend_eta(i, condition, now)

    def _choose_target(self, held: list[bool]) -> int | None:
        """The condition to name: one that holds; else the one with the smallest ETA (the first
        listed of equal ones), which stays the target until another's ETA is under
        :data:`SWITCH_ETA_RATIO` of its own or its ETA is unknown; while no condition has an
        ETA, the one closest to holding, kept until another is :data:`SWITCH_MARGIN` closer."""
        if any(held):
            return held.index(True)
        current = self._target
        etas = {i: eta for i, eta in {**self._pace_etas, **self._trend_etas}.items() if eta is not None}
        if etas:
            nearest = min(etas, key=lambda i: (etas[i], i))  # of equal ETAs the first listed
            keep = current in etas and etas[nearest] >= SWITCH_ETA_RATIO * etas[current]
        elif self._closeness:
            closeness = self._closeness
            nearest = max(closeness, key=lambda i: (closeness[i], -i))
            keep = current in closeness and closeness[nearest] < closeness[current] + SWITCH_MARGIN
        else:
            return None
        return current if keep else nearest

    def update(
        self,
        stats: Mapping[str, float],
        conditions: Sequence[Condition],
        *,
        force: bool = False,
        held: Sequence[bool] | None = None,
    ) -> None:
        """Record a step's ``stats``, the run's stop ``conditions`` and which of them ``held`` at
        this step (``None``: none); redraw the line if the last draw is old enough, or now when
        ``force`` (the final state of a run) unless the line of this step is drawn already."""
        if not self.enabled:
            return
        steps = float(stats.get("env/steps", 0.0))
        if force and steps == self._drawn_steps:
            return  # the final state is the line drawn last: not twice
        now = time.monotonic()
        held = list(held) if held is not None else [False] * len(conditions)
        for name, prefix in (("return", ""), ("eval return", "eval/")):
            key = next((prefix + key for key in _RETURN_KEYS if prefix + key in stats), None)
            if key is not None and not is_nan(stats[key]):  # else the last mean: no episode ended
                self._latest_returns[name] = float(stats[key])
        if self._started_at is None:  # the run started one step ago, which took this long
            step_ms = stats.get("profiling/collect_ms", 0.0) + stats.get("profiling/step_ms", 0.0)
            self._started_at = now - step_ms / 1e3
        self._measure(stats, conditions, now)
        self._target = self._choose_target(held)
        if not force and now - self._last_write < self.interval:
            return
        if not self.announce() and not force:
            return  # no progress line before the lines saying where the run goes
        self._last_write, self._drawn_steps = now, steps
        self._write(self._line(stats, conditions, held))

    def _line(
        self, stats: Mapping[str, float], conditions: Sequence[Condition], held: list[bool]
    ) -> str:
        """The progress line: env steps, the logged ``throughput/env_steps_per_s``, the latest
        returns, and the target condition with its ETA."""
        parts = [f"rl8 {_format_count(float(stats.get('env/steps', 0.0)))} env steps"]
        speed = stats.get("throughput/env_steps_per_s")
        if speed is not None and not is_nan(speed):
            parts.append(f"{_format_count(float(speed))} steps/s")
        parts += self._returns()
        target = self._target
        if target is None or (target not in self._closeness and not held[target]):
            return " | ".join(parts)
        condition, done = conditions[target], held[target]
        percent = 100 if done else min(99, math.floor(100 * self._closeness[target]))
        parts.append(f"{percent}% to {_condition_label(condition)}")
        if target in self._pace_etas:
            if (eta := 0.0 if done else self._pace_etas[target]) is not None:
                parts.append(f"ETA {_format_duration(eta)}")
        elif not done:
            if (eta := self._trend_etas.get(target)) is not None:
                parts.append(f"ETA ~{_format_duration(eta)} at the recent trend")
            if budget := [eta for eta in self._pace_etas.values() if eta is not None]:
                parts.append(f"budget {_format_duration(min(budget))} left")
        return " | ".join(parts)

    def _returns(self) -> list[str]:
        return [
            f"{name} {value:.4g}" for name, value in self._latest_returns.items() if value is not None
        ]

    def _write(self, line: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._wrote = True

    def announce(self) -> bool:
        """Once per run, as soon as the MLflow run has an id: where the results go (on
        ``stream``, before any progress line). Whether they have been written (or there are
        none: no ``run``)."""
        if self.enabled and not self._announced and self.run is not None:
            lines = start_lines(self.run)
            if lines is not None:
                self._announced = True
                self.close()
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
        return self._announced

    def results(self, trainer: RunView) -> None:
        """At the end of a run: where the results went, on stdout (what ``rl8 train --quiet``
        prints too, for scripts)."""
        if self.enabled:
            self.close()
            print(*results_lines(trainer), sep="\n", flush=True)

    def summary(
        self,
        stats: Mapping[str, float],
        stopped_by: Condition | None,
        *,
        held_at_checkpoint: bool = False,
        callback: str | None = None,
    ) -> None:
        """The last line of a run: what stopped it (``stopped_by``, the conditions that held at
        the checkpoint resumed from, or the ``callback`` named), after how many env steps and
        how long, with the latest returns."""
        if not self.enabled:
            return
        self.close()
        steps = float(stats.get("env/steps", 0.0))
        seconds = time.monotonic() - self._started_at if self._started_at is not None else 0.0
        if held_at_checkpoint:
            cause = (
                f"stopped by {stopped_by!r}, which already held at the checkpoint's step"
                if stopped_by is not None
                else "stopped: the stop conditions already held at the checkpoint's step"
            )
        elif stopped_by is not None:
            cause = f"stopped by {stopped_by!r}"
        elif callback is not None:
            cause = f"stopped by the callback {callback}"
        else:
            cause = "stopped"
        line = f"rl8: {cause} after {_format_count(steps)} env steps in {_format_duration(seconds)}"
        if self._returns():
            line += f" ({', '.join(self._returns())})"
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line (a newline on a terminal)."""
        if self.enabled and self.tty and self._wrote:
            self.stream.write("\n")
            self.stream.flush()
        self._wrote = False
