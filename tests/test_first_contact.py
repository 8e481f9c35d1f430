"""What a newcomer meets first: runs that end, eval env on demand, progress and start-up."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.training.conditions import HitsUpperBound
from rl8.training.progress import Progress

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")

SMALL = dict(num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)
STEP = 16 * 8  # env steps per training step
REPO = Path(__file__).resolve().parents[1]


def make_algo(env=CartPole, **hparams):
    return PPO(env, **{**SMALL, **hparams})


# --------------------------------------------------------------------------------------------
# every run a script starts ends


SCRIPT = """
import sys
import torch
from rl8 import PPO, Trainer
from rl8.training.conditions import HitsUpperBound
from rl8.envs import CartPole

torch.set_num_threads(1)

def main():
    algo = PPO(CartPole, num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1)
    trainer = Trainer(algo, run_name="in-a-function", progress=False)
    trainer.step()
    print(trainer.run_id)
    if sys.argv[1] == "raise":
        raise ValueError("the script fails after training")
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt

main()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "ending, status", [("return", "FINISHED"), ("raise", "FAILED"), ("interrupt", "KILLED")]
)
def test_a_trainer_made_in_a_function_ends_its_run_at_exit(mlflow_uri, tmp_path, ending, status):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script), ending], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode == 0) == (ending == "return"), done.stderr
    run_id = done.stdout.split()[0]
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == status
    assert run.info.end_time is not None
    assert run.data.metrics["env/steps"] == STEP  # the queued metrics were sent before the end


# --------------------------------------------------------------------------------------------
# Trainer.eval() after the first step: an eval env on demand


def eval_stats(stats):
    return {k: v for k, v in stats.items() if k.startswith("eval/")}


def test_eval_after_the_first_step_builds_an_eval_env_on_demand():
    kw = dict(num_envs=32, env_config={"max_episode_steps": 12})  # reset once (the default)
    plain = Trainer(make_algo(**kw), progress=False)
    expected = [plain.step()["losses/total"] for _ in range(2)]
    plain.close()
    trainer = Trainer(make_algo(**kw), progress=False)
    try:
        got = [trainer.step()["losses/total"]]
        a = trainer.eval()
        assert trainer.eval_envs.eval_env.num_envs == 16  # min(num_envs, 16)
        # the training env's config, run for its episode limit: whole episodes in every env
        assert a["eval/episodes/count"] >= 16 and a["eval/episodes/length_mean"] <= 12
        short = trainer.eval(env_config={"max_episode_steps": 5})  # explicit options still apply
        assert short["eval/episodes/length_mean"] <= 5
        assert eval_stats(trainer.eval()) == eval_stats(a)  # the same start state every time
        trainer.eval(deterministic=False)  # samples: torch's RNG untouched
        got.append(trainer.step()["losses/total"])
        assert got == expected  # training goes on as without the evaluations
    finally:
        trainer.close()


def test_run_evaluates_between_reset_boundaries_on_an_eval_env():
    trainer = Trainer(make_algo(horizons_per_env_reset=2), progress=False)
    try:
        stats = trainer.run(steps_per_eval=3, stop_conditions=HitsUpperBound("algorithm/steps", 3))
        assert stats["algorithm/steps"] == 3 and "eval/rollout/reward_sum_mean" in stats
        assert (
            trainer.eval_envs.eval_env is not None
        )  # step 3 is not a reset boundary of the training envs
    finally:
        trainer.close()


# --------------------------------------------------------------------------------------------
# progress: plain lines outside a terminal, the nearest condition, the summary


def run_logged(monkeypatch, **kwargs):
    stream = io.StringIO()  # not a terminal: a log file, a pipe
    monkeypatch.setattr(sys, "stderr", stream)
    trainer = Trainer(make_algo(), **kwargs)
    # a progress line waits for the lines saying where the run goes, which wait for its id (a run
    # starting in the background gets it, on a busy machine, after the first step)
    assert trainer.run_id is not None  # starts the run and waits for its id
    trainer.run(stop_conditions=HitsUpperBound("env/steps", 3 * STEP))
    trainer.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("rl8: MLflow run ") and lines[1].startswith("rl8: checkpoints in ")
    return lines[2:]


def test_progress_lines_outside_a_terminal_by_default_every_n_seconds(monkeypatch):
    default = run_logged(monkeypatch)  # every 10 s: the first step, the final state, the summary
    assert [line.split(" | ")[0] for line in default] == [
        "rl8 128 env steps",
        "rl8 384 env steps",
        default[-1],
    ]
    assert default[-1].startswith("rl8: stopped by")
    often = run_logged(monkeypatch, progress_every_s=1e-9)  # a line every step, the last once
    assert [line.split(" | ")[0] for line in often[:-1]] == [
        "rl8 128 env steps",
        "rl8 256 env steps",
        "rl8 384 env steps",
    ]
    with pytest.raises(ValueError, match="progress_every_s must be a number of seconds > 0, got 0"):
        Trainer(make_algo(), progress_every_s=0)


def test_run_without_a_stop_condition_warns(monkeypatch):
    trainer = Trainer(make_algo(), progress=False)
    steps = []
    update = trainer.algo.update

    def interrupted_after_two_steps():
        if len(steps) == 2:
            raise KeyboardInterrupt
        steps.append(update())
        return steps[-1]

    monkeypatch.setattr(trainer.algo, "update", interrupted_after_two_steps)
    with pytest.warns(UserWarning, match="no stop_conditions, so training runs until interrupted"):
        with pytest.raises(KeyboardInterrupt):
            trainer.run()
    assert len(steps) == 2


def test_progress_shows_the_condition_with_the_nearest_eta_and_the_eval_return():
    stream = io.StringIO()
    progress = Progress(None, stream, interval_s=1e-9)
    conditions = [HitsUpperBound("env/steps", 10_000), HitsUpperBound("episodes/return_mean", 110)]
    progress.update(
        {"env/steps": 100, "episodes/return_mean": 10.0, "eval/episodes/return_mean": 12.0}, conditions
    )
    time.sleep(0.01)
    progress.update({"env/steps": 200, "episodes/return_mean": 60.0}, conditions)
    line = stream.getvalue().splitlines()[-1]
    # the return target is half way from the first return seen (10) to 110, but two values give
    # it no ETA: the env/steps bound, at 2% and with an ETA, ends the run at the latest
    assert "return 60 | eval return 12 | 2% to env/steps >= 1e+04 | ETA " in line


def test_the_summary_says_which_condition_stopped_training(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    target = HitsUpperBound("eval/rollout/reward_sum_mean", -1.0)
    trainer = Trainer(make_algo(), progress_every_s=1e-9)
    trainer.run(steps_per_eval=2, stop_conditions=[HitsUpperBound("env/steps", 100 * STEP), target])
    trainer.close()
    assert trainer.stopped_by is target and trainer.algo.steps == 2
    *lines, summary = stream.getvalue().splitlines()
    assert "eval return" not in lines[0] and "eval return" in lines[-1]
    assert summary.startswith(
        "rl8: stopped by HitsUpperBound('eval/rollout/reward_sum_mean', -1.0) after 256 env steps in "
    )
    assert "eval return" in summary


# --------------------------------------------------------------------------------------------
# metrics and params that say what they are


def test_params_are_logged_once(mlflow_uri):
    trainer = Trainer(make_algo(seed=None, device="auto"), progress=False)
    run_id = trainer.run_id  # starts the run, which logs the configuration
    trainer.close()
    params = MlflowClient(mlflow_uri).get_run(run_id).data.params
    assert params["hparams/seed"] == str(trainer.algo.seed)  # the seed drawn, not "None"
    assert params["hparams/device"] == str(trainer.algo.device)  # not "auto"
    assert not {"seed", "device", "env_class"} & set(params)


def test_the_example_config_uses_the_default_experiment_name():
    import yaml

    config = yaml.safe_load((REPO / "examples" / "cartpole.yaml").read_text())
    trainer = Trainer(make_algo(), tracking=False, progress=False)
    trainer.close()
    assert config["experiment"] == trainer.experiment == "CartPole"  # one experiment per env
