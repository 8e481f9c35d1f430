"""A new run in a local store starts in the logging thread while the first steps run.

Timings are in ``benchmarks/startup.py``; these tests check the behaviour: the run id, params
and metrics arrive, a start that fails is reported, closing during a start ends the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hparams import SMALL, STEP
from mlflow.tracking import MlflowClient

import rl8.tracking.store
from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.io.checkpoint import load_checkpoint
from rl8.tracking import Tracker, TrackingError, TrackingWarning

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def held_start(monkeypatch):
    """``Tracker.start`` waits (at most 10 s) until the returned event is set."""
    gate = threading.Event()
    start = Tracker.start

    def held(self):
        gate.wait(10)
        return start(self)

    monkeypatch.setattr(Tracker, "start", held)
    return gate


def test_training_starts_before_the_run_and_its_steps_reach_it(mlflow_uri, tmp_path, held_start):
    trainer = Trainer(PPO(CartPole, **SMALL), progress=False, log_every=1)
    trainer.step()  # the run is still starting
    assert trainer.tracker.run_id is None
    held_start.set()
    run_id = trainer.run_id  # waits for the start
    assert run_id is not None and trainer.tracker.run_id == run_id
    assert trainer.checkpoint_dir == tmp_path / "checkpoints" / run_id
    trainer.step()
    trainer.close()
    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["hparams/num_envs"] == "16"
    assert [m.value for m in client.get_metric_history(run_id, "env/steps")] == [STEP, 2 * STEP]


def test_close_during_the_start_ends_the_run_finished(mlflow_uri, held_start):
    trainer = Trainer(PPO(CartPole, **SMALL), progress=False)
    trainer.step()
    assert trainer.tracker.run_id is None
    threading.Timer(0.2, held_start.set).start()
    trainer.close()  # waits for the start, sends the step, ends the run
    run_id = trainer.run_id
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["env/steps"] == STEP
    assert run.data.params["hparams/horizon"] == "8"


def unusable_uri(tmp_path: Path) -> str:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return f"sqlite:///{blocker / 'mlflow.db'}"  # its folder cannot be created


def test_a_failed_start_is_raised_at_the_next_step(tmp_path):
    trainer = Trainer(PPO(CartPole, **SMALL), tracking_uri=unusable_uri(tmp_path), progress=False)
    deadline = time.monotonic() + 60
    with pytest.raises(
        TrackingError,
        match=r"could not be started: the MLflow SQLite store .*a-file.*cannot be opened and written",
    ):
        while time.monotonic() < deadline:  # steps go on until the start has failed
            trainer.step()
    with pytest.raises(TrackingError, match="could not be started"):
        trainer.step()  # and every step after
    trainer.close()  # raised already; nothing left to end
    assert trainer.tracker.final_status is None


def test_a_failed_start_is_raised_by_close(tmp_path, held_start):
    trainer = Trainer(PPO(CartPole, **SMALL), tracking_uri=unusable_uri(tmp_path), progress=False)
    trainer.step()  # starts the run, which fails once let go
    held_start.set()
    with pytest.raises(TrackingError, match="could not be started"):
        trainer.close()  # waits for the start


def test_a_failed_start_is_raised_by_run_id_and_the_checkpoint_dir(tmp_path):
    trainer = Trainer(PPO(CartPole, **SMALL), tracking_uri=unusable_uri(tmp_path), progress=False)
    for _ in range(2):
        with pytest.raises(TrackingError, match="could not be started"):
            trainer.run_id
    with pytest.raises(TrackingError, match="could not be started"):
        trainer.checkpoint_dir
    trainer.close()  # raised already


def test_without_async_logging_a_failed_start_is_raised_before_the_first_collect(tmp_path):
    algo = PPO(CartPole, **SMALL)
    trainer = Trainer(algo, tracking_uri=unusable_uri(tmp_path), async_logging=False, progress=False)
    with pytest.raises(TrackingError, match="cannot be opened and written"):
        trainer.run(max_env_steps=STEP)
    assert algo.collects == 0


def test_an_explicit_checkpoint_dir_does_not_wait_for_the_run(tmp_path, held_start):
    trainer = Trainer(PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False)
    assert trainer.checkpoint_dir == tmp_path / "ck"
    assert trainer.tracker.run_id is None
    held_start.set()
    trainer.close()


@pytest.mark.slow
def test_creating_a_tracker_does_not_import_mlflow(mlflow_uri):
    code = textwrap.dedent("""
        import sys
        from rl8 import Trainer
        from rl8.tracking import Tracker
        tracker = Tracker(experiment="x")
        assert tracker.is_local
        print(sorted(m for m in sys.modules if m.split(".")[0] == "mlflow"))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


SCRIPT = """
import torch
from rl8 import PPO, Trainer
from rl8.envs import CartPole

torch.set_num_threads(1)
trainer = Trainer(PPO(CartPole, num_envs=16, horizon=8), experiment="startup", run_name="left-at-once", progress=False)
trainer.step()  # starts the run in the background; the process exits while it may still be starting
"""


@pytest.mark.slow
def test_a_process_that_exits_during_the_start_ends_the_run(mlflow_uri, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    client = MlflowClient(mlflow_uri)
    [run] = client.search_runs([client.get_experiment_by_name("startup").experiment_id])
    assert run.info.run_name == "left-at-once"
    assert run.info.status == "FINISHED"
    assert run.data.params["hparams/num_envs"] == "16"


@pytest.mark.slow
def test_a_failed_start_that_nothing_raised_is_a_warning_at_exit(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.replace('experiment="startup"', f"tracking_uri={unusable_uri(tmp_path)!r}"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "TrackingWarning: the MLflow run (started in the background" in done.stderr
    assert "a-file" in done.stderr


@pytest.mark.parametrize(
    "uri, local",
    [
        (None, True),
        ("sqlite:///mlflow.db", True),
        ("file:///tmp/mlruns", True),
        ("mlruns", True),
        ("http://127.0.0.1:5000", False),
        ("https://mlflow.example.com", False),
        ("postgresql://user@host/db", False),
        ("databricks", False),
    ],
)
def test_which_stores_are_local(monkeypatch, uri, local):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert Tracker(experiment="x", tracking_uri=uri).is_local is local


@pytest.fixture
def held_create(monkeypatch):
    """Creating the run (inside ``Tracker.start``) waits (at most 10 s) until the returned
    event is set."""
    gate = threading.Event()
    create = MlflowClient.create_run

    def held(self, *args, **kwargs):
        gate.wait(10)
        return create(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "create_run", held)
    return gate


def test_a_bounded_close_during_the_start_ends_the_run_once_it_is_created(mlflow_uri, held_create):
    trainer = Trainer(PPO(CartPole, **SMALL), progress=False)
    trainer.step()
    t0 = time.monotonic()
    with pytest.warns(TrackingWarning, match="still starting.*marked KILLED as soon as"):
        trainer.close("KILLED", timeout_s=0.5)
    report = trainer.tracker.end_report("KILLED")  # the signal message does not wait for the start
    assert time.monotonic() - t0 < 3
    assert "still starting" in report
    held_create.set()
    assert trainer.tracker.wait_started(10)
    run = MlflowClient(mlflow_uri).get_run(trainer.tracker.run_id)
    assert run.info.status == "KILLED"
    assert trainer.tracker.final_status == "KILLED"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_signals_checkpoint_never_waits_for_a_run_start_that_hangs(tmp_path, monkeypatch, capsys):
    release, ready_store = threading.Event(), rl8.tracking.store.ready_store
    # the store's creation hangs (another process creating it, MLflow retrying an engine) until released
    monkeypatch.setattr(
        rl8.tracking.store, "ready_store", lambda uri: (release.wait(60), ready_store(uri))
    )
    trainer = Trainer(PPO(CartPole, num_envs=4, horizon=4, sgd_minibatch_size=16), progress=False)

    def sigterm_at_step_2(trainer, stats):
        if stats["algorithm/steps"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit, match="143"):
        trainer.run(max_env_steps=10**6, callbacks=sigterm_at_step_2)
    assert not release.is_set() and trainer.tracker.run_id is None  # written while the start still hangs
    written = trainer.last_checkpoint
    assert (
        written.parent.parent == tmp_path / "checkpoints" and written.name == f"checkpoint-{32:012d}.pt"
    )
    assert load_checkpoint(written)["trainer"]["run_id"] is None
    assert (
        "the MLflow run was still starting: it is marked KILLED once started" in capsys.readouterr().err
    )
    release.set()
    assert trainer.tracker.wait_started(30) and trainer.tracker.run_id is not None
    assert MlflowClient().get_run(trainer.tracker.run_id).info.status == "KILLED"
