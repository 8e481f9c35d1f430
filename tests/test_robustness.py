"""Faults and bad input found by fault injection (issue 23): jobs never destroy each other's
data, malformed files and configs are clear errors, and tracking never fails training."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rl8

ROOT = Path(rl8.__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The environment of a subprocess that imports this rl8."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


# ---- the default SQLite store, created by several processes at once ---------------------------


def test_three_processes_create_a_fresh_sqlite_store_at_once_quietly(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    (tmp_path / "fresh").mkdir()
    script = textwrap.dedent(f"""
        from rl8.tracking import Tracker
        with Tracker(experiment="together", tracking_uri={uri!r}) as tracker:
            tracker.log_metrics({{"x": 1.0}}, step=0)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    for out in outputs:  # MLflow's INFO lines on a new store are silenced
        assert "Creating initial MLflow database tables" not in out, out
        assert "alembic" not in out.lower(), out
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(uri).get_experiment_by_name("together")
    assert len(MlflowClient(uri).search_runs([experiment.experiment_id])) == 3


# ---- tracking never fails training: a temporary folder where nothing can be staged -----------

SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)


def test_a_checkpoint_whose_policy_cannot_be_staged_for_mlflow_ends_the_run_finished(
        tmp_path, migrated_store, monkeypatch):
    import tempfile

    from mlflow.tracking import MlflowClient

    from rl8 import PPO, Trainer
    from rl8.conditions import HitsUpperBound
    from rl8.envs import CartPole
    from rl8.tracking import TrackingWarning

    (tmp_path / "afile").write_text("a file, not a folder")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))  # every mkdtemp fails
    trainer = Trainer(PPO(CartPole, **SMALL), checkpoint_dir=tmp_path / "ck", progress=False,
                      async_logging=False)
    with pytest.warns(TrackingWarning, match="not logged to MLflow run .*staging them in the temporary folder"):
        trainer.run(stop_conditions=HitsUpperBound("env/steps", 128))
    trainer.close()
    assert trainer.last_checkpoint.is_file()
    run = MlflowClient(migrated_store).get_run(trainer.run_id)
    assert run.info.status == "FINISHED"


def test_an_artifact_that_cannot_be_staged_is_a_warning(tmp_path, migrated_store, monkeypatch):
    import tempfile

    from rl8.tracking import Tracker, TrackingWarning

    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "notes.txt").write_text("notes")
    with Tracker(experiment="staging", asynchronous=True) as tracker:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "afile" / "tmp"))
        with pytest.warns(TrackingWarning, match="staging a copy in the temporary folder .* failed"):
            tracker.log_artifact(tmp_path / "notes.txt")
        assert tracker.pending_artifacts == 0
