"""Faults during a run: NaN/inf in training, resuming a finished run from the command line, a
tracking server that hangs, runs left RUNNING by a dead process."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gymnasium import spaces
from hparams import SMALL, STEP
from mlflow.tracking import MlflowClient
from tensordict import TensorDict

from rl8 import PPO, Env, EnvOutputError, NonFiniteError, Trainer
from rl8.envs import CartPole
from rl8.io.checkpoint import load_checkpoint
from rl8.io.checkpoint_dir import CheckpointManager
from rl8.ppo import algorithm as rl8_ppo
from rl8.training.conditions import HitsUpperBound, TimeLimit

pytestmark = pytest.mark.usefixtures("migrated_store", "one_torch_thread")


class GoesBadEnv(Env):
    """Never resets; obs is the step counter; from step ``bad_from`` on, env 2's ``what``
    (``"obs"`` or ``"rewards"``) is NaN."""

    observation_space = spaces.Box(-1e6, 1e6, (1,))
    action_space = spaces.Discrete(2)

    def __init__(self, num_envs, /, horizon=None, *, device="cpu", what="rewards", bad_from=10**9):
        super().__init__(num_envs, horizon, device=device)
        self.what, self.bad_from = what, bad_from
        self.t = torch.zeros(num_envs, 1)

    def reset(self, *, config=None, seed=None):
        self.t = torch.zeros(self.num_envs, 1)
        return self.t.clone()

    def step(self, action):
        self.t = self.t + 1
        out = {"obs": self.t.clone() / 100, "rewards": torch.ones(self.num_envs, 1)}
        if int(self.t[0]) >= self.bad_from:
            out[self.what][2] = float("nan")
        return TensorDict(out, batch_size=[self.num_envs])


def policy_is_finite(state):
    return all(
        torch.isfinite(v).all() for v in state["algo"]["policy"].values() if v.is_floating_point()
    )


# --------------------------------------------------------------------------------------------
# NaN / inf


def test_nan_loss_mid_run_fails_the_run_and_keeps_the_last_good_checkpoint(monkeypatch, tmp_path):
    real_loss, calls = rl8_ppo.ppo_loss, []

    def loss_that_goes_nan(*args, **kwargs):  # one minibatch per update: NaN from update 4 on
        calls.append(1)
        loss = real_loss(*args, **kwargs)
        if len(calls) >= 4:
            loss = dataclasses.replace(
                loss, **{f.name: getattr(loss, f.name) * float("nan") for f in dataclasses.fields(loss)}
            )
        return loss

    monkeypatch.setattr(rl8_ppo, "ppo_loss", loss_that_goes_nan)
    algo = PPO(CartPole, **{**SMALL, "sgd_minibatch_size": STEP})
    trainer = Trainer(algo, progress=False, checkpoint_dir=tmp_path / "ck", checkpoint_every=1)
    with pytest.raises(
        NonFiniteError, match=r"non-finite losses/total=nan, monitors/grad_norm=nan at update step 4 "
    ):
        trainer.run(stop_conditions=HitsUpperBound("env/steps", 10 * STEP))
    run = MlflowClient(trainer.tracker.tracking_uri).get_run(trainer.run_id)
    assert run.info.status == "FAILED"
    newest = CheckpointManager(tmp_path / "ck", keep_last=None).latest()
    assert CheckpointManager(tmp_path / "ck").step_of(newest) == 3 * STEP
    assert policy_is_finite(load_checkpoint(newest))
    # the parameters are NaN now: no checkpoint of them, the last good one stays the newest
    with pytest.raises(
        NonFiniteError,
        match=r"refusing to write a checkpoint at env step 512: the policy's .*"
        r"hold NaN or inf; the last good checkpoint is .*checkpoint-0*384\.pt",
    ):
        trainer.save_checkpoint()
    assert CheckpointManager(tmp_path / "ck", keep_last=None).latest() == newest


def test_save_checkpoint_refuses_non_finite_parameters(tmp_path):
    trainer = Trainer(
        PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck", tracking=False
    )
    trainer.step()
    good = trainer.save_checkpoint()
    trainer.step()
    with torch.no_grad():
        next(trainer.algo.policy.parameters())[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"the policy's model\..* hold NaN or inf"):
        trainer.save_checkpoint(tmp_path / "explicit.pt")
    with pytest.raises(NonFiniteError):
        trainer.save_checkpoint()
    assert not (tmp_path / "explicit.pt").exists()
    assert CheckpointManager(tmp_path / "ck", keep_last=None).list() == [good]


def test_nan_rewards_after_the_checked_collects_are_found_by_the_collect():
    # check_finite_collects=2 scans every value of collects 1 and 2; collect 4 goes bad
    algo = PPO(GoesBadEnv, env_kwargs={"what": "rewards", "bad_from": 3 * 8 + 2}, **SMALL)
    for _ in range(3):
        algo.collect()
        algo.update()
    with pytest.raises(EnvOutputError, match=r"non-finite values .* in 'rewards' at \(env 2, step 1\)"):
        algo.collect()


def test_nan_observations_after_the_checked_collects_are_found_by_the_update():
    algo = PPO(GoesBadEnv, env_kwargs={"what": "obs", "bad_from": 3 * 8 + 2}, **SMALL)
    for _ in range(3):
        algo.collect()
        algo.update()
    algo.collect()  # NaN obs are not in the reduced rollout stats...
    with pytest.raises(EnvOutputError, match=r"non-finite values .* in 'obs' at \(env 2, step 2\)"):
        algo.update()  # ...but they make the losses NaN, and the update names the cause


def test_non_finite_update_without_env_cause_names_the_stat():
    algo = PPO(CartPole, lr=1e30, **SMALL)
    with pytest.raises(
        NonFiniteError, match=r"non-finite .*(losses/total|monitors/grad_norm)=\S+ at update step \d+"
    ):
        for _ in range(20):
            algo.collect()
            algo.update()
    assert algo.steps < 20


# --------------------------------------------------------------------------------------------
# resuming with `rl8 train --resume` a run started from Python


def count_steps(monkeypatch, limit=6):
    """Count the training steps of every Trainer.run (the rl8 command's too) with a callback
    that each run gets; fail (instead of training forever) past ``limit``."""
    steps = []
    run = Trainer.run

    def count(trainer, stats):
        steps.append(1)
        if len(steps) > limit:
            raise AssertionError(f"more than {limit} training steps: the stop conditions were lost")

    def counted_run(self, *, callbacks=None, **kwargs):
        return run(self, callbacks=[*(callbacks or []), count], **kwargs)

    monkeypatch.setattr(Trainer, "run", counted_run)
    return steps


def test_cli_resume_keeps_the_stop_conditions_of_a_run_started_from_python(monkeypatch, tmp_path):
    from rl8.cli import main

    stop = [HitsUpperBound("env/steps", 2 * STEP), TimeLimit(3600)]
    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        trainer.run(stop_conditions=stop)
    steps = count_steps(monkeypatch)
    # finished at the stored condition: zero more steps
    assert main(["train", "--resume", str(tmp_path / "ck"), "--quiet"]) == 0
    assert steps == []
    latest = CheckpointManager(tmp_path / "ck").latest()
    assert CheckpointManager(tmp_path / "ck").step_of(latest) == 2 * STEP
    # a new condition trains on from the checkpoint to it
    assert (
        main(["train", "--resume", str(tmp_path / "ck"), "--quiet", "--max-steps", str(4 * STEP)]) == 0
    )
    assert len(steps) == 2
    latest = CheckpointManager(tmp_path / "ck").latest()
    assert CheckpointManager(tmp_path / "ck").step_of(latest) == 4 * STEP
    assert MlflowClient().get_run(trainer.run_id).info.status == "FINISHED"


def test_python_resume_of_a_finished_run_trains_zero_steps(monkeypatch, tmp_path):
    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        trainer.run(stop_conditions=HitsUpperBound("env/steps", 2 * STEP))
    steps = count_steps(monkeypatch)
    with Trainer.from_checkpoint(tmp_path / "ck", progress=False) as resumed:
        stats = resumed.run(stop_conditions=HitsUpperBound("env/steps", 2 * STEP))
        assert steps == [] and stats["env/steps"] == 2 * STEP
        resumed.run(stop_conditions=HitsUpperBound("env/steps", 3 * STEP))  # raised: trains on
        assert len(steps) == 1 and resumed.algo.env_steps == 3 * STEP


def test_cli_resume_refuses_stop_conditions_it_cannot_rebuild(monkeypatch, tmp_path, capsys):
    from rl8.cli import main
    from rl8.training.conditions import Condition

    class AfterTwo(Condition):
        def __call__(self, stats):
            return stats["algorithm/steps"] >= 2

    with Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck") as trainer:
        trainer.run(stop_conditions=AfterTwo())
    count_steps(monkeypatch)
    assert main(["train", "--resume", str(tmp_path / "ck"), "--quiet"]) == 2
    assert "stop conditions (AfterTwo) that it cannot rebuild" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# a tracking server that does not answer (the live-server test is in test_tracking.py)


def test_save_checkpoint_does_not_wait_for_the_tracking_backlog(monkeypatch, tmp_path):
    import threading

    stuck, release = threading.Event(), threading.Event()
    real = MlflowClient.log_batch

    def hangs(self, *args, **kwargs):  # the logging thread inside a request that hangs
        if threading.current_thread().name == "rl8-mlflow-logger":
            stuck.set()
            release.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", hangs)
    trainer = Trainer(PPO(CartPole, **SMALL), progress=False, checkpoint_dir=tmp_path / "ck")
    try:
        trainer.step()
        assert stuck.wait(10)
        written = []
        saver = threading.Thread(target=lambda: written.append(trainer.save_checkpoint()))
        saver.start()
        saver.join(5)
        assert written and written[0].is_file()  # written while the logging thread is stuck
        trainer.step()  # and training goes on
    finally:
        release.set()
    trainer.close()
    client = MlflowClient(trainer.tracker.tracking_uri)
    artifacts = {f.path for d in ("policy", "rl8") for f in client.list_artifacts(trainer.run_id, d)}
    assert artifacts == {
        "rl8/checkpoint.json",
        *(
            f"policy/{name}"
            for name in (  # an MLflow model folder
                "MLmodel",
                "policy.pt",
                "input_example.json",
                "serving_input_example.json",
                "requirements.txt",
                "python_env.yaml",
            )
        ),
    }  # uploaded in the background


# --------------------------------------------------------------------------------------------
# runs left RUNNING by a process that died


def test_runs_record_their_process_and_rl8_runs_clean_marks_dead_ones_failed(mlflow_uri, capsys):
    import os
    import socket
    import subprocess

    from rl8.cli import main
    from rl8.tracking import Tracker

    client = MlflowClient(mlflow_uri)
    alive = Tracker(experiment="clean")
    alive.start()
    tags = client.get_run(alive.run_id).data.tags
    assert tags["rl8.host"] == socket.gethostname() and tags["rl8.pid"] == str(os.getpid())
    # a run whose process was killed before it could end it: its pid no longer exists
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = Tracker(experiment="clean")
    dead.start()
    client.set_tag(dead.run_id, "rl8.pid", str(gone.pid))
    elsewhere = Tracker(experiment="clean")  # a run of another machine: unknown process
    elsewhere.start()
    client.set_tag(elsewhere.run_id, "rl8.host", "another-host")

    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"{dead.run_id}  clean" in out and f":{gone.pid}  process dead" in out
    assert "process alive" in out and "another-host" in out and "process unknown" in out
    assert main(["runs", "--clean", "--dry-run"]) == 0
    assert client.get_run(dead.run_id).info.status == "RUNNING"
    assert main(["runs", "--clean"]) == 0
    assert dead.run_id in capsys.readouterr().out
    status = {t.run_id: client.get_run(t.run_id).info.status for t in (alive, dead, elsewhere)}
    assert status == {alive.run_id: "RUNNING", dead.run_id: "FAILED", elsewhere.run_id: "RUNNING"}
    assert "is gone" in client.get_run(dead.run_id).data.tags["rl8.cleaned"]
    # --older-than: also runs of unknown process started long enough ago; never a live one
    assert main(["runs", "--clean", "--older-than", "0"]) == 0
    assert client.get_run(elsewhere.run_id).info.status == "FAILED"
    assert client.get_run(alive.run_id).info.status == "RUNNING"
    assert main(["runs", "--older-than", "1h"]) == 2
    assert "--older-than only applies with --clean" in capsys.readouterr().err
    alive.end()
