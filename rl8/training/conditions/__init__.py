"""Stop conditions: when to end a training run (see ``docs/conditions.md``)."""

from rl8.training.conditions.base import (
    COUNTER_PREFIXES,
    EVAL_PREFIX,
    And,
    Condition,
    MissingStatError,
    Or,
    StatCondition,
)
from rl8.training.conditions.clock import TimeLimit
from rl8.training.conditions.config import (
    CONDITIONS,
    MAX_CONDITION_DEPTH,
    from_config,
    with_current_stat_names,
)
from rl8.training.conditions.stats import (
    HitsLowerBound,
    HitsUpperBound,
    Plateaus,
    StopsDecreasing,
    StopsIncreasing,
)

__all__ = [
    "And",
    "Condition",
    "HitsLowerBound",
    "HitsUpperBound",
    "MissingStatError",
    "Or",
    "Plateaus",
    "StopsDecreasing",
    "StopsIncreasing",
    "TimeLimit",
    "from_config",
    "with_current_stat_names",
    "COUNTER_PREFIXES",
    "EVAL_PREFIX",
    "MAX_CONDITION_DEPTH",
    "CONDITIONS",
    "StatCondition",
]
