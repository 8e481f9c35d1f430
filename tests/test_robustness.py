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
