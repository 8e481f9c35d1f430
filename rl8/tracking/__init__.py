"""MLflow tracking, the only part of rl8 that talks to MLflow (``docs/tracking.md``): the
:class:`Tracker` of a run and the runs left RUNNING by dead processes; it knows nothing of PPO."""

from rl8.tracking.common import TrackingError, TrackingWarning
from rl8.tracking.runs import RunProcess, clean_runs, running_runs
from rl8.tracking.tracker import EXIT_CLOSE_TIMEOUT_S, Tracker, flatten_params

__all__ = [
    "EXIT_CLOSE_TIMEOUT_S",
    "RunProcess",
    "Tracker",
    "TrackingError",
    "TrackingWarning",
    "clean_runs",
    "flatten_params",
    "running_runs",
]
