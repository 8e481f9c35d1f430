"""The tracking store and the run: creating a local SQLite store (once, under a lock, quietly),
opening a new MLflow run or resuming one."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rl8.mlflow_http import LOG_BACKOFF, LOG_RETRIES, LOG_TIMEOUT_S, http_policy, is_http
from rl8.mlflow_store import StoreSchemaError, check_store_schema, sqlite_file
from rl8.tracking.common import TrackingError, logger
from rl8.version import __version__

try:  # POSIX: processes creating one SQLite store take turns (see :func:`ready_store`)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__: list[str] = []  # the Tracker's internals

#: HTTP policy of the probe in :meth:`rl8.tracking.Tracker.start`: no retry, seconds per request.
_PROBE_RETRIES = 0
_PROBE_TIMEOUT_S = 5
#: Loggers that report the creation of a new SQLite store at INFO level (silenced meanwhile).
_STORE_LOGGERS = ("mlflow.store.db.utils", "alembic")
#: Attempts at creating a SQLite store that a process outside rl8's lock creates at the same time.
_STORE_ATTEMPTS = 3
_ready_lock = threading.Lock()  # threads of one process (flock locks a process's own fd only)


def _source_tags(run_name: str | None) -> dict[str, str]:
    try:  # the same context tags mlflow.start_run records: user, source, git commit
        from mlflow.tracking.context.registry import resolve_tags

        tags = {k: str(v) for k, v in resolve_tags({}).items()}
    except Exception:  # pragma: no cover - context providers are best effort
        tags = {}
    if tags.get("mlflow.source.name", "-") == "-":  # MLflow's answer for stdin / notebooks
        argv0 = sys.argv[0] if sys.argv else ""
        tags["mlflow.source.name"] = (
            "<interactive>" if argv0 in ("", "-", "-c") else os.path.abspath(argv0)
        )
    tags.setdefault("mlflow.source.type", "LOCAL")
    # host and pid: the process that keeps the run RUNNING (see running_runs)
    tags.update(
        {"rl8.version": __version__, "rl8.host": socket.gethostname(), "rl8.pid": str(os.getpid())}
    )
    if run_name is not None:
        tags["mlflow.runName"] = run_name
    return tags


@contextlib.contextmanager
def _quiet_store_loggers():
    """Raise MLflow's and alembic's store-creation loggers to WARNING for the block."""
    loggers = [logging.getLogger(name) for name in _STORE_LOGGERS]
    levels = [store_logger.level for store_logger in loggers]
    for store_logger in loggers:
        store_logger.setLevel(max(store_logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for store_logger, level in zip(loggers, levels):
            store_logger.setLevel(level)


@contextlib.contextmanager
def _file_lock(path: Path):
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never through a link) for the
    block, if possible."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        fd = None
    try:
        if fd is not None and fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed, or when the process dies
        yield
    finally:
        if fd is not None:
            os.close(fd)


def check_file_store(uri: str) -> None:
    """Refuse (:class:`TrackingError`, before training) a folder store (``./mlruns``,
    ``file://``), which MLflow 3 refuses at the first request ("maintenance mode") unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set; it says when MLflow picked an old ``./mlruns`` over its
    default ``sqlite:///mlflow.db`` itself."""
    if "://" in uri and not uri.lower().startswith("file:") or uri.lower().startswith("databricks"):
        return
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
        return
    chosen_by_mlflow = not os.environ.get("MLFLOW_TRACKING_URI") and uri.rstrip("/").endswith(
        str(Path("mlruns").absolute())
    )
    why = (
        f"MLflow picked the folder store {uri!r} over the default sqlite:///mlflow.db because that "
        "folder holds runs of an older MLflow (or rl8 1.0)"
        if chosen_by_mlflow
        else f"{uri!r} is a folder store"
    )
    raise TrackingError(
        f"{why}, and MLflow 3 refuses folder stores. Migrate them into the default store "
        f"(`mlflow migrate-filestore`, see its --help) or move the folder away, then train again; or give a "
        f"store: tracking_uri / --tracking-uri / MLFLOW_TRACKING_URI = sqlite:///PATH/mlflow.db (a file), or a "
        f"server's http://HOST:PORT (or MLFLOW_ALLOW_FILE_STORE=true to keep the folder store)"
    )


def ready_store(uri: str) -> None:
    """Create a ``sqlite:///`` store before first use, quietly, under a lock file of the temporary
    folder named after the database (processes started together would otherwise run the migrations
    together and fail), trying again if a process outside rl8 (``mlflow ui``) creates it meanwhile.
    A database that cannot be opened and written is a :class:`TrackingError` at once, where MLflow
    would try again for minutes; one that a newer MLflow wrote is a
    :class:`~rl8.mlflow_store.StoreSchemaError`. Other stores are left to MLflow."""
    db = sqlite_file(uri)
    if db is None:
        return
    probe = db.with_name(f".{db.name}.rl8-probe-{os.getpid()}")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as connection:
            connection.execute("PRAGMA schema_version").fetchone()
    except (OSError, sqlite3.Error) as exc:
        raise TrackingError(
            f"the MLflow SQLite store {db} ({uri}) cannot be opened and written: {exc}. Give a "
            "writable place (tracking_uri / --tracking-uri sqlite:///PATH/mlflow.db), or disable tracking"
        ) from None
    from mlflow.tracking import MlflowClient

    lock = (
        Path(tempfile.gettempdir())
        / f"rl8-mlflow-{hashlib.sha256(str(db.absolute()).encode()).hexdigest()[:16]}.lock"
    )
    with _ready_lock, _quiet_store_loggers(), _file_lock(lock):
        for attempt in range(1, _STORE_ATTEMPTS + 1):
            try:
                MlflowClient(uri).search_experiments(max_results=1)
                break
            except Exception as exc:  # MLflow raises several kinds here
                check_store_schema(uri)  # a newer MLflow's store: no attempt can open it
                if attempt == _STORE_ATTEMPTS:
                    raise
                logger.debug("creating the MLflow store %s failed (%s); trying again", uri, exc)
                time.sleep(0.5 * attempt)


@dataclasses.dataclass(frozen=True)
class _OpenedRun:
    client: Any  # the MlflowClient that opened it
    run_id: str
    run_name: str | None
    experiment_id: str
    params: dict[str, str]  # what the run held already (a resumed run)


def open_run(
    uri: str,
    experiment: str,
    run_name: str | None,
    resume_id: str | None,
    tags: dict[str, str] | None = None,
) -> _OpenedRun:
    """Probe an ``http(s)`` store, then create a run in ``experiment`` (with ``tags`` besides the
    source tags) or resume ``resume_id``; every failure is a :class:`TrackingError` naming ``uri``
    and the cause, but a store of a newer MLflow, a :class:`~rl8.mlflow_store.StoreSchemaError`."""
    from mlflow.tracking import MlflowClient

    http = is_http(uri)
    check_file_store(uri)
    try:
        ready_store(uri)
        client = MlflowClient(uri)
        if http:
            with http_policy(http, _PROBE_RETRIES, 0, _PROBE_TIMEOUT_S, force=True):
                client.search_experiments(max_results=1)
    except (TrackingError, StoreSchemaError):
        raise
    except Exception as exc:
        server = "Start the server (`mlflow server --host HOST --port PORT`), fix" if http else "Fix"
        raise TrackingError(
            f"cannot reach the MLflow tracking store at {uri!r}: {exc}. {server} `tracking_uri` / "
            "MLFLOW_TRACKING_URI, or disable tracking."
        ) from exc
    try:
        with http_policy(http, LOG_RETRIES, LOG_BACKOFF, LOG_TIMEOUT_S, force=False):
            if resume_id is not None:
                return _resume_run(client, uri, experiment, run_name, resume_id)
            experiment_id = _experiment_id(client, uri, experiment)
            run = client.create_run(
                experiment_id, run_name=run_name, tags={**_source_tags(run_name), **(tags or {})}
            )
            return _OpenedRun(client, run.info.run_id, run.info.run_name, experiment_id, {})
    except TrackingError:
        raise
    except Exception as exc:
        raise TrackingError(
            f"cannot start an MLflow run in {uri!r} (experiment {experiment!r}): {exc}"
        ) from exc


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
        logger.debug("experiment %r created concurrently: %s", experiment, exc)
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
        logger.warning(
            "resuming run %s, which belongs to experiment %r, not %r; it stays there",
            run_id,
            exp.name,
            experiment,
        )
    tags = _source_tags(run_name)  # no mlflow.runName unless a new name is given
    client.update_run(run_id, status="RUNNING", name=run_name)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
    name = run.info.run_name if run_name is None else run_name
    return _OpenedRun(client, run_id, name, experiment_id, dict(run.data.params))
