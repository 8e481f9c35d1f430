"""Actors and learners, part 2 (a second file, so that ``pytest -n 2 --dist loadfile`` runs it
beside ``tests/test_actors.py``): a 4-process job (2 actors, 2 learners, weights through a
file, truncated importance weights) solves CartPole; ``max_staleness=0`` is synchronous and learns like one process with
all the envs."""

from __future__ import annotations

import math
import sys

import pytest
from test_actors import CARTPOLE_CONFIG, MAX_STEPS, history, torchrun


def _only_run(client, experiment: str):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, "one MLflow run for the job"
    return runs[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_actors_two_learners_solve_cartpole_with_weights_through_a_file_and_importance_weights(
    tmp_path, mlflow_uri
):
    from mlflow.tracking import MlflowClient

    config = tmp_path / "cartpole.yaml"
    # each learner's batch: its one actor's 32 envs
    config.write_text(
        CARTPOLE_CONFIG.replace("num_envs: 64 ", "num_envs: 32 ").replace(
            "sgd_minibatch_size: 512", "sgd_minibatch_size: 256"
        )
        + "importance_weight_cap: 1.0\n"
    )
    job = torchrun(
        [
            "-m",
            "rl8",
            "train",
            str(config),
            "--quiet",
            "--actors",
            "2",
            "--max-staleness",
            "2",
            "--weight-sync-interval",
            "2",
            "--weight-sync",
            "checkpoint",
            "--weight-sync-dir",
            "weights",
        ],
        nproc=4,
        timeout=240,
    )
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
    # truncated importance weights (cap 1): at most 1, below 1 once the data is stale
    weights = history(client, run_id, "monitors/importance_weight_mean")
    assert len(weights) == len(steps) and max(weights) <= 1 and min(weights) < 1
    assert run.data.params["trainer/importance_weight_cap"] == "1.0"
    assert (tmp_path / "weights" / "weights.pt").is_file()


# One process with all 64 envs and CARTPOLE_CONFIG's hyper-parameters, seeds 0-4: updates
# until the eval return reached 475 were 16, 12, 14, 32, 18, and the mean of
# episodes/return_mean over those updates 115, 86, 111, 171, 134 (``python
# tests/test_actors_sync.py band`` prints them). The bands below are their ranges widened by 25%.
ONE_PROCESS_UPDATES = (12 / 1.25, 32 * 1.25)
ONE_PROCESS_MEAN_RETURN = (86 / 1.25, 171 * 1.25)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_max_staleness_0_is_synchronous_and_learns_like_one_process(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    config = tmp_path / "cartpole.yaml"
    config.write_text(CARTPOLE_CONFIG)
    job = torchrun(
        ["-m", "rl8", "train", str(config), "--quiet", "--actors", "2", "--max-staleness", "0"], nproc=3
    )
    assert job.returncode == 0, job.output
    client = MlflowClient(mlflow_uri)
    run = _only_run(client, "actors").info.run_id

    # synchronous: every rollout was collected with the learner's current weights, none dropped
    assert set(history(client, run, "monitors/policy_lag")) == {0.0}
    assert history(client, run, "actors/dropped_rollouts")[-1] == 0
    # ... so it is PPO on the batch of one process with all the envs: its learning curve lies
    # within the spread of one-process runs over seeds (updates to solve, mean episode return
    # over them); a learner that trained on wrong rows, stale or unsynced weights falls outside
    assert history(client, run, "eval/episodes/return_mean")[-1] >= 475
    curve = history(client, run, "episodes/return_mean")
    mean_return = sum(v for v in curve if not math.isnan(v)) / len(curve)
    assert ONE_PROCESS_UPDATES[0] <= len(curve) <= ONE_PROCESS_UPDATES[1], len(curve)
    assert ONE_PROCESS_MEAN_RETURN[0] <= mean_return <= ONE_PROCESS_MEAN_RETURN[1], mean_return


def _band() -> None:
    """Print, for one process and seeds 0-4, the updates to solve CARTPOLE_CONFIG's CartPole and
    the mean episode return over them (the reference of the synchronous test)."""
    import torch

    from rl8 import PPO, Trainer
    from rl8.envs import CartPole
    from rl8.training.conditions import HitsUpperBound

    torch.set_num_threads(1)
    for seed in range(5):
        algo = PPO(CartPole, seed=seed, device="cpu", num_envs=64, sgd_minibatch_size=512)
        trainer = Trainer(
            algo, tracking=False, eval_num_envs=8, progress=False, checkpoint_dir=f"band-{seed}"
        )
        returns: list[float] = []
        trainer.run(
            steps_per_eval=2,
            stop_conditions=[
                HitsUpperBound("eval/episodes/return_mean", 475),
                HitsUpperBound("env/steps", MAX_STEPS),
            ],
            callbacks=[lambda trainer, stats: returns.append(stats["episodes/return_mean"])],
        )
        print(
            seed, len(returns), sum(v for v in returns if not math.isnan(v)) / len(returns), flush=True
        )


if __name__ == "__main__":
    {"band": _band}[sys.argv[1]]()
