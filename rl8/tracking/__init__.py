"""MLflow tracking, the only part of rl8 that talks to MLflow: the :class:`Tracker` of a run
(:mod:`~rl8.tracking.tracker`), what waits for the store (:mod:`~rl8.tracking.delivery`), the
store and opening a run (:mod:`~rl8.tracking.store`), runs left RUNNING by dead processes
(:mod:`~rl8.tracking.runs`) and what they share (:mod:`~rl8.tracking.common`). It knows
nothing of PPO. See ``docs/tracking.md``."""

from rl8.tracking.common import TrackingError, TrackingWarning
from rl8.tracking.runs import RunProcess, clean_runs, running_runs
from rl8.tracking.tracker import EXIT_CLOSE_TIMEOUT_S, Tracker, flatten_params

__all__ = [
    "EXIT_CLOSE_TIMEOUT_S", "RunProcess", "Tracker", "TrackingError", "TrackingWarning", "clean_runs",
    "flatten_params", "running_runs",
]
