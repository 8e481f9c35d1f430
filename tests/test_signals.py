"""Signals during Trainer.run, in a subprocess: SIGUSR1 checkpoints and goes on; SIGTERM and
SIGINT checkpoint, end the MLflow run as KILLED and exit."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from rl8.io.checkpoint_dir import CheckpointManager

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("migrated_store"),
    pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals"),
]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    torch.set_num_threads(1)
    from rl8 import PPO, Trainer
    from rl8.training.conditions import Condition
    from rl8.envs import CartPole

    class Report(Condition):
        '''Never stops; prints each step so that the test knows where training is.'''
        def __call__(self, stats):
            print(f"STEP {int(stats['algorithm/steps'])}", flush=True)
            time.sleep(0.05)
            return False

    algo = PPO(CartPole, num_envs=16, horizon=8, sgd_minibatch_size=64, num_sgd_iters=1, seed=0)
    trainer = Trainer(algo, checkpoint_dir=sys.argv[1], progress=False)
    print(f"RUN {trainer.run_id}", flush=True)
    trainer.run(stop_conditions=[Report()])
    """
)


class Training:
    """The script in a subprocess, its stdout read line by line in a thread."""

    def __init__(self, tmp_path: Path):
        self.checkpoints = tmp_path / "ck"
        (tmp_path / "train.py").write_text(SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "train.py"), str(self.checkpoints)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.run_id = self.wait_for("RUN ").split()[1]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line
        self.proc.kill()
        pytest.fail(f"no line starting with {prefix!r}; stderr:\n{self.proc.stderr.read()[-3000:]}")

    def step(self) -> int:
        return int(self.wait_for("STEP ").split()[1])

    def checkpoint_steps(self) -> list[int]:
        manager = CheckpointManager(self.checkpoints, keep_last=None)
        return [manager.step_of(p) for p in manager.list()]

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, self.proc.stderr.read()


@pytest.mark.timeout(120)
def test_sigusr1_checkpoints_and_continues_then_sigterm_exits(tmp_path, mlflow_uri):
    training = Training(tmp_path)
    try:
        training.step()
        assert training.checkpoint_steps() == []
        training.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not training.checkpoint_steps() and time.monotonic() < deadline:
            time.sleep(0.05)
        (first,) = training.checkpoint_steps()
        after = training.step()
        after = training.step()  # training goes on after the checkpoint
        assert after * 128 > first and training.proc.poll() is None
        assert MlflowClient(mlflow_uri).get_run(training.run_id).info.status == "RUNNING"

        training.proc.send_signal(signal.SIGTERM)
        code, err = training.finish()
    finally:
        if training.proc.poll() is None:
            training.proc.kill()
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: checkpoint written to" in err and "KILLED" in err
    steps = training.checkpoint_steps()
    assert len(steps) == 2 and steps[-1] >= after * 128
    run = MlflowClient(mlflow_uri).get_run(training.run_id)
    assert run.info.status == "KILLED"
    # the final checkpoint holds the MLflow run id and is resumable
    state = torch.load(training.checkpoints / f"checkpoint-{steps[-1]:012d}.pt", weights_only=True)
    assert state["trainer"]["run_id"] == training.run_id
    assert state["algo"]["counters"]["env_steps"] == steps[-1]


@pytest.mark.timeout(120)
def test_sigint_checkpoints_and_raises_keyboard_interrupt(tmp_path, mlflow_uri):
    training = Training(tmp_path)
    try:
        training.step()
        training.proc.send_signal(signal.SIGINT)
        code, err = training.finish()
    finally:
        if training.proc.poll() is None:
            training.proc.kill()
    # an uncaught KeyboardInterrupt: Python dies by SIGINT after printing the traceback
    assert code in (-signal.SIGINT, 130), err
    assert "KeyboardInterrupt" in err and "SIGINT: checkpoint written to" in err
    assert len(training.checkpoint_steps()) == 1
    assert MlflowClient(mlflow_uri).get_run(training.run_id).info.status == "KILLED"
