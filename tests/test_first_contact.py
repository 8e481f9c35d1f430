"""What a newcomer meets first: runs that end, eval env on demand, progress and start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rl8 import PPO, Trainer
from rl8.envs import CartPole

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
