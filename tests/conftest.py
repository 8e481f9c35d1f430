"""Shared test set-up: every test runs with a temporary MLflow store and few threads."""

from __future__ import annotations

import sys

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


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
