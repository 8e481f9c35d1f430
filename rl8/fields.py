"""Configs declared as dataclass fields (:class:`rl8.HParams`, ``TrainerConfig``): each field's
``metadata`` holds its ``check`` (:data:`Check`) and its ``doc``. The shared checks, the loop that
runs them, the docstring made from the docs and rl8's one reader of numbers from config files.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "Check",
    "Entry",
    "Invalid",
    "attributes_doc",
    "check",
    "check_entries",
    "check_int",
    "did_you_mean",
    "first_invalid",
    "int_at_least",
    "is_int",
    "is_number",
    "one_of",
    "optional",
    "read_numbers",
    "unknown_names_message",
]


def did_you_mean(
    name: Any,
    choices: Iterable[str] = (),
    *,
    close: Sequence[str] | None = None,
    n: int = 3,
    cutoff: float = 0.6,
) -> str:
    """The hint of an error about an unknown ``name``: ``"; did you mean 'a' or 'b'?"``, or ``""``.

    Args:
        name: What was given.
        choices: The valid names; the hint names up to ``n`` of them, those closer to ``name``
            than ``cutoff`` (``difflib.get_close_matches``'s ratio, 0 to 1).
        close: The close names, found otherwise (then ``choices`` is not searched).
        n: The most names the hint gives.
        cutoff: The least similarity, 0 to 1, of a name the hint gives.
    """
    if close is None:
        close = difflib.get_close_matches(str(name), list(choices), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def unknown_names_message(kind: str, hints: Mapping[Any, str], valid: Iterable[str]) -> str:
    """The message of an error about unknown names, each with what it may mean: ``"unknown
    {kind} 'x'; <hint> (valid: a, b)"`` for one name, one line per name for several.

    Args:
        kind: What the names are, singular (``"hyper-parameter"``; an ``s`` makes it plural).
        hints: Each unknown name (in the order given) and what it may mean, or ``""``
            (``"did you mean 'lr'?"``).
        valid: The valid names.
    """
    listed = ", ".join(valid)
    if len(hints) == 1:
        [(name, hint)] = hints.items()
        return f"unknown {kind} {name!r}{'; ' if hint else ''}{hint} (valid: {listed})"
    lines = "".join(f"\n  {name!r}{': ' if hint else ''}{hint}" for name, hint in hints.items())
    return f"{len(hints)} unknown {kind}s (valid: {listed}):{lines}"


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def read_numbers(value: Any, *, whole_as_int: bool = False) -> Any:
    """``value`` with its numeric strings as numbers, recursively (YAML reads ``3e-4`` as a
    string): ``"12"`` becomes the int 12, ``"3e-4"`` the float; other values stay as they are.

    Args:
        value: A value read from a config file or the command line.
        whole_as_int: Also turn whole floats into ints (``1e3`` and ``"1e3"`` into 1000).
    """
    if isinstance(value, str):
        text = value.strip()
        if _INT.fullmatch(text):
            return int(text)
        if not _FLOAT.fullmatch(text):
            return value
        value = float(text)
    if isinstance(value, float) and whole_as_int and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: read_numbers(v, whole_as_int=whole_as_int) for k, v in value.items()}
    if isinstance(value, list):
        return [read_numbers(v, whole_as_int=whole_as_int) for v in value]
    return value


#: A field's check: ``check(value, name)`` is ``None`` when ``value`` is valid for the field
#: ``name``, else what it expects (``"an int >= 1"``); it may also raise an error of its own.
Check = Callable[[Any, str], "str | None"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int (``True`` and ``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int when it is an integer (numpy's too, not a bool) ``>= minimum``, else
    ``ValueError("{name} must be an int >= {minimum}, got {value!r}")``, where ``name`` is what
    the message calls the value (``"Catch: rows"``, ``"model_config hidden_size"``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check(expected: str, ok: Callable[[Any], bool]) -> Check:
    """The check that accepts the values for which ``ok(value)`` is true; ``expected`` is what the
    field expects, for the error message (``"a number in [0, 1]"``)."""
    return lambda value, name: None if ok(value) else expected


def int_at_least(low: int) -> Check:
    """An int (not a bool) ``>= low``."""
    return check(f"an int >= {low}", lambda v: is_int(v) and v >= low)


def one_of(*choices: str) -> Check:
    """One of the strings ``choices`` (``'sync' or 'overlap'``)."""
    return check(" or ".join(map(repr, choices)), lambda v: isinstance(v, str) and v in choices)


def optional(inner: Check) -> Check:
    """``None``, or a value that ``inner`` accepts (``"an int >= 1 or None"``)."""

    def check_optional(value: Any, name: str) -> str | None:
        expected = None if value is None else inner(value, name)
        return None if expected is None else f"{expected} or None"

    return check_optional


class Invalid(NamedTuple):
    """The first field of a config whose value its check refuses."""

    name: str
    expected: str
    value: Any


def first_invalid(config: Any) -> Invalid | None:
    """The first field of the frozen dataclass instance ``config`` that its ``check`` refuses,
    or ``None``; a field's ``convert`` (metadata), if any, replaces its value first."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("convert") is not None:
            value = f.metadata["convert"](value)
            object.__setattr__(config, f.name, value)
        expected = f.metadata["check"](value, f.name) if f.metadata.get("check") else None
        if expected is not None:
            return Invalid(f.name, expected, value)
    return None


#: A dict hparam's key: what its value is expected to be (``"a number >= 0"``, for the message)
#: and the test that accepts the valid values.
Entry = tuple[str, Callable[[Any], bool]]


def check_entries(
    value: Mapping[Any, Any], field: str, entries: Mapping[str, Entry], *, required: Iterable[str] = ()
) -> None:
    """Check the dict ``value`` of a config field with known keys (hparams ``rnd`` and
    ``symmetry``) key by key: a ``ValueError`` for a key that ``entries`` lacks (with the close
    names), a ``required`` key that is missing, or a value its entry refuses; each message
    names the key (``hparam rnd['weight']``), what it expects and what was given.

    Args:
        value: The dict given.
        field: What the messages call the dict (``"hparam rnd"``).
        entries: Each key the dict may have, with what its value is expected to be and the test
            that accepts it (:data:`Entry`).
        required: The keys that must be there.
    """
    unknown = [key for key in value if key not in entries]
    if unknown:
        raise ValueError(
            f"{field}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], entries)} (expected keys "
            f"among {list(entries)}), got {dict(value)!r}"
        )
    for key in required:
        if key not in value:
            raise ValueError(f"{field}[{key!r}]: missing (expected {entries[key][0]})")
    for key, (expected, ok) in entries.items():
        if key in value and not ok(value[key]):
            raise ValueError(f"{field}[{key!r}]: expected {expected}, got {value[key]!r}")


def attributes_doc(cls: type) -> str:
    """The ``Attributes:`` docstring section of dataclass ``cls``: each field's ``doc``."""
    return "\n    Attributes:\n" + "".join(
        f"        {f.name}: {f.metadata['doc']}\n" for f in dataclasses.fields(cls)
    )
