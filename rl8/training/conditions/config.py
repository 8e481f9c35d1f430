"""Conditions from config files (:func:`from_config`) and checkpoints."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from rl8.ppo.stats import current_stat_name
from rl8.training.conditions.base import And, Condition, Or
from rl8.training.conditions.clock import TimeLimit
from rl8.training.conditions.stats import (
    HitsLowerBound,
    HitsUpperBound,
    Plateaus,
    StopsDecreasing,
    StopsIncreasing,
)

__all__ = ["CONDITIONS", "MAX_CONDITION_DEPTH", "from_config", "with_current_stat_names"]

CONDITIONS: dict[str, type[Condition]] = {
    cls.config_name: cls
    for cls in (
        HitsUpperBound,
        HitsLowerBound,
        Plateaus,
        StopsIncreasing,
        StopsDecreasing,
        TimeLimit,
        And,
        Or,
    )
}
"""Names accepted by :func:`from_config` and the classes they build."""

_FLOAT_FIELDS = {"bound", "rtol", "atol", "min_delta", "seconds"}
#: Most levels of ``and`` / ``or`` inside one another that :func:`from_config` builds.
MAX_CONDITION_DEPTH = 32


def from_config(spec: Mapping[str, Any], *, _path: str = "", _depth: int = 1) -> Condition:
    """Build a condition from ``spec``, a YAML/JSON-friendly mapping (e.g. from ``yaml.safe_load``)
    with one key, the condition's name (see :data:`CONDITIONS`), whose value is the constructor's
    keyword arguments, or for ``and`` / ``or`` a list of such mappings: ``{"time_limit":
    {"seconds": 3600}}``. Numeric fields also accept numeric strings (YAML reads ``1e6`` as a
    string). See ``docs/conditions.md``.

    Raises:
        ValueError: An unknown name (with close matches), a missing or unknown field, an invalid
            value, or ``and`` / ``or`` nested deeper than :data:`MAX_CONDITION_DEPTH`; the
            message says where in ``spec``.
    """
    where = f"stop condition config{' at ' + _path if _path else ''}"
    if _depth > MAX_CONDITION_DEPTH:
        raise ValueError(
            f"{where}: 'and' / 'or' conditions are nested deeper than {MAX_CONDITION_DEPTH} "
            "levels; rl8 builds conditions up to that depth"
        )
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
        raise ValueError(
            f"{where}: unknown condition {name!r}.{hint} Valid names: {', '.join(CONDITIONS)}."
        )
    path = f"{_path}.{name}" if _path else name
    where = f"stop condition config at {path}"
    cls = CONDITIONS[name]
    if cls in (And, Or):
        if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
            raise ValueError(f"{where}: expected a list of conditions, got {args!r}")
        children = [
            from_config(child, _path=f"{path}[{i}]", _depth=_depth + 1) for i, child in enumerate(args)
        ]
        if not children:
            raise ValueError(f"{where}: expected a non-empty list of conditions, got []")
        return cls(children)
    if not isinstance(args, Mapping):
        raise ValueError(f"{where}: expected a mapping of arguments, got {args!r}")
    parameters = inspect.signature(cls).parameters
    unknown = [field for field in args if field not in parameters]
    if unknown:
        field = unknown[0]
        close = difflib.get_close_matches(str(field), list(parameters), n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"{where}: unknown field {field!r}.{hint} Valid fields: {', '.join(parameters)}."
        )
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
    """A copy of ``spec``, a stored :meth:`Condition.to_config` or :meth:`Condition.state_dict`
    (or a list of them, as read from a checkpoint; other values are returned as they are) with
    rl8 1.0.0's names of renamed stats replaced by the current ones, without a warning: old
    checkpoints resume as they are."""
    if isinstance(spec, Mapping):
        return {
            name: (current_stat_name(value) or value)
            if name == "key" and isinstance(value, str)
            else with_current_stat_names(value)
            for name, value in spec.items()
        }
    if isinstance(spec, list):
        return [with_current_stat_names(value) for value in spec]
    return spec
