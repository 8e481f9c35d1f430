"""The :class:`Condition` contract, conditions on one stat, and the combinators ``a & b``, ``a | b``."""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from rl8.ppo.stats import current_stat_name, warn_renamed

__all__ = [
    "And",
    "COUNTER_PREFIXES",
    "Condition",
    "EVAL_PREFIX",
    "MissingStatError",
    "Or",
    "StatCondition",
]

#: Keys with these prefixes are monotone counters (``env/steps``, ``algorithm/collects``...);
#: an upper bound on one of them reports :meth:`Condition.progress`.
COUNTER_PREFIXES: tuple[str, ...] = ("env/", "algorithm/")
#: Keys with this prefix are only reported on evaluation steps and may be absent otherwise.
EVAL_PREFIX = "eval/"
_MAX_LISTED_KEYS = 30


class MissingStatError(KeyError):
    """A stop condition needs a stat that the step did not report; the message lists close
    matches among the reported keys (all of them when there are few)."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


def _check_key(owner: str, key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(
            f"{owner}: key must be a non-empty str (a stat name such as "
            f"'episodes/return_mean'), got {key!r}"
        )
    new = current_stat_name(key)
    if new is not None:  # an rl8 1.0.0 name: once, when the condition is built, at the user's line
        frame, level = inspect.currentframe(), 1
        while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__):
            frame, level = frame.f_back, level + 1
        warn_renamed(key, new, stacklevel=level)
        return new
    return key


def check_number(
    owner: str, field: str, value: Any, *, minimum: float | None = None, strictly_positive: bool = False
) -> float | int:
    """``value`` as a finite int or float, else a ``TypeError``/``ValueError`` naming ``owner``
    and ``field``; ``minimum``: the least value; ``strictly_positive``: > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{owner}: {field} must be a finite number, got {value!r} ({type(value).__name__})"
        )
    if not math.isfinite(float(value)):
        raise ValueError(f"{owner}: {field} must be a finite number, got {value!r}")
    if strictly_positive and value <= 0:
        raise ValueError(f"{owner}: {field} must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {field} must be >= {minimum}, got {value!r}")
    # ints stay ints (repr shows 475, not 475.0); numpy/torch scalar types are dropped
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def check_patience(owner: str, patience: Any) -> int:
    """``patience`` as an int >= 1, else a ``TypeError``/``ValueError`` naming ``owner``."""
    if isinstance(patience, bool) or not isinstance(patience, numbers.Integral):
        raise TypeError(
            f"{owner}: patience must be an int >= 1 (a number of checks), got "
            f"{patience!r} ({type(patience).__name__})"
        )
    if patience < 1:
        raise ValueError(f"{owner}: patience must be an int >= 1 (a number of checks), got {patience!r}")
    return int(patience)


class Condition(ABC):
    """Base class of stop conditions: subclasses implement :meth:`__call__`, stateful ones also
    :meth:`reset`, :meth:`state_dict` and :meth:`load_state_dict`. ``&`` builds :class:`And`,
    ``|`` builds :class:`Or`."""

    #: The name :func:`~rl8.training.conditions.from_config` knows this class by, declared by
    #: each built-in class (not inherited); ``None``: a class defined elsewhere.
    config_name: ClassVar[str | None] = None

    @abstractmethod
    def __call__(self, stats: Mapping[str, float]) -> bool:
        """Whether training should stop after the step whose flat ``{name: number}`` stats
        are ``stats``."""

    def start(self) -> None:
        """Mark the start of training (a no-op except for clocks, which otherwise start at the
        first check)."""

    def reset(self) -> None:
        """Forget all state (patience counters, best values, clocks), as if newly built."""

    def progress(self, stats: Mapping[str, float]) -> float | None:
        """Fraction of the way to stopping at the latest step's ``stats``, in ``[0, 1]``, or
        ``None`` when unknown (only bounds on a monotone quantity know it); never raises for a
        missing key."""
        return None

    def stat_names(self) -> list[str]:
        """The stats this condition reads (``[]``: none, or it does not say), so that
        :meth:`rl8.Trainer.run` refuses an ``eval/`` stat in a run without evaluations."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """The condition's state as plain Python types (for checkpoints)."""
        return {"type": type(self).__name__}

    def to_config(self) -> dict[str, Any] | None:
        """The :func:`~rl8.training.conditions.config.from_config` mapping that builds this
        condition again (without its state), or ``None`` for a class defined elsewhere."""
        name = self._config_name()
        if name is None:
            return None
        fields = list(inspect.signature(type(self).__init__).parameters)[1:]
        return {name: {field: getattr(self, field) for field in fields}}

    def _config_name(self) -> str | None:
        return type(self).__dict__.get("config_name")  # its own, not an inherited one

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`; a ``ValueError`` for the state of
        another kind of condition."""
        self._check_state(state)

    def _check_state(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(
                f"{self!r}: state must be a dict from state_dict(), got {type(state).__name__}"
            )
        saved = state.get("type")
        if saved != type(self).__name__:
            raise ValueError(
                f"{self!r}: cannot load the state of a {saved} condition into a "
                f"{type(self).__name__} condition"
            )

    def __and__(self, other: Condition) -> And:
        return And([self, other])

    def __or__(self, other: Condition) -> Or:
        return Or([self, other])


class StatCondition(Condition):
    """A condition on the stat ``key``, with the shared missing-key / eval / NaN rules."""

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
                return None  # not an evaluation step
            raise MissingStatError(self._missing_message(stats)) from None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"{self!r}: stat {self.key!r} must be a number, got {value!r} ({type(value).__name__})"
            ) from None

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
            message += (
                " (eval/ keys may be missing on steps without evaluation, but this step has eval stats.)"
            )
        return message

    def stat_names(self) -> list[str]:
        return [self.key]

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "key": self.key}

    def _check_state(self, state: Mapping[str, Any]) -> None:
        super()._check_state(state)
        if state.get("key") != self.key:
            raise ValueError(
                f"{self!r}: cannot load the state of a condition on "
                f"{state.get('key')!r} into a condition on {self.key!r}"
            )


class _Combinator(Condition):
    def __init__(self, conditions: Iterable[Condition]) -> None:
        name = type(self).__name__
        if isinstance(conditions, Condition) or not isinstance(conditions, Iterable):
            raise TypeError(
                f"{name}: conditions must be a list of conditions, e.g. "
                f"{name}([a, b]), got {conditions!r}"
            )
        self.conditions: list[Condition] = list(conditions)
        if not self.conditions:
            raise ValueError(f"{name}: conditions must be a non-empty list, got []")
        for i, condition in enumerate(self.conditions):
            if not isinstance(condition, Condition):
                raise TypeError(
                    f"{name}: conditions[{i}] must be a Condition, got "
                    f"{condition!r} ({type(condition).__name__})"
                )

    def _evaluate(self, stats: Mapping[str, float]) -> list[bool]:
        # no short-circuit: stateful children (patience counters, clocks) see every step
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
        return {
            **super().state_dict(),
            "conditions": [condition.state_dict() for condition in self.conditions],
        }

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
            raise ValueError(
                f"{self!r}: the state holds {len(children)} conditions, this "
                f"{type(self).__name__} has {len(self.conditions)}"
            )
        for condition, child in zip(self.conditions, children):
            condition.load_state_dict(child)

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(repr(c) for c in self.conditions)}])"


class And(_Combinator):
    """Stop when every one of ``conditions`` (a non-empty list) holds on the same check (all are
    called on every check). :meth:`progress` is the smallest of theirs, ``None`` if any does not
    know it."""

    config_name = "and"

    def __call__(self, stats: Mapping[str, float]) -> bool:
        return all(self._evaluate(stats))

    def progress(self, stats: Mapping[str, float]) -> float | None:
        values = [condition.progress(stats) for condition in self.conditions]
        return None if None in values else min(values)  # type: ignore[type-var]


class Or(_Combinator):
    """Stop when any of ``conditions`` (a non-empty list) holds (all are called on every check).
    :meth:`progress` is the largest known progress among them (``None`` when none knows it)."""

    config_name = "or"

    def __call__(self, stats: Mapping[str, float]) -> bool:
        return any(self._evaluate(stats))

    def progress(self, stats: Mapping[str, float]) -> float | None:
        values = [condition.progress(stats) for condition in self.conditions]
        known = [value for value in values if value is not None]
        return max(known) if known else None
