"""What rl8's tracking modules share: the errors and the HTTP policy of MLflow's client."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["TrackingError", "TrackingWarning"]

logger = logging.getLogger(__name__)
#: HTTP policy of logging calls unless the user set MLflow's variables: quick retries for blips,
#: not MLflow's default of 7 retries with back-off and a 120 s timeout (it would stall training).
LOG_RETRIES = 2
LOG_BACKOFF = 1
LOG_TIMEOUT_S = 10
DEGRADED_TIMEOUT_S = 5  # seconds per request while the server is known to be down
_HTTP_ENV_VARS = tuple(f"MLFLOW_HTTP_REQUEST_{k}" for k in ("MAX_RETRIES", "BACKOFF_FACTOR",
                                                              "BACKOFF_JITTER", "TIMEOUT"))
# os.environ is process-wide: trackers in several threads must not interleave their changes.
_ENV_LOCK = threading.RLock()


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable, unknown run id or experiment, bad URI),
    or a call came in the wrong order; failures during a run are :class:`TrackingWarning`."""


class TrackingWarning(RuntimeWarning):
    """Logging to MLflow failed during a run; the data is kept and retried, or was lost."""


def is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


@contextlib.contextmanager
def http_policy(http: bool, retries: int, backoff: int, timeout_s: int, force: bool,
                deadline: float = math.inf) -> Iterator[None]:
    """Set MLflow's HTTP retry/timeout environment variables (:data:`_HTTP_ENV_VARS`, the client's
    only knobs) under :data:`_ENV_LOCK` for the block (``http(s)`` stores only); user values are
    kept unless ``force``; waiting for the lock past ``deadline`` (``time.monotonic()``) raises
    :class:`TimeoutError`; ``timeout_s``: seconds per request."""
    if not http:
        yield
        return
    wait = deadline - time.monotonic()
    if not _ENV_LOCK.acquire(timeout=-1 if wait == math.inf else max(0.0, wait)):
        raise TimeoutError("another request to the tracking server did not finish in time")
    saved = {k: os.environ.get(k) for k in _HTTP_ENV_VARS}
    try:
        for key, value in zip(_HTTP_ENV_VARS, (retries, backoff, 0.0, timeout_s)):
            if force or saved[key] is None:
                # MLflow parses all but the jitter as int ("0.5" is an error)
                os.environ[key] = str(float(value) if key.endswith("JITTER") else int(value))
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _ENV_LOCK.release()
