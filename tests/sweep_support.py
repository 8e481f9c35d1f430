"""The config, search space and stores of the sweep tests (tests/test_sweep.py,
tests/test_sweep_faults.py)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

CONFIG = """\
env: rl8.envs.CartPole
hparams: {{num_envs: 8, horizon: 16, num_sgd_iters: 2, seed: 0}}
max_steps: 768
steps_per_eval: 2
eval_num_envs: 4
eval_num_steps: 50
experiment: sweep-test
tracking_uri: {uri}
"""
SPACE = """\
lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
num_minibatches: {type: categorical, choices: [1, 2, 4]}
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The paths of a sweep's config and space files and the URIs of its stores, in ``tmp_path``
    (the working folder)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "config.yaml").write_text(CONFIG.format(uri=uri))
    (tmp_path / "space.yaml").write_text(SPACE)
    return {
        "config": str(tmp_path / "config.yaml"),
        "space": str(tmp_path / "space.yaml"),
        "uri": uri,
        "storage": f"sqlite:///{tmp_path / 'study.db'}",
    }


def sweep_runs(uri):
    """The client of store ``uri``, the study runs of experiment sweep-test and the trials' runs."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweep-test")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


#: A heartbeat each second and a stale trial after 3 s, for the tests that kill a sweep.
HEARTBEAT_ENV = {"RL8_SWEEP_HEARTBEAT_INTERVAL": "1", "RL8_SWEEP_GRACE_PERIOD": "3"}
