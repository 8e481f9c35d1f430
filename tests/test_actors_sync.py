"""Actors and learners, part 2 (a second file, so that ``pytest -n 2 --dist loadfile`` runs it
beside ``tests/test_actors.py``): a 4-process job (2 actors, 2 learners, weights through a
file) solves CartPole; ``max_staleness=0`` is synchronous and learns like one process with
all the envs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from test_actors import CARTPOLE_CONFIG, MAX_STEPS, history, torchrun


def _only_run(client, experiment: str):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, "one MLflow run for the job"
    return runs[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_actors_two_learners_solve_cartpole_with_weights_through_a_file(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    config = tmp_path / "cartpole.yaml"
    # each learner's batch: its one actor's 32 envs
    config.write_text(CARTPOLE_CONFIG.replace("num_envs: 64 ", "num_envs: 32 ").replace("sgd_minibatch_size: 512", "sgd_minibatch_size: 256"))
    job = torchrun(["-m", "rl8", "train", str(config), "--quiet", "--actors", "2", "--max-staleness", "2",
                    "--weight-sync-interval", "2", "--weight-sync", "checkpoint", "--weight-sync-dir", "weights"],
                   nproc=4, timeout=240)
    assert job.returncode == 0, job.output
    run = _only_run(MlflowClient(mlflow_uri), "actors")
    client, run_id = MlflowClient(mlflow_uri), run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["distributed/learners"] == "2"
    assert run.data.params["trainer/weight_sync"] == "checkpoint"
    assert run.data.metrics["eval/episodes/return_mean"] >= 475
    steps = history(client, run_id, "env/steps")
    assert steps[:2] == [2 * 32 * 32, 4 * 32 * 32] and steps[-1] < MAX_STEPS  # both learners' batches
    assert max(history(client, run_id, "monitors/policy_lag")) <= 2
    assert (tmp_path / "weights" / "weights.pt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_max_staleness_0_is_synchronous_and_learns_like_one_process(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    config = tmp_path / "cartpole.yaml"
    config.write_text(CARTPOLE_CONFIG)
    job = torchrun(["-m", "rl8", "train", str(config), "--quiet", "--actors", "2", "--max-staleness", "0"], nproc=3)
    assert job.returncode == 0, job.output
    # one process with all 64 envs, the same hyper-parameters
    single = subprocess.run([sys.executable, "-m", "rl8", "train", str(config), "--quiet", "--experiment", "single"],
                            capture_output=True, text=True, timeout=200, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert single.returncode == 0, single.stderr
    client = MlflowClient(mlflow_uri)
    actors, one = _only_run(client, "actors").info.run_id, _only_run(client, "single").info.run_id

    # synchronous: every rollout was collected with the learner's current weights, none dropped
    assert set(history(client, actors, "monitors/policy_lag")) == {0.0}
    assert history(client, actors, "actors/dropped_rollouts")[-1] == 0
    # ... so it is PPO on the same batch shape as one process: the same learning curve up to
    # the randomness of the envs and actions. Both solve; the updates each needed, and the
    # mean episode return over the updates both ran, agree within a factor of 1.5 (seed-to-seed
    # spread of one-process runs of this config is well inside that; a learner that trained on
    # the wrong rows or stale weights falls outside it)
    curves = {name: history(client, run, "episodes/return_mean") for name, run in (("actors", actors), ("one", one))}
    updates = {name: len(curve) for name, curve in curves.items()}
    assert all(history(client, run, "eval/episodes/return_mean")[-1] >= 475 for run in (actors, one))
    assert abs(math.log(updates["actors"] / updates["one"])) <= math.log(1.5), updates
    n = min(updates.values())
    means = {name: sum(v for v in curve[:n] if not math.isnan(v)) / n for name, curve in curves.items()}
    assert abs(math.log(means["actors"] / means["one"])) <= math.log(1.5), means
