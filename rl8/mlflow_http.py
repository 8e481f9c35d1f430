"""MLflow's HTTP client policy (its retries and seconds per request), set for a block of calls:
the Tracker's writes and every read of a run by id (``rl8 eval RUN_ID``, ``load_policy``,
``--resume RUN_ID``, ``rl8 runs``) wait at most so long for a server that never answers."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["LOG_BACKOFF", "LOG_RETRIES", "LOG_TIMEOUT_S", "bounded_requests", "http_policy", "is_http"]

#: Retries of a request (the policy of logging calls and reads by run id unless the user set
#: MLflow's variables: quick retries for blips, not MLflow's 7 retries of up to 120 s each).
LOG_RETRIES = 2
#: Back-off factor between those retries (MLflow's ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``).
LOG_BACKOFF = 1
#: Seconds a request may wait for an answer.
LOG_TIMEOUT_S = 10
_HTTP_ENV_VARS = tuple(
    f"MLFLOW_HTTP_REQUEST_{k}" for k in ("MAX_RETRIES", "BACKOFF_FACTOR", "BACKOFF_JITTER", "TIMEOUT")
)
# os.environ is process-wide: trackers in several threads must not interleave their changes.
_ENV_LOCK = threading.RLock()


def is_http(uri: str) -> bool:
    """Whether ``uri`` names a tracking server (``http(s)://``), not a local store."""
    return uri.lower().startswith(("http://", "https://"))


@contextlib.contextmanager
def http_policy(
    http: bool, retries: int, backoff: int, timeout_s: int, force: bool, deadline: float = math.inf
) -> Iterator[None]:
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


def bounded_requests(uri: str | None) -> contextlib.AbstractContextManager[None]:
    """The block's requests to ``uri`` (``None``: MLflow's default store) under the logging
    calls' policy (:data:`LOG_RETRIES`, :data:`LOG_TIMEOUT_S` seconds a request), not MLflow's
    default of 7 retries of 120 s; variables the user set are kept."""
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    return http_policy(is_http(uri), LOG_RETRIES, LOG_BACKOFF, LOG_TIMEOUT_S, force=False)
