"""What rl8's tracking modules share: the errors and the HTTP policy of MLflow's client."""

from __future__ import annotations

import logging

__all__ = ["TrackingError", "TrackingWarning"]

logger = logging.getLogger(__name__)
DEGRADED_TIMEOUT_S = 5  # seconds per request while the server is known to be down


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable, unknown run id or experiment, bad URI),
    or a call came in the wrong order; failures during a run are :class:`TrackingWarning`."""


class TrackingWarning(RuntimeWarning):
    """Logging to MLflow failed during a run; the data is kept and retried, or was lost."""
