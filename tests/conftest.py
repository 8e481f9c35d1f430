"""Shared test set-up: every test runs with a temporary MLflow store and few threads."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys

import pytest
import torch

# Intra-op threads: the cores divided among pytest-xdist's workers (at most 2 each). More
# threads than cores make torch's thread pool wait on busy cores, which slows small ops by an
# order of magnitude; subprocesses (``rl8 train``, torchrun) inherit the same limit.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


def pytest_collection_modifyitems(config, items):
    """Skip the ``heavy_sim`` tests (simulators that compile for minutes on a CPU, such as MJX)
    unless ``RL8_HEAVY_SIM_TESTS=1``: CI runs the cheap simulator tests, a developer all."""
    if os.environ.get("RL8_HEAVY_SIM_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="a heavy simulator test: set RL8_HEAVY_SIM_TESTS=1 to run it")
    for item in items:
        if "heavy_sim" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def mlflow_uri(tmp_path, monkeypatch):
    """Point MLflow at a throw-away SQLite store so no test writes to the user's store.

    The store is only created when a test uses MLflow; the working directory is the test's
    temporary folder, so nothing (``mlflow.db``, checkpoints, videos) lands in the repo.
    """
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(uri)
    yield uri
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture(scope="session")
def template_db(tmp_path_factory):
    """A migrated, empty MLflow SQLite store, made once per session (migrations take seconds)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def migrated_store(mlflow_uri, tmp_path, template_db):
    """Start this test's store (see ``mlflow_uri``) from the migrated template: a fresh
    SQLite store would spend seconds on schema migrations."""
    shutil.copy(template_db, tmp_path / "mlflow.db")
    return mlflow_uri


#: A schema revision that no MLflow's migrations hold: the store of a newer MLflow, as the
#: installed one sees it.
NEWER_REVISION = "ffffffffffff"


@pytest.fixture
def newer_mlflow_store(migrated_store, tmp_path):
    """This test's store (see ``migrated_store``) as a newer MLflow leaves it: its schema revision
    (alembic's ``alembic_version`` table) is one that the installed MLflow does not know."""
    with contextlib.closing(sqlite3.connect(tmp_path / "mlflow.db")) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (NEWER_REVISION,))
        db.commit()
    return migrated_store


@pytest.fixture
def one_torch_thread():
    """Tiny models: one intra-op thread is faster and steadier on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
