"""Tests of rl8.tracking.tracker: runs, batched metrics, params, resume, statuses, outages.

Most tests use the temporary SQLite store that ``conftest.mlflow_uri`` sets up; the
``live_server`` tests start a real ``mlflow server`` subprocess on a free local port.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
import urllib.request
import warnings
from fractions import Fraction
from pathlib import Path

import hparams
import mlflow
import numpy as np
import pytest
import torch
from launch import free_port, rl8_env
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import rl8
from rl8 import PPO, Trainer, load_policy
from rl8.cli import main
from rl8.envs import CartPole
from rl8.mlflow_store import StoreSchemaError, check_store_schema
from rl8.tracking import Tracker, TrackingError, TrackingWarning, flatten_params, running_runs
from rl8.tracking.cadence import INTERVAL_S, YOUNG_S, YOUNG_STEPS, LogCadence
from rl8.tracking.runs import tag_run
from rl8.tracking.store import ready_store
from rl8.training.conditions import HitsUpperBound

pytestmark = pytest.mark.usefixtures("migrated_store")

SMALL = {**hparams.SMALL, "num_envs": 4, "sgd_minibatch_size": 16}

# --------------------------------------------------------------------------------------------
# helpers


class _Policy:
    class Inner:
        pass


def _act(x):
    return x


def _spy_log_batch(monkeypatch):
    """Record every MlflowClient.log_batch call (metrics, params) and pass it through."""
    calls = []
    real = MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), *args, **kwargs):
        calls.append({"metrics": list(metrics), "params": list(params), "tags": list(tags)})
        return real(self, run_id, metrics, params, tags, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    return calls


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


class _Server:
    """An ``mlflow server`` subprocess in its own process group (so all its workers die)."""

    def __init__(self, tmp: Path, port: int, template_db: Path):
        self.tmp, self.port = tmp, port
        shutil.copy(template_db, tmp / "srv.db")
        self.uri = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no job runner: starts in ~5 s
        cmd = [
            sys.executable, "-m", "mlflow", "server",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.tmp / 'srv.db'}",
            "--artifacts-destination", str(self.tmp / "art"), "--serve-artifacts",
        ]  # fmt: skip
        self.log = open(self.tmp / "server.log", "ab")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            time.sleep(0.2)
        self.stop()
        log = (self.tmp / "server.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"mlflow server did not answer on {self.uri} within {timeout_s} s:\n{log}")

    def pause(self) -> None:
        """SIGSTOP the server: it accepts connections (the kernel does) but never answers."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill the server's process group (SIGKILL: like a crash) and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        self.log.close()


@pytest.fixture
def live_server(tmp_path, template_db):
    server = _Server(tmp_path, free_port(), template_db)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------
# flatten_params


def test_flatten_params_nested_keys_and_string_values():
    flat = flatten_params(
        {
            "hparams": {"lr": 3e-4, "sched": {"kind": "linear"}},
            "model": _Policy.Inner,
            "act": _act,
            "builtin": float,
            "sizes": [64, 64],
            "names": ("a", float),
            "none": None,
            "long": "x" * 7000,
        }
    )
    assert flat == {
        "hparams/lr": "0.0003",
        "hparams/sched/kind": "linear",
        "model": f"{__name__}._Policy.Inner",
        "act": f"{__name__}._act",
        "builtin": "float",
        "sizes": "[64, 64]",
        "names": "('a', float)",
        "none": "None",
        "long": "x" * 6000,
    }
    assert flatten_params({"lr": 1}, prefix="hparams") == {"hparams/lr": "1"}


# --------------------------------------------------------------------------------------------
# runs in the local store


def test_start_creates_experiment_and_run_with_tags(mlflow_uri):
    tracker = Tracker(experiment="exp-a", run_name="first")
    assert tracker.tracking_uri == mlflow_uri
    run_id = tracker.start()
    assert tracker.run_id == run_id and tracker.start() == run_id  # second start: same run

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("exp-a")
    run = client.get_run(run_id)
    assert run.info.experiment_id == exp.experiment_id
    assert run.info.status == "RUNNING"
    assert run.data.tags["mlflow.runName"] == "first"
    assert run.data.tags["rl8.version"] == rl8.__version__
    assert run.data.tags["mlflow.source.name"]
    tracker.end()
    assert client.get_run(run_id).info.status == "FINISHED"

    # a second run reuses the experiment
    with Tracker(experiment="exp-a") as second:
        assert client.get_run(second.run_id).info.experiment_id == exp.experiment_id
        assert second.run_name  # MLflow picked one


def test_default_store_is_mlflow_db_in_cwd(tmp_path, monkeypatch):
    mlflow.set_tracking_uri(None)  # also unsets MLFLOW_TRACKING_URI (monkeypatch restores it)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker(experiment="default")
    db = tmp_path / "mlflow.db"  # the working directory of the test
    assert Path(tracker.tracking_uri.removeprefix("sqlite:///")).resolve() == db.resolve()
    with tracker:
        pass
    assert MlflowClient(f"sqlite:///{db}").get_run(tracker.run_id).info.status == "FINISHED"


def test_experiment_created_concurrently_is_reused(mlflow_uri, monkeypatch):
    MlflowClient(mlflow_uri).create_experiment("race")
    real = MlflowClient.get_experiment_by_name
    answers = iter([None])  # the first lookup misses: someone creates it just after

    def lookup(self, name):
        return next(answers, None) or real(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lookup)
    with Tracker(experiment="race") as tracker:
        exp = MlflowClient(mlflow_uri).get_experiment_by_name("race")
        assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.experiment_id == (exp.experiment_id)


def test_log_metrics_is_one_log_batch_per_step(mlflow_uri, monkeypatch):
    calls = _spy_log_batch(monkeypatch)
    with Tracker(experiment="metrics") as tracker:
        calls.clear()  # start() may tag the run through log_batch
        for step in (0, 100, 200):
            tracker.log_metrics({f"m/{i}": step + i for i in range(40)}, step=step)
        run_id = tracker.run_id
    assert len(calls) == 3
    assert all(len(c["metrics"]) == 40 for c in calls)
    client = MlflowClient(mlflow_uri)
    assert _history(client, run_id, "m/7") == [(0, 7.0), (100, 107.0), (200, 207.0)]


def test_log_metrics_chunks_at_mlflow_limit(monkeypatch):
    calls = _spy_log_batch(monkeypatch)
    with Tracker(experiment="chunks") as tracker:
        calls.clear()
        tracker.log_metrics({f"k{i}": i for i in range(2500)}, step=1)
    assert [len(c["metrics"]) for c in calls] == [1000, 1000, 500]


def test_metric_values_are_converted_to_float(mlflow_uri):
    with Tracker(experiment="values") as tracker:
        tracker.log_metrics(
            {
                "tensor": torch.tensor(1.5),
                "tensor1": torch.tensor([2.5]),
                "np": np.float32(0.25),
                "int": 3,
                "bool": True,
                "nan": float("nan"),
            },
            step=np.int64(7),
        )
        with pytest.raises(TypeError, match="'vec'"):
            tracker.log_metrics({"vec": torch.ones(3)}, step=8)
        run = MlflowClient(mlflow_uri).get_run(tracker.run_id)
    assert {k: v for k, v in run.data.metrics.items() if k != "nan"} == {
        "tensor": 1.5, "tensor1": 2.5, "np": 0.25, "int": 3.0, "bool": 1.0,
    }  # fmt: skip
    assert math.isnan(run.data.metrics["nan"])


def test_log_params_flattened_truncated_and_batched(mlflow_uri, monkeypatch):
    calls = _spy_log_batch(monkeypatch)
    with Tracker(experiment="params") as tracker:
        calls.clear()
        tracker.log_params({"hparams": {"lr": 3e-4, "model": _Policy}, "long": "y" * 9000})
        tracker.log_params({f"p{i}": i for i in range(250)})
        tracker.log_params({"hparams": {"lr": 3e-4}})  # same value again: no request, no error
        run = MlflowClient(mlflow_uri).get_run(tracker.run_id)
    assert [len(c["params"]) for c in calls] == [3, 100, 100, 50]
    assert run.data.params["hparams/lr"] == "0.0003"
    assert run.data.params["hparams/model"] == f"{__name__}._Policy"
    assert run.data.params["long"] == "y" * 6000
    assert run.data.params["p249"] == "249"


def test_changed_param_on_new_run_warns_and_is_not_logged(mlflow_uri):
    with Tracker(experiment="params") as tracker:
        tracker.log_params({"lr": 1})
        with pytest.warns(TrackingWarning, match="'lr' is already '1'"):
            tracker.log_params({"lr": 2})
        assert MlflowClient(mlflow_uri).get_run(tracker.run_id).data.params == {"lr": "1"}


def test_resume_continues_the_same_run(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    with Tracker(experiment="resume", run_name="r") as first:
        first.log_params({"hparams": {"lr": 1e-3, "gamma": 0.99}})
        for step in range(3):
            first.log_metrics({"loss": float(step)}, step=step * 10)
        run_id = first.run_id
    assert client.get_run(run_id).info.status == "FINISHED"

    second = Tracker(experiment="resume", run_id=run_id)
    assert second.start() == run_id
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.tags["mlflow.runName"] == "r"
    # same value: skipped silently; changed value: logged under resumed/
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second.log_params({"hparams": {"lr": 1e-4, "gamma": 0.99}})
    for step in range(3, 6):
        second.log_metrics({"loss": float(step)}, step=step * 10)
    second.end()

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["hparams/lr"] == "0.001"
    assert run.data.params["resumed/hparams/lr"] == "0.0001"
    assert _history(client, run_id, "loss") == [(s * 10, float(s)) for s in range(6)]
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_resume_unknown_run_is_a_clear_error():
    with pytest.raises(TrackingError, match="deadbeef.*does not exist"):
        Tracker(experiment="x", run_id="deadbeef" * 4).start()


@pytest.mark.parametrize("status", ["FINISHED", "FAILED", "KILLED"])
def test_end_sets_status_once(mlflow_uri, status):
    tracker = Tracker(experiment="status")
    tracker.start()
    tracker.end(status)
    tracker.end("FINISHED")  # idempotent: the first status stays
    assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.status == status
    with pytest.raises(TrackingError, match="ended"):
        tracker.log_metrics({"a": 1}, step=0)


@pytest.mark.parametrize("end_if_running", [None, "FAILED", "KILLED"])
def test_tag_run_tags_another_process_run_and_ends_it_if_still_running(mlflow_uri, end_if_running):
    """rl8 sweep's trials: a run left RUNNING by its process ends with the status given (FAILED:
    the process died; KILLED: interrupted); a run that had ended keeps its status."""
    running, ended = Tracker(experiment="tags"), Tracker(experiment="tags")
    running.start()
    ended.start()
    ended.end("FINISHED")
    client = MlflowClient(mlflow_uri)
    for tracker, status in ((running, end_if_running or "RUNNING"), (ended, "FINISHED")):
        tag_run(mlflow_uri, tracker.run_id, {"rl8.sweep.trial": 3}, end_if_running=end_if_running)
        run = client.get_run(tracker.run_id)
        assert (run.info.status, run.data.tags["rl8.sweep.trial"]) == (status, "3")
    running.end("FINISHED")  # its own thread and exit hook


def test_end_rejects_unknown_status():
    with pytest.raises(ValueError, match="status"):
        Tracker(experiment="status").end("DONE")


def test_log_before_start_is_an_error():
    with pytest.raises(TrackingError, match="start"):
        Tracker(experiment="x").log_metrics({"a": 1.0}, step=0)


@pytest.mark.parametrize("name", ["asynchronous", "end_at_exit"])
def test_switches_must_be_booleans(name):
    with pytest.raises(ValueError, match=f"^{name} must be True or False, got 'yes'$"):
        Tracker(experiment="x", **{name: "yes"})


def test_a_background_start_needs_an_asynchronous_tracker():
    with pytest.raises(
        TrackingError, match=r"start_in_background\(\) needs a Tracker made with asynchronous=True"
    ):
        Tracker(experiment="x").start_in_background()


@pytest.mark.parametrize(("exc", "status"), [(ValueError, "FAILED"), (KeyboardInterrupt, "KILLED")])
def test_context_manager_marks_failed_and_killed_runs(mlflow_uri, exc, status):
    with pytest.raises(exc):
        with Tracker(experiment="ctx") as tracker:
            tracker.log_metrics({"a": 1.0}, step=0)
            raise exc("boom")
    assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.status == status


def test_disabled_tracker_does_nothing(tmp_path, monkeypatch):
    (tmp_path / "mlflow.db").unlink()
    created = []
    monkeypatch.setattr(MlflowClient, "__init__", lambda *a, **k: created.append(a))
    tracker = Tracker(experiment="off", enabled=False)
    with tracker:
        assert tracker.start() is None and tracker.run_id is None
        tracker.log_params({"a": {"b": 1}})
        tracker.log_metrics({"x": 1.0}, step=0)
        tracker.log_artifact(tmp_path / "missing.txt")
        tracker.log_artifacts(tmp_path)
        tracker.flush()
    tracker.end("FAILED")
    assert created == [] and tracker.run_id is None
    assert not (tmp_path / "mlflow.db").exists()


def test_independent_of_the_fluent_active_run(mlflow_uri):
    with mlflow.start_run() as user_run:
        with Tracker(experiment="mine") as tracker:
            tracker.log_metrics({"x": 1.0}, step=0)
        assert mlflow.active_run().info.run_id == user_run.info.run_id
    client = MlflowClient(mlflow_uri)
    assert tracker.run_id != user_run.info.run_id
    assert client.get_run(user_run.info.run_id).data.metrics == {}
    assert client.get_run(tracker.run_id).data.metrics == {"x": 1.0}


def test_artifacts_are_uploaded_and_failures_only_warn(tmp_path, mlflow_uri):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "a.pt").write_bytes(b"a")
    (tmp_path / "notes.txt").write_text("hello")
    with Tracker(experiment="art") as tracker:
        tracker.log_artifact(tmp_path / "notes.txt")
        tracker.log_artifacts(tmp_path / "ckpt", artifact_path="checkpoints")
        with pytest.warns(TrackingWarning, match="missing.txt"):
            tracker.log_artifact(tmp_path / "missing.txt")
    client = MlflowClient(mlflow_uri)
    assert {f.path for f in client.list_artifacts(tracker.run_id)} == {"checkpoints", "notes.txt"}
    assert [f.path for f in client.list_artifacts(tracker.run_id, "checkpoints")] == ["checkpoints/a.pt"]


# --------------------------------------------------------------------------------------------
# outages, simulated: log_batch raises as it does when the server is down


def _break_log_batch(monkeypatch):
    """Make log_batch fail like an unreachable server until ``state['down']`` is False."""
    state = {"down": True, "calls": 0}
    real = MlflowClient.log_batch

    def flaky(self, *args, **kwargs):
        state["calls"] += 1
        if state["down"]:
            raise MlflowException("API request to http://x failed with exception refused")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    return state


def test_outage_queues_metrics_warns_once_and_redelivers_in_order(mlflow_uri, monkeypatch, caplog):
    with Tracker(experiment="outage", retry_interval_s=0) as tracker:
        tracker.log_params({"lr": 1})
        tracker.log_metrics({"a": 0.0}, step=0)
        state = _break_log_batch(monkeypatch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(1, 6):
                tracker.log_metrics({"a": float(step), "b": -float(step)}, step=step)
            tracker.log_params({"gamma": 0.9})
        messages = [str(w.message) for w in caught if w.category is TrackingWarning]
        assert len(messages) == 1, messages
        assert "failed" in messages[0] and "retried" in messages[0]
        assert tracker.pending == 10

        state["down"] = False
        with caplog.at_level(logging.WARNING, logger="rl8.tracking.tracker"):
            tracker.log_metrics({"a": 6.0}, step=6)
        assert "delivered 11 pending metric values" in caplog.text
        assert tracker.pending == 0
    client = MlflowClient(mlflow_uri)
    assert _history(client, tracker.run_id, "a") == [(s, float(s)) for s in range(7)]
    assert _history(client, tracker.run_id, "b") == [(s, -float(s)) for s in range(1, 6)]
    assert client.get_run(tracker.run_id).data.params == {"lr": "1", "gamma": "0.9"}


def test_outage_retries_at_most_every_interval_and_flush_forces(monkeypatch):
    with Tracker(experiment="interval", retry_interval_s=3600) as tracker:
        state = _break_log_batch(monkeypatch)
        with pytest.warns(TrackingWarning):
            tracker.log_metrics({"a": 0.0}, step=0)
        assert state["calls"] == 1
        for step in range(1, 4):
            tracker.log_metrics({"a": 1.0}, step=step)
        assert state["calls"] == 1 and tracker.pending == 4  # queued without requests
        tracker.flush()
        assert state["calls"] == 2 and tracker.pending == 4
        state["down"] = False
        tracker.flush()
        assert tracker.pending == 0


def test_retry_interval_doubles_while_the_server_stays_down(monkeypatch):
    clock = {"t": 1000.0}
    monkeypatch.setattr("rl8.tracking.tracker.time.monotonic", lambda: clock["t"])
    with Tracker(experiment="backoff", retry_interval_s=1) as tracker:
        state = _break_log_batch(monkeypatch)
        attempts = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrackingWarning)
            for t in range(16):  # one step per second
                clock["t"] = 1000.0 + t
                before = state["calls"]
                tracker.log_metrics({"a": 1.0}, step=t)
                if state["calls"] > before:
                    attempts.append(t)
            assert attempts == [0, 1, 3, 7, 15]  # waits of 1, 2, 4, 8 s
            state["down"] = False
            tracker.flush()
        assert tracker.pending == 0


def test_queue_is_bounded_and_lost_metrics_are_reported_at_end(mlflow_uri, monkeypatch):
    tracker = Tracker(experiment="bounded", max_pending=5, retry_interval_s=0)
    tracker.start()
    _break_log_batch(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            tracker.log_metrics({"a": 1.0, "b": 2.0}, step=step)
        assert tracker.pending == 5
        tracker.end()  # still down: warns with the count, does not raise
    messages = [str(w.message) for w in caught if w.category is TrackingWarning]
    assert len(messages) == 3, messages  # failure, overflow, loss at the end
    assert "oldest are being dropped" in messages[1]
    assert "8 metric values" in messages[2] and "lost" in messages[2]
    assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.status == "FINISHED"


# --------------------------------------------------------------------------------------------
# a real tracking server


def test_unreachable_server_fails_fast_at_start():
    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match=uri.replace(".", r"\.")):
        Tracker(experiment="x", tracking_uri=uri).start()
    assert time.monotonic() - t0 < 15
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # restored


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_live_server_logs_survives_a_restart_and_redelivers(live_server, tmp_path, caplog):
    uri = live_server.uri
    (tmp_path / "config.yaml").write_text("lr: 0.001\n")
    client = MlflowClient(uri)
    tracker = Tracker(experiment="live", tracking_uri=uri, run_name="srv", retry_interval_s=0)
    try:
        tracker.start()
        tracker.log_params({"hparams": {"lr": 1e-3}})
        tracker.log_artifact(tmp_path / "config.yaml")
        for step in range(3):
            tracker.log_metrics({"loss": float(step), "env/steps": step * 8}, step=step * 8)
        assert _history(client, tracker.run_id, "loss") == [(s * 8, float(s)) for s in range(3)]
        run = client.get_run(tracker.run_id)
        assert run.data.params == {"hparams/lr": "0.001"}
        assert run.info.status == "RUNNING"
        assert [f.path for f in client.list_artifacts(tracker.run_id)] == ["config.yaml"]

        live_server.stop()  # the server dies mid-run
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(3, 6):
                tracker.log_metrics({"loss": float(step), "env/steps": step * 8}, step=step * 8)
        assert time.monotonic() - t0 < 15  # training is not stalled by HTTP retries
        assert len([w for w in caught if w.category is TrackingWarning]) == 1
        assert tracker.pending == 6

        live_server.start()  # back, same port and database
        with caplog.at_level(logging.WARNING, logger="rl8.tracking.tracker"):
            tracker.flush()
        assert tracker.pending == 0
        assert "delivered 6 pending metric values" in caplog.text
        tracker.log_metrics({"loss": 6.0}, step=48)
        tracker.end()
        assert _history(client, tracker.run_id, "loss") == [(s * 8, float(s)) for s in range(7)]
        assert client.get_run(tracker.run_id).info.status == "FINISHED"
    finally:
        tracker.end("FAILED")  # no-op when ended above


def test_log_metrics_many_sends_several_steps_in_one_batch(monkeypatch):
    from mlflow.tracking import MlflowClient

    tracker = Tracker(experiment="many")
    tracker.start()
    calls = []
    original = MlflowClient.log_batch

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("metrics") or (args[1] if len(args) > 1 else None))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    tracker.log_metrics_many([({"a": 1.0, "b": 2.0}, 10), ({"a": 3.0, "b": 4.0}, 20)])
    tracker.flush()
    assert len(calls) == 1
    tracker.end()
    history = MlflowClient(tracker.tracking_uri).get_metric_history(tracker.run_id, "a")
    assert [(m.step, m.value) for m in history] == [(10, 1.0), (20, 3.0)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_trainer_against_a_live_server_reads_back_with_mlflow_client(live_server):
    from rl8 import PPO, Trainer
    from rl8.envs import CartPole

    algo = PPO(CartPole, num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)
    trainer = Trainer(algo, tracking_uri=live_server.uri, experiment="live", progress=False, log_every=1)
    steps = [trainer.step()["env/steps"] for _ in range(3)]
    run_id = trainer.tracker.run_id
    trainer.close()
    client = MlflowClient(live_server.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["hparams/horizon"] == "8"
    history = client.get_metric_history(run_id, "losses/total")
    assert [m.step for m in history] == steps == [128, 256, 384]
    assert [m.step for m in client.get_metric_history(run_id, "env/steps")] == steps


TRAIN_SCRIPT = """
import sys
import torch
torch.set_num_threads(1)
from rl8 import PPO, Trainer
from rl8.training.conditions import Condition
from rl8.envs import CartPole

class Report(Condition):
    # never stops; prints each step so that the test knows where training is
    def __call__(self, stats):
        print(f"STEP {int(stats['algorithm/steps'])}", flush=True)
        return False

algo = PPO(CartPole, num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)
trainer = Trainer(algo, tracking_uri=sys.argv[1], checkpoint_dir=sys.argv[2], checkpoint_every=5,
                  keep_checkpoints=2, progress=False)
print(f"RUN {trainer.run_id}", flush=True)
trainer.run(stop_conditions=[Report()])
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hung_server_does_not_stall_training_and_sigterm_exits_in_bounded_time(live_server, tmp_path):
    """SIGSTOP the tracking server mid-run: training keeps its pace (metrics and the
    checkpoints' artifacts are queued in the background), and SIGTERM still exits within 15 s,
    saying that the run's status could not be set."""
    import queue
    import threading

    window_s = 2.5
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(rl8.__file__).parents[1])}
    err_file = open(tmp_path / "train.err", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "train.py"), live_server.uri, str(tmp_path / "ck")],
        stdout=subprocess.PIPE,
        stderr=err_file,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()

    def reader() -> None:
        for line in proc.stdout:
            lines.put((time.monotonic(), line))

    threading.Thread(target=reader, daemon=True).start()
    steps: list[tuple[float, int]] = []  # (time received, algorithm/steps)
    run: list[str] = []

    def read_until(t_end: float) -> None:
        while time.monotonic() < t_end:
            try:
                t, line = lines.get(timeout=max(0.01, t_end - time.monotonic()))
            except queue.Empty:
                continue
            if line.startswith("STEP"):
                steps.append((t, int(line.split()[1])))
            elif line.startswith("RUN"):
                run.append(line.split()[1])

    def steps_between(t0: float, t1: float) -> int:
        return sum(1 for t, _ in steps if t0 <= t < t1)

    try:
        deadline = time.monotonic() + 90
        while not (steps and steps[-1][1] >= 10) and time.monotonic() < deadline:  # 2 checkpoints
            read_until(time.monotonic() + 0.2)
        assert steps and steps[-1][1] >= 10, (tmp_path / "train.err").read_text()[-3000:]
        t0 = time.monotonic()
        read_until(t0 + window_s)
        live_server.pause()
        t1 = time.monotonic()
        read_until(t1 + window_s)
        before, during = steps_between(t0, t1), steps_between(t1, t1 + window_s)
        assert before > 5
        assert during >= before / 2, (
            f"{before} steps in {window_s} s before the outage, {during} during it"
        )
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        exit_s = time.monotonic() - t_term
        err = (tmp_path / "train.err").read_text()
        assert proc.returncode == 143, err[-3000:]
        assert exit_s < 15, f"SIGTERM took {exit_s:.1f} s\n{err[-3000:]}"
        assert "SIGTERM: checkpoint written to" in err
        assert f"MLflow run {run[0]} could NOT be marked KILLED" in err and "ended as KILLED" not in err
    finally:
        live_server.resume()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err_file.close()
    # truthful: the server, answering again, still shows the run RUNNING
    assert MlflowClient(live_server.uri).get_run(run[0]).info.status == "RUNNING"


def test_artifacts_are_queued_during_an_outage_and_delivered_after(mlflow_uri, monkeypatch, tmp_path):
    down = {"on": False, "calls": 0}
    real = MlflowClient.log_artifact

    def flaky(self, *args, **kwargs):
        down["calls"] += 1
        if down["on"]:
            raise MlflowException("API request to http://x failed with exception refused")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_artifact", flaky)
    policy = tmp_path / "policy.pt"
    with Tracker(experiment="art-outage", retry_interval_s=3600) as tracker:
        down["on"] = True
        policy.write_text("v1")
        with pytest.warns(TrackingWarning, match="1 artifacts are kept and will be retried"):
            tracker.log_artifact(policy, "policy")
        policy.write_text("v2")  # a newer file for the same destination replaces the queued one
        tracker.log_artifact(policy, "policy")
        policy.unlink()  # the tracker kept its own copy
        assert tracker.pending_artifacts == 1 and down["calls"] == 1  # no request while down
        down["on"] = False
        tracker.flush()
        assert tracker.pending_artifacts == 0
    client = MlflowClient(mlflow_uri)
    assert [f.path for f in client.list_artifacts(tracker.run_id, "policy")] == ["policy/policy.pt"]
    local = client.download_artifacts(tracker.run_id, "policy/policy.pt", str(tmp_path))
    assert Path(local).read_text() == "v2"
    assert tracker.final_status == "FINISHED"


def test_artifacts_still_queued_at_end_are_reported_lost(monkeypatch, tmp_path):
    def refused(self, *args, **kwargs):
        raise MlflowException("API request to http://x failed with exception refused")

    (tmp_path / "a.txt").write_text("a")
    tracker = Tracker(experiment="art-lost", retry_interval_s=3600)
    tracker.start()
    monkeypatch.setattr(MlflowClient, "log_artifact", refused)
    with pytest.warns(TrackingWarning):
        tracker.log_artifact(tmp_path / "a.txt")
    with pytest.warns(TrackingWarning, match="1 artifacts could not be delivered and are lost"):
        assert tracker.end("FINISHED") is True  # the status itself went through
    assert tracker.undelivered == {"metrics": 0, "params": 0, "artifacts": 1}


def test_end_with_a_timeout_gives_up_on_a_request_that_hangs(mlflow_uri, monkeypatch):
    import threading

    tracker = Tracker(experiment="hang", asynchronous=True)
    tracker.start()
    release, holding = threading.Event(), threading.Event()
    real = MlflowClient.log_batch

    def hung_request(self, *args, **kwargs):  # the logging thread inside a request that hangs
        holding.set()
        release.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", hung_request)
    tracker.log_metrics({"a": 1.0}, step=0)
    assert tracker.flush(timeout_s=0.1) is False  # the logging thread is stuck
    assert holding.wait(5)
    t0 = time.monotonic()
    with pytest.warns(
        TrackingWarning, match=r"to KILLED: a request to the server did not finish within 0\.5 s"
    ):
        assert tracker.end("KILLED", timeout_s=0.5) is False
    assert time.monotonic() - t0 < 2
    assert tracker.final_status is None
    assert "could NOT be marked KILLED" in tracker.end_report("KILLED")
    release.set()
    assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.status == "RUNNING"  # truthful


def test_asynchronous_tracker_sends_held_steps_together_in_order(mlflow_uri, monkeypatch):
    import threading

    calls = []
    real = MlflowClient.log_batch

    def spy(self, run_id, *args, metrics=(), **kwargs):
        if metrics:
            calls.append((threading.current_thread().name, sorted({m.step for m in metrics})))
        return real(self, run_id, *args, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    tracker = Tracker(experiment="async", asynchronous=True)
    tracker.start()
    for step in range(5):  # held by the logging thread (up to 1 s or 1,000 values), then one request
        tracker.log_metrics({"x": float(step)}, step=step)
    assert tracker.flush() is True
    assert calls == [("rl8-mlflow-logger", [0, 1, 2, 3, 4])]
    tracker.end()
    history = MlflowClient(mlflow_uri).get_metric_history(tracker.run_id, "x")
    assert [(m.step, m.value) for m in history] == [(s, float(s)) for s in range(5)]


def test_the_logging_thread_sends_a_full_request_at_once_and_never_parts_a_step(monkeypatch):
    import threading

    calls, sent = [], threading.Event()
    real = MlflowClient.log_batch

    def spy(self, run_id, *args, metrics=(), **kwargs):
        if metrics:
            calls.append([m.step for m in metrics])
            sent.set()
        return real(self, run_id, *args, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    tracker = Tracker(experiment="async", asynchronous=True)
    tracker.start()
    # 1,200 values: more than a request holds, sent without the 1 s wait, in whole steps
    tracker.log_metrics_many([({f"m{i}": 1.0 for i in range(400)}, step) for step in range(3)])
    assert sent.wait(0.9)
    assert tracker.flush() is True
    tracker.end()
    assert [sorted(set(steps)) for steps in calls] == [[0, 1], [2]]
    assert [len(steps) for steps in calls] == [800, 400]


def test_log_cadence_logs_every_step_while_young_then_one_step_per_interval():
    def logged(cadence, times):
        return [n for n, now in enumerate(times, 1) if cadence.due(now)]

    # 2 steps a second: every step of the first 60 s (120 steps), then one step per 10 s
    times = [n / 2 for n in range(400)]
    assert logged(LogCadence(young_s=60, young_steps=1000, interval_s=10), times) == [
        *range(1, 121),
        *range(140, 401, 20),
    ]
    # 100 steps a second: young for 1,000 steps only (10 s), then one step per 10 s
    times = [Fraction(n, 100) for n in range(5000)]  # exact: no rounding at the 10 s boundaries
    assert logged(LogCadence(young_s=60, young_steps=1000, interval_s=10), times) == [
        *range(1, 1001),
        *range(2000, 5001, 1000),
    ]
    # a step every 15 s: every step, young or not
    assert logged(LogCadence(young_s=60, young_steps=2, interval_s=10), [15 * n for n in range(9)]) == [
        *range(1, 10)
    ]


def test_log_cadence_with_log_every_logs_exactly_every_nth_step_whatever_the_clock():
    cadence = LogCadence(5)
    assert [n for n in range(1, 23) if cadence.due(now=0.0 if n < 10 else 1e6 + n)] == [5, 10, 15, 20]
    for bad in (0, -1, 2.5, True, "5"):
        with pytest.raises(ValueError, match=rf"log_every must be an int >= 1 or None .*got {bad!r}"):
            LogCadence(bad)
    with pytest.raises(ValueError, match="interval_s must be a number of seconds >= 0, got -1"):
        LogCadence(interval_s=-1)
    with pytest.raises(ValueError, match="log_every must be an int >= 1 or None"):
        Tracker(experiment="bad", log_every=0)


@pytest.mark.parametrize("steps_per_s", [1, 10, 100])
def test_the_default_cadence_logs_a_bounded_number_of_steps_in_ten_hours(steps_per_s):
    cadence = LogCadence()
    steps = 10 * 3600 * steps_per_s
    logged = sum(cadence.due(n / steps_per_s) for n in range(steps))
    young = min(YOUNG_STEPS, YOUNG_S * steps_per_s)  # every step of these, then one per 10 s
    assert abs(logged - (young + (10 * 3600 - young / steps_per_s) / INTERVAL_S)) <= 1
    assert logged <= 1000 + 3600  # vs 36,000 to 3,600,000 steps


def test_a_tracker_with_log_every_logs_each_nth_step_forced_ones_and_the_last(mlflow_uri):
    with Tracker(experiment="every", log_every=5) as tracker:
        for step in range(1, 14):
            tracker.log_metrics({"x": float(step)}, step=step)
            if step == 7:
                tracker.log_metrics({"eval/x": -1.0}, step=step, always=True)
        run_id = tracker.run_id
    client = MlflowClient(mlflow_uri)
    assert _history(client, run_id, "x") == [(s, float(s)) for s in (5, 7, 10, 13)]
    assert _history(client, run_id, "eval/x") == [(7, -1.0)]


def test_a_tracker_past_its_young_run_logs_one_step_per_interval_evaluations_and_the_last(
    mlflow_uri,
):
    with Tracker(experiment="old") as tracker:
        # past its young run: the first step, then one an hour
        tracker._cadence = LogCadence(young_steps=0, interval_s=3600)
        for step in range(1, 11):
            tracker.log_metrics({"x": float(step)}, step=step)
            if step == 4:
                tracker.log_metrics({"eval/x": -1.0}, step=step, always=True)
        run_id = tracker.run_id
    assert _history(MlflowClient(mlflow_uri), run_id, "x") == [(1, 1.0), (4, 4.0), (10, 10.0)]


def test_a_tracker_logs_every_step_of_a_young_run_by_default(mlflow_uri):
    with Tracker(experiment="young") as tracker:
        for step in range(30):
            tracker.log_metrics({"x": float(step)}, step=step)
        run_id = tracker.run_id
    assert _history(MlflowClient(mlflow_uri), run_id, "x") == [(s, float(s)) for s in range(30)]


@pytest.mark.slow
def test_a_tracker_ending_at_exit_ends_its_run_with_the_status_of_the_exit(mlflow_uri):
    code = textwrap.dedent("""
        import sys
        from rl8.tracking import Tracker

        def train():  # the tracker is dropped when train() returns; its exit hook holds it
            tracker = Tracker(experiment="exit", run_name=sys.argv[1], end_at_exit=True, asynchronous=True)
            tracker.start_in_background()
            tracker.log_metrics({"x": 1.0}, step=1)

        train()
        if sys.argv[1] == "failed":
            raise RuntimeError("boom")
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(rl8.__file__).parents[1])}
    for name in ("finished", "failed"):
        subprocess.run([sys.executable, "-c", code, name], env=env, capture_output=True, timeout=120)
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("exit").experiment_id])
    assert {r.info.run_name: (r.info.status, r.data.metrics) for r in runs} == {
        "finished": ("FINISHED", {"x": 1.0}),
        "failed": ("FAILED", {"x": 1.0}),
    }


def test_end_with_a_timeout_on_a_healthy_store_delivers_and_sets_the_status(mlflow_uri):
    tracker = Tracker(experiment="bounded")
    tracker.start()
    tracker.log_metrics({"a": 1.0}, step=0)
    assert tracker.end("KILLED", timeout_s=10) is True
    assert MlflowClient(mlflow_uri).get_run(tracker.run_id).info.status == "KILLED"


# --------------------------------------------------------------------------------------------
# MLflow's releases: one for mlflow and mlflow-skinny, and a store that a newer one wrote


def test_mlflow_and_mlflow_skinny_are_pinned_to_one_release_in_every_extra():
    """mlflow pins mlflow-skinny exactly: an extra installed after a first run must not move
    mlflow-skinny to another release, whose MLflow cannot read the store the first one wrote."""
    project = tomllib.loads((Path(rl8.__file__).parents[1] / "pyproject.toml").read_text())["project"]
    lists = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    pins = {
        f"{where}: {text}": [(spec.operator, spec.version) for spec in Requirement(text).specifier]
        for where, requirements in lists.items()
        for text in requirements
        if canonicalize_name(Requirement(text).name) in ("mlflow", "mlflow-skinny")
    }
    named = {canonicalize_name(Requirement(pin.split(": ", 1)[1]).name) for pin in pins}
    assert named == {"mlflow", "mlflow-skinny"}, pins
    assert all(len(specs) == 1 and specs[0][0] == "==" for specs in pins.values()), pins
    assert len({specs[0][1] for specs in pins.values()}) == 1, pins


def test_a_store_of_a_newer_mlflow_says_in_one_line_what_to_install(newer_mlflow_store):
    for start in (Tracker(experiment="newer").start, running_runs):  # a run, `rl8 runs`
        with pytest.raises(StoreSchemaError) as caught:
            start()
        message = str(caught.value)
        assert "\n" not in message and newer_mlflow_store in message
        assert f"newer MLflow than the installed MLflow {mlflow.__version__}" in message
        assert 'python -m pip install -e ".[ui]"' in message


def test_a_store_of_a_newer_mlflow_is_the_same_error_from_a_background_start(newer_mlflow_store):
    tracker = Tracker(experiment="newer", asynchronous=True)
    tracker.start_in_background()
    assert tracker.wait_started(60)
    with pytest.raises(StoreSchemaError, match="newer MLflow"):
        tracker.check_start()


def test_only_a_store_revision_unknown_to_the_installed_mlflow_is_a_newer_store(
    mlflow_uri, tmp_path, template_db
):
    check_store_schema(mlflow_uri)  # no file yet: MLflow creates it
    check_store_schema("http://127.0.0.1:1")  # a server: its MLflow opens the store
    old = tmp_path / "old.db"  # an older store: MLflow's advice (mlflow db upgrade) is right
    shutil.copy(template_db, old)
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute(
            "UPDATE alembic_version SET version_num = '451aebb31d03'"
        )  # the first migration (metric steps)
        db.commit()
    check_store_schema(f"sqlite:///{old}")


def test_an_old_mlruns_folder_is_explained_before_training(tmp_path, monkeypatch):
    (tmp_path / "mlruns" / "0").mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")  # an rl8 1.0-era store
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(None)  # MLflow's own default: it picks ./mlruns
    algo = PPO(CartPole, **SMALL)
    with pytest.raises(
        TrackingError,
        match=r"MLflow picked the folder store .*mlruns.* over the default "
        r"sqlite:///mlflow.db .*mlflow migrate-filestore",
    ):
        Trainer(algo, progress=False).run(max_env_steps=1)  # the run starts before training
    assert algo.env_steps == 0
    with pytest.raises(TrackingError, match="is a folder store, and MLflow 3 refuses folder stores"):
        Trainer(algo, progress=False, tracking_uri=str(tmp_path / "runs")).step()
    assert algo.env_steps == 0


def test_creating_the_default_store_leaves_no_lock_file_in_the_users_folder(tmp_path):
    ready_store(f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}")
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["mlflow.db"]


@pytest.mark.parametrize("where", ["a-file/mlflow.db", "a-folder"])
def test_a_sqlite_store_that_cannot_be_opened_fails_at_the_first_step(tmp_path, where):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder").mkdir()
    algo = PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16)
    trainer = Trainer(algo, tracking_uri=f"sqlite:///{tmp_path / where}", progress=False)
    with pytest.raises(TrackingError, match=r"\) cannot be opened and written: .*Give a writable place"):
        trainer.run(max_env_steps=10**9, max_seconds=120)  # MLflow alone: minutes of retries
    assert algo.env_steps <= 16 * 3


@pytest.mark.parametrize("uri", ["file:///{tmp}/store", "{tmp}/store", "./mlruns"])
def test_a_folder_tracking_uri_is_told_what_to_use_not_to_start_a_server(tmp_path, uri):
    uri = uri.format(tmp=tmp_path)
    for start in (
        lambda: Tracker(experiment="x", tracking_uri=uri).start(),
        lambda: Tracker(experiment="x", tracking_uri=uri, run_id="a" * 32).start(),
    ):
        with pytest.raises(TrackingError) as raised:
            start()
        assert "MLflow 3 refuses folder stores" in str(raised.value)
        assert "sqlite:///PATH/mlflow.db (a file), or a server's http://HOST:PORT" in str(raised.value)
        assert "Start the server" not in str(raised.value)


@pytest.fixture
def silent_server(monkeypatch):
    """The URI of a server on 127.0.0.1 that accepts connections and never answers; the read
    policy shortened to 1 s a request, no retry (the mechanism, not MLflow's 7 x 120 s)."""
    import socket
    import threading

    import rl8.mlflow_http

    monkeypatch.setattr(rl8.mlflow_http, "LOG_TIMEOUT_S", 1)
    monkeypatch.setattr(rl8.mlflow_http, "LOG_RETRIES", 0)
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in held:
        conn.close()


def _returns_within(seconds, call):
    done = threading.Event()
    outcome = []

    def target():
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the outcome is inspected below
            outcome.append(exc)
        done.set()

    threading.Thread(target=target, daemon=True).start()
    assert done.wait(seconds), f"still waiting on a silent tracking server after {seconds} s"
    return outcome[0]


def test_reading_a_run_by_id_from_a_silent_server_is_bounded(silent_server):
    run = "a" * 32
    assert isinstance(
        _returns_within(60, lambda: load_policy(run, tracking_uri=silent_server)), Exception
    )
    for command in (["eval", run], ["record", run, "-o", "v.mp4"], ["train", "--resume", run], ["runs"]):
        code = _returns_within(60, lambda: main([*command, "--tracking-uri", silent_server]))
        assert code in (1, 2), (command, code)


def test_loading_a_model_uri_from_a_silent_server_is_bounded(silent_server):
    for ref in ("models:/m-" + "a" * 32, "models:/cartpole-ppo/1", "models:/cartpole-ppo@best"):
        outcome = _returns_within(60, lambda: load_policy(ref, tracking_uri=silent_server))
        assert isinstance(outcome, FileNotFoundError), (ref, outcome)
        assert "cannot download" in str(outcome)
    code = _returns_within(
        60, lambda: main(["eval", "models:/cartpole-ppo@best", "--tracking-uri", silent_server])
    )
    assert code in (1, 2)


@pytest.mark.slow
def test_three_processes_create_a_fresh_sqlite_store_at_once_quietly(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    (tmp_path / "fresh").mkdir()
    script = textwrap.dedent(f"""
        from rl8.tracking import Tracker
        with Tracker(experiment="together", tracking_uri={uri!r}) as tracker:
            tracker.log_metrics({{"x": 1.0}}, step=0)
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=rl8_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    for out in outputs:  # MLflow's INFO lines on a new store are silenced
        assert "Creating initial MLflow database tables" not in out, out
        assert "alembic" not in out.lower(), out
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(uri).get_experiment_by_name("together")
    assert len(MlflowClient(uri).search_runs([experiment.experiment_id])) == 3


def test_a_checkpoint_whose_policy_cannot_be_staged_for_mlflow_ends_the_run_finished(
    tmp_path, migrated_store, monkeypatch
):
    (tmp_path / "afile").write_text("a file, not a folder")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))  # every mkdtemp fails
    trainer = Trainer(
        PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False, async_logging=False
    )
    with pytest.warns(TrackingWarning, match=r"not \(all\) logged to MLflow run .*\(staging folder "):
        trainer.run(stop_conditions=HitsUpperBound("env/steps", 128))
    trainer.close()
    assert trainer.last_checkpoint.is_file()
    run = MlflowClient(migrated_store).get_run(trainer.run_id)
    assert run.info.status == "FINISHED"


def test_an_artifact_that_cannot_be_staged_is_a_warning(tmp_path, migrated_store, monkeypatch):
    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "notes.txt").write_text("notes")
    with Tracker(experiment="staging", asynchronous=True) as tracker:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))
        with pytest.warns(TrackingWarning, match="staging a copy in the temporary folder .* failed"):
            tracker.log_artifact(tmp_path / "notes.txt")
        assert tracker.pending_artifacts == 0
