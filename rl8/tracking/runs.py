"""Runs left RUNNING by a process that died: :func:`running_runs` lists the RUNNING runs and
their process, :func:`clean_runs` marks those of dead processes FAILED (``rl8 runs``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from rl8.mlflow_http import bounded_requests
from rl8.processes import process_state
from rl8.tracking.common import TrackingError
from rl8.tracking.store import ready_store

__all__ = ["RunProcess", "clean_runs", "running_runs", "tag_run"]


@dataclasses.dataclass(frozen=True)
class RunProcess:
    """A ``RUNNING`` MLflow run and what is known about the process that owns it.

    Attributes:
        run_id: The MLflow run id.
        experiment: The name of its experiment.
        run_name: Its display name.
        host: Host name of its process (tag ``rl8.host``); ``None`` for runs not made by rl8.
        pid: That process's id (tag ``rl8.pid``); ``None`` when unknown.
        start_time_s: When the run started, in seconds since the epoch.
        process: ``"alive"``, ``"dead"`` (no process with that pid on this host) or ``"unknown"``.
    """

    run_id: str
    experiment: str
    run_name: str
    host: str | None
    pid: int | None
    start_time_s: float
    process: str


@contextlib.contextmanager
def _bounded(uri: str | None) -> Iterator[None]:
    """The block's requests bounded (:func:`bounded_requests`), their failure a ``TrackingError``."""
    try:
        with bounded_requests(uri):
            yield
    except TrackingError:
        raise
    except Exception as exc:  # MLflow raises several kinds
        raise TrackingError(
            f"cannot read the runs of {uri or 'MLflow default store'!r}: "
            f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}"
        ) from exc


def running_runs(tracking_uri: str | None = None, *, experiment: str | None = None) -> list[RunProcess]:
    """The ``RUNNING`` runs of the store ``tracking_uri`` (default: MLflow's), of ``experiment``
    only (``None``: of every one), oldest first, with the state of their process (see
    ``docs/cli.md``); a ``TrackingError`` for an experiment that does not exist."""
    import mlflow
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    ready_store(tracking_uri or mlflow.get_tracking_uri())
    with _bounded(tracking_uri):
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
                list(names),
                filter_string="attributes.status = 'RUNNING'",
                max_results=1000,
                page_token=token,
            )
            for run in page:
                host, pid_text = run.data.tags.get("rl8.host"), run.data.tags.get("rl8.pid", "")
                pid = int(pid_text) if pid_text.isdigit() else None
                info = run.info
                out.append(
                    RunProcess(
                        info.run_id,
                        names.get(info.experiment_id, info.experiment_id),
                        info.run_name or "",
                        host,
                        pid,
                        (info.start_time or 0) / 1000,
                        process_state(host, pid),
                    )
                )
            if not (token := page.token):
                break
    return sorted(out, key=lambda r: r.start_time_s)


def clean_runs(
    tracking_uri: str | None = None,
    *,
    experiment: str | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
) -> list[RunProcess]:
    """Mark ``FAILED`` (with the tag ``rl8.cleaned``) the ``RUNNING`` runs whose process is gone
    (see :func:`running_runs`); a run whose process is alive is never touched. Returns the runs
    cleaned (or that would be).

    Args:
        tracking_uri: The store (default: MLflow's).
        experiment: Only this experiment's runs; ``None``: every experiment.
        older_than_s: Also clean runs of unknown process started more than this many seconds
            ago; ``None``: only runs whose process is known dead.
        dry_run: Only return the runs that would be cleaned.
    """
    from mlflow.tracking import MlflowClient

    if older_than_s is not None and not (isinstance(older_than_s, (int, float)) and older_than_s >= 0):
        raise ValueError(f"older_than_s must be a number of seconds >= 0, got {older_than_s!r}")
    now = time.time()
    chosen = []
    for run in running_runs(tracking_uri, experiment=experiment):
        if run.process == "dead":
            chosen.append((run, f"process {run.pid} on {run.host} is gone"))
        elif (
            run.process == "unknown"
            and older_than_s is not None
            and now - run.start_time_s > older_than_s
        ):
            chosen.append((run, f"started {now - run.start_time_s:.0f} s ago, process unknown"))
    if not dry_run:
        client = MlflowClient(tracking_uri)
        with _bounded(tracking_uri):
            for run, reason in chosen:
                client.set_tag(run.run_id, "rl8.cleaned", reason)
                client.set_terminated(run.run_id, status="FAILED")
    return [run for run, _ in chosen]


def tag_run(
    tracking_uri: str, run_id: str, tags: dict[str, Any], *, end_if_running: str | None = None
) -> None:
    """Set ``tags`` (``{name: value}``, values as strings) on the run ``run_id`` of another process
    in the store ``tracking_uri`` (``rl8 sweep``'s trials); ``end_if_running``: first end it with
    this status (``"FAILED"``: its process died; ``"KILLED"``: it was interrupted) if it is still
    ``RUNNING``."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if end_if_running is not None and client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status=end_if_running)
    client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])
