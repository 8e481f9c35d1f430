"""Stop conditions: when to end a training run.

A :class:`Condition` is called by the Trainer after every training step with that step's stats
(the flat ``{name: number}`` mapping of ``docs/conditions.md``, e.g. ``"episodes/return_mean"``,
``"env/steps"``, ``"eval/episodes/return_mean"``) and returns ``True`` when training should stop::

    from rl8.training.conditions import HitsUpperBound, Plateaus, TimeLimit

    stop = HitsUpperBound("episodes/return_mean", 475) | TimeLimit(3600)
    stop = from_config({"or": [{"hits_upper_bound": {"key": "env/steps", "bound": 1_000_000}},
                               {"time_limit": {"seconds": 3600}}]})

Every condition that reads a stat follows the same rules (``docs/conditions.md``, "Missing
stats, evaluation stats and NaN"): a missing key raises :class:`MissingStatError` listing close
matches; an ``eval/`` key may be absent on steps without eval stats (the check is then ``False``,
the state unchanged); ``NaN`` carries no information; rl8 1.0.0's name of a renamed stat
(:data:`rl8.ppo.stats.RENAMED_STATS`) is replaced by the current one, with a ``DeprecationWarning``.

Stateful conditions expose :meth:`Condition.state_dict` / :meth:`Condition.load_state_dict`
(plain Python types only) so that a resumed run continues its patience counters and clocks.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from rl8.ppo.stats import current_stat_name, warn_renamed

__all__ = [
    "And", "Condition", "HitsLowerBound", "HitsUpperBound", "MissingStatError", "Or", "Plateaus",
    "StopsDecreasing", "StopsIncreasing", "TimeLimit", "from_config", "with_current_stat_names",
    "COUNTER_PREFIXES", "EVAL_PREFIX", "MAX_CONDITION_DEPTH",
]

#: Keys with these prefixes are monotone counters (``env/steps``, ``algorithm/collects``...);
#: an upper bound on one of them reports :meth:`Condition.progress`.
COUNTER_PREFIXES: tuple[str, ...] = ("env/", "algorithm/")

#: Keys with this prefix are only reported on evaluation steps and may be absent otherwise.
EVAL_PREFIX = "eval/"

_MAX_LISTED_KEYS = 30


class MissingStatError(KeyError):
    """A stop condition needs a stat that the step did not report.

    The message lists close matches among the reported keys (and all of them when there are
    few). Subclass of ``KeyError``.
    """

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


# ---- Argument validation (the edge: clear messages naming the field, expected and given value)


def _check_key(owner: str, key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"{owner}: key must be a non-empty str (a stat name such as "
                        f"'episodes/return_mean'), got {key!r}")
    new = current_stat_name(key)
    if new is not None:  # an rl8 1.0.0 name: once, when the condition is built
        warn_renamed(key, new, stacklevel=4)
        return new
    return key


def _check_number(owner: str, field: str, value: Any, *, minimum: float | None = None,
                  strictly_positive: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {field} must be a finite number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(float(value)):
        raise ValueError(f"{owner}: {field} must be a finite number, got {value!r}")
    if strictly_positive and value <= 0:
        raise ValueError(f"{owner}: {field} must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {field} must be >= {minimum}, got {value!r}")
    # Keep ints as ints (so repr shows 475, not 475.0) but drop numpy/torch scalar types.
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _check_patience(owner: str, patience: Any) -> int:
    if isinstance(patience, bool) or not isinstance(patience, numbers.Integral):
        raise TypeError(f"{owner}: patience must be an int >= 1 (a number of checks), got "
                        f"{patience!r} ({type(patience).__name__})")
    if patience < 1:
        raise ValueError(f"{owner}: patience must be an int >= 1 (a number of checks), got {patience!r}")
    return int(patience)


# ---- Base classes


class Condition(ABC):
    """Base class of stop conditions.

    Subclasses implement :meth:`__call__`; stateful ones also override :meth:`reset`,
    :meth:`state_dict` and :meth:`load_state_dict`. Conditions combine with ``&``
    (:class:`And`) and ``|`` (:class:`Or`).
    """

    @abstractmethod
    def __call__(self, stats: Mapping[str, float]) -> bool:
        """Check one training step's stats.

        Args:
            stats: The step's flat ``{stat name: number}`` mapping.

        Returns:
            ``True`` when training should stop.
        """

    def start(self) -> None:
        """Mark the start of training (optional; a no-op except for clocks).

        The Trainer may call this right before the first training step so that
        :class:`TimeLimit` counts that step too; without it, clocks start at the first check.
        """

    def reset(self) -> None:
        """Forget all state (patience counters, best values, clocks), as if newly built."""

    def progress(self, stats: Mapping[str, float]) -> float | None:
        """Fraction of the way to stopping, in ``[0, 1]``, or ``None`` when unknown.

        Only conditions that bound a monotone quantity (an upper bound on a counter such as
        ``env/steps``, or a :class:`TimeLimit`) know how far along they are; the Trainer uses
        it for an ETA. Never raises for a missing key (returns ``None``).

        Args:
            stats: The latest step's stats.
        """
        return None

    def stat_names(self) -> list[str]:
        """The stats this condition reads (its children's for :class:`And` / :class:`Or`),
        so that :meth:`rl8.Trainer.run` can refuse, before training, a condition on a stat
        the run never reports (an ``eval/`` stat without evaluations). ``[]`` for a condition
        that reads none (:class:`TimeLimit`) or does not say (a subclass of your own)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """The condition's state as plain Python types (for checkpoints)."""
        return {"type": type(self).__name__}

    def to_config(self) -> dict[str, Any] | None:
        """The :func:`from_config` mapping that builds this condition again (without its
        state), or ``None`` for a condition :func:`from_config` cannot build (a subclass
        defined elsewhere). Checkpoints store it so that ``rl8 train --resume`` can rebuild
        the conditions of a run started from Python."""
        name = self._config_name()
        if name is None:
            return None
        fields = list(inspect.signature(type(self).__init__).parameters)[1:]
        return {name: {field: getattr(self, field) for field in fields}}

    def _config_name(self) -> str | None:
        """This class's name in :data:`CONDITIONS`; ``None`` for a class defined elsewhere."""
        return next((n for n, cls in CONDITIONS.items() if cls is type(self)), None)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict` (e.g. when resuming a run).

        Raises:
            ValueError: When ``state`` was saved by a different kind of condition.
        """
        self._check_state(state)

    def _check_state(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"{self!r}: state must be a dict from state_dict(), got {type(state).__name__}")
        saved = state.get("type")
        if saved != type(self).__name__:
            raise ValueError(f"{self!r}: cannot load the state of a {saved} condition into a "
                             f"{type(self).__name__} condition")

    def __and__(self, other: Condition) -> And:
        return And([self, other])

    def __or__(self, other: Condition) -> Or:
        return Or([self, other])


class _StatCondition(Condition):
    """A condition on one stat, with the shared missing-key / eval / NaN rules."""

    def __init__(self, key: str) -> None:
        self.key = _check_key(type(self).__name__, key)

    def _lookup(self, stats: Mapping[str, float]) -> float | None:
        """The stat as a float, ``None`` for an eval key on a step without eval stats."""
        try:
            value = stats[self.key]
        except KeyError:
            if self.key.startswith(EVAL_PREFIX) and not any(
                str(k).startswith(EVAL_PREFIX) for k in stats
            ):
                return None
            raise MissingStatError(self._missing_message(stats)) from None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{self!r}: stat {self.key!r} must be a number, got {value!r} "
                            f"({type(value).__name__})") from None

    def _missing_message(self, stats: Mapping[str, float]) -> str:
        keys = sorted(str(k) for k in stats)
        message = f"{self!r}: stat {self.key!r} is not in the step's stats."
        close = difflib.get_close_matches(self.key, keys, n=5, cutoff=0.6)
        if close:
            message += " Did you mean " + " or ".join(repr(k) for k in close) + "?"
        if not keys:
            message += " The stats are empty."
        elif len(keys) <= _MAX_LISTED_KEYS:
            message += f" Available keys: {', '.join(keys)}."
        else:
            message += f" ({len(keys)} keys available.)"
        if self.key.startswith(EVAL_PREFIX):
            message += (" (eval/ keys may be missing on steps without evaluation, but this step "
                        "has eval stats.)")
        return message

    def stat_names(self) -> list[str]:
        return [self.key]

    def _peek(self, stats: Mapping[str, float]) -> float | None:
        """Like :meth:`_lookup` but ``None`` instead of raising (for :meth:`progress`)."""
        try:
            return float(stats[self.key])
        except (KeyError, TypeError, ValueError):
            return None

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "key": self.key}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        super()._check_state(state)
        if state.get("key") != self.key:
            raise ValueError(f"{self!r}: cannot load the state of a condition on "
                             f"{state.get('key')!r} into a condition on {self.key!r}")


# ---- Bounds


class HitsUpperBound(_StatCondition):
    """Stop when ``stats[key] >= bound``.

    An upper bound on a counter (a key starting with ``env/`` or ``algorithm/``) reports
    :meth:`progress` as ``value / bound``, which the Trainer turns into an ETA.

    Args:
        key: Stat name, e.g. ``"episodes/return_mean"`` or ``"env/steps"``.
        bound: Finite number in the stat's own unit (e.g. environment steps).

    Example:
        ``HitsUpperBound("env/steps", 1_000_000)`` stops after one million environment steps.
    """

    def __init__(self, key: str, bound: float) -> None:
        super().__init__(key)
        self.bound = _check_number(type(self).__name__, "bound", bound)

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


class HitsLowerBound(_StatCondition):
    """Stop when ``stats[key] <= bound``.

    Args:
        key: Stat name, e.g. ``"losses/vf"``.
        bound: Finite number in the stat's own unit.

    Example:
        ``HitsLowerBound("eval/episodes/length_mean", 50)`` stops once evaluation episodes are
        50 steps or shorter (e.g. a goal is reached quickly).
    """

    def __init__(self, key: str, bound: float) -> None:
        super().__init__(key)
        self.bound = _check_number(type(self).__name__, "bound", bound)

    def __call__(self, stats: Mapping[str, float]) -> bool:
        value = self._lookup(stats)
        return value is not None and value <= self.bound

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, {self.bound!r})"


# ---- Patience-based conditions


class _Patience(_StatCondition):
    """Shared logic of the conditions that stop after ``patience`` consecutive checks without
    progress (:class:`Plateaus`, :class:`StopsIncreasing`, :class:`StopsDecreasing`).

    Each non-NaN value either counts (``count`` goes up by one) or becomes the new mark, the
    value later ones are compared with (``count`` back to 0); the first value is a mark. The
    mark is the attribute and state entry named :attr:`_mark`.
    """

    _mark: str  # "reference" or "best"

    def __init__(self, key: str, patience: int) -> None:
        super().__init__(key)
        self.patience = _check_patience(type(self).__name__, patience)
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

    _mark = "reference"

    def __init__(self, key: str, *, patience: int, rtol: float, atol: float = 0.0) -> None:
        super().__init__(key, patience)
        name = type(self).__name__
        self.rtol = float(_check_number(name, "rtol", rtol, minimum=0))
        self.atol = float(_check_number(name, "atol", atol, minimum=0))

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
        self.min_delta = float(_check_number(type(self).__name__, "min_delta", min_delta, minimum=0))

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

    _sign = -1.0


# ---- Wall clock


class TimeLimit(Condition):
    """Stop when ``seconds`` of wall-clock time have elapsed.

    The clock (``time.monotonic``) starts at the first check, or at :meth:`start` when the
    Trainer calls it before the first training step, whichever comes first. Time spent before
    that (building envs, compiling) is not counted. :meth:`state_dict` keeps the elapsed time,
    so a resumed run continues counting from there (the clock resumes at the resumed run's
    first check or :meth:`start`; the time between the two runs is not counted).

    :meth:`progress` is the elapsed fraction of ``seconds``.

    Args:
        seconds: Wall-clock budget in seconds, a finite number > 0.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = _check_number(type(self).__name__, "seconds", seconds, strictly_positive=True)
        self._offset = 0.0  # seconds elapsed in earlier runs (restored from a checkpoint)
        self._started_at: float | None = None

    @property
    def elapsed(self) -> float:
        """Seconds counted so far (0 before the clock starts)."""
        if self._started_at is None:
            return self._offset
        return self._offset + (time.monotonic() - self._started_at)

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


# ---- Combinators


class _Combinator(Condition):
    def __init__(self, conditions: Iterable[Condition]) -> None:
        name = type(self).__name__
        if isinstance(conditions, Condition) or not isinstance(conditions, Iterable):
            raise TypeError(f"{name}: conditions must be a list of conditions, e.g. "
                            f"{name}([a, b]), got {conditions!r}")
        self.conditions: list[Condition] = list(conditions)
        if not self.conditions:
            raise ValueError(f"{name}: conditions must be a non-empty list, got []")
        for i, condition in enumerate(self.conditions):
            if not isinstance(condition, Condition):
                raise TypeError(f"{name}: conditions[{i}] must be a Condition, got "
                                f"{condition!r} ({type(condition).__name__})")

    def _evaluate(self, stats: Mapping[str, float]) -> list[bool]:
        # Every child is called on every check (no short-circuit) so that stateful children
        # (patience counters, clocks) see every step.
        return [bool(condition(stats)) for condition in self.conditions]

    def start(self) -> None:
        for condition in self.conditions:
            condition.start()

    def reset(self) -> None:
        for condition in self.conditions:
            condition.reset()

    def stat_names(self) -> list[str]:
        return [name for condition in self.conditions for name in condition.stat_names()]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "conditions": [condition.state_dict() for condition in self.conditions]}

    def to_config(self) -> dict[str, Any] | None:
        name = self._config_name()
        children = [condition.to_config() for condition in self.conditions]
        if name is None or any(child is None for child in children):
            return None
        return {name: children}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        children = state["conditions"]
        if len(children) != len(self.conditions):
            raise ValueError(f"{self!r}: the state holds {len(children)} conditions, this "
                             f"{type(self).__name__} has {len(self.conditions)}")
        for condition, child in zip(self.conditions, children):
            condition.load_state_dict(child)

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(repr(c) for c in self.conditions)}])"


class And(_Combinator):
    """Stop when every condition holds on the same check.

    All conditions are evaluated on every check, so stateful ones stay up to date.
    :meth:`progress` is the smallest of the conditions' progress, or ``None`` if any of them
    does not know its progress.

    Args:
        conditions: Non-empty list of conditions.
    """

    def __call__(self, stats: Mapping[str, float]) -> bool:
        return all(self._evaluate(stats))

    def progress(self, stats: Mapping[str, float]) -> float | None:
        values = [condition.progress(stats) for condition in self.conditions]
        if any(value is None for value in values):
            return None
        return min(values)  # type: ignore[type-var]


class Or(_Combinator):
    """Stop when any condition holds.

    All conditions are evaluated on every check (no short-circuit), so stateful ones stay up
    to date. :meth:`progress` is the largest known progress among the conditions (``None`` when
    none knows): the run ends no later than that condition's ETA.

    Args:
        conditions: Non-empty list of conditions.
    """

    def __call__(self, stats: Mapping[str, float]) -> bool:
        return any(self._evaluate(stats))

    def progress(self, stats: Mapping[str, float]) -> float | None:
        values = [condition.progress(stats) for condition in self.conditions]
        known = [value for value in values if value is not None]
        return max(known) if known else None


# ---- Config files

CONDITIONS: dict[str, type[Condition]] = {
    "hits_upper_bound": HitsUpperBound,
    "hits_lower_bound": HitsLowerBound,
    "plateaus": Plateaus,
    "stops_increasing": StopsIncreasing,
    "stops_decreasing": StopsDecreasing,
    "time_limit": TimeLimit,
    "and": And,
    "or": Or,
}
"""Names accepted by :func:`from_config` and the classes they build."""

_FLOAT_FIELDS = {"bound", "rtol", "atol", "min_delta", "seconds"}


#: Most levels of ``and`` / ``or`` inside one another that :func:`from_config` builds.
MAX_CONDITION_DEPTH = 32


def from_config(spec: Mapping[str, Any], *, _path: str = "", _depth: int = 1) -> Condition:
    """Build a condition from a YAML/JSON-friendly mapping.

    The mapping has exactly one key, the condition's name (see :data:`CONDITIONS`), whose value
    is the constructor's keyword arguments, or for ``and`` / ``or`` a list of such mappings::

        {"hits_upper_bound": {"key": "episodes/return_mean", "bound": 475}}
        {"time_limit": {"seconds": 3600}}
        {"or": [{"plateaus": {"key": "episodes/return_mean", "patience": 20, "rtol": 0.01}},
                {"hits_upper_bound": {"key": "env/steps", "bound": 1.0e6}}]}

    Numeric fields (``bound``, ``rtol``, ``atol``, ``min_delta``, ``seconds``) also accept
    strings that parse as numbers, because YAML reads ``1e6`` (without a dot) as a string.

    Args:
        spec: The mapping, e.g. from ``yaml.safe_load``.

    Returns:
        The condition.

    Raises:
        ValueError: For an unknown name (listing close matches and the valid names), a missing
            or unknown field, an invalid value, or ``and`` / ``or`` nested deeper than
            :data:`MAX_CONDITION_DEPTH` levels; the message says where in ``spec`` it is.
    """
    where = f"stop condition config{' at ' + _path if _path else ''}"
    if _depth > MAX_CONDITION_DEPTH:
        raise ValueError(f"{where}: 'and' / 'or' conditions are nested deeper than {MAX_CONDITION_DEPTH} "
                         "levels; rl8 builds conditions up to that depth")
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise ValueError(
            f"{where}: expected a mapping with exactly one key, the condition's name (one of "
            f"{', '.join(CONDITIONS)}), e.g. {{'hits_upper_bound': {{'key': "
            f"'episodes/return_mean', 'bound': 475}}}}; got {spec!r}"
        )
    ((name, args),) = spec.items()
    if name not in CONDITIONS:
        close = difflib.get_close_matches(str(name), list(CONDITIONS), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"{where}: unknown condition {name!r}.{hint} Valid names: {', '.join(CONDITIONS)}.")
    path = f"{_path}.{name}" if _path else name
    where = f"stop condition config at {path}"
    cls = CONDITIONS[name]

    if cls in (And, Or):
        if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
            raise ValueError(f"{where}: expected a list of conditions, got {args!r}")
        children = [from_config(child, _path=f"{path}[{i}]", _depth=_depth + 1) for i, child in enumerate(args)]
        if not children:
            raise ValueError(f"{where}: expected a non-empty list of conditions, got []")
        return cls(children)

    if not isinstance(args, Mapping):
        raise ValueError(f"{where}: expected a mapping of arguments, got {args!r}")
    parameters = dict(inspect.signature(cls.__init__).parameters)
    parameters.pop("self")
    unknown = [field for field in args if field not in parameters]
    if unknown:
        field = unknown[0]
        close = difflib.get_close_matches(str(field), list(parameters), n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"{where}: unknown field {field!r}.{hint} Valid fields: {', '.join(parameters)}.")
    required = [field for field, p in parameters.items() if p.default is p.empty]
    missing = [field for field in required if field not in args]
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r} (required: {', '.join(required)})")
    kwargs = {}
    for field, value in args.items():
        if field in _FLOAT_FIELDS and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{where}: {field} must be a number, got {value!r}") from None
        kwargs[field] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err


def with_current_stat_names(spec: Any) -> Any:
    """A copy of a stored condition config (:meth:`Condition.to_config`) or state
    (:meth:`Condition.state_dict`) in which rl8 1.0.0's names of renamed stats are replaced by
    the current ones, without a warning: checkpoints written before the rename resume as
    they are.

    Args:
        spec: A mapping or list of them, as read from a checkpoint; other values are returned
            unchanged.
    """
    if isinstance(spec, Mapping):
        return {
            name: (current_stat_name(value) or value) if name == "key" and isinstance(value, str)
            else with_current_stat_names(value)
            for name, value in spec.items()
        }
    if isinstance(spec, list):
        return [with_current_stat_names(value) for value in spec]
    return spec
