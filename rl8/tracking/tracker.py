"""The :class:`Tracker` of one MLflow run, through its own ``MlflowClient`` (docs/tracking.md)."""

from __future__ import annotations

import atexit

# imported now, not when a run starts at interpreter exit: MLflow's import makes thread pools,
# which concurrent.futures refuses at shutdown
import concurrent.futures.thread  # noqa: F401
import contextlib
import enum
import functools
import json
import math
import os
import sys
import tempfile
import threading
import time
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rl8.fields import check_int
from rl8.mlflow_store import StoreSchemaError
from rl8.registry import qualified_name
from rl8.tracking.cadence import LogCadence
from rl8.tracking.common import DEGRADED_TIMEOUT_S, TrackingError, TrackingWarning
from rl8.tracking.delivery import (
    MODEL_VERSIONS_TAG,
    Courier,
    LogThread,
    ModelLink,
    Outbox,
    warn_overflow,
)
from rl8.tracking.store import check_file_store, open_run

__all__ = ["Tracker", "flatten_params"]

#: MLflow's limit on the length of a param's value (``mlflow.utils.validation``); longer ones are cut.
MAX_PARAM_VALUE_LENGTH = 6000
#: Seconds that ending a run left open at exit may take at most (``Tracker(end_at_exit=True)``).
EXIT_CLOSE_TIMEOUT_S = 30.0
#: The statuses that end an MLflow run.
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")


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
    """Flatten nested mappings into MLflow params: ``{"a": {"b": 1}}`` -> ``{"a/b": "1"}``; values
    as strings (classes and functions by dotted name, enums as ``"Enum.NAME"``), cut to
    MLflow's limit of 6000 characters.

    Args:
        obj: A mapping of scalars, sequences, classes or nested mappings.
        prefix: Prepended to every key, joined with ``"/"`` (empty: no prefix).
    """
    out: dict[str, str] = {}
    for key, value in obj.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_params(value, name))
        else:
            out[name] = _param_str(value)[:MAX_PARAM_VALUE_LENGTH]
    return out


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


class Tracker:
    """One MLflow run: params, per-step metrics, artifacts and its final status, all through one
    queue (see ``docs/tracking.md``); ``with Tracker(...) as tracker:`` starts and ends the run.

    Args:
        experiment: Name of the MLflow experiment of a new run; created when absent.
        run_name: Display name of the run; ``None``: MLflow's for a new run, a resumed one's.
        tracking_uri: Where runs are stored (``http(s)://host:port``, ``sqlite:///path.db``; a
            folder or ``file://`` store is refused, as MLflow 3 does); ``None``:
            ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.
        run_id: Resume this existing run instead of creating one.
        enabled: ``False`` makes every method a no-op (non-zero ranks of distributed training).
        max_pending: Most metric values kept while the server is unreachable (then the oldest
            are dropped, with a warning).
        retry_interval_s: Seconds between delivery attempts while the server is unreachable
            (doubling up to ``max(60, retry_interval_s)``).
        asynchronous: ``True``: logging calls only queue and the logging thread sends;
            ``False``: each call sends before it returns.
        end_at_exit: ``True``: a run still open when the process exits is ended then (within
            :data:`EXIT_CLOSE_TIMEOUT_S` seconds; ``FAILED`` after an uncaught exception).
        system_metrics: ``True``: MLflow's system metrics (``system/*``: CPU, memory, disk,
            network, GPU with ``nvidia-ml-py``) are logged from its own thread while the run is
            open (needs ``psutil``).
        tags: Tags of a new run besides the source tags (``{"mlflow.parentRunId": id}``: a
            nested run); ``None``: none.
        log_every: Which steps (distinct ``step`` values of :meth:`log_metrics`) are logged, by
            :class:`~rl8.tracking.cadence.LogCadence`: an int N, every N-th step (1: every
            step); ``None``: every step for the first minute (at most 1,000 steps), then one
            step per 10 s. Each log has the latest value of every metric, at the step it came
            from; values logged with ``always=True``, at a step :meth:`log_model` names, or
            held at :meth:`flush` or :meth:`end` are logged too.

    Attributes:
        run_id: The MLflow run id once started; ``None`` before, and always when disabled.
        experiment_id: The MLflow experiment id once started.
        start_error: The :class:`TrackingError` of a background start that failed (a
            :class:`~rl8.mlflow_store.StoreSchemaError` for a store of a newer MLflow), else ``None``.
        final_status: Terminal status recorded in the store by :meth:`end`, else ``None``.
        undelivered: What :meth:`end` could not deliver: ``{"metrics": n, "params": n,
            "artifacts": n}``.
    """

    def __init__(
        self,
        *,
        experiment: str,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        enabled: bool = True,
        max_pending: int = 100_000,
        retry_interval_s: float = 5.0,
        asynchronous: bool = False,
        end_at_exit: bool = False,
        system_metrics: bool = False,
        tags: dict[str, str] | None = None,
        log_every: int | None = None,
    ) -> None:
        if not isinstance(experiment, str) or not experiment:
            raise ValueError(f"experiment must be a non-empty string, got {experiment!r}")
        check_int("max_pending", max_pending, 0)
        if not (isinstance(retry_interval_s, (int, float)) and retry_interval_s >= 0):
            raise ValueError(f"retry_interval_s must be a number >= 0, got {retry_interval_s!r}")
        for name, value in (
            ("asynchronous", asynchronous),
            ("end_at_exit", end_at_exit),
            ("system_metrics", system_metrics),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.experiment = experiment
        self.run_name = run_name
        mlflow = sys.modules.get(
            "mlflow"
        )  # the configured URI, without importing mlflow (None: its default)
        configured = (
            mlflow.get_tracking_uri() if mlflow else os.environ.get("MLFLOW_TRACKING_URI") or None
        )
        self._tracking_uri = str(tracking_uri) if tracking_uri else configured
        self.enabled = bool(enabled)
        self.retry_interval_s = float(retry_interval_s)
        self.end_at_exit = end_at_exit
        self.system_metrics = system_metrics
        self._monitor: Any = None  # MLflow's SystemMetricsMonitor, while the run is open
        self._step_metrics: tuple[int, dict[str, tuple]] = (-1, {})  # what the latest step logged
        self._cadence = LogCadence(log_every)
        self._held: dict[str, tuple] = {}  # metric -> its latest value not logged yet (cadence)
        self._step_due = False  # whether the cadence logs the latest step
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.start_error: TrackingError | StoreSchemaError | None = None
        self.final_status: str | None = None
        self.undelivered: dict[str, int] = {"metrics": 0, "params": 0, "artifacts": 0}
        self._resume_id = run_id
        self._tags = dict(tags or {})
        self._lock = threading.RLock()  # held by whoever makes requests (start, send, end)
        self._ended = False
        self._wanted_status: str | None = (
            None  # left for a start by an end() that gave up waiting for it
        )
        self._params: dict[str, str] = {}  # what the run holds (or will, once delivered)
        self._outbox = Outbox(max_pending)
        self._courier: Courier | None = None  # once started
        self._thread = (
            LogThread(
                self._outbox,
                courier=lambda: self._courier,
                start_run=self._start_in_thread,
                deliver=self._deliver,
            )
            if asynchronous
            else None
        )
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

    def start(self) -> str | None:
        """Create (or resume) the run, after one quick request to an ``http(s)`` store so that a
        dead server fails here; the run id (the same on every call; ``None`` when disabled).

        Raises:
            TrackingError: The store is unreachable or unusable, or ``run_id`` does not name an
                existing, non-deleted run.
            rl8.mlflow_store.StoreSchemaError: A newer MLflow than the installed one wrote the
                SQLite store.
        """
        if not self.enabled:
            return None
        with self._lock:
            if self.run_id is not None:
                return self.run_id
            if self._ended and self._start_done.is_set():  # not a background start end() let go
                raise TrackingError("this Tracker has ended; create a new one")
            uri = self.tracking_uri
            run = open_run(uri, self.experiment, self.run_name, self._resume_id, self._tags)
            with self._outbox.changed:
                self._params.update(run.params)
                self._courier = Courier(
                    run.client, run.run_id, uri, self.retry_interval_s, run.experiment_id
                )
                self.run_id, self.run_name, self.experiment_id = (
                    run.run_id,
                    run.run_name,
                    run.experiment_id,
                )
                wanted = self._wanted_status
            if self._start_done.is_set():  # a background start registered it already
                self._hook_exit()
            if wanted is not None:  # end() gave up waiting for this start
                self._ended = True  # one short attempt: that end() has returned already
                short = time.monotonic() + 2 * DEGRADED_TIMEOUT_S
                if self._courier.set_status(wanted, deadline=short, when=" once its start completed"):
                    self.final_status = wanted
            elif self._thread is not None:
                self._thread.launch(start_run=False)
            if self.system_metrics and wanted is None:
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                self._monitor = SystemMetricsMonitor(
                    self.run_id, resume_logging=self._resume_id is not None, tracking_uri=uri
                )
                self._monitor.start()
            return self.run_id

    def start_in_background(self) -> None:
        """:meth:`start` in the logging thread (``asynchronous`` only), queueing what is logged
        meanwhile; a failure disables the tracker and is raised by :meth:`check_start`."""
        if not self.enabled:
            return
        if self._thread is None:
            raise TrackingError("start_in_background() needs a Tracker made with asynchronous=True")
        check_file_store(self.tracking_uri)  # before training, not at its first request
        # MLflow's import makes thread pools, refused at shutdown: let a start at exit complete
        self._hook_exit()
        self._start_done.clear()
        self._thread.launch(start_run=True)

    def _start_in_thread(self) -> bool:
        try:
            self.start()
            return not self._ended
        except BaseException as exc:  # noqa: BLE001 - raised by check_start in the owner's thread
            if isinstance(exc, StoreSchemaError):  # what to install, whichever thread opened the store
                self.start_error = exc
            else:
                self.start_error = TrackingError(
                    f"the MLflow run (started in the background) could not be started: {exc}"
                )
                self.start_error.__cause__ = exc
            self.enabled = False
            self._outbox.clear()
            return False
        finally:
            self._start_done.set()

    def wait_started(self, timeout_s: float | None = None) -> bool:
        """Wait at most ``timeout_s`` seconds (``None``: no limit) for a background start; whether
        none is in progress any more."""
        return self._start_done.wait(timeout_s)

    def check_start(self, *, once: bool = False) -> None:
        """Raise the error of a failed background start; ``once``: unless raised before."""
        if self.start_error is None or not self._start_done.is_set():
            return
        if not (once and self._start_error_reported):
            self._start_error_reported = True
            raise self.start_error

    def end(self, status: str = "FINISHED", *, timeout_s: float | None = None) -> bool:
        """Deliver what is pending and close the run with ``status`` (idempotent); whether the
        run's status is now ``status`` in the store. Never raises on tracking failures (what is
        lost is in :attr:`undelivered` and a :class:`TrackingWarning`).

        Args:
            status: ``"FINISHED"``, ``"FAILED"`` (an exception stopped training) or ``"KILLED"``.
            timeout_s: Seconds this call may take at most, whatever the server does; ``None``:
                the usual HTTP policy.
        """
        status = str(status).upper()
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"status must be one of {TERMINAL_STATUSES}, got {status!r}")
        if not self.enabled:
            return False
        self._release_held()  # none are held once ended
        if self._exit_hook:
            atexit.unregister(self._end_at_exit)
            self._exit_hook = False
        deadline = math.inf if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        if self._thread is not None:
            self._thread.stop()  # from now on only end() sends
        if self._monitor is not None:  # its last request may hang: not waited for past the deadline
            stopper = threading.Thread(
                target=self._monitor.finish, name="rl8-system-metrics-stop", daemon=True
            )
            stopper.start()
            stopper.join(min(EXIT_CLOSE_TIMEOUT_S, max(0.0, deadline - time.monotonic())))
            self._monitor = None
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
            lost = self.undelivered = self._outbox.counts()
            if any(lost.values()):
                warnings.warn(
                    f"MLflow run {self.run_id} at {self.tracking_uri!r}: {lost['metrics']} "
                    f"metric values, {lost['params']} params and {lost['artifacts']} artifacts "
                    f"could not be delivered and are lost",
                    TrackingWarning,
                    stacklevel=2,
                )
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
            message = (
                f"the MLflow run at {self.tracking_uri!r} was still starting after "
                f"{timeout_s:g} s; it is marked {status} as soon as its start completes"
            )
        else:
            message = (
                f"could not set the status of MLflow run {self.run_id} at "
                f"{self.tracking_uri!r} to {status}: a request to the server did not finish "
                f"within {timeout_s:g} s; the run stays RUNNING (`rl8 runs --clean` marks "
                "such runs FAILED) and what was still queued is lost"
            )
        warnings.warn(message, TrackingWarning, stacklevel=3)

    def end_report(self, status: str) -> str:
        """What :meth:`end` with ``status`` achieved, as a clause for a message (``"; MLflow run
        ID ended as KILLED"``, or why not); empty without a run."""
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
        """The exit hook of ``end_at_exit``."""
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

    @property
    def pending(self) -> int:
        """Number of metric values waiting to be delivered (0 when all went through)."""
        return len(self._outbox.metrics)

    @property
    def pending_artifacts(self) -> int:
        """Number of artifact uploads waiting to be delivered."""
        return len(self._outbox.artifacts)

    def _check_started(self) -> None:
        if self.run_id is None and self._start_done.is_set():
            raise TrackingError("Tracker.start() must be called before logging")
        if self._ended:
            raise TrackingError(f"MLflow run {self.run_id} has ended; nothing more can be logged")

    def _queued(self, overflow: bool) -> None:
        """After adding to the outbox: send now, or leave it to the logging thread."""
        if overflow:
            warn_overflow(self._outbox, self.tracking_uri, stacklevel=4)
        if self._thread is None:
            self._deliver(force=False, stacklevel=5)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's configuration ``params``, a (possibly nested) mapping of names to values,
        as MLflow params (:func:`flatten_params`). A param logged again with another value is logged
        as ``"resumed/<key>"`` on a resumed run (once), else dropped with a :class:`TrackingWarning`."""
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
                            TrackingWarning,
                            stacklevel=2,
                        )
                    elif alt not in self._params:
                        new[alt] = value
            self._params.update(new)
        if new:
            self._queued(self._outbox.add(params=new))

    def log_metrics(self, metrics: Mapping[str, Any], step: int, *, always: bool = False) -> None:
        """Record the metrics of one step (values become ``float``; queued while the store cannot
        be reached; held back between the steps that the cadence, ``log_every``, logs).

        Args:
            metrics: ``{name: value}`` (Python or numpy numbers, one-element tensors).
            step: The x-axis value of this point (the Trainer uses ``env/steps``).
            always: ``True``: logged whatever ``log_every`` says (the Trainer's evaluations).
        """
        self.log_metrics_many([(metrics, step)], always=always)

    def log_metrics_many(
        self, items: Iterable[tuple[Mapping[str, Any], int]], *, always: bool = False
    ) -> None:
        """:meth:`log_metrics` of several steps with one delivery: ``items`` are ``(metrics, step)``
        pairs, oldest first; ``always`` as there."""
        if not self.enabled:
            return
        self._check_started()
        ms = int(time.time() * 1000)
        steps = [
            [(str(k), _to_float(k, v), ms, int(step)) for k, v in metrics.items()]
            for metrics, step in items
        ]
        overflow = False
        with self._outbox.changed:
            for values in filter(None, steps):
                step = values[0][3]
                if step != self._step_metrics[0]:  # a new step: log_model links its values
                    self._step_metrics = (step, {})
                    self._step_due = self._cadence.due(time.monotonic())
                for value in values:
                    self._step_metrics[1][value[0]] = self._held[value[0]] = value
                if always or self._step_due:
                    overflow = self._release_held() or overflow
        self._queued(overflow)

    def _release_held(self) -> bool:
        """Move the metric values held back by the cadence to the outbox (oldest step first);
        whether old values began to be dropped."""
        with self._outbox.changed:
            values = sorted(self._held.values(), key=lambda v: v[3])
            self._held = {}
            return bool(values) and self._outbox.add(metrics=values)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Try now to deliver everything queued (asynchronous: wait at most ``timeout_s`` seconds,
        ``None``: no limit); whether nothing waits any more. Never raises on tracking failures."""
        if not self.enabled:
            return True
        self._queued(self._release_held())
        if self._thread is None or not self._thread.alive():
            self._deliver(force=True)
        elif not self._thread.flush(timeout_s):
            return False
        return self._outbox.empty()

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a copy of one file to the run's artifacts (queued like metrics; a newer file for
        the same destination replaces a queued one). A missing file is a warning.

        Args:
            local_path: The file to upload.
            artifact_path: Folder inside the run's artifacts (``None``: the root).
        """
        self._upload("log_artifact", local_path, artifact_path)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        """Like :meth:`log_artifact` for every file (recursively) of the folder ``local_dir``."""
        self._upload("log_artifacts", local_dir, artifact_path)

    def log_model(
        self, local_dir: str | Path, name: str, step: int, *, replaces: Iterable[str] = ()
    ) -> None:
        """Log an MLflow model folder as an MLflow 3 logged model of the run (queued like
        artifacts): named ``name``, a run output at ``step``, with the run's params (those
        logged so far, as the run holds them) and the metrics this tracker logged at ``step``
        linked to it (so ``search_logged_models`` can filter and rank models by them).

        Args:
            local_dir: The model folder (with its ``MLmodel``).
            name: The model's name (the Trainer's: ``checkpoint-<env steps>``).
            step: The step the model belongs to (the Trainer's: ``env/steps``).
            replaces: Names of the run's logged models to delete once this one is READY
                (MLflow marks them deleted); one that a registered model version was made
                from (the tag ``mlflow.modelVersions``) is kept.
        """
        latest, values = self._step_metrics
        linked = list(values.values()) if latest == step else []
        if any(v[3] == step for v in self._held.values()):
            self._queued(self._release_held())  # the model's step is in the run's metrics
        with self._outbox.changed:
            params = dict(self._params)
        link = ModelLink(name, int(step), linked, params, tuple(replaces))
        self._upload("log_model", local_dir, None, link)

    def register_best(
        self, name: str, metric: str, *, mode: str = "max", alias: str = "best"
    ) -> tuple[str, float, int]:
        """Register the run's logged model with the best ``metric`` as a new version of the
        store's registered model ``name`` (created when missing), named by ``alias``, once what
        is queued is delivered; the version, the metric's value and the model's step (the
        Trainer's: ``env/steps`` of the checkpoint).

        Args:
            name: The registered model's name.
            metric: A metric linked to the logged models, e.g. ``"eval/episodes/return_mean"``.
            mode: ``"max"`` or ``"min"``: which value is best.
            alias: The alias that names the new version (``models:/NAME@ALIAS``).

        Raises:
            ValueError: A bad ``mode``, or no logged model of the run has ``metric``.
            TrackingError: Queued models could not be delivered, or the store refused a request.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        with self._registering(name) as client:
            found = client.search_logged_models(
                [self.experiment_id],
                filter_string=f"source_run_id = '{self.run_id}'",
                max_results=1,
                order_by=[{"field_name": f"metrics.{metric}", "ascending": mode == "min"}],
            )
            linked = {m.key: m for m in found[0].metrics or ()} if found else {}
            values = {key: m.value for key, m in linked.items()}
            if metric not in values:
                raise ValueError(
                    f"no logged model (checkpoint) of MLflow run {self.run_id} has the stat {metric!r}, so "
                    f"none can be registered as {name!r}; the best has {sorted(values)[:8] or 'no stats'}"
                    f"{' ...' if len(values) > 8 else ''} (an eval/ stat is linked to the checkpoints "
                    "written at evaluation steps)"
                )
            # the source by location: MLflow resolves a models:/ source in the default store
            version = self._new_version(
                client,
                name,
                found[0].artifact_location,
                model_id=found[0].model_id,
                description=f"{found[0].name} of run {self.run_id}: {metric} = {values[metric]:g} ({mode})",
                alias=alias,
            )
        return version, values[metric], int(linked[metric].step)

    def register_artifact(
        self, name: str, artifact_path: str, *, description: str, alias: str = "best"
    ) -> str:
        """Register the run's artifact folder ``artifact_path`` (an MLflow model folder, for a
        run without logged models) as a new version of the store's registered model ``name``
        (created when missing), named by ``alias``, once what is queued is delivered; the version.

        Args:
            name: The registered model's name.
            artifact_path: The folder inside the run's artifacts, e.g. ``"best_policy"``.
            description: The new version's description.
            alias: The alias that names the new version (``models:/NAME@ALIAS``).

        Raises:
            TrackingError: Queued artifacts could not be delivered, or the store refused a request.
        """
        with self._registering(name) as client:
            root = client.get_run(self.run_id).info.artifact_uri
            return self._new_version(
                client,
                name,
                f"{root}/{artifact_path}",
                model_id=None,
                description=description,
                alias=alias,
            )

    @contextlib.contextmanager
    def _registering(self, name: str) -> Iterator[Any]:
        """Once everything queued is delivered: an ``MlflowClient`` of the store and its Model
        Registry, under this tracker's lock; a failure of a request is a :class:`TrackingError`."""
        self._check_started()
        if not self.flush() or self._outbox.artifacts:
            raise TrackingError(
                f"MLflow run {self.run_id}: {len(self._outbox.artifacts)} logged models or "
                f"artifacts are not delivered to {self.tracking_uri!r} yet; nothing was registered"
            )
        from mlflow import MlflowClient

        client = MlflowClient(self.tracking_uri, registry_uri=self.tracking_uri)
        try:
            with self._lock, self._courier.policy()[1]:
                yield client
        except (ValueError, TrackingError):
            raise
        except Exception as exc:
            raise TrackingError(
                f"registering the best checkpoint of MLflow run {self.run_id} as {name!r} in "
                f"{self.tracking_uri!r} failed: {exc}"
            ) from exc

    def _new_version(
        self, client: Any, name: str, source: str, *, model_id: str | None, description: str, alias: str
    ) -> str:
        """Make ``source`` a new version of the registered model ``name`` (created when missing)
        named by ``alias``; the logged model ``model_id`` (``None``: none) gets it in its tag
        ``mlflow.modelVersions``, as MLflow's server and ``mlflow.register_model`` write it, so
        that it is never deleted as a replaced checkpoint."""
        if not client.search_registered_models(filter_string=f"name = '{name}'"):
            client.create_registered_model(name)
        version = str(
            client.create_model_version(
                name, source, run_id=self.run_id, model_id=model_id, description=description
            ).version
        )
        client.set_registered_model_alias(name, alias, version)
        if model_id is not None:
            listed = client.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG)
            versions = json.loads(listed) if listed else []
            if not any(v["name"] == name and str(v["version"]) == version for v in versions):
                versions.append({"name": name, "version": version})
                client.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(versions)})
        return version

    def _upload(
        self, method: str, local: str | Path, artifact_path: str | None, link: ModelLink | None = None
    ) -> None:
        if not self.enabled:
            return
        self._check_started()
        source = Path(local)
        is_file = method == "log_artifact"
        if not (source.is_file() if is_file else source.is_dir()):
            warnings.warn(
                f"could not log artifacts from {str(local)!r} to MLflow run {self.run_id} "
                f"at {self.tracking_uri!r}: no such {'file' if is_file else 'folder'}",
                TrackingWarning,
                stacklevel=3,
            )
            return
        try:
            self._outbox.stage(method, source, artifact_path, link)
        except OSError as exc:  # a full or unwritable temporary folder: tracking never fails training
            warnings.warn(
                f"could not log {str(local)!r} to MLflow run {self.run_id}: staging a copy in "
                f"the temporary folder {tempfile.gettempdir()} failed ({exc}); it is not uploaded",
                TrackingWarning,
                stacklevel=3,
            )
            return
        self._queued(False)

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else (self.run_id or "not started")
        return f"Tracker(experiment={self.experiment!r}, uri={self.tracking_uri!r}, run={state})"
