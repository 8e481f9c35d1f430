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

The conditions live in :mod:`~rl8.training.conditions.base` (the contract, ``And``, ``Or``),
:mod:`~rl8.training.conditions.stats`, :mod:`~rl8.training.conditions.clock` and
:mod:`~rl8.training.conditions.config` (from config files); this package exports them.
"""

from rl8.training.conditions.base import (
    COUNTER_PREFIXES, EVAL_PREFIX, And, Condition, MissingStatError, Or, StatCondition,
)
from rl8.training.conditions.clock import TimeLimit
from rl8.training.conditions.config import CONDITIONS, MAX_CONDITION_DEPTH, from_config, with_current_stat_names
from rl8.training.conditions.stats import HitsLowerBound, HitsUpperBound, Plateaus, StopsDecreasing, StopsIncreasing

__all__ = [
    "And", "Condition", "HitsLowerBound", "HitsUpperBound", "MissingStatError", "Or", "Plateaus",
    "StopsDecreasing", "StopsIncreasing", "TimeLimit", "from_config", "with_current_stat_names",
    "COUNTER_PREFIXES", "EVAL_PREFIX", "MAX_CONDITION_DEPTH", "CONDITIONS", "StatCondition",
]
