"""What waits for the tracking store: the bounded queue (:class:`Outbox`), the :class:`Courier`
that delivers it and the logging thread of an asynchronous tracker (:class:`LogThread`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rl8.mlflow_http import LOG_BACKOFF, LOG_RETRIES, LOG_TIMEOUT_S, http_policy, is_http
from rl8.tracking.common import DEGRADED_TIMEOUT_S, TrackingWarning, logger

__all__: list[str] = []  # the Tracker's internals


#: The tag of a logged model naming the registered model versions made from it (MLflow's own:
#: ``mlflow.utils.mlflow_tags.MLFLOW_MODEL_VERSIONS``); a model that has it is never deleted.
MODEL_VERSIONS_TAG = "mlflow.modelVersions"


@dataclasses.dataclass
class ModelLink:
    """A logged model in the :class:`Outbox`: its step's metric values, the run's params it
    carries, the names of the run's logged models it replaces (deleted once it is READY) and
    how far its delivery got."""

    name: str
    step: int
    metrics: list[tuple[str, float, int, int]]
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    replaces: tuple[str, ...] = ()
    model_id: str | None = None
    done: int = 0


#: MLflow's limits (``mlflow.utils.validation``): metrics, params per ``log_batch`` request.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
#: HTTP policy while the server is known to be down (retrying the queue): one attempt.
_DEGRADED_RETRIES = 0
#: The logging thread of an asynchronous tracker sends metric values once the oldest waited this
#: many seconds (or a request's worth, MAX_METRICS_PER_BATCH, waits): several steps share one
#: request and the thread keeps up with a fast run. It delays what the cadence logs, never thins it.
_HOLD_S = 1.0
# MLflow error codes that mean "the store refused this request": retrying cannot help.
_REJECTED_CODES = frozenset(
    {
        "INVALID_PARAMETER_VALUE",
        "BAD_REQUEST",
        "RESOURCE_DOES_NOT_EXIST",
        "INVALID_STATE",
        "RESOURCE_ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
    }
)


class Outbox:
    """The one queue of a :class:`Tracker`, oldest first: params, metric values and staged
    artifact uploads (at most ``max_pending`` metric values); :attr:`changed` guards it and is
    notified on every addition."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.changed = threading.Condition()
        self.params: dict[str, str] = {}
        self.metrics: deque[tuple[str, float, int, int]] = deque()  # (key, value, ms, step)
        # uploads: key -> (MlflowClient method, staged copy, artifact path, ModelLink of a model)
        self.artifacts: dict[Any, tuple[str, Path, str | None, ModelLink | None]] = {}
        self.first_at = math.inf  # time.monotonic() when the oldest waiting metric value came
        self.dropped = 0  # metric values dropped since the last successful delivery
        self.overflowing = False
        self._staging: Path | None = None  # folder of the staged copies

    def empty(self) -> bool:
        return not (self.params or self.metrics or self.artifacts)

    def counts(self) -> dict[str, int]:
        """What waits (dropped metric values included), by kind."""
        with self.changed:
            return {
                "metrics": len(self.metrics) + self.dropped,
                "params": len(self.params),
                "artifacts": len(self.artifacts),
            }

    def add(self, *, params: Mapping[str, str] | None = None, metrics: Iterable[tuple] = ()) -> bool:
        """Queue params and metric values (``(key, value, ms, step)``); whether old metric values
        began to be dropped."""
        with self.changed:
            self.params.update(params or {})
            if not self.metrics:
                self.first_at = time.monotonic()
            self.metrics.extend(metrics)
            self.changed.notify_all()
            return self._trim()

    def stage(
        self, method: str, source: Path, artifact_path: str | None, link: ModelLink | None = None
    ) -> None:
        """Queue a copy of ``source`` (file or folder, as ``method``; ``"log_model"``: a folder
        logged as the model ``link``): the caller may delete it."""
        with self.changed:
            if self._staging is None:
                self._staging = Path(tempfile.mkdtemp(prefix="rl8-artifacts-"))
            staged = Path(tempfile.mkdtemp(dir=self._staging)) / source.name
        is_file = method == "log_artifact"
        try:
            (shutil.copyfile if is_file else shutil.copytree)(source, staged)
        except OSError:  # e.g. a full disk: no partial copy is left
            shutil.rmtree(staged.parent, ignore_errors=True)
            raise
        # a file replaces a waiting one of the same destination; MLflow merges folders: all kept
        key = (artifact_path, source.name) if is_file else staged
        with self.changed:
            replaced = self.artifacts.pop(key, None)
            self.artifacts[key] = (method, staged, artifact_path, link)
            self.changed.notify_all()
        if replaced is not None:
            shutil.rmtree(replaced[1].parent, ignore_errors=True)

    def take(self, name: str, n: int) -> list:
        """Remove and return the oldest ``n`` entries of ``name`` (an attribute of this box); metric
        values of one step are not parted (fewer are taken then), unless the step has more than ``n``."""
        with self.changed:
            if name == "metrics":
                chunk = [self.metrics.popleft() for _ in range(min(n, len(self.metrics)))]
                cut = _step_start(chunk) if self.metrics and self.metrics[0][3] == chunk[-1][3] else 0
                if cut:  # the last step goes on past the chunk: it waits for the next one
                    self.metrics.extendleft(reversed(chunk[cut:]))
                    del chunk[cut:]
                return chunk
            box = getattr(self, name)
            return [(key, box.pop(key)) for key in list(itertools.islice(box, n))]

    def put_back(self, name: str, chunk: list) -> bool:
        """Return a chunk taken by :meth:`take` to the front (a newer artifact of the same
        destination wins); whether old metric values began to be dropped."""
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


def _step_start(values: list[tuple[str, float, int, int]]) -> int:
    """The index of the first of the metric values (oldest first) of the last one's step."""
    start = len(values)
    while start > 0 and values[start - 1][3] == values[-1][3]:
        start -= 1
    return start


def warn_overflow(outbox: Outbox, uri: str, stacklevel: int) -> None:
    warnings.warn(
        f"more than {outbox.max_pending} metric values are waiting for the MLflow tracking "
        f"store at {uri!r}; the oldest are being dropped",
        TrackingWarning,
        stacklevel=stacklevel,
    )


class Courier:
    """Sends an :class:`Outbox` to one run: quick retries while the store answers; after a
    failure (one warning per outage) one short attempt per ``retry_interval_s``, doubling up to
    ``max(60, retry_interval_s)`` s."""

    def __init__(
        self, client: Any, run_id: str, uri: str, retry_interval_s: float, experiment_id: str = ""
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.uri = uri
        self.http = is_http(uri)
        self.retry_interval_s = retry_interval_s
        self.degraded = False  # True from a failed delivery until the queue is empty again
        self.last_attempt = -math.inf  # time.monotonic() at the end of the last failed attempt
        self.interval_s = retry_interval_s  # current wait between attempts (backs off)

    def due_in(self) -> float:
        """Seconds until the next attempt is due (0 while healthy)."""
        if not self.degraded:
            return 0.0
        return max(0.0, self.last_attempt + self.interval_s - time.monotonic())

    def policy(
        self, deadline: float = math.inf, requests: int = 1
    ) -> tuple[int, AbstractContextManager]:
        """The seconds per request (0 without HTTP) and the :func:`http_policy` of the next
        requests: before a ``deadline``, one attempt each, short enough that ``requests`` of them
        end in time (at least 1 s)."""
        if deadline < math.inf:
            left = deadline - time.monotonic()
            timeout_s = int(min(DEGRADED_TIMEOUT_S, max(1.0, left / (2 * requests))))
            args = (_DEGRADED_RETRIES, 0, timeout_s, True)
        elif self.degraded:
            args = (_DEGRADED_RETRIES, 0, DEGRADED_TIMEOUT_S, True)
        else:
            args = (LOG_RETRIES, LOG_BACKOFF, LOG_TIMEOUT_S, False)
        return (args[2] if self.http else 0), http_policy(self.http, *args, deadline=deadline)

    def deliver(
        self, outbox: Outbox, *, force: bool, deadline: float = math.inf, stacklevel: int = 3
    ) -> None:
        """Send params, metrics (oldest first), artifacts until the first failure; unless
        ``force``, only when due. Before a ``deadline``, each request gets at most half the
        time left (the rest is for the run's status)."""
        if outbox.empty() or (not force and self.due_in() > 0):
            return
        from mlflow.entities import Metric, Param

        was_degraded = self.degraded
        timeout_s, policy = self.policy(deadline, requests=2)

        def send_all(name: str, n: int, send: Any) -> int:
            sent = 0
            while chunk := outbox.take(name, n):
                try:
                    if time.monotonic() + timeout_s > deadline - timeout_s:
                        raise TimeoutError("no time left before the deadline")
                    send(chunk)
                except BaseException:
                    if outbox.put_back(name, chunk):
                        warn_overflow(outbox, self.uri, stacklevel)
                    raise
                sent += len(chunk)
            return sent

        try:
            with policy:
                send_all(
                    "params",
                    MAX_PARAMS_PER_BATCH,
                    lambda chunk: self._send_batch("params", [Param(k, v) for k, v in chunk]),
                )
                delivered = send_all(
                    "metrics",
                    MAX_METRICS_PER_BATCH,
                    lambda chunk: self._send_batch("metrics", [Metric(*m) for m in chunk]),
                )
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
                TrackingWarning,
                stacklevel=stacklevel,
            )
            return
        self.degraded = False
        outbox.overflowing = False
        if was_degraded:
            dropped = f" ({outbox.dropped} were dropped)" if outbox.dropped else ""
            logger.warning(
                "MLflow tracking store at %r is reachable again: delivered %d pending metric values%s",
                self.uri,
                delivered,
                dropped,
            )
            outbox.dropped = 0

    def _send_artifact(
        self, method: str, staged: Path, artifact_path: str | None, link: ModelLink | None
    ) -> None:
        """One upload (then its staged copy is removed)."""
        if link is None:
            self._send(
                lambda: getattr(self.client, method)(self.run_id, str(staged), artifact_path),
                f"the artifact {staged.name!r}",
            )
        else:
            self._send(lambda: self._send_model(staged, link), f"the artifact {staged.name!r}")
        shutil.rmtree(staged.parent, ignore_errors=True)

    def _send_model(self, folder: Path, link: ModelLink) -> None:
        """Create the logged model of ``link`` (MLflow 3) from ``folder`` with the run's params,
        a run output at its step with its step's metrics, mark it READY, then delete the models
        it replaces; a retry goes on from the failed request."""
        from mlflow.entities import LoggedModelOutput, Metric

        client = self.client

        def create() -> None:
            link.model_id = client.create_logged_model(
                self.experiment_id,
                name=link.name,
                source_run_id=self.run_id,
                tags={"rl8.env_steps": str(link.step)},
                params=link.params,
            ).model_id

        requests = (
            create,
            lambda: client.log_model_artifacts(link.model_id, str(folder)),
            lambda: client.log_outputs(self.run_id, [LoggedModelOutput(link.model_id, link.step)]),
            lambda: client.log_batch(
                self.run_id,
                metrics=[Metric(*m, model_id=link.model_id) for m in link.metrics],
                synchronous=True,
            ),
            lambda: client.finalize_logged_model(link.model_id, "READY"),
            lambda: self._delete_models(link.replaces),
        )
        for request in requests[link.done :]:
            request()
            link.done += 1

    def _delete_models(self, names: tuple[str, ...]) -> None:
        """Delete the run's logged models named ``names`` (MLflow marks them deleted; ``mlflow
        gc`` removes their files), except those a registered model version was made from."""
        if not names:
            return
        found, token = [], None
        while True:
            page = self.client.search_logged_models(
                [self.experiment_id], filter_string=f"source_run_id = '{self.run_id}'", page_token=token
            )
            found.extend(page)
            token = page.token
            if not token:
                break
        for model in found:
            if model.name in names and MODEL_VERSIONS_TAG not in (model.tags or {}):
                self.client.delete_logged_model(model.model_id)

    def _send_batch(self, what: str, entries: list) -> None:
        """One ``log_batch`` request of ``entries``, ``what`` (``"params"`` or ``"metrics"``)."""
        names = sorted({e.key for e in entries})
        self._send(
            lambda: self.client.log_batch(self.run_id, synchronous=True, **{what: entries}),
            f"{len(entries)} {what} ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})",
        )

    def _send(self, request: Callable[[], Any], what: str) -> None:
        """Make one ``request``; one the store refuses (it answered: retrying cannot help) is
        dropped with a warning naming ``what`` it sent."""
        try:
            request()
        except Exception as exc:
            if getattr(exc, "error_code", None) not in _REJECTED_CODES:
                raise
            warnings.warn(
                f"MLflow rejected {what} for run {self.run_id}: {exc}", TrackingWarning, stacklevel=6
            )

    def set_status(self, status: str, *, deadline: float = math.inf, when: str = "") -> bool:
        """Mark the run ``status`` (not past ``deadline``); whether it was set (else a warning)."""
        try:
            if time.monotonic() >= deadline:
                raise TimeoutError("no time was left for it")
            with self.policy(deadline, requests=1)[1]:
                self.client.set_terminated(self.run_id, status=status)
            return True
        except Exception as exc:
            warnings.warn(
                f"could not set the status of MLflow run {self.run_id} at {self.uri!r} "
                f"to {status}{when}: {exc}",
                TrackingWarning,
                stacklevel=4,
            )
            return False


class LogThread:
    """The ``rl8-mlflow-logger`` thread of an asynchronous :class:`Tracker`: ``start_run()`` if asked
    (``False``: no run), then ``deliver(force=...)`` once ``outbox`` holds params, artifacts,
    a full request of metric values (:data:`MAX_METRICS_PER_BATCH`) or one older than
    :data:`_HOLD_S`, or on :meth:`flush` (while ``courier()``, ``None`` before the run started, is
    degraded: when due)."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        courier: Callable[[], Courier | None],
        start_run: Callable[[], bool],
        deliver: Callable[..., Any],
    ) -> None:
        self.outbox = outbox
        self.courier, self.start_run, self.deliver = courier, start_run, deliver
        self.stopping = False
        self.flush_wanted = 0  # flush requests made; guarded by outbox.changed
        self.flushed = 0  # flush requests done
        self.finished = False  # the thread has ended (or is ending)
        self._thread: threading.Thread | None = None

    def launch(self, *, start_run: bool) -> None:
        """Start the thread (once); with ``start_run``, its first job is starting the run."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, args=(start_run,), name="rl8-mlflow-logger", daemon=True
            )
            self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and not self.finished

    def flush(self, timeout_s: float | None) -> bool:
        """Have everything queued so far tried once; False when ``timeout_s`` passed first."""
        with self.outbox.changed:
            self.flush_wanted += 1
            wanted = self.flush_wanted
            self.outbox.changed.notify_all()
            return self.outbox.changed.wait_for(
                lambda: self.flushed >= wanted or not self.alive(), timeout_s
            )

    def stop(self) -> None:
        """No more deliveries: the thread ends after its current request."""
        with self.outbox.changed:
            self.stopping = True
            self.outbox.changed.notify_all()

    def _wait_s(self) -> float | None:
        """Seconds until the next delivery is due (<= 0: now; ``None``: not before news)."""
        if self.flush_wanted > self.flushed:
            return 0.0
        outbox = self.outbox
        if outbox.empty():
            return None
        courier = self.courier()
        if courier is not None and courier.degraded:
            return courier.due_in()
        if outbox.params or outbox.artifacts or len(outbox.metrics) >= MAX_METRICS_PER_BATCH:
            return 0.0
        return outbox.first_at + _HOLD_S - time.monotonic()

    def _loop(self, start_run: bool) -> None:
        changed = self.outbox.changed
        try:
            if start_run and not self.start_run():
                return
            while True:
                with changed:
                    while not self.stopping and not ((wait := self._wait_s()) is not None and wait <= 0):
                        changed.wait(wait)
                    if self.stopping:
                        return
                    wanted = self.flush_wanted
                self.deliver(force=wanted > self.flushed, stacklevel=4)
                with changed:
                    self.flushed = wanted
                    changed.notify_all()
        finally:
            with changed:
                self.finished = True
                changed.notify_all()  # flush() waits no longer
