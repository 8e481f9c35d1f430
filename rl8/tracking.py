"""MLflow tracking: the only module of rl8 that talks to MLflow.

A :class:`Tracker` owns one MLflow run through its own ``MlflowClient`` (never MLflow's global
active run), checks the store before training, and keeps what a down server cannot take in
one bounded queue (see :class:`Tracker`). See ``docs/tracking.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import functools
import itertools
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import types
import warnings
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ._resolve import qualified_name

try:  # POSIX: processes creating one SQLite store take turns (see _ready_store)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "RunProcess", "Tracker", "TrackingError", "TrackingWarning", "clean_runs", "flatten_params",
    "running_runs",
]

_logger = logging.getLogger(__name__)

#: MLflow's limits (``mlflow.utils.validation``): metrics per ``log_batch`` request, params per
#: request, characters per param value.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000

#: HTTP policy of the probe in :meth:`Tracker.start`: no retry, seconds per request.
_PROBE_RETRIES = 0
_PROBE_TIMEOUT_S = 5
#: HTTP policy of logging calls unless the user set MLflow's variables: quick retries for blips,
#: not MLflow's default of 7 retries with back-off and a 120 s timeout (it would stall training).
_LOG_RETRIES = 2
_LOG_BACKOFF = 1
_LOG_TIMEOUT_S = 10
#: HTTP policy while the server is known to be down (retrying the queue): one attempt.
_DEGRADED_RETRIES = 0
_DEGRADED_TIMEOUT_S = 5

_HTTP_ENV_VARS = tuple(f"MLFLOW_HTTP_REQUEST_{k}" for k in ("MAX_RETRIES", "BACKOFF_FACTOR",
                                                              "BACKOFF_JITTER", "TIMEOUT"))
# os.environ is process-wide: trackers in several threads must not interleave their changes.
_ENV_LOCK = threading.RLock()

#: An asynchronous tracker holds metrics at most this many seconds or steps (one request for several).
_HOLD_S = 1.0
_HOLD_STEPS = 20

#: Seconds that ending a run left open at exit may take at most (``Tracker(end_at_exit=True)``).
EXIT_CLOSE_TIMEOUT_S = 30.0

_TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
# MLflow error codes that mean "the store refused this request": retrying cannot help.
_REJECTED_CODES = frozenset({
    "INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE",
    "RESOURCE_ALREADY_EXISTS", "PERMISSION_DENIED", "UNAUTHENTICATED",
})


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable, unknown run id or experiment, bad URI),
    or a call came in the wrong order; failures during a run are :class:`TrackingWarning`."""


class TrackingWarning(RuntimeWarning):
    """Logging to MLflow failed during a run; the data is kept and retried, or was lost."""


# ---- params ----------------------------------------------------------------------------------


def _param_str(value: Any) -> str:
    """One param value as MLflow stores it: a string; classes and functions by dotted name."""
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, functools.partial):
        return f"partial({_param_str(value.func)})"
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return qualified_name(value)
    if isinstance(value, (list, tuple)):
        items = ", ".join(repr(v) if isinstance(v, str) else _param_str(v) for v in value)
        if isinstance(value, tuple):
            return f"({items},)" if len(value) == 1 else f"({items})"
        return f"[{items}]"
    return str(value)


def flatten_params(obj: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings into MLflow params: ``{"a": {"b": 1}}`` -> ``{"a/b": "1"}``.

    Args:
        obj: A mapping whose values are scalars, sequences, classes or nested mappings (e.g.
            the hyper-parameters of a ``PPO`` object).
        prefix: Prepended to every key, joined with ``"/"`` (e.g. ``"hparams"`` gives
            ``"hparams/lr"``). Empty: no prefix.

    Returns:
        A flat dict of strings: values as ``str`` (classes and functions as
        ``"module.QualName"``, enums as ``"Enum.NAME"``, sequences element by element), cut to
        MLflow's limit of 6000 characters.
    """
    out: dict[str, str] = {}
    for key, value in obj.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_params(value, name))
        else:
            out[name] = _param_str(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


# ---- helpers ---------------------------------------------------------------------------------


def _configured_uri() -> str | None:
    """The configured tracking URI (``None``: MLflow's default), without importing mlflow."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        return mlflow.get_tracking_uri()
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def _is_rejection(exc: BaseException) -> bool:
    """True when the store answered and refused the request (bad key, value...)."""
    return getattr(exc, "error_code", None) in _REJECTED_CODES


def _to_float(key: str, value: Any) -> float:
    try:
        return float(value)  # python/numpy scalars, 0-d and one-element tensors
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"metric {key!r} must be a number (python, numpy or one-element tensor), "
            f"got {type(value).__name__}: {value!r:.80}"
        ) from exc


def _status_after(error: type[BaseException] | None) -> str:
    """The status of a run that ``error`` (an exception type; ``None``: none) ended."""
    if error is None:
        return "FINISHED"
    return "KILLED" if issubclass(error, KeyboardInterrupt) else "FAILED"


def _source_tags(run_name: str | None) -> dict[str, str]:
    import rl8

    try:  # the same context tags mlflow.start_run records: user, source, git commit
        from mlflow.tracking.context.registry import resolve_tags

        tags = {k: str(v) for k, v in resolve_tags({}).items()}
    except Exception:  # pragma: no cover - context providers are best effort
        tags = {}
    if tags.get("mlflow.source.name", "-") == "-":  # MLflow's answer for stdin / notebooks
        argv0 = sys.argv[0] if sys.argv else ""
        tags["mlflow.source.name"] = "<interactive>" if argv0 in ("", "-", "-c") else os.path.abspath(argv0)
    tags.setdefault("mlflow.source.type", "LOCAL")
    # host and pid: the process that keeps the run RUNNING (see running_runs)
    tags.update({"rl8.version": rl8.__version__, "rl8.host": socket.gethostname(), "rl8.pid": str(os.getpid())})
    if run_name is not None:
        tags["mlflow.runName"] = run_name
    return tags


class _HttpPolicy:
    """MLflow's HTTP retry/timeout environment variables (:data:`_HTTP_ENV_VARS`, the client's
    only knobs), set under :data:`_ENV_LOCK` around some calls and restored after. User values
    are kept unless ``force``; waiting for the lock past ``deadline`` (``time.monotonic()``)
    raises :class:`TimeoutError`; ``timeout_s``: seconds per request (``http(s)`` stores only)."""

    def __init__(self, http: bool, retries: int, backoff: int, timeout_s: int, force: bool,
                 deadline: float = math.inf) -> None:
        self.http = http
        self.wanted = dict(zip(_HTTP_ENV_VARS, (retries, backoff, 0.0, timeout_s)))
        self.timeout_s = timeout_s if http else 0
        self.force = force
        self.deadline = deadline
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> _HttpPolicy:
        if not self.http:
            return self
        wait = self.deadline - time.monotonic()
        if not _ENV_LOCK.acquire(timeout=-1 if wait == math.inf else max(0.0, wait)):
            raise TimeoutError("another request to the tracking server did not finish in time")
        self._saved = {k: os.environ.get(k) for k in _HTTP_ENV_VARS}
        for key, value in self.wanted.items():
            if self.force or self._saved[key] is None:
                # MLflow parses all but the jitter as int ("0.5" is an error)
                as_int = not key.endswith("JITTER")
                os.environ[key] = str(int(value) if as_int else float(value))
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.http:
            return
        try:
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        finally:
            _ENV_LOCK.release()


# ---- creating a local store ------------------------------------------------------------------

#: Loggers that report the creation of a new SQLite store at INFO level (silenced meanwhile).
_STORE_LOGGERS = ("mlflow.store.db.utils", "alembic")
#: Attempts at creating a SQLite store that a process outside rl8's lock creates at the same time.
_STORE_ATTEMPTS = 3
_ready_lock = threading.Lock()  # threads of one process (flock locks a process's own fd only)


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; ``None`` for other stores and ``:memory:``."""
    if not uri.lower().startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def _quiet_store_loggers():
    """Raise MLflow's and alembic's store-creation loggers to WARNING for the block (MLflow
    prints "Creating initial MLflow database tables..." at INFO on every new store)."""
    loggers = [logging.getLogger(name) for name in _STORE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _file_lock(path: Path):
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; without one
    (Windows, a folder that does not exist or cannot be written), the block runs unlocked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        fd = None
    try:
        if fd is not None and fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed, or when the process dies
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _ready_store(uri: str) -> None:
    """Create a ``sqlite:///`` store (its tables: seconds of migrations) before first use, quietly, under a lock on ``<database>.lock`` beside it: several processes
    started at once in a fresh folder would otherwise run the migrations together and fail
    (``table _alembic_tmp_experiments already exists``). A creation that still fails (a
    creator outside rl8, e.g. ``mlflow ui``) is tried again, :data:`_STORE_ATTEMPTS` times in
    all. Other stores are left to MLflow."""
    db = _sqlite_file(uri)
    if db is None:
        return
    from mlflow.tracking import MlflowClient

    with _ready_lock, _quiet_store_loggers(), _file_lock(db.with_name(db.name + ".lock")):
        for attempt in range(1, _STORE_ATTEMPTS + 1):
            try:
                MlflowClient(uri).search_experiments(max_results=1)
                break
            except Exception as exc:  # MLflow raises several kinds here
                if attempt == _STORE_ATTEMPTS:
                    raise
                _logger.debug("creating the MLflow store %s failed (%s); trying again", uri, exc)
                time.sleep(0.5 * attempt)


# ---- opening a run ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _OpenedRun:
    client: Any  # the MlflowClient that opened it
    run_id: str
    run_name: str | None
    experiment_id: str
    params: dict[str, str]  # what the run held already (a resumed run)


def _open_run(uri: str, experiment: str, run_name: str | None, resume_id: str | None) -> _OpenedRun:
    """Probe an ``http(s)`` store, then create a run in ``experiment`` or resume ``resume_id``;
    every failure is a :class:`TrackingError` naming ``uri`` and the cause."""
    from mlflow.tracking import MlflowClient

    http = _is_http(uri)
    try:
        _ready_store(uri)
        client = MlflowClient(uri)
        if http:
            with _HttpPolicy(http, _PROBE_RETRIES, 0, _PROBE_TIMEOUT_S, force=True):
                client.search_experiments(max_results=1)
    except Exception as exc:
        raise TrackingError(
            f"cannot reach the MLflow tracking store at {uri!r}: {exc}. Start the "
            f"server (`mlflow server --host HOST --port PORT`), fix `tracking_uri` / "
            f"MLFLOW_TRACKING_URI, or disable tracking."
        ) from exc
    try:
        with _HttpPolicy(http, _LOG_RETRIES, _LOG_BACKOFF, _LOG_TIMEOUT_S, force=False):
            if resume_id is not None:
                return _resume_run(client, uri, experiment, run_name, resume_id)
            experiment_id = _experiment_id(client, uri, experiment)
            run = client.create_run(experiment_id, run_name=run_name, tags=_source_tags(run_name))
            return _OpenedRun(client, run.info.run_id, run.info.run_name, experiment_id, {})
    except TrackingError:
        raise
    except Exception as exc:
        raise TrackingError(f"cannot start an MLflow run in {uri!r} (experiment {experiment!r}): {exc}") from exc


def _experiment_id(client: Any, uri: str, experiment: str) -> str:
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise TrackingError(
                f"experiment {experiment!r} is deleted in {uri!r}; "
                f"restore it (`mlflow experiments restore`) or use another name"
            )
        return exp.experiment_id
    try:
        return client.create_experiment(experiment)
    except Exception as exc:  # created by someone else in between (e.g. another rank)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise
        _logger.debug("experiment %r created concurrently: %s", experiment, exc)
        return exp.experiment_id


def _resume_run(client: Any, uri: str, experiment: str, run_name: str | None, run_id: str) -> _OpenedRun:
    from mlflow.entities import RunTag

    try:
        run = client.get_run(run_id)
    except Exception as exc:
        code = getattr(exc, "error_code", None)
        if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise TrackingError(f"cannot resume run {run_id!r}: it does not exist in {uri!r}") from exc
        raise
    if run.info.lifecycle_stage == "deleted":
        raise TrackingError(
            f"cannot resume run {run_id!r} in {uri!r}: the run is deleted "
            f"(restore it with `mlflow runs restore --run-id {run_id}`)"
        )
    experiment_id = run.info.experiment_id
    exp = client.get_experiment(experiment_id)
    if exp.name != experiment:
        _logger.warning(
            "resuming run %s, which belongs to experiment %r, not %r; it stays there",
            run_id, exp.name, experiment,
        )
    tags = _source_tags(run_name)  # no mlflow.runName unless a new name is given
    client.update_run(run_id, status="RUNNING", name=run_name)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
    name = run.info.run_name if run_name is None else run_name
    return _OpenedRun(client, run_id, name, experiment_id, dict(run.data.params))


# ---- the queue of what waits for the store ---------------------------------------------------


class _Outbox:
    """The one queue of a :class:`Tracker`, oldest first: params, metric values and staged
    artifact uploads. Deliverers take chunks and put back what failed; :attr:`changed` guards
    it and is notified on every addition; at most ``max_pending`` metric values are kept."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.changed = threading.Condition()
        self.params: dict[str, str] = {}
        self.metrics: deque[tuple[str, float, int, int]] = deque()  # (key, value, ms, step)
        # uploads: key -> (MlflowClient method, staged copy, artifact path)
        self.artifacts: dict[Any, tuple[str, Path, str | None]] = {}
        self.steps = 0  # logging calls since the last delivery: an asynchronous tracker batches
        self.first_at = math.inf  # time.monotonic() of the first of them
        self.dropped = 0  # metric values dropped since the last successful delivery
        self.overflowing = False
        self._staging: Path | None = None  # folder of the staged copies
        self._staged = 0  # copies made so far (names their sub-folders)

    def empty(self) -> bool:
        return not (self.params or self.metrics or self.artifacts)

    def counts(self) -> dict[str, int]:
        """What waits (metric values dropped included): ``{"metrics", "params", "artifacts"}``."""
        with self.changed:
            return {"metrics": len(self.metrics) + self.dropped, "params": len(self.params),
                    "artifacts": len(self.artifacts)}

    def add(self, *, params: Mapping[str, str] | None = None, metrics: Iterable[tuple] = (),
            steps: int = 0) -> bool:
        """Queue params and metric values (``(key, value, ms, step)``) of ``steps`` logging
        calls; returns whether old metric values began to be dropped."""
        with self.changed:
            self.params.update(params or {})
            self.metrics.extend(metrics)
            if steps and not self.steps:
                self.first_at = time.monotonic()
            self.steps += steps
            self.changed.notify_all()
            return self._trim()

    def stage(self, method: str, source: Path, artifact_path: str | None) -> None:
        """Queue a copy of ``source`` (file or folder, as ``method``): the caller may delete it."""
        with self.changed:
            if self._staging is None:
                self._staging = Path(tempfile.mkdtemp(prefix="rl8-artifacts-"))
            self._staged += 1
            staged = self._staging / str(self._staged) / source.name
        is_file = method == "log_artifact"
        try:
            staged.parent.mkdir()
            (shutil.copyfile if is_file else shutil.copytree)(source, staged)
        except OSError:  # e.g. a full disk: no partial copy is left
            shutil.rmtree(staged.parent, ignore_errors=True)
            raise
        # files replace a waiting file of the same destination; folders are merged by MLflow,
        # so each upload of one is kept
        key = (artifact_path, source.name) if is_file else staged
        with self.changed:
            replaced = self.artifacts.pop(key, None)
            self.artifacts[key] = (method, staged, artifact_path)
            self.changed.notify_all()
        if replaced is not None:
            shutil.rmtree(replaced[1].parent, ignore_errors=True)

    def take(self, name: str, n: int) -> list:
        """Remove and return the oldest ``n`` entries of ``name`` (an attribute of this box)."""
        with self.changed:
            if name == "metrics":
                self.steps = 0
                return [self.metrics.popleft() for _ in range(min(n, len(self.metrics)))]
            box = getattr(self, name)
            return [(key, box.pop(key)) for key in list(itertools.islice(box, n))]

    def put_back(self, name: str, chunk: list) -> bool:
        """Return a chunk taken by :meth:`take` to the front (a newer artifact of the same
        destination wins); returns whether old metric values began to be dropped."""
        with self.changed:
            if name == "metrics":
                self.metrics.extendleft(reversed(chunk))
                return self._trim()
            box = getattr(self, name)
            for key, entry in chunk:
                if name == "artifacts" and key in box:
                    shutil.rmtree(entry[1].parent, ignore_errors=True)
            setattr(self, name, {**dict(chunk), **box})
            return False

    def clear(self) -> None:
        """Forget everything queued and remove the staged copies."""
        with self.changed:
            self.params.clear()
            self.metrics.clear()
            self.artifacts.clear()
            self.steps = 0
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)
                self._staging = None

    def _trim(self) -> bool:
        excess = len(self.metrics) - self.max_pending
        if excess <= 0:
            return False
        for _ in range(excess):
            self.metrics.popleft()
        self.dropped += excess
        started, self.overflowing = not self.overflowing, True
        return started


def _warn_overflow(outbox: _Outbox, uri: str, stacklevel: int) -> None:
    warnings.warn(
        f"more than {outbox.max_pending} metric values are waiting for the MLflow tracking "
        f"store at {uri!r}; the oldest are being dropped",
        TrackingWarning, stacklevel=stacklevel)


# ---- delivery: the HTTP retry policy ---------------------------------------------------------


class _Courier:
    """Sends an :class:`_Outbox` to one run: quick retries while the store answers; after a
    failure (one warning per outage) one short attempt per ``retry_interval_s``, doubling up to
    ``max(60, retry_interval_s)`` s; with a deadline, attempts short enough to end before it."""

    def __init__(self, client: Any, run_id: str, uri: str, retry_interval_s: float) -> None:
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.http = _is_http(uri)
        self.retry_interval_s = retry_interval_s
        self.degraded = False  # True from a failed delivery until the queue is empty again
        self.last_attempt = -math.inf  # time.monotonic() at the end of the last failed attempt
        self.interval_s = retry_interval_s  # current wait between attempts (backs off)

    def due_in(self) -> float:
        """Seconds until the next attempt is due: 0 while healthy."""
        if not self.degraded:
            return 0.0
        return max(0.0, self.last_attempt + self.interval_s - time.monotonic())

    def policy(self, deadline: float = math.inf, requests: int = 1) -> _HttpPolicy:
        """The HTTP policy of the next requests: before a ``deadline``, one attempt each, short
        enough that ``requests`` of them end in time (at least 1 s: MLflow counts whole s)."""
        if deadline < math.inf:
            left = deadline - time.monotonic()
            timeout_s = int(min(_DEGRADED_TIMEOUT_S, max(1.0, left / (2 * requests))))
            return _HttpPolicy(self.http, _DEGRADED_RETRIES, 0, timeout_s, True, deadline)
        if self.degraded:
            return _HttpPolicy(self.http, _DEGRADED_RETRIES, 0, _DEGRADED_TIMEOUT_S, True)
        return _HttpPolicy(self.http, _LOG_RETRIES, _LOG_BACKOFF, _LOG_TIMEOUT_S, False)

    def deliver(self, outbox: _Outbox, *, force: bool, deadline: float = math.inf, stacklevel: int = 3) -> None:
        """Send params, metrics (oldest first), artifacts; stop at the first failure. Unless
        ``force``, only when due. Before a ``deadline``, each request gets at most half the
        time left (the rest is for the run's status)."""
        if outbox.empty() or (not force and self.due_in() > 0):
            return
        from mlflow.entities import Metric, Param

        was_degraded = self.degraded
        policy = self.policy(deadline, requests=2)

        def send_all(name: str, n: int, send: Any) -> int:
            sent = 0
            while chunk := outbox.take(name, n):
                try:
                    if time.monotonic() + policy.timeout_s > deadline - policy.timeout_s:
                        raise TimeoutError("no time left before the deadline")
                    send(chunk)
                except BaseException:
                    if outbox.put_back(name, chunk):
                        _warn_overflow(outbox, self.uri, stacklevel)
                    raise
                sent += len(chunk)
            return sent

        try:
            with policy:
                send_all("params", MAX_PARAMS_PER_BATCH,
                         lambda chunk: self._send(params=[Param(k, v) for k, v in chunk], what="params"))
                delivered = send_all("metrics", MAX_METRICS_PER_BATCH,
                                     lambda chunk: self._send(metrics=[Metric(*m) for m in chunk], what="metrics"))
                send_all("artifacts", 1, lambda chunk: self._send_artifact(*chunk[0][1]))
        except Exception as exc:
            self.last_attempt = time.monotonic()
            if self.degraded:  # still down: wait longer before the next attempt
                self.interval_s = min(2 * self.interval_s, max(60.0, self.retry_interval_s))
                return
            self.degraded = True
            self.interval_s = self.retry_interval_s
            warnings.warn(
                f"logging to the MLflow tracking store at {self.uri!r} failed ({exc}); training "
                f"goes on, {len(outbox.metrics)} metric values and {len(outbox.artifacts)} "
                f"artifacts are kept and will be retried (first in {self.retry_interval_s:g} s)",
                TrackingWarning, stacklevel=stacklevel)
            return
        self.degraded = False
        outbox.overflowing = False
        if was_degraded:
            dropped = f" ({outbox.dropped} were dropped)" if outbox.dropped else ""
            _logger.warning(
                "MLflow tracking store at %r is reachable again: delivered %d pending metric "
                "values%s",
                self.uri, delivered, dropped,
            )
            outbox.dropped = 0

    def _send_artifact(self, method: str, staged: Path, artifact_path: str | None) -> None:
        """One upload (then its staged copy is removed); a refused one is dropped with a warning."""
        try:
            getattr(self.client, method)(self.run_id, str(staged), artifact_path)
        except Exception as exc:
            if not _is_rejection(exc):
                raise
            warnings.warn(
                f"MLflow rejected the artifact {staged.name!r} for run {self.run_id}: {exc}",
                TrackingWarning, stacklevel=5)
        shutil.rmtree(staged.parent, ignore_errors=True)

    def _send(self, *, what: str, metrics=(), params=()) -> None:
        """One ``log_batch`` request; a request the store refuses is dropped, not retried."""
        try:
            self.client.log_batch(self.run_id, metrics=metrics, params=params, synchronous=True)
        except Exception as exc:
            if not _is_rejection(exc):
                raise
            names = sorted({e.key for e in (metrics or params)})
            warnings.warn(
                f"MLflow rejected {len(metrics) or len(params)} {what} ({', '.join(names[:5])}"
                f"{', ...' if len(names) > 5 else ''}) for run {self.run_id}: {exc}",
                TrackingWarning, stacklevel=5)

    def set_status(self, status: str, *, deadline: float = math.inf, when: str = "") -> bool:
        """Mark the run ``status`` (not past ``deadline``); a failure is a warning. Returns
        whether the status was set."""
        try:
            if time.monotonic() >= deadline:
                raise TimeoutError("no time was left for it")
            with self.policy(deadline, requests=1):
                self.client.set_terminated(self.run_id, status=status)
            return True
        except Exception as exc:
            warnings.warn(
                f"could not set the status of MLflow run {self.run_id} at {self.uri!r} "
                f"to {status}{when}: {exc}",
                TrackingWarning, stacklevel=4)
            return False


# ---- the logging thread of an asynchronous tracker -------------------------------------------


class _LogThread:
    """The ``rl8-mlflow-logger`` thread of an asynchronous :class:`Tracker`: starts the run if
    asked, then delivers the outbox once it holds params, artifacts, :data:`_HOLD_STEPS` steps or
    metrics older than :data:`_HOLD_S`, or on :meth:`flush`; while the store is down, when due."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.outbox = tracker._outbox
        self.stopping = False
        self.flush_wanted = 0  # flush requests made; guarded by outbox.changed
        self.flushed = 0  # flush requests done
        self.finished = False  # the thread has ended (or is ending)
        self._thread: threading.Thread | None = None

    def launch(self, *, start_run: bool) -> None:
        """Start the thread (once); with ``start_run``, its first job is ``tracker.start()``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, args=(start_run,),
                                            name="rl8-mlflow-logger", daemon=True)
            self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and not self.finished

    def flush(self, timeout_s: float | None) -> bool:
        """Have everything queued so far tried once; False when ``timeout_s`` passed first."""
        with self.outbox.changed:
            self.flush_wanted += 1
            wanted = self.flush_wanted
            self.outbox.changed.notify_all()
            return self.outbox.changed.wait_for(lambda: self.flushed >= wanted or not self.alive(), timeout_s)

    def stop(self) -> None:
        """No more deliveries: the thread ends after its current request."""
        with self.outbox.changed:
            self.stopping = True
            self.outbox.changed.notify_all()

    def _wait_s(self) -> float | None:
        """Seconds until the next delivery is due (<= 0: now; ``None``: not before news)."""
        if self.flush_wanted > self.flushed:
            return 0.0
        if self.outbox.empty():
            return None
        courier = self.tracker._courier
        if courier is not None and courier.degraded:
            return courier.due_in()
        if self.outbox.params or self.outbox.artifacts or self.outbox.steps >= _HOLD_STEPS:
            return 0.0
        return self.outbox.first_at + _HOLD_S - time.monotonic()

    def _loop(self, start_run: bool) -> None:
        tracker, changed = self.tracker, self.outbox.changed
        try:
            if start_run and not tracker._start_in_thread():
                return
            while True:
                with changed:
                    while not self.stopping and not ((wait := self._wait_s()) is not None and wait <= 0):
                        changed.wait(wait)
                    if self.stopping:
                        return
                    wanted = self.flush_wanted
                tracker._deliver(force=wanted > self.flushed, stacklevel=4)
                with changed:
                    self.flushed = wanted
                    changed.notify_all()
        finally:
            with changed:
                self.finished = True
                changed.notify_all()  # flush() waits no longer


# ---- the tracker -----------------------------------------------------------------------------


class _Run:
    """The life cycle of one MLflow run (start, end, report); the base of :class:`Tracker`,
    whose docstring describes the arguments and which does the logging."""

    def __init__(self, *, experiment: str, run_name: str | None = None, tracking_uri: str | None = None,
                 run_id: str | None = None, enabled: bool = True, max_pending: int = 100_000,
                 retry_interval_s: float = 5.0, asynchronous: bool = False, end_at_exit: bool = False) -> None:
        if not isinstance(experiment, str) or not experiment:
            raise ValueError(f"experiment must be a non-empty string, got {experiment!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 0:
            raise ValueError(f"max_pending must be an int >= 0, got {max_pending!r}")
        if not (isinstance(retry_interval_s, (int, float)) and retry_interval_s >= 0):
            raise ValueError(f"retry_interval_s must be a number >= 0, got {retry_interval_s!r}")
        for name, value in (("asynchronous", asynchronous), ("end_at_exit", end_at_exit)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.experiment = experiment
        self.run_name = run_name
        # resolved without importing mlflow when the URI is given or set in the environment
        self._tracking_uri = str(tracking_uri) if tracking_uri else _configured_uri()
        self.enabled = bool(enabled)
        self.max_pending = max_pending
        self.retry_interval_s = float(retry_interval_s)
        self.asynchronous = asynchronous
        self.end_at_exit = end_at_exit
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.start_error: TrackingError | None = None
        self.final_status: str | None = None
        self.undelivered: dict[str, int] = {"metrics": 0, "params": 0, "artifacts": 0}
        self._resume_id = run_id
        self._lock = threading.RLock()  # held by whoever makes requests (start, send, end)
        self._ended = False
        # the status an end() that gave up waiting for a start leaves for that start to set
        self._wanted_status: str | None = None
        self._params: dict[str, str] = {}  # what the run holds (or will, once delivered)
        self._outbox = _Outbox(max_pending)
        self._courier: _Courier | None = None  # once started
        self._thread = _LogThread(self) if asynchronous else None
        self._start_done = threading.Event()  # cleared while a background start is in progress
        self._start_done.set()
        self._start_error_reported = self._exit_hook = False

    @property
    def tracking_uri(self) -> str:
        """The resolved tracking URI (never ``None``)."""
        if self._tracking_uri is None:
            import mlflow

            self._tracking_uri = mlflow.get_tracking_uri()
        return self._tracking_uri

    @property
    def is_local(self) -> bool:
        """Whether the store is a local SQLite database or folder, not a server."""
        uri = self._tracking_uri
        if uri is None:
            return True
        if "://" not in uri:  # a folder, or "databricks" (a Databricks workspace)
            return not uri.lower().startswith("databricks")
        return uri.split(":", 1)[0].lower() in ("sqlite", "file")

    # ---- life cycle -------------------------------------------------------------------------

    def start(self) -> str | None:
        """Create (or resume) the run, after one quick request (no retry, 5 s timeout) to an
        ``http(s)`` store so that a dead server fails here, not after training.

        Sets the tags ``mlflow.runName``, ``mlflow.source.name``, ``mlflow.user``,
        ``rl8.version``, ``rl8.host`` and ``rl8.pid`` (see :func:`running_runs`). Calling it
        again returns the same run id; a run whose :meth:`end` gave up waiting for this start
        is ended at once with the status asked for.

        Returns:
            The run id; ``None`` when the tracker is disabled.

        Raises:
            TrackingError: The store is unreachable or unusable, or ``run_id`` does not name
                an existing, non-deleted run. The message names the URI and the cause.
        """
        if not self.enabled:
            return None
        with self._lock:
            if self.run_id is not None:
                return self.run_id
            if self._ended and self._start_done.is_set():  # not a background start end() let go
                raise TrackingError("this Tracker has ended; create a new one")
            uri = self.tracking_uri
            run = _open_run(uri, self.experiment, self.run_name, self._resume_id)
            with self._outbox.changed:
                self._params.update(run.params)
                self._courier = _Courier(run.client, run.run_id, uri, self.retry_interval_s)
                self.run_id, self.run_name, self.experiment_id = run.run_id, run.run_name, run.experiment_id
                wanted = self._wanted_status
            if self._start_done.is_set():  # a background start registered it already
                self._hook_exit()
            if wanted is not None:  # end() gave up waiting for this start
                self._ended = True  # one short attempt: that end() has returned already
                short = time.monotonic() + 2 * _DEGRADED_TIMEOUT_S
                if self._courier.set_status(wanted, deadline=short, when=" once its start completed"):
                    self.final_status = wanted
            elif self._thread is not None:
                self._thread.launch(start_run=False)
            return self.run_id

    def start_in_background(self) -> None:
        """:meth:`start` in the logging thread (``asynchronous`` only); returns at once, and what
        is logged meanwhile is queued. A failure disables the tracker (dropping the queue) and
        is kept in :attr:`start_error`, raised by :meth:`check_start`."""
        if not self.enabled:
            return
        if self._thread is None:
            raise TrackingError("start_in_background() needs a Tracker made with asynchronous=True")
        # MLflow's import makes thread pools, refused at shutdown: let a start at exit complete
        import concurrent.futures.thread  # noqa: F401

        self._hook_exit()
        self._start_done.clear()
        self._thread.launch(start_run=True)

    def _start_in_thread(self) -> bool:
        try:
            self.start()
            return not self._ended
        except BaseException as exc:  # noqa: BLE001 - raised by check_start in the owner's thread
            self.start_error = TrackingError(
                f"the MLflow run (started in the background) could not be started: {exc}")
            self.start_error.__cause__ = exc
            self.enabled = False
            self._outbox.clear()
            return False
        finally:
            self._start_done.set()

    def wait_started(self, timeout_s: float | None = None) -> bool:
        """Wait at most ``timeout_s`` seconds (``None``: no limit) for a background start to
        end; returns whether none is in progress any more."""
        return self._start_done.wait(timeout_s)

    def check_start(self, *, once: bool = False) -> None:
        """Raise :attr:`start_error` when a background start has failed (not waiting for one
        in progress); with ``once``, only if it was never raised before."""
        if self.start_error is None or not self._start_done.is_set():
            return
        if not (once and self._start_error_reported):
            self._start_error_reported = True
            raise self.start_error

    def end(self, status: str = "FINISHED", *, timeout_s: float | None = None) -> bool:
        """Deliver what is pending and close the run with ``status``. Idempotent.

        Args:
            status: Terminal status: ``"FINISHED"`` (normal end), ``"FAILED"`` (an exception
                stopped training) or ``"KILLED"`` (interrupted by the user or a signal).
            timeout_s: Seconds this call may take at most, whatever the server does (each
                request then waits at most half the time left, without retry); ``None``: the
                usual HTTP policy. Signal exits use it.

        Returns:
            Whether the run's status is now ``status`` in the store (also
            :attr:`final_status`); ``False`` when disabled or never started.

        Waits for a background start in progress. Never raises on tracking failures: metrics,
        params and artifacts that still cannot be delivered are counted in :attr:`undelivered`
        and reported as lost in a :class:`TrackingWarning`, as is a status that could not be set.
        """
        status = str(status).upper()
        if status not in _TERMINAL_STATUSES:
            raise ValueError(f"status must be one of {_TERMINAL_STATUSES}, got {status!r}")
        if not self.enabled:
            return False
        if self._exit_hook:
            atexit.unregister(self._end_at_exit)
            self._exit_hook = False
        deadline = math.inf if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        if self._thread is not None:
            self._thread.stop()  # from now on only end() sends
        started = self._start_done.wait(None if timeout_s is None else max(0.0, timeout_s))
        left = -1 if timeout_s is None else max(0.0, deadline - time.monotonic())
        if not (started and self._lock.acquire(timeout=left)):  # a start or a request hangs
            self._give_up(status, timeout_s)
            return False
        try:
            ended, self._ended = self._ended, True
            if ended or not self.enabled or self.run_id is None:
                return self.final_status == status
            self._courier.deliver(self._outbox, force=True, deadline=deadline)
            self.undelivered = self._outbox.counts()
            if any(self.undelivered.values()):
                lost = self.undelivered
                warnings.warn(
                    f"MLflow run {self.run_id} at {self.tracking_uri!r}: {lost['metrics']} "
                    f"metric values, {lost['params']} params and {lost['artifacts']} artifacts "
                    f"could not be delivered and are lost",
                    TrackingWarning, stacklevel=2)
            self._outbox.clear()
            if self._courier.set_status(status, deadline=deadline):
                self.final_status = status
            return self.final_status == status
        finally:
            self._lock.release()

    def _give_up(self, status: str, timeout_s: float | None) -> None:
        """:meth:`end` ran out of time waiting for a start or a request of another thread."""
        self._ended = True
        self.undelivered = self._outbox.counts()
        with self._outbox.changed:  # a start completing reads _wanted_status under this lock
            starting = self.run_id is None
            if starting:
                self._wanted_status = status
        if starting:
            message = (f"the MLflow run at {self.tracking_uri!r} was still starting after "
                       f"{timeout_s:g} s; it is marked {status} as soon as its start completes")
        else:
            message = (f"could not set the status of MLflow run {self.run_id} at "
                       f"{self.tracking_uri!r} to {status}: a request to the server did not finish "
                       f"within {timeout_s:g} s; the run stays RUNNING (`rl8 runs --clean` marks "
                       "such runs FAILED) and what was still queued is lost")
        warnings.warn(message, TrackingWarning, stacklevel=3)

    def end_report(self, status: str) -> str:
        """What :meth:`end` with ``status`` achieved, as a clause for a message (``"; MLflow run
        ID ended as KILLED"``, or why not, and what was not delivered); empty without a run."""
        if not self.run_id:
            if not self._start_done.is_set():
                return f"; the MLflow run was still starting: it is marked {status} once started"
            return ""
        if self.final_status == status:
            report = f"; MLflow run {self.run_id} ended as {status}"
        else:
            report = (
                f"; MLflow run {self.run_id} could NOT be marked {status} (the tracking server "
                "did not answer in time): it shows RUNNING until `rl8 runs --clean` marks it FAILED"
            )
        names = {"metrics": "metric values", "params": "params", "artifacts": "artifacts"}
        lost = [f"{n} {names[what]}" for what, n in self.undelivered.items() if n]
        return report + (f"; not delivered: {', '.join(lost)}" if lost else "")

    def _hook_exit(self) -> None:
        if self.end_at_exit and not self._exit_hook and not self._ended:
            self._exit_hook = True
            atexit.register(self._end_at_exit)

    def _end_at_exit(self) -> None:
        """The exit hook of ``end_at_exit``; warns of a failed background start never raised."""
        error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        self._exit_hook = False  # running now: end() does not unregister it
        self.end(_status_after(None if error is None else type(error)), timeout_s=EXIT_CLOSE_TIMEOUT_S)
        if self.start_error is not None and not self._start_error_reported:
            warnings.warn(str(self.start_error), TrackingWarning, stacklevel=2)

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end(_status_after(exc_type))
        return False

    def _deliver(self, force: bool, stacklevel: int = 4) -> None:
        """Send the outbox (unless ``force``, only when due)."""
        with self._lock:
            stopped = self._thread is not None and self._thread.stopping
            if not (self._ended or stopped) and self._courier is not None:
                self._courier.deliver(self._outbox, force=force, stacklevel=stacklevel)


class Tracker(_Run):
    """One MLflow run: params, per-step metrics, artifacts and its final status.

    The tracker talks to the store through its own ``MlflowClient``; it never touches MLflow's
    global active run. ``with Tracker(...) as tracker:`` starts the run and ends it on exit
    (``docs/tracking.md`` has an example). Everything logged goes through one queue: sent at
    once by the calling thread, or, when ``asynchronous``, by the tracker's logging thread
    (``rl8-mlflow-logger``), so that a slow or hung store never holds up the caller.

    Args:
        experiment: Name of the MLflow experiment the run goes to; created when absent.
            Ignored when resuming (``run_id``): the run stays in its experiment.
        run_name: Display name of the run (tag ``mlflow.runName``). ``None``: MLflow picks a
            random name for a new run; a resumed run keeps its name.
        tracking_uri: Where runs are stored: ``http(s)://host:port`` for a tracking server,
            ``sqlite:///path.db``, or a folder. ``None``: MLflow's default, i.e. the
            ``MLFLOW_TRACKING_URI`` environment variable, else ``sqlite:///mlflow.db`` in the
            current directory.
        run_id: Resume this existing run instead of creating one: its status goes back to
            ``RUNNING`` and metrics are appended to its history (use steps after the last one).
        enabled: ``False`` makes every method a no-op and :attr:`run_id` stays ``None``; used
            on non-zero ranks of distributed training.
        max_pending: Most metric values (one key at one step each) kept while the server is
            unreachable; when more arrive the oldest are dropped, with a warning.
        retry_interval_s: Seconds between attempts to deliver pending metrics (and artifacts)
            while the server is unreachable; doubles after each failed attempt, up to
            ``max(60, retry_interval_s)`` s (one short attempt each). :meth:`flush` and
            :meth:`end` always try.
        asynchronous: ``True``: logging calls only queue; the logging thread sends, holding
            metrics up to 1 s (or 20 steps) so that several steps share one request, and
            :meth:`start_in_background` can create the run there. ``False``: each call sends
            before it returns.
        end_at_exit: ``True``: a run still open when the process exits is ended then (within
            :data:`EXIT_CLOSE_TIMEOUT_S` seconds): ``FAILED`` after an uncaught exception,
            ``KILLED`` after an uncaught ``KeyboardInterrupt``, else ``FINISHED``. The exit
            hook holds the tracker, so this holds for a tracker its owner dropped.

    Attributes:
        run_id: The MLflow run id once started; ``None`` before, and always when disabled.
        experiment_id: The MLflow experiment id once started.
        start_error: The :class:`TrackingError` of a background start that failed, else ``None``.
        final_status: Terminal status recorded in the store by :meth:`end`; ``None`` until
            then, or when setting it failed.
        undelivered: What :meth:`end` could not deliver: ``{"metrics": n, "params": n,
            "artifacts": n}``.
    """

    @property
    def pending(self) -> int:
        """Number of metric values waiting to be delivered (0 when all went through)."""
        return len(self._outbox.metrics)

    @property
    def pending_artifacts(self) -> int:
        """Number of artifact uploads waiting to be delivered."""
        return len(self._outbox.artifacts)

    # ---- logging ----------------------------------------------------------------------------

    def _check_started(self) -> None:
        if self.run_id is None and self._start_done.is_set():
            raise TrackingError("Tracker.start() must be called before logging")
        if self._ended:
            raise TrackingError(f"MLflow run {self.run_id} has ended; nothing more can be logged")

    def _queued(self, overflow: bool) -> None:
        """After adding to the outbox: send now, or leave it to the logging thread."""
        if overflow:
            _warn_overflow(self._outbox, self.tracking_uri, stacklevel=4)
        if self._thread is None:
            self._deliver(force=False, stacklevel=5)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's configuration as MLflow params.

        Flattened by :func:`flatten_params` (``"hparams/lr"``), sent in batches of 100. MLflow
        params cannot change once logged: a param logged again with the same value is skipped;
        a changed value is logged as ``"resumed/<key>"`` on a resumed run (once), else dropped
        with a :class:`TrackingWarning` (see ``docs/tracking.md``, "Resuming a run").

        Args:
            params: A (possibly nested) mapping of names to values.
        """
        if not self.enabled:
            return
        self._check_started()
        new: dict[str, str] = {}
        with self._outbox.changed:
            for key, value in flatten_params(params).items():
                old = self._params.get(key)
                if old is None:
                    new[key] = value
                elif old != value:
                    alt = f"resumed/{key}"
                    if self._resume_id is None or self._params.get(alt, value) != value:
                        warnings.warn(
                            f"MLflow param {key!r} is already {old!r} in run {self.run_id}; "
                            f"the new value {value!r} is not recorded (params cannot change)",
                            TrackingWarning, stacklevel=2)
                    elif alt not in self._params:
                        new[alt] = value
            self._params.update(new)
        if new:
            self._queued(self._outbox.add(params=new))

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record the metrics of one step, in one request (chunks of 1000 metrics).

        Values (Python or numpy numbers, one-element tensors) become ``float`` (NaN and inf are
        kept), stamped with the wall-clock time in ms. While the store cannot be reached they
        are queued and retried as the class docstring says (``max_pending``,
        ``retry_interval_s``); a log message reports their delivery.

        Args:
            metrics: ``{name: value}``; names like ``"losses/policy"``.
            step: The x-axis value of this point; the Trainer uses ``env/steps`` (total env
                transitions collected so far).

        Raises:
            TypeError: A value is not a number.
        """
        self.log_metrics_many([(metrics, step)])

    def log_metrics_many(self, items: Iterable[tuple[Mapping[str, Any], int]]) -> None:
        """Record the metrics of several steps with one delivery (chunks of 1000 metrics).

        Like :meth:`log_metrics` for each ``(metrics, step)`` pair, but every pair is queued
        first and the queue is then delivered at once (a request's fixed cost dominates).

        Args:
            items: ``(metrics, step)`` pairs, oldest first; see :meth:`log_metrics`.
        """
        if not self.enabled:
            return
        self._check_started()
        ms = int(time.time() * 1000)
        values, steps = [], 0
        for metrics, step in items:
            values.extend((str(k), _to_float(k, v), ms, int(step)) for k, v in metrics.items())
            steps += 1
        if values:
            self._queued(self._outbox.add(metrics=values, steps=steps))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Try now to deliver everything queued (asynchronous: wait at most ``timeout_s``
        seconds, ``None``: no limit, for the logging thread to try). Never raises on tracking
        failures; returns whether nothing waits any more."""
        if not self.enabled:
            return True
        if self._thread is None or not self._thread.alive():
            self._deliver(force=True)
        elif not self._thread.flush(timeout_s):
            return False
        return self._outbox.empty()

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        """Upload one file to the run's artifacts, or queue it while the server is down.

        The file is copied first (the caller may delete it at once) and queued like metrics; a
        newer file for the same destination (``artifact_path`` and name) replaces a queued one.

        Args:
            local_path: The file to upload.
            artifact_path: Folder inside the run's artifacts (e.g. ``"checkpoints"``);
                ``None``: the root.

        A missing file is a :class:`TrackingWarning`, not an error; so are a copy that cannot be
        made (a full temporary folder: the file is not uploaded) and an upload the store
        refuses, and artifacts still queued at :meth:`end` are reported as lost.
        """
        self._upload("log_artifact", local_path, artifact_path)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        """Like :meth:`log_artifact` for every file (recursively) of the folder ``local_dir``."""
        self._upload("log_artifacts", local_dir, artifact_path)

    def _upload(self, method: str, local: str | Path, artifact_path: str | None) -> None:
        if not self.enabled:
            return
        self._check_started()
        source = Path(local)
        is_file = method == "log_artifact"
        if not (source.is_file() if is_file else source.is_dir()):
            warnings.warn(
                f"could not log artifacts from {str(local)!r} to MLflow run {self.run_id} "
                f"at {self.tracking_uri!r}: no such {'file' if is_file else 'folder'}",
                TrackingWarning, stacklevel=3)
            return
        try:
            self._outbox.stage(method, source, artifact_path)
        except OSError as exc:  # a full or unwritable temporary folder: tracking never fails training
            warnings.warn(
                f"could not log {str(local)!r} to MLflow run {self.run_id}: staging a copy in "
                f"the temporary folder {tempfile.gettempdir()} failed ({exc}); it is not uploaded",
                TrackingWarning, stacklevel=3)
            return
        self._queued(False)

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else (self.run_id or "not started")
        return f"Tracker(experiment={self.experiment!r}, uri={self.tracking_uri!r}, run={state})"


# ---- runs left RUNNING by a process that died ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunProcess:
    """A ``RUNNING`` MLflow run and what is known about the process that owns it.

    Attributes:
        run_id: The MLflow run id.
        experiment: The name of its experiment.
        run_name: Its display name.
        host: Host name of the process that started (or last resumed) it: tag ``rl8.host``;
            ``None`` for runs not made by rl8.
        pid: That process's id: tag ``rl8.pid``; ``None`` when unknown.
        start_time_s: When the run started, in seconds since the epoch.
        process: ``"alive"`` (a process with that pid exists on this host), ``"dead"`` (none
            does) or ``"unknown"`` (another host, or no tags).
    """

    run_id: str
    experiment: str
    run_name: str
    host: str | None
    pid: int | None
    start_time_s: float
    process: str


def _process_state(host: str | None, pid: int | None) -> str:
    if host != socket.gethostname() or pid is None or pid <= 0:
        return "unknown"
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return "dead"
    except PermissionError:  # it exists, owned by another user
        pass
    return "alive"


def running_runs(tracking_uri: str | None = None, *, experiment: str | None = None) -> list[RunProcess]:
    """The ``RUNNING`` runs of a tracking store, with the state of their process.

    A run started by rl8 records the host name and process id of its process as the tags
    ``rl8.host`` and ``rl8.pid``; on that host, a run whose process no longer exists was
    killed before it could end its run (``kill -9``, a crash, an out-of-memory kill). A pid
    reused by a newer process makes the run look alive (never the other way round).

    Args:
        tracking_uri: The store (default: MLflow's, i.e. ``MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db``).
        experiment: Only this experiment's runs; ``None``: every experiment.

    Returns:
        The runs, oldest first.

    Raises:
        TrackingError: The experiment does not exist.
    """
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    import mlflow

    _ready_store(tracking_uri or mlflow.get_tracking_uri())
    client = MlflowClient(tracking_uri)
    if experiment is None:
        experiments = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    else:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise TrackingError(f"no experiment {experiment!r} in {client.tracking_uri!r}")
        experiments = [found]
    names = {e.experiment_id: e.name for e in experiments}
    out: list[RunProcess] = []
    token = None
    while names:
        page = client.search_runs(
            list(names), filter_string="attributes.status = 'RUNNING'",
            max_results=1000, page_token=token,
        )
        for run in page:
            host, pid_text = run.data.tags.get("rl8.host"), run.data.tags.get("rl8.pid", "")
            pid = int(pid_text) if pid_text.isdigit() else None
            info = run.info
            out.append(RunProcess(info.run_id, names.get(info.experiment_id, info.experiment_id),
                                  info.run_name or "", host, pid, (info.start_time or 0) / 1000,
                                  _process_state(host, pid)))
        if not (token := page.token):
            break
    return sorted(out, key=lambda r: r.start_time_s)


def clean_runs(tracking_uri: str | None = None, *, experiment: str | None = None, older_than_s: float | None = None,
               dry_run: bool = False) -> list[RunProcess]:
    """Mark ``FAILED`` the ``RUNNING`` runs whose process is gone (see :func:`running_runs`).

    A run is cleaned when its process is ``"dead"`` (it ran on this host and no process has
    its pid), or, with ``older_than_s``, when it started more than that many seconds ago and
    its process is not known to be alive (runs of other hosts, runs not made by rl8). A run
    whose process is alive is never touched. A cleaned run gets the tag ``rl8.cleaned`` with
    the reason.

    Args:
        tracking_uri: The store (default: MLflow's).
        experiment: Only this experiment's runs; ``None``: every experiment.
        older_than_s: Also clean runs of unknown process started more than this many seconds
            ago; ``None``: only runs whose process is known dead.
        dry_run: Only return the runs that would be cleaned.

    Returns:
        The runs cleaned (or that would be).
    """
    from mlflow.tracking import MlflowClient

    if older_than_s is not None and not (isinstance(older_than_s, (int, float)) and older_than_s >= 0):
        raise ValueError(f"older_than_s must be a number of seconds >= 0, got {older_than_s!r}")
    now = time.time()
    chosen = []
    for run in running_runs(tracking_uri, experiment=experiment):
        if run.process == "dead":
            chosen.append((run, f"process {run.pid} on {run.host} is gone"))
        elif run.process == "unknown" and older_than_s is not None and now - run.start_time_s > older_than_s:
            chosen.append((run, f"started {now - run.start_time_s:.0f} s ago, process unknown"))
    if not dry_run:
        client = MlflowClient(tracking_uri)
        for run, reason in chosen:
            client.set_tag(run.run_id, "rl8.cleaned", reason)
            client.set_terminated(run.run_id, status="FAILED")
    return [run for run, _ in chosen]
